//! The S3-compatible servers W6 reads from, each on a free loopback port,
//! started here and stopped on drop:
//! - `moto` (from the test venv): the protocol tests' server. It answers
//!   any GET of a large object, ranged or not, only after loading the
//!   whole object, so block reads of one big file cost far more than on S3.
//! - `s3s` (`s3s-fs` 0.14.1 from crates.io behind `tools/s3s-server`,
//!   built on first use into `target/tools`, with TCP_NODELAY as S3's
//!   endpoints have): serves each object from a file and a ranged GET from
//!   that range of the file, as S3 does. It does not honour conditional
//!   puts, so W6 publishes into its directory through `file://` (the same
//!   bytes and keys), then PUTs every object again through S3 ([`Server::
//!   settle`]) so that s3s-fs records its ETag as for any upload (without
//!   one it computes the MD5 of the whole file on every GET, ranged or
//!   not, as S3 does not), and reads back through S3.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{RunError, progress};

use super::err;

/// Which server a line was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// moto's server (Python).
    Moto,
    /// `s3s-fs`: ranged GETs read from disk.
    S3s,
}

impl Kind {
    /// The name lines carry in `server`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Moto => "moto",
            Kind::S3s => "s3s-fs",
        }
    }

    /// `--server`'s value: `moto`, `s3s` or `both` (the default).
    pub fn parse_list(s: &str) -> Result<Vec<Kind>, RunError> {
        match s {
            "moto" => Ok(vec![Kind::Moto]),
            "s3s" | "s3s-fs" => Ok(vec![Kind::S3s]),
            "both" => Ok(vec![Kind::Moto, Kind::S3s]),
            other => Err(err(format!(
                "unknown W6 server {other:?} (moto, s3s or both)"
            ))),
        }
    }
}

const ACCESS_KEY: &str = "cachex-bench";
const SECRET_KEY: &str = "cachex-bench-secret";

/// A running server (stopped on drop).
pub struct Server {
    /// Which one.
    pub kind: Kind,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// s3s-fs's root directory (a bucket is a folder of it).
    root: Option<PathBuf>,
    child: Option<Child>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The workspace's root (benches/ is one of its members).
pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

/// `CACHEX_VENV`, else `target/py-venv` of the workspace (as scripts/test).
pub(crate) fn venv() -> PathBuf {
    if let Some(v) = std::env::var_os("CACHEX_VENV") {
        return PathBuf::from(v);
    }
    workspace().join("target").join("py-venv")
}

/// The `s3s-fs` server: `CACHEX_S3S_FS`, else
/// `target/tools/bin/cachex-s3s-server`, built there on first use from
/// `tools/s3s-server` (s3s-fs 0.14.1 from crates.io, pinned by its own
/// lock file, with TCP_NODELAY on its connections: s3s-fs's own binary
/// leaves Nagle's algorithm on, so each small response waits for the
/// client's delayed ACK, as no S3 endpoint does).
fn s3s_binary() -> Result<PathBuf, RunError> {
    if let Some(p) = std::env::var_os("CACHEX_S3S_FS") {
        return Ok(PathBuf::from(p));
    }
    let root = workspace().join("target").join("tools");
    let bin = root.join("bin").join("cachex-s3s-server");
    if bin.is_file() {
        return Ok(bin);
    }
    progress!("w6: building tools/s3s-server into {}", root.display());
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .arg("install")
        .arg("--path")
        .arg(workspace().join("tools").join("s3s-server"))
        .arg("--root")
        .arg(&root)
        .arg("--target-dir")
        .arg(root.join("build"))
        .arg("--locked")
        .status()
        .map_err(err)?;
    if !status.success() || !bin.is_file() {
        return Err(err(format!(
            "cargo install tools/s3s-server failed ({status})"
        )));
    }
    Ok(bin)
}

fn free_port() -> Result<u16, RunError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(err)?
        .port())
}

impl Server {
    /// Starts a server of `kind`; s3s-fs keeps its buckets under `scratch`.
    /// For moto, `CACHEX_S3_ENDPOINT` names one already running (the one
    /// scripts/test starts), used instead.
    pub fn start(kind: Kind, scratch: &Path) -> Result<Server, RunError> {
        if let (Kind::Moto, Ok(endpoint)) = (kind, std::env::var("CACHEX_S3_ENDPOINT")) {
            return Ok(Server {
                kind,
                endpoint,
                root: None,
                child: None,
            });
        }
        let port = free_port()?;
        let (child, root) = match kind {
            Kind::Moto => {
                let moto = venv().join("bin").join("moto_server");
                if !moto.is_file() {
                    return Err(err(format!(
                        "no {} (run scripts/test once, or set CACHEX_VENV)",
                        moto.display()
                    )));
                }
                let child = Command::new(&moto)
                    .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(err)?;
                (child, None)
            }
            Kind::S3s => {
                let bin = s3s_binary()?;
                let root = scratch.join("s3s-root");
                std::fs::create_dir_all(&root).map_err(err)?;
                let child = Command::new(&bin)
                    .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                    .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
                    .arg(&root)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(err)?;
                (child, Some(root))
            }
        };
        let server = Server {
            kind,
            endpoint: format!("http://127.0.0.1:{port}"),
            root,
            child: Some(child),
        };
        for _ in 0..300 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                progress!("w6: {} S3 server at {}", kind.name(), server.endpoint);
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(err(format!("the {} S3 server did not start", kind.name())))
    }

    /// `object_store` options for this server.
    pub fn options(&self) -> Vec<(String, String)> {
        [
            ("aws_endpoint", self.endpoint.as_str()),
            ("aws_allow_http", "true"),
            ("aws_region", "us-east-1"),
            ("aws_access_key_id", ACCESS_KEY),
            ("aws_secret_access_key", SECRET_KEY),
            ("aws_virtual_hosted_style_request", "false"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// Creates a bucket of its own for one run of `workload` (named by the
    /// process and the time, so runs on a shared moto never meet); its name.
    pub fn run_bucket(&self, workload: &str) -> Result<String, RunError> {
        let name = format!(
            "cachex-{workload}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        );
        self.new_bucket(&name)?;
        Ok(name)
    }

    /// Creates a bucket: moto takes an unsigned `PUT /<bucket>`; s3s-fs's
    /// bucket is a folder of its root.
    pub fn new_bucket(&self, name: &str) -> Result<(), RunError> {
        if let Some(root) = &self.root {
            return std::fs::create_dir_all(root.join(name)).map_err(err);
        }
        let host = self
            .endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/');
        let mut conn = TcpStream::connect(host).map_err(err)?;
        write!(
            conn,
            "PUT /{name} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .map_err(err)?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer).map_err(err)?;
        if !answer.starts_with("HTTP/1.1 200") {
            return Err(err(format!("create bucket {name}: {answer}")));
        }
        Ok(())
    }

    /// Makes the objects published under `bucket/name` through `file://`
    /// what s3s-fs would hold had they been uploaded through it: each one
    /// PUT again through S3 (the same bytes), so that s3s-fs records its
    /// ETag (without, it hashes the whole file for every GET, even of 4
    /// KiB). Nothing to do for moto, which was published through S3.
    pub fn settle(&self, bucket: &str, name: &str) -> Result<(), RunError> {
        let Some(root) = &self.root else {
            return Ok(());
        };
        let dir = root.join(bucket).join(name);
        let (store, prefix) =
            remote_tier::build_store(&format!("s3://{bucket}/{name}"), self.options())
                .map_err(err)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(err)?;
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).map_err(err)? {
                let path = entry.map_err(err)?.path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let rel = path.strip_prefix(&dir).map_err(err)?;
                let mut key = prefix.clone();
                for part in rel.iter() {
                    key = key.join(part.to_string_lossy().as_ref());
                }
                let bytes = std::fs::read(&path).map_err(err)?;
                rt.block_on(object_store::ObjectStoreExt::put(
                    store.as_ref(),
                    &key,
                    bytes.into(),
                ))
                .map_err(err)?;
            }
        }
        Ok(())
    }

    /// The URL a cache is read from, and the URL and options it is
    /// published through (the same keys and bytes: s3s-fs's through its
    /// directory, since it does not honour conditional puts).
    pub fn urls(&self, bucket: &str, name: &str) -> (String, String, Vec<(String, String)>) {
        let read = format!("s3://{bucket}/{name}");
        match &self.root {
            Some(root) => (
                read,
                format!("file://{}", root.join(bucket).join(name).display()),
                Vec::new(),
            ),
            None => (read.clone(), read, self.options()),
        }
    }
}

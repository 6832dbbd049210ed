//! The object-store test servers that `scripts/test` starts on loopback
//! (`scripts/test-servers`): moto for S3, fake-gcs-server for GCS, Azurite
//! for Azure Blob. Each is found through its `CACHEX_*_ENDPOINT`; a test
//! gets the `object_store` options that point at it and a root URL no
//! other test uses.
//!
//! ```no_run
//! use test_support::servers::{Backend, Server};
//!
//! for backend in Backend::ALL {
//!     let Some(server) = Server::find(backend) else { continue };
//!     let url = server.new_url("demo", "caches/a"); // s3://…, gs://…, az://…
//!     let options = server.options();
//!     # let _ = (url, options);
//! }
//! ```

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};

/// An object store kind the remote tests run on, each against its emulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Amazon S3, served by moto (`s3://`).
    S3,
    /// Google Cloud Storage, served by fake-gcs-server (`gs://`).
    Gcs,
    /// Azure Blob Storage, served by Azurite (`az://`).
    Azure,
}

/// The Azure container `scripts/test-servers` creates on Azurite, where
/// each test takes a fresh prefix (creating a container takes a signed
/// request; a bucket on the other two servers does not).
pub const AZURE_CONTAINER: &str = "cachex";

/// Azurite's one account and its key, published by Microsoft for the
/// emulator (they open nothing real).
const AZURITE_ACCOUNT: &str = "devstoreaccount1";
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

impl Backend {
    /// Every backend, S3 first.
    pub const ALL: [Backend; 3] = [Backend::S3, Backend::Gcs, Backend::Azure];

    /// The environment variable that holds the server's endpoint.
    pub fn endpoint_var(self) -> &'static str {
        match self {
            Backend::S3 => "CACHEX_S3_ENDPOINT",
            Backend::Gcs => "CACHEX_GCS_ENDPOINT",
            Backend::Azure => "CACHEX_AZURE_ENDPOINT",
        }
    }

    /// The store's name as the messages say it (`S3`, `GCS`, `Azure`).
    pub fn name(self) -> &'static str {
        match self {
            Backend::S3 => "S3",
            Backend::Gcs => "GCS",
            Backend::Azure => "Azure",
        }
    }
}

/// A running test server of one backend.
#[derive(Clone, Debug)]
pub struct Server {
    /// What it serves.
    pub backend: Backend,
    /// Its URL: `http://127.0.0.1:<port>` (Azurite's with the account,
    /// `…/devstoreaccount1`).
    pub endpoint: String,
}

static ROOTS: AtomicUsize = AtomicUsize::new(0);

impl Server {
    /// The test server of `backend`, or `None` (said on stderr, so the skip
    /// is visible) when none runs outside CI. Under `CI=true` a missing
    /// server fails the test.
    pub fn find(backend: Backend) -> Option<Server> {
        let var = backend.endpoint_var();
        if let Ok(endpoint) = std::env::var(var) {
            return Some(Server { backend, endpoint });
        }
        let msg = format!(
            "{var} not set: run scripts/test, which starts the {} test server",
            backend.name()
        );
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{msg}");
        }
        eprintln!("skipping {} test: {msg}", backend.name());
        None
    }

    /// The `object_store` options that point at the server, with the
    /// credentials it takes (real ones come from the environment, never
    /// from here): any key for moto, none for fake-gcs-server (an empty
    /// bearer token), Azurite's published account key.
    pub fn options(&self) -> Vec<(&'static str, String)> {
        let endpoint = self.endpoint.clone();
        match self.backend {
            Backend::S3 => vec![
                ("aws_endpoint", endpoint),
                ("aws_allow_http", "true".into()),
                ("aws_access_key_id", "cachex-test".into()),
                ("aws_secret_access_key", "cachex-test".into()),
                ("aws_region", "us-east-1".into()),
            ],
            Backend::Gcs => vec![
                ("google_base_url", endpoint),
                ("google_allow_http", "true".into()),
                ("google_bearer_token", "cachex-test".into()),
            ],
            Backend::Azure => vec![
                ("azure_storage_endpoint", endpoint),
                ("azure_allow_http", "true".into()),
                ("azure_storage_account_name", AZURITE_ACCOUNT.into()),
                ("azure_storage_account_key", AZURITE_KEY.into()),
            ],
        }
    }

    /// A root no other test (in this or another process) uses, with
    /// `prefix` inside it: `s3://` or `gs://` a fresh bucket
    /// (`cachex-<tag>-<pid>-<n>-<nanos>`), or `az://cachex/` a fresh prefix
    /// of that name. `tag` is lowercase letters, digits and dashes.
    pub fn new_url(&self, tag: &str, prefix: &str) -> String {
        let n = ROOTS.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let fresh = format!("cachex-{tag}-{}-{n}-{nanos}", std::process::id());
        let prefix = prefix.trim_start_matches('/');
        match self.backend {
            Backend::S3 => {
                self.create_bucket(&fresh);
                format!("s3://{fresh}/{prefix}")
            }
            Backend::Gcs => {
                self.create_bucket(&fresh);
                format!("gs://{fresh}/{prefix}")
            }
            Backend::Azure => format!("az://{AZURE_CONTAINER}/{fresh}/{prefix}"),
        }
    }

    /// Creates the bucket `name` with the one unsigned request each server
    /// takes: `PUT /<name>` (moto), `POST /storage/v1/b` (fake-gcs-server).
    pub fn create_bucket(&self, name: &str) {
        let (method, path, body) = match self.backend {
            Backend::S3 => ("PUT", format!("/{name}"), String::new()),
            Backend::Gcs => (
                "POST",
                "/storage/v1/b?project=cachex-test".to_string(),
                format!(r#"{{"name":"{name}"}}"#),
            ),
            Backend::Azure => panic!("Azure tests share the container {AZURE_CONTAINER}"),
        };
        let answer = self.request(method, &path, body.as_bytes());
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "create bucket {name} on the {} test server: {answer}",
            self.backend.name()
        );
    }

    /// Uploads `body` as the object `name` of `bucket` through
    /// fake-gcs-server's JSON API (`uploadType=media`): the way onto the
    /// GCS emulator, which refuses object_store's own uploads (the XML API's
    /// `PUT`), for tests of what it does serve.
    pub fn gcs_upload(&self, bucket: &str, name: &str, body: &[u8]) {
        assert_eq!(
            self.backend,
            Backend::Gcs,
            "gcs_upload on {:?}",
            self.backend
        );
        let name: String = name
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let path = format!("/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}");
        let answer = self.request("POST", &path, body);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "upload {bucket}/{name} to the GCS test server: {answer}"
        );
    }

    /// Sends one request to the server and returns its whole answer.
    fn request(&self, method: &str, path: &str, body: &[u8]) -> String {
        let host = self
            .endpoint
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or_default();
        let server = self.backend.name();
        let mut conn = TcpStream::connect(host)
            .unwrap_or_else(|e| panic!("connect to the {server} test server at {host}: {e}"));
        write!(
            conn,
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .and_then(|()| conn.write_all(body))
        .unwrap_or_else(|e| panic!("send {method} {path} to the {server} test server: {e}"));
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer)
            .unwrap_or_else(|e| panic!("read the {server} test server's answer: {e}"));
        String::from_utf8_lossy(&answer).into_owned()
    }
}

/// Turns each `fn name(backend: Backend)` into one test per backend
/// listed, `name::<test>` (each skips, or fails under `CI=true`, where
/// [`Server::find`] does).
///
/// ```no_run
/// use test_support::servers::{Backend, Server};
///
/// fn round_trip(backend: Backend) {
///     let Some(server) = Server::find(backend) else { return };
///     let url = server.new_url("demo", "cache");
///     # let _ = url;
/// }
/// test_support::on_backends!([s3 = S3, azure = Azure] round_trip);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! on_backends {
    ([$($test:ident = $backend:ident),+ $(,)?] $name:ident $(,)?) => {
        mod $name {
            $(
                #[test]
                fn $test() {
                    super::$name($crate::servers::Backend::$backend)
                }
            )+
        }
    };
    ([$($list:tt)+] $name:ident, $($rest:ident),+ $(,)?) => {
        $crate::on_backends!([$($list)+] $name);
        $crate::on_backends!([$($list)+] $($rest),+);
    };
}

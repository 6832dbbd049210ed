//! `cachex-s3s-server --host H --port P --access-key K --secret-key S ROOT`:
//! s3s-fs's file-system S3 server, each accepted connection with
//! TCP_NODELAY (see Cargo.toml). Serves until killed.

use std::path::PathBuf;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use s3s_fs::FileSystem;
use tokio::net::TcpListener;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Opt {
    host: String,
    port: u16,
    access_key: String,
    secret_key: String,
    root: PathBuf,
}

fn parse() -> Result<Opt, BoxError> {
    let mut args = std::env::args().skip(1);
    let (mut host, mut port, mut ak, mut sk, mut root) = (None, None, None, None, None);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--host" => host = Some(value()?),
            "--port" => port = Some(value()?.parse::<u16>()?),
            "--access-key" => ak = Some(value()?),
            "--secret-key" => sk = Some(value()?),
            _ if !a.starts_with("--") => root = Some(PathBuf::from(a)),
            _ => return Err(format!("unknown option {a}").into()),
        }
    }
    Ok(Opt {
        host: host.unwrap_or_else(|| "127.0.0.1".into()),
        port: port.ok_or("--port is required")?,
        access_key: ak.ok_or("--access-key is required")?,
        secret_key: sk.ok_or("--secret-key is required")?,
        root: root.ok_or("the root directory is required")?,
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let opt = parse()?;
    let fs = FileSystem::new(&opt.root).map_err(|e| format!("{}: {e:?}", opt.root.display()))?;
    let service = {
        let mut b = S3ServiceBuilder::new(fs);
        b.set_auth(SimpleAuth::from_single(opt.access_key, opt.secret_key));
        b.build()
    };
    let listener = TcpListener::bind((opt.host.as_str(), opt.port)).await?;
    let http = ConnBuilder::new(TokioExecutor::new());
    loop {
        let (socket, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                eprintln!("accept: {e}");
                continue;
            }
        };
        // The one change from s3s-fs's own binary.
        socket.set_nodelay(true)?;
        let conn = http
            .serve_connection(TokioIo::new(socket), service.clone())
            .into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

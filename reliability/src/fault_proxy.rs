//! A fault proxy: an HTTP/1.1 proxy on 127.0.0.1 between an object-store
//! client and the S3 test server that breaks one chosen request.
//!
//! Requests are numbered in the order they arrive (over every connection).
//! [`FaultProxy::arm`] picks a request index and an [`HttpFault`]; that one
//! request is dropped before it reaches the server, answered 500, held
//! until the client gives up, or forwarded and then its answer lost,
//! truncated or corrupted. Every other request passes unchanged, so a
//! sweep over every index of an operation tests the real client, its
//! retries and timeouts, and the checks above them — not a fake.
//!
//! [`FaultProxy::ignore_if_none_match`] makes the proxy a server that
//! accepts conditional puts without honouring them: it removes the
//! `If-None-Match` header before forwarding, as some S3-compatible servers
//! do, so a create overwrites what is there.
//!
//! Each request is forwarded on its own connection to the server (with
//! `Connection: close`); answers are re-framed with a `Content-Length` so
//! that the client's connection stays open between requests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What happens to the armed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpFault {
    /// The connection is closed before the request reaches the server.
    Reset,
    /// The request is performed, then the connection closed unanswered.
    LostAnswer,
    /// The request is held, unanswered, until the client closes the
    /// connection (or [`HOLD_MAX`] passes): longer than any timeout.
    Delay,
    /// The request is performed; the answer's head is sent with half its
    /// body (half the head when it has no body), then the connection is
    /// closed.
    Truncate,
    /// The request is performed; one byte in the middle of the answer's
    /// body (of its head, when it has no body) is flipped.
    Corrupt,
    /// The request never reaches the server; the answer is a 500.
    ServerError,
}

/// Every fault, in the order sweeps run them.
pub const HTTP_FAULTS: [HttpFault; 6] = [
    HttpFault::Reset,
    HttpFault::LostAnswer,
    HttpFault::Delay,
    HttpFault::Truncate,
    HttpFault::Corrupt,
    HttpFault::ServerError,
];

/// The longest a [`HttpFault::Delay`] holds a request whose client is
/// still waiting (a client that waits this long has hung).
pub const HOLD_MAX: Duration = Duration::from_secs(300);

/// How long the proxy waits on the server before it drops a request.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest request or answer body the proxy buffers.
const MAX_BODY: usize = 256 << 20;

#[derive(Debug, Default)]
struct Armed {
    at: Option<(u64, HttpFault)>,
    fired: bool,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    requests: AtomicU64,
    armed: Mutex<Armed>,
    strip_if_none_match: AtomicBool,
    stop: AtomicBool,
    log: Mutex<Vec<String>>,
}

impl Shared {
    fn armed(&self) -> MutexGuard<'_, Armed> {
        self.armed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running fault proxy (stopped when dropped).
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port in front of `endpoint`
    /// (`http://127.0.0.1:PORT`, the S3 test server).
    pub fn start(endpoint: &str) -> std::io::Result<FaultProxy> {
        let host = endpoint.trim_start_matches("http://").trim_end_matches('/');
        let upstream = host.to_socket_addrs()?.next().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "no upstream address")
        })?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            requests: AtomicU64::new(0),
            armed: Mutex::new(Armed::default()),
            strip_if_none_match: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            log: Mutex::new(Vec::new()),
        });
        let for_accept = Arc::clone(&shared);
        let accept = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if for_accept.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let shared = Arc::clone(&for_accept);
                // Connection threads end when their client closes; they are
                // not joined (a held request may outlive the proxy briefly).
                std::thread::spawn(move || serve(conn, &shared));
            }
        });
        Ok(FaultProxy {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// The endpoint clients use instead of the server's.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests seen so far (the index the next one gets).
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Breaks the request with index `at` (see [`requests`](Self::requests))
    /// with `fault`; any earlier arming is replaced.
    pub fn arm(&self, at: u64, fault: HttpFault) {
        *self.shared.armed() = Armed {
            at: Some((at, fault)),
            fired: false,
        };
    }

    /// No request is broken from now on; returns whether the armed fault
    /// was applied.
    pub fn disarm(&self) -> bool {
        let mut armed = self.shared.armed();
        armed.at = None;
        std::mem::take(&mut armed.fired)
    }

    /// Whether `If-None-Match` is removed from requests (a server that
    /// ignores conditional puts).
    pub fn ignore_if_none_match(&self, on: bool) {
        self.shared.strip_if_none_match.store(on, Ordering::SeqCst);
    }

    /// `"<index> <METHOD> <path>"` of every request since `from`.
    pub fn log_since(&self, from: u64) -> Vec<String> {
        let log = self.shared.log.lock().unwrap_or_else(|p| p.into_inner());
        log.iter()
            .filter(|l| {
                l.split(' ')
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .is_some_and(|n| n >= from)
            })
            .cloned()
            .collect()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// One HTTP message: its head (start line and headers, without the blank
/// line) and its body.
struct Message {
    start: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The body ended with the connection (no length given).
    until_close: bool,
}

impl Message {
    fn head_bytes(&self) -> Vec<u8> {
        let mut out = format!("{}\r\n", self.start);
        for (k, v) in &self.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.into_bytes()
    }
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// A start line and its headers.
type Head = (String, Vec<(String, String)>);

/// Reads a head; `None` at a clean end of the connection.
fn read_head(r: &mut impl BufRead) -> std::io::Result<Option<Head>> {
    let mut start = String::new();
    if r.read_line(&mut start)? == 0 {
        return Ok(None);
    }
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Err(bad("connection closed inside a head"));
        }
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| bad("header without a colon"))?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    Ok(Some((start.trim_end().to_string(), headers)))
}

/// Reads a chunked body (de-chunked).
fn read_chunked(r: &mut impl BufRead) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line)?;
        let size = line.trim().split(';').next().unwrap_or("");
        let size = usize::from_str_radix(size, 16).map_err(|_| bad("bad chunk size"))?;
        if body.len() + size > MAX_BODY {
            return Err(bad("body too large"));
        }
        if size == 0 {
            // Trailers, up to the blank line.
            loop {
                let mut t = String::new();
                if r.read_line(&mut t)? == 0 || t.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        let at = body.len();
        body.resize(at + size, 0);
        r.read_exact(&mut body[at..])?;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)?;
    }
}

/// Reads a body framed by `headers` (`no_body`: a HEAD answer, 1xx, 204,
/// 304); without a length, up to the end of the connection when
/// `to_close` (answers) or empty (requests).
fn read_body(
    r: &mut impl BufRead,
    headers: &[(String, String)],
    no_body: bool,
    to_close: bool,
) -> std::io::Result<(Vec<u8>, bool)> {
    if no_body {
        return Ok((Vec::new(), false));
    }
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    if get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        return Ok((read_chunked(r)?, false));
    }
    if let Some(len) = get("content-length") {
        let len: usize = len.parse().map_err(|_| bad("bad content-length"))?;
        if len > MAX_BODY {
            return Err(bad("body too large"));
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body)?;
        return Ok((body, false));
    }
    if !to_close {
        return Ok((Vec::new(), false));
    }
    let mut body = Vec::new();
    r.take(MAX_BODY as u64).read_to_end(&mut body)?;
    Ok((body, true))
}

/// Re-frames `headers` for a body sent whole with its length.
fn framed(headers: &[(String, String)], body_len: Option<usize>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = headers
        .iter()
        .filter(|(k, _)| {
            !k.eq_ignore_ascii_case("connection")
                && !k.eq_ignore_ascii_case("keep-alive")
                && !k.eq_ignore_ascii_case("transfer-encoding")
                && (body_len.is_none() || !k.eq_ignore_ascii_case("content-length"))
        })
        .cloned()
        .collect();
    if let Some(n) = body_len {
        out.push(("Content-Length".into(), n.to_string()));
    }
    out
}

/// Serves one client connection, request after request.
fn serve(client: TcpStream, shared: &Shared) {
    let _ = client.set_read_timeout(Some(UPSTREAM_TIMEOUT));
    let Ok(mut out) = client.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(client);
    loop {
        let Ok(Some((start, headers))) = read_head(&mut reader) else {
            return;
        };
        let Ok((body, _)) = read_body(&mut reader, &headers, false, false) else {
            return;
        };
        let request = Message {
            start,
            headers,
            body,
            until_close: false,
        };
        let index = shared.requests.fetch_add(1, Ordering::SeqCst);
        let fault = {
            let mut armed = shared.armed();
            match armed.at {
                Some((at, f)) if at == index => {
                    armed.fired = true;
                    Some(f)
                }
                _ => None,
            }
        };
        {
            let mut log = shared.log.lock().unwrap_or_else(|p| p.into_inner());
            let mut words = request.start.split(' ');
            let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            let tag = fault.map(|f| format!(" [{f:?}]")).unwrap_or_default();
            log.push(format!("{index} {method} {path}{tag}"));
        }
        match fault {
            Some(HttpFault::Reset) => return,
            Some(HttpFault::Delay) => return hold(&out, shared),
            Some(HttpFault::ServerError) => {
                let body = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>InternalError</Code><Message>injected by the fault proxy</Message></Error>";
                let head = format!(
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                if out.write_all(head.as_bytes()).is_err() || out.write_all(body).is_err() {
                    return;
                }
                continue;
            }
            _ => {}
        }
        let strip = shared.strip_if_none_match.load(Ordering::SeqCst);
        let Ok(answer) = forward(shared.upstream, &request, strip) else {
            return;
        };
        let is_head = request.start.starts_with("HEAD ");
        let mut head = Message {
            start: answer.start.clone(),
            headers: framed(&answer.headers, (!is_head).then_some(answer.body.len())),
            body: Vec::new(),
            until_close: false,
        }
        .head_bytes();
        let mut body = answer.body;
        match fault {
            Some(HttpFault::LostAnswer) => return,
            Some(HttpFault::Truncate) => {
                let sent = if body.is_empty() {
                    out.write_all(&head[..head.len() / 2])
                } else {
                    out.write_all(&head)
                        .and_then(|()| out.write_all(&body[..body.len() / 2]))
                };
                let _ = sent.and_then(|()| out.flush());
                let _ = out.shutdown(Shutdown::Both);
                return;
            }
            Some(HttpFault::Corrupt) => {
                if body.is_empty() {
                    let at = head.len() / 2;
                    head[at] ^= 0x01;
                } else {
                    let at = body.len() / 2;
                    body[at] ^= 0x01;
                }
            }
            _ => {}
        }
        if out.write_all(&head).is_err() || out.write_all(&body).is_err() || out.flush().is_err() {
            return;
        }
        if answer.until_close {
            let _ = out.shutdown(Shutdown::Both);
            return;
        }
    }
}

/// Holds a request unanswered until its client closes the connection.
fn hold(client: &TcpStream, shared: &Shared) {
    let until = Instant::now() + HOLD_MAX;
    let _ = client.set_read_timeout(Some(Duration::from_millis(50)));
    let mut byte = [0u8; 1];
    while Instant::now() < until && !shared.stop.load(Ordering::SeqCst) {
        match client.peek(&mut byte) {
            // Closed by the client: it gave up.
            Ok(0) => return,
            // The client sent more on a connection it still waits on.
            Ok(_) => std::thread::sleep(Duration::from_millis(50)),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// Sends `request` to the server on a new connection and reads its answer.
fn forward(upstream: SocketAddr, request: &Message, strip: bool) -> std::io::Result<Message> {
    let mut conn = TcpStream::connect_timeout(&upstream, UPSTREAM_TIMEOUT)?;
    conn.set_read_timeout(Some(UPSTREAM_TIMEOUT))?;
    let mut headers = framed(&request.headers, Some(request.body.len()));
    if strip {
        headers.retain(|(k, _)| !k.eq_ignore_ascii_case("if-none-match"));
    }
    headers.push(("Connection".into(), "close".into()));
    let head = Message {
        start: request.start.clone(),
        headers,
        body: Vec::new(),
        until_close: false,
    }
    .head_bytes();
    conn.write_all(&head)?;
    conn.write_all(&request.body)?;
    conn.flush()?;
    let mut reader = BufReader::new(conn);
    let (start, headers) = read_head(&mut reader)?.ok_or_else(|| bad("no answer"))?;
    let status: u16 = start
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let no_body = request.start.starts_with("HEAD ")
        || (100..200).contains(&status)
        || status == 204
        || status == 304;
    let (body, until_close) = read_body(&mut reader, &headers, no_body, true)?;
    Ok(Message {
        start,
        headers,
        body,
        until_close,
    })
}

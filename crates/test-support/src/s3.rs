//! The S3-compatible test server that `scripts/test` starts on loopback
//! (moto, found through `CACHEX_S3_ENDPOINT`): whether it runs, the
//! `object_store` options that point at it, and a fresh bucket per test.
//! The S3 side of [`servers`](crate::servers), by endpoint.

use crate::servers::{Backend, Server};

fn server(endpoint: &str) -> Server {
    Server {
        backend: Backend::S3,
        endpoint: endpoint.to_string(),
    }
}

/// The endpoint of the S3 test server, or `None` (said on stderr, so the
/// skip is visible) when none runs outside CI. Under `CI=true` a missing
/// server fails the test.
pub fn endpoint() -> Option<String> {
    Server::find(Backend::S3).map(|s| s.endpoint)
}

/// The `object_store` options that point at the test server, which takes
/// any credentials (real ones come from the environment, never from here).
pub fn options(endpoint: &str) -> Vec<(&'static str, String)> {
    server(endpoint).options()
}

/// Creates a bucket no other test (in this or another process) uses and
/// returns its name, `cachex-<tag>-<pid>-<n>-<nanos>`. The test server
/// accepts unsigned requests, so a bare `PUT /<bucket>` does.
pub fn new_bucket(endpoint: &str, tag: &str) -> String {
    let url = server(endpoint).new_url(tag, "");
    url.trim_start_matches("s3://")
        .trim_end_matches('/')
        .to_string()
}

/// What a test hands a child process of itself (spawned to share a bucket
/// and a directory with it) in one environment variable: the endpoint, the
/// bucket URL, the directory and any further fields, a line each. The
/// child reads them back with [`child_fields`].
pub fn child_env(endpoint: &str, url: &str, dir: &std::path::Path, rest: &[&str]) -> String {
    let dir = dir.display().to_string();
    [endpoint, url, dir.as_str()]
        .into_iter()
        .chain(rest.iter().copied())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The fields a parent passed in `var` with [`child_env`] (endpoint, URL,
/// directory, then the rest), or `None` when this process is not such a
/// child: the child half of a test then does nothing.
pub fn child_fields(var: &str) -> Option<Vec<String>> {
    let value = std::env::var(var).ok()?;
    let fields: Vec<String> = value.split('\n').map(str::to_string).collect();
    assert!(
        fields.len() >= 3,
        "{var} holds {} fields, not 3 or more",
        fields.len()
    );
    Some(fields)
}

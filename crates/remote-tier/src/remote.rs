//! Requests to the object store: one place for timeouts, retries and the
//! mapping of the store's errors into this crate's.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

use crate::constants::WAIT_SLACK;
use crate::{Error, Result};

/// How requests are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per request that is safe to repeat (at least 1).
    pub attempts: u32,
    /// Wait before the second attempt; doubled before each later one.
    pub backoff: Duration,
    /// Time allowed to one attempt, body included.
    pub request_timeout: Duration,
}

impl RetryPolicy {
    /// The longest a caller waits for one request, retries included: every
    /// attempt's timeout, every backoff, and a few seconds of slack. No
    /// call of a tier blocks longer (a multipart upload allows each wave
    /// of parts its timeout); past it the call is `Error::NoAnswer`.
    pub fn call_timeout(&self) -> Duration {
        let attempts = self.attempts.max(1);
        let mut total = self.request_timeout.saturating_mul(attempts);
        for n in 1..attempts {
            total = total.saturating_add(self.backoff.saturating_mul(1 << (n - 1).min(10)));
        }
        total.saturating_add(WAIT_SLACK)
    }
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            attempts: 4,
            backoff: Duration::from_millis(100),
            request_timeout: Duration::from_secs(120),
        }
    }
}

/// Everything a request needs, cheap to clone into a task.
#[derive(Debug, Clone)]
pub(crate) struct Remote {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) prefix: ObjectPath,
    /// The URL as shown in errors (no credentials).
    pub(crate) url: Arc<str>,
    pub(crate) retry: RetryPolicy,
}

/// Collects `body`, at most `cap` bytes: `Err(n)` as soon as more arrived
/// (`n` the bytes seen so far), without reading the rest.
pub(crate) async fn collect_capped(
    mut body: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    cap: u64,
) -> object_store::Result<std::result::Result<Bytes, u64>> {
    use futures::StreamExt;
    let mut out = bytes::BytesMut::with_capacity(cap.min(1 << 20) as usize);
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        let seen = out.len() as u64 + chunk.len() as u64;
        if seen > cap {
            return Ok(Err(seen));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Ok(out.freeze()))
}

/// Whether a store error may go away when the request is repeated.
pub(crate) fn is_transient(e: &object_store::Error) -> bool {
    !matches!(
        e,
        object_store::Error::NotFound { .. }
            | object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. }
            | object_store::Error::NotModified { .. }
            | object_store::Error::NotImplemented { .. }
            | object_store::Error::InvalidPath { .. }
            | object_store::Error::NotSupported { .. }
            | object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. }
            | object_store::Error::UnknownConfigurationKey { .. }
    )
}

/// The outcome of one attempt that did not succeed.
pub(crate) enum Failure {
    Store(object_store::Error),
    Timeout,
}

impl Remote {
    /// The store path of `name` under the URL's prefix.
    pub(crate) fn path(&self, name: &str) -> Result<ObjectPath> {
        let rel = ObjectPath::parse(name).map_err(|e| Error::BadName {
            url: self.url.to_string(),
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        if rel.as_ref().is_empty() {
            return Err(Error::BadName {
                url: self.url.to_string(),
                name: name.to_string(),
                reason: "empty".into(),
            });
        }
        Ok(self.prefix.parts().chain(rel.parts()).collect())
    }

    /// The name of `path` relative to the prefix.
    pub(crate) fn name_of(&self, path: &ObjectPath) -> String {
        match path.prefix_match(&self.prefix) {
            Some(parts) => parts
                .map(|p| p.as_ref().to_string())
                .collect::<Vec<_>>()
                .join("/"),
            None => path.to_string(),
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or (when
    /// `repeatable`) the attempts run out. Returns the value and the
    /// number of attempts it took, or the last failure and the attempts.
    pub(crate) async fn retrying<T, F, Fut>(
        &self,
        repeatable: bool,
        mut attempt: F,
    ) -> std::result::Result<(T, u32), (Failure, u32)>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        let most = if repeatable {
            self.retry.attempts.max(1)
        } else {
            1
        };
        let mut n = 0;
        loop {
            n += 1;
            let failure = match tokio::time::timeout(self.retry.request_timeout, attempt()).await {
                Ok(Ok(v)) => return Ok((v, n)),
                Ok(Err(e)) if !is_transient(&e) => return Err((Failure::Store(e), n)),
                Ok(Err(e)) => Failure::Store(e),
                Err(_) => Failure::Timeout,
            };
            if n >= most {
                return Err((failure, n));
            }
            let wait = self.retry.backoff.saturating_mul(1 << (n - 1).min(10));
            tokio::time::sleep(wait).await;
        }
    }

    /// This crate's error for a failed request.
    pub(crate) fn error(
        &self,
        name: &str,
        op: &'static str,
        failure: Failure,
        attempts: u32,
    ) -> Error {
        let url = self.url.to_string();
        let name = name.to_string();
        match failure {
            Failure::Timeout => Error::TimedOut {
                url,
                name,
                op,
                attempts,
                timeout: self.retry.request_timeout,
            },
            Failure::Store(object_store::Error::NotFound { .. }) => Error::NotFound { url, name },
            Failure::Store(object_store::Error::AlreadyExists { .. }) => {
                Error::CommitTaken { url, name }
            }
            Failure::Store(object_store::Error::Precondition { .. }) => Error::Corrupt {
                url,
                name,
                problem: "the object changed since its first block was fetched".into(),
            },
            Failure::Store(
                source @ (object_store::Error::NotImplemented { .. }
                | object_store::Error::NotSupported { .. }),
            ) => Error::Unsupported {
                url,
                name,
                op,
                source: Box::new(source),
            },
            Failure::Store(source) => Error::Remote {
                url,
                name,
                op,
                attempts,
                source: Box::new(source),
            },
        }
    }
}

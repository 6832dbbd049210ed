//! What every tier of a process shares: one runtime for the requests and
//! one HTTP client per client configuration.
//!
//! Building an HTTP client loads the system's TLS roots (every time, and
//! not cheaply), and a client's connections run as tasks on the runtime that
//! opened them. So a second tier on the same store in one process (the
//! next epoch, another cache of the same bucket) takes the client and
//! runtime the first one built and reuses its open connections, and a
//! tier that goes away never takes down a connection another tier uses.
//!
//! A forked child cannot use its parent's: the runtime's threads are not
//! there, and the sockets are the parent's. Both are therefore kept per
//! process ([`PerProcess`]): a child builds its own, and leaves the
//! parent's alone (leaked, never dropped: dropping a connection could
//! write to a socket the parent still reads) — never even locking it, as
//! another thread of the parent may have held that lock at the fork.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use durable_fs::PerProcess;
use object_store::ClientOptions;
use object_store::client::{HttpClient, HttpConnector, ReqwestConnector};

use crate::constants::MAX_CLIENTS;
use crate::{Error, Result};

#[derive(Default)]
struct Shared {
    runtime: Option<Arc<tokio::runtime::Runtime>>,
    clients: HashMap<String, HttpClient>,
}

static SHARED: PerProcess<Mutex<Shared>> = PerProcess::new();

/// The process's shared state, after a fork the child's own (the lock is
/// held only for lookups and inserts, never while building).
fn shared() -> MutexGuard<'static, Shared> {
    SHARED.get().lock().unwrap_or_else(|p| p.into_inner())
}

/// The runtime every tier of this process runs its requests on (two
/// worker threads, started on first use, kept for the process's life).
pub(crate) fn runtime() -> Result<Arc<tokio::runtime::Runtime>> {
    if let Some(rt) = shared().runtime.clone() {
        return Ok(rt);
    }
    let built = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("remote-tier")
            .enable_all()
            .build()
            .map_err(|e| Error::Runtime(e.to_string()))?,
    );
    let mut s = shared();
    match &s.runtime {
        // Another thread built one meanwhile: use that, drop ours (it ran nothing).
        Some(rt) => {
            let rt = Arc::clone(rt);
            drop(s);
            if let Ok(ours) = Arc::try_unwrap(built) {
                ours.shutdown_background();
            }
            Ok(rt)
        }
        None => {
            s.runtime = Some(Arc::clone(&built));
            Ok(built)
        }
    }
}

/// The [`HttpConnector`] of the stores [`build_store`](crate::build_store)
/// builds: one client per configuration per process.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SharedConnector;

impl HttpConnector for SharedConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        // The configuration's full text is the key. Root certificates do
        // not show in it, so a configuration with any (never set through
        // string options, the only ones `build_store` passes) is not shared.
        let key = format!("{options:?}");
        let shareable = key.contains("root_certificates: []");
        if shareable && let Some(c) = shared().clients.get(&key) {
            return Ok(c.clone());
        }
        let client = ReqwestConnector::default().connect(options)?;
        if shareable {
            let mut s = shared();
            if s.clients.len() < MAX_CLIENTS {
                return Ok(s.clients.entry(key).or_insert(client).clone());
            }
        }
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_per_configuration_and_one_runtime() {
        let a = ClientOptions::new().with_allow_http(true);
        let b = ClientOptions::new().with_timeout(std::time::Duration::from_secs(7));
        let ka = format!("{a:?}");
        assert!(ka.contains("root_certificates: []"), "{ka}");
        SharedConnector.connect(&a).unwrap();
        SharedConnector.connect(&a).unwrap();
        SharedConnector.connect(&b).unwrap();
        let guard = shared();
        let clients = &guard.clients;
        assert!(clients.contains_key(&ka));
        assert!(clients.contains_key(&format!("{b:?}")));
        drop(guard);
        assert!(Arc::ptr_eq(&runtime().unwrap(), &runtime().unwrap()));
    }
}

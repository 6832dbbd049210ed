//! Points inside a publish or a gc where a test acts (changes a file,
//! runs gc, publishes), deterministically, instead of racing them.

use std::sync::{Arc, Mutex};

use remote_tier::RemoteTier;

/// Where a publish, push, staged upload or gc stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Every piece is hashed; nothing is uploaded yet.
    Hashed,
    /// Every piece is uploaded (or reused); the check that each is in the
    /// store and the commit follow.
    Uploaded,
    /// A lease is written, and a gc sweep that names some of its objects
    /// (and may have read the leases before this one) has not ended: the
    /// publish waits for it before it looks for any object.
    AwaitingSweep,
    /// gc found an object that nothing it read needs, asked for it again
    /// (HEAD) and found it older than the grace period: its delete
    /// follows.
    Deleting,
}

type Hook = Arc<dyn Fn(Stage) + Send + Sync>;

static HOOKS: Mutex<Vec<(String, Hook)>> = Mutex::new(Vec::new());

/// Calls `hook` at each [`Stage`] of every publish, push, staged upload
/// and gc of `url` (as [`RemoteTier::url`] shows it) in this process,
/// from the thread that reached it. For tests.
pub fn on_stage(url: &str, hook: impl Fn(Stage) + Send + Sync + 'static) {
    let mut hooks = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    hooks.push((url.to_string(), Arc::new(hook)));
}

/// Runs the hooks of `tier`'s URL for `stage`.
pub(crate) fn reached(tier: &RemoteTier, stage: Stage) {
    let hooks: Vec<Hook> = {
        let hooks = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
        hooks
            .iter()
            .filter(|(url, _)| url == tier.url())
            .map(|(_, h)| Arc::clone(h))
            .collect()
    };
    for hook in hooks {
        hook(stage);
    }
}

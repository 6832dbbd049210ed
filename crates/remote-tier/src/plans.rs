//! Plan records: the upcoming uses of an object's blocks, as the readers
//! of a node registered them, so eviction can keep what is needed soonest.
//!
//! (Interface stub: the records themselves land with issue 36 part B.
//! Until then no block is planned and eviction stays an LRU.)

use std::collections::HashMap;
use std::path::Path;

/// A position no use has (`first`, `last` or `next_first` unset).
pub const NONE: u32 = u32::MAX;

/// One block's uses in one reader's plan, in the reader's batch clock:
/// positions `0..epoch_len` are this epoch, `epoch_len..2·epoch_len` the
/// next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockUse {
    /// The block's index in its object (offset / block size).
    pub block: u32,
    /// Its first use this epoch, or [`NONE`].
    pub first: u32,
    /// Its last use this epoch, or [`NONE`].
    pub last: u32,
    /// Its first use in the next epoch (a position ≥ `epoch_len`), or
    /// [`NONE`].
    pub next_first: u32,
}

/// The node's next use of every planned block: the nearest over the live
/// plan records, each at its own progress.
#[derive(Debug, Default)]
pub(crate) struct NextUses {
    /// Object key → (block → distance in batches; 0 = in use now).
    by_key: HashMap<String, HashMap<u32, u64>>,
}

impl NextUses {
    /// How many batches until `block` of the object `key` is read next,
    /// `None` when no live plan reads it again.
    pub(crate) fn distance(&self, key: &str, block: u64) -> Option<u64> {
        let block = u32::try_from(block).ok()?;
        self.by_key.get(key)?.get(&block).copied()
    }

    /// The keys of the objects some live plan reads.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        self.by_key.keys().map(String::as_str)
    }

    /// Whether no live plan is registered.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

/// The next uses the live plan records under `<tier_root>/plans/` give;
/// a record that is unreadable, torn or of a dead registrant counts as
/// absent (eviction then falls back to LRU for its blocks).
pub(crate) fn next_uses(_tier_root: &Path) -> NextUses {
    NextUses::default()
}

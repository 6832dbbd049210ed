//! [`StoreKind`]: the one name of each cachex store, in configs, messages,
//! `--json` output and the remote crates alike.

use serde::{Deserialize, Serialize};

/// The stores of cachex, by the kebab-case name configs and messages
/// use (`kind = "segment-store"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreKind {
    /// `segment-store`: keyed tensor records on Arrow IPC segments (and
    /// the torchcachex drop-in).
    SegmentStore,
    /// `memmap-array`: fixed-shape rows in `.bin` arrays, read by blocks
    /// from a remote cache.
    MemmapArray,
    /// `shard-store`: the items of a deterministic iterator, by index (and
    /// the loadit drop-in).
    ShardStore,
    /// `page-alloc`: samples by index in one page file, read by blocks
    /// from a remote cache.
    PageAlloc,
}

#[allow(non_upper_case_globals)]
impl StoreKind {
    /// Every kind, in the order above.
    pub const ALL: [StoreKind; 4] = [
        StoreKind::SegmentStore,
        StoreKind::MemmapArray,
        StoreKind::ShardStore,
        StoreKind::PageAlloc,
    ];

    /// The former name of [`StoreKind::SegmentStore`].
    #[deprecated(note = "use StoreKind::SegmentStore")]
    pub const Segments: StoreKind = StoreKind::SegmentStore;
    /// The former name of [`StoreKind::ShardStore`].
    #[deprecated(note = "use StoreKind::ShardStore")]
    pub const Shards: StoreKind = StoreKind::ShardStore;
    /// The former name of [`StoreKind::MemmapArray`].
    #[deprecated(note = "use StoreKind::MemmapArray")]
    pub const Arrays: StoreKind = StoreKind::MemmapArray;
    /// The former name of [`StoreKind::PageAlloc`].
    #[deprecated(note = "use StoreKind::PageAlloc")]
    pub const Pages: StoreKind = StoreKind::PageAlloc;
    /// The former "any store": a kind not known before the cache is
    /// opened is now `None`.
    #[deprecated(note = "use None (an Option<StoreKind>)")]
    pub const Any: Option<StoreKind> = None;

    /// The kebab-case name used in configs, messages and `--json` output.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::SegmentStore => "segment-store",
            StoreKind::MemmapArray => "memmap-array",
            StoreKind::ShardStore => "shard-store",
            StoreKind::PageAlloc => "page-alloc",
        }
    }

    /// The kind named `name` (as [`name`](Self::name) spells it).
    pub fn from_name(name: &str) -> Option<StoreKind> {
        StoreKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_serde_and_from_name() {
        for kind in StoreKind::ALL {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
            assert_eq!(serde_json::from_str::<StoreKind>(&json).unwrap(), kind);
            assert_eq!(StoreKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(StoreKind::from_name("segments"), None);
    }
}

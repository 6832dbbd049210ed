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

impl StoreKind {
    /// Every kind, in the order above.
    pub const ALL: [StoreKind; 4] = [
        StoreKind::SegmentStore,
        StoreKind::MemmapArray,
        StoreKind::ShardStore,
        StoreKind::PageAlloc,
    ];

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

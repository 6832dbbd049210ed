//! What kind of cache a path holds, as [`crate::detect`] names it: the
//! store that reads it and, for another tool's files, which format.

use crate::StoreKind;

/// What [`detect`](crate::detect) found at a path: the store that reads it, and, when
/// its files were written by another tool, which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Detected {
    /// The store that reads it.
    pub kind: StoreKind,
    /// The format of another tool it is in (`None`: the store's own).
    pub peer: Option<PeerFormat>,
}

/// A format of another tool that a cachex store reads as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum PeerFormat {
    /// A torchcachex directory (segments, no index of ours): read by
    /// segment-store.
    Torchcachex,
    /// An FFCV `.beton` file: read by page-alloc.
    Beton,
}

impl PeerFormat {
    /// The format's name in messages and `--json` output.
    pub fn name(self) -> &'static str {
        match self {
            PeerFormat::Torchcachex => "torchcachex",
            PeerFormat::Beton => "beton",
        }
    }

    /// The store that reads it.
    pub fn store(self) -> StoreKind {
        match self {
            PeerFormat::Torchcachex => StoreKind::SegmentStore,
            PeerFormat::Beton => StoreKind::PageAlloc,
        }
    }
}

impl Detected {
    /// A cache in `kind`'s own format.
    pub const fn own(kind: StoreKind) -> Detected {
        Detected { kind, peer: None }
    }

    /// A cache in the format `peer`, read by its store.
    pub fn peer(peer: PeerFormat) -> Detected {
        Detected {
            kind: peer.store(),
            peer: Some(peer),
        }
    }

    /// Its name in messages and `--json` output: the peer format's, else
    /// the store's (`segment-store`, `torchcachex`, `beton`, ...).
    pub fn name(self) -> &'static str {
        self.peer.map_or(self.kind.name(), PeerFormat::name)
    }
}

impl From<StoreKind> for Detected {
    fn from(kind: StoreKind) -> Detected {
        Detected::own(kind)
    }
}

impl serde::Serialize for Detected {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

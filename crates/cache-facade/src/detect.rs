//! Which kind of cache a path holds, from the files each store writes.
//! `open` refuses a directory of another kind with it, and the `cachex`
//! tool picks its adapter with it.

use std::io::Read;
use std::path::Path;

use page_alloc::beton::{self, HEADER_LEN};

use crate::StoreKind;

/// What [`detect`] found at a path: the store that reads it, and, when
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

/// Every problem of the cache or file at `path`, of kind `kind` (as
/// [`detect`] found it), each naming its file: what `cachex verify` and
/// `cachex.verify` report. A path, not an open store, so it also checks
/// what cannot open (a damaged file, a half-built memmap-array cache). A
/// torchcachex directory has no index log of ours, which is not a problem.
pub fn verify(kind: Detected, path: &Path) -> Vec<cache_check::Problem> {
    match (kind.peer, kind.kind) {
        (Some(PeerFormat::Beton), _) => beton::verify(path),
        (Some(PeerFormat::Torchcachex), _) => {
            let index = path.join(segment_store::format::INDEX_FILE);
            let mut problems = segment_store::verify(path);
            problems.retain(|p| !(p.kind == cache_check::ProblemKind::Missing && p.path == index));
            problems
        }
        (None, StoreKind::SegmentStore) => segment_store::verify(path),
        (None, StoreKind::MemmapArray) => memmap_array::verify(path),
        (None, StoreKind::ShardStore) => shard_store::verify(path),
        (None, StoreKind::PageAlloc) => page_alloc::verify(path),
    }
}

/// The kind of cache at `path`, or `None` when it is none we know.
pub fn detect(path: &Path) -> Option<Detected> {
    if path.is_dir() {
        // Ours: the shared index log, or (several writers) their logs.
        if path.join(segment_store::format::INDEX_FILE).is_file()
            || path.join(segment_store::format::WRITERS_DIR).is_dir()
        {
            return Some(Detected::own(StoreKind::SegmentStore));
        }
        if path.join(segment_store::format::SEGMENTS_DIR).is_dir() {
            return Some(Detected::peer(PeerFormat::Torchcachex));
        }
        if path.join(memmap_array::SHAPES_FILE).is_file()
            || path.join(memmap_array::MANIFEST_FILE).is_file()
        {
            return Some(Detected::own(StoreKind::MemmapArray));
        }
        if path.join(shard_store::format::METADATA_FILE).is_file()
            && path.join(shard_store::format::SHARDS_DIR).is_dir()
        {
            return Some(Detected::own(StoreKind::ShardStore));
        }
    }
    if path.is_file() {
        let mut head = Vec::with_capacity(HEADER_LEN);
        let len = std::fs::File::open(path).and_then(|f| {
            let len = f.metadata()?.len();
            f.take(HEADER_LEN as u64).read_to_end(&mut head)?;
            Ok(len)
        });
        let Ok(len) = len else {
            return None;
        };
        if head.get(..8) == Some(&page_alloc::format::MAGIC[..]) {
            return Some(Detected::own(StoreKind::PageAlloc));
        }
        // FFCV has no magic. A file named `.beton` is taken at its word
        // when it starts with version 2 (so a damaged one is verified, not
        // ignored); any other file needs a plausible whole header: version,
        // counts, and pointers within the file.
        let named = path.extension().is_some_and(|e| e == "beton");
        let version_2 = head.get(..2) == Some(&beton::BETON_VERSION.to_le_bytes()[..]);
        if (named && version_2) || beton::is_beton_header(&head, len) {
            return Some(Detected::peer(PeerFormat::Beton));
        }
    }
    None
}

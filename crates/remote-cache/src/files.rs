//! [`StoreFiles`]: how each store's files travel between a working
//! directory and the commit log, as the store crates declare it.

/// Which of a store's files stay on the machine, which are read by blocks
/// from the local tier instead of copied whole, and whose removal is a
/// local eviction rather than a deletion to publish. Each store crate
/// names its own files; [`StoreFiles::for_kind`] gathers them.
#[derive(Debug, Clone, Copy)]
pub struct StoreFiles {
    /// Files never published nor removed (`path` relative to the cache
    /// directory, `/`-separated): locks, scratch space. The state
    /// directory, lock files and temporary files never travel anyway.
    pub private: fn(&str) -> bool,
    /// Files (`path`, size) a store maps and reads in parts: left sparse
    /// in the local tier and fetched by block ranges.
    pub by_blocks: fn(&str, u64) -> bool,
    /// Files a store may remove from one machine on its own (a disk
    /// budget's eviction): their removal is never published.
    pub evicted_locally: fn(&str) -> bool,
}

/// The stores a working directory may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// segment-store (and the torchcachex drop-in).
    Segments,
    /// shard-store (and the loadit drop-in).
    Shards,
    /// memmap-array: `.bin` arrays read by blocks.
    Arrays,
    /// page-alloc: `.pages` files read by blocks.
    Pages,
    /// A cache of a kind not known before it is opened (the facade, the
    /// `cachex` tool): every store's private files stay, every file is
    /// copied whole.
    Any,
}

fn never(_: &str) -> bool {
    false
}

fn never_by_blocks(_: &str, _: u64) -> bool {
    false
}

fn arrays_by_blocks(path: &str, _: u64) -> bool {
    memmap_array::is_array_file(path)
}

fn pages_by_blocks(path: &str, _: u64) -> bool {
    page_alloc::format::is_page_file(path)
}

impl StoreFiles {
    /// Nothing private, nothing by blocks, nothing evicted.
    pub const PLAIN: StoreFiles = StoreFiles {
        private: never,
        by_blocks: never_by_blocks,
        evicted_locally: never,
    };

    /// How the files of a store of `kind` travel.
    pub fn for_kind(kind: StoreKind) -> StoreFiles {
        match kind {
            StoreKind::Segments => StoreFiles::PLAIN,
            StoreKind::Shards | StoreKind::Any => StoreFiles {
                private: shard_store::format::is_private,
                by_blocks: never_by_blocks,
                evicted_locally: shard_store::format::is_shard,
            },
            StoreKind::Arrays => StoreFiles {
                by_blocks: arrays_by_blocks,
                ..StoreFiles::PLAIN
            },
            StoreKind::Pages => StoreFiles {
                by_blocks: pages_by_blocks,
                ..StoreFiles::PLAIN
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_store_names_its_files() {
        let shards = StoreFiles::for_kind(StoreKind::Shards);
        assert!((shards.private)("locks/a.lock") && (shards.private)("scratch"));
        assert!(!(shards.private)("lockstep.json") && !(shards.private)("shards/0.1.shard.pickle"));
        assert!((shards.evicted_locally)("shards/0.1.shard.pickle"));
        assert!(!(shards.evicted_locally)("metadata.json"));
        let arrays = StoreFiles::for_kind(StoreKind::Arrays);
        assert!((arrays.by_blocks)("x.bin", 1) && !(arrays.by_blocks)("sub/x.bin", 1));
        assert!((StoreFiles::for_kind(StoreKind::Pages).by_blocks)(
            "data.pages",
            1
        ));
        assert!(!(StoreFiles::PLAIN.by_blocks)("data.pages", 1));
    }
}

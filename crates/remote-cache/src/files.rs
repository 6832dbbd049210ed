//! [`StoreFiles`]: how each store's files travel between a working
//! directory and the commit log, as the store crates declare it.

use crate::StoreKind;

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
    /// Files (`path`, size) read by blocks of their own size (`None`: the
    /// tier's): their publisher records a block list in that size, and a
    /// reader links them whatever their size, fetching a block at a time.
    pub block_size: fn(&str, u64) -> Option<u64>,
    /// Files read by blocks whose reader holds a lease on the bytes it
    /// reads while it reads them (`RemotePages`, `RemoteSegments`): linked with
    /// `remote_tier::RemoteTier::open_leased`, so the tier may free their
    /// other blocks while they are open and a file larger than the budget
    /// stays within it. Any other linked file is kept whole while open.
    pub evict_blocks: fn(&str) -> bool,
}

/// The block size of segment files: a row read through byte ranges
/// touches about ten places of its segment (footer, batch metadata, an
/// offset pair and the values of each column), so a key costs about ten
/// blocks. At 4 KiB that is some 40 KiB a key, where the tier's 8 MiB
/// would fetch most of a segment; the price is one 64-character hash per
/// 4 KiB in the commit record (1.6% of the segment bytes).
pub const SEGMENT_BLOCK_SIZE: u64 = remote_tier::MIN_BLOCK_SIZE;

fn never(_: &str) -> bool {
    false
}

fn never_by_blocks(_: &str, _: u64) -> bool {
    false
}

fn memmap_by_blocks(path: &str, _: u64) -> bool {
    memmap_array::is_array_file(path)
}

fn pages_by_blocks(path: &str, _: u64) -> bool {
    page_alloc::format::is_page_file(path)
}

fn pages_evict_blocks(path: &str) -> bool {
    page_alloc::format::is_page_file(path)
}

fn tier_block_size(_: &str, _: u64) -> Option<u64> {
    None
}

fn segments_by_blocks(path: &str, _: u64) -> bool {
    segment_store::format::is_segment_file(path)
}

fn segments_evict_blocks(path: &str) -> bool {
    segment_store::format::is_segment_file(path)
}

fn segment_block_size(path: &str, _: u64) -> Option<u64> {
    segment_store::format::is_segment_file(path).then_some(SEGMENT_BLOCK_SIZE)
}

impl StoreFiles {
    /// Nothing private, nothing by blocks, nothing evicted.
    pub const PLAIN: StoreFiles = StoreFiles {
        private: never,
        by_blocks: never_by_blocks,
        evicted_locally: never,
        block_size: tier_block_size,
        evict_blocks: never,
    };

    /// The block size of the hashes a publisher records for the whole file
    /// `rel` of `size` bytes (`None`: no list). Which files a reader links
    /// is its own choice (its store, its tier's whole-file size), so every
    /// file one may link gets a hash per block: those the store reads by
    /// blocks, and any the tier would not fetch whole. In the store's own
    /// block size while `hashes_left` (of the commit's budget for them)
    /// allows, which this takes from, else the tier's: a store's small
    /// blocks cost a hash each in the record, and a record past its limit
    /// is one no reader accepts.
    pub(crate) fn block_list_size(
        &self,
        rel: &str,
        size: u64,
        tier: &remote_tier::TierConfig,
        hashes_left: &mut u64,
    ) -> Option<u64> {
        if size == 0 || !((self.by_blocks)(rel, size) || size > tier.whole_file_max) {
            return None;
        }
        let wanted = (self.block_size)(rel, size).filter(|b| size.div_ceil(*b) <= *hashes_left);
        *hashes_left -= wanted.map_or(0, |b| size.div_ceil(b));
        remote_tier::BlockHashes::block_size_for(size, wanted.unwrap_or(tier.block_size))
    }

    /// How the files of a store of `kind` travel; `None` for a cache of a
    /// kind not known before it is opened (the facade, the `cachex` tool):
    /// every store's private files stay, every file is copied whole.
    pub fn for_kind(kind: impl Into<Option<StoreKind>>) -> StoreFiles {
        match kind.into() {
            // Segments are read row by row where they are not whole
            // locally (`RemoteSegments::get_batch`): in small blocks,
            // under leases (a store larger than the budget stays within
            // it; one mapped is made whole for the mapping's life).
            Some(StoreKind::SegmentStore) => StoreFiles {
                by_blocks: segments_by_blocks,
                block_size: segment_block_size,
                evict_blocks: segments_evict_blocks,
                ..StoreFiles::PLAIN
            },
            Some(StoreKind::ShardStore) | None => StoreFiles {
                private: shard_store::format::is_private,
                by_blocks: never_by_blocks,
                evicted_locally: shard_store::format::is_shard,
                block_size: tier_block_size,
                evict_blocks: never,
            },
            Some(StoreKind::MemmapArray) => StoreFiles {
                by_blocks: memmap_by_blocks,
                ..StoreFiles::PLAIN
            },
            Some(StoreKind::PageAlloc) => StoreFiles {
                by_blocks: pages_by_blocks,
                evict_blocks: pages_evict_blocks,
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
        let shards = StoreFiles::for_kind(StoreKind::ShardStore);
        assert!((shards.private)("locks/a.lock") && (shards.private)("scratch"));
        assert!(!(shards.private)("lockstep.json") && !(shards.private)("shards/0.1.shard.pickle"));
        assert!((shards.evicted_locally)("shards/0.1.shard.pickle"));
        assert!(!(shards.evicted_locally)("metadata.json"));
        let arrays = StoreFiles::for_kind(StoreKind::MemmapArray);
        assert!((arrays.by_blocks)("x.bin", 1) && !(arrays.by_blocks)("sub/x.bin", 1));
        assert!((StoreFiles::for_kind(StoreKind::PageAlloc).by_blocks)(
            "data.pages",
            1
        ));
        assert!(!(StoreFiles::PLAIN.by_blocks)("data.pages", 1));
        let pages = StoreFiles::for_kind(StoreKind::PageAlloc);
        assert!((pages.evict_blocks)("data.pages") && !(pages.evict_blocks)("data.json"));
        assert!(!(StoreFiles::PLAIN.evict_blocks)("data.pages"));
        assert!(!(arrays.evict_blocks)("x.bin"));
        let segments = StoreFiles::for_kind(StoreKind::SegmentStore);
        let seg = "segments/segment_000003.arrow";
        assert!((segments.by_blocks)(seg, 1) && !(segments.by_blocks)("segment-index.log", 1));
        assert_eq!((segments.block_size)(seg, 1), Some(SEGMENT_BLOCK_SIZE));
        assert_eq!((segments.block_size)("schema.json", 1), None);
        assert_eq!((StoreFiles::PLAIN.block_size)(seg, 1), None);
        assert!((segments.evict_blocks)(seg) && !(segments.evict_blocks)("schema.json"));
    }
}

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
    /// tier's): their publisher records a block list in that size (at most
    /// its tier's block), and a reader links them whatever their size,
    /// fetching a block at a time.
    pub block_size: fn(&str, u64) -> Option<u64>,
    /// Files read by blocks whose reader holds a lease on the bytes it
    /// reads while it reads them (`PagesAt`, `SegmentsAt`): linked with
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

/// The block size of page files: a page of the default size is four
/// blocks. A read leases its sample's whole run (page), and a plan reads
/// runs, so a block larger than a page fetches pages no read asked for: at
/// the tier's 8 MiB every random read of a small sample fetches 8 MiB,
/// which the next miss evicts under a budget of a few blocks. Blocks of a
/// quarter page fetch a run only up to the block its bytes end in (not the
/// page's unused tail), and the tier's touch clocks (one per 16 blocks)
/// order pages in groups of four. The price is one hash per block in the
/// commit record (0.4% of the file's bytes), and a request per block to
/// warm (prefetch) a page, where reading it is one request.
pub const PAGE_BLOCK_SIZE: u64 = 16 << 10;

/// The block size of memmap `.bin` arrays, as a page file's: a row read
/// fetches the blocks its row lies in (and a read-ahead while rows are read
/// in order), so a random row costs its own bytes and a block or two, not
/// the tier's 8 MiB; one hash per block in the commit record (0.4% of the
/// array's bytes).
pub const ARRAY_BLOCK_SIZE: u64 = PAGE_BLOCK_SIZE;

fn never(_: &str) -> bool {
    false
}

fn never_by_blocks(_: &str, _: u64) -> bool {
    false
}

fn memmap_by_blocks(path: &str, _: u64) -> bool {
    memmap_array::is_array_file(path)
}

fn memmap_block_size(path: &str, _: u64) -> Option<u64> {
    memmap_array::is_array_file(path).then_some(ARRAY_BLOCK_SIZE)
}

fn pages_by_blocks(path: &str, _: u64) -> bool {
    page_alloc::format::is_page_file(path)
}

fn page_block_size(path: &str, _: u64) -> Option<u64> {
    page_alloc::format::is_page_file(path).then_some(PAGE_BLOCK_SIZE)
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

fn any_by_blocks(path: &str, size: u64) -> bool {
    pages_by_blocks(path, size) || memmap_by_blocks(path, size) || segments_by_blocks(path, size)
}

fn any_block_size(path: &str, size: u64) -> Option<u64> {
    page_block_size(path, size)
        .or_else(|| memmap_block_size(path, size))
        .or_else(|| segment_block_size(path, size))
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

    /// Every store's files read by blocks, by name, each in its store's
    /// block size: for a publisher that does not know which store a
    /// directory holds ([`push_dir`](crate::push_dir)), so that a reader
    /// of whichever kind finds its files listed in the blocks it reads.
    pub(crate) const ANY_STORE: StoreFiles = StoreFiles {
        private: never,
        by_blocks: any_by_blocks,
        evicted_locally: never,
        block_size: any_block_size,
        evict_blocks: never,
    };

    /// The block size of the hashes a publisher records for the whole file
    /// `rel` of `size` bytes (`None`: no list). Which files a reader links
    /// is its own choice (its store, its tier's whole-file size), so every
    /// file one may link gets a hash per block: those the store reads by
    /// blocks, and any the tier would not fetch whole.
    ///
    /// In the store's own block size, at most the tier's (a publisher's
    /// tier of smaller blocks asks for smaller ones), doubled while the
    /// file would take more hashes than `hashes_left` (of the commit's
    /// budget for them), which this takes from; the tier's where even that
    /// does not fit: a store's small blocks cost a hash each in the
    /// record, and a record past its limit is one no reader accepts.
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
        let wanted = (self.block_size)(rel, size).and_then(|own| {
            let mut block = own.min(tier.block_size).max(1);
            while block < tier.block_size && size.div_ceil(block) > *hashes_left {
                block = (block * 2).min(tier.block_size);
            }
            (size.div_ceil(block) <= *hashes_left).then_some(block)
        });
        *hashes_left -= wanted.map_or(0, |b| size.div_ceil(b));
        remote_tier::BlockHashes::block_size_for(size, wanted.unwrap_or(tier.block_size))
    }

    /// How the files of a store of `kind` travel; `None` for a cache of a
    /// kind not known before it is opened (the facade, the `cachex` tool):
    /// every store's private files stay, every file is copied whole.
    pub fn for_kind(kind: impl Into<Option<StoreKind>>) -> StoreFiles {
        match kind.into() {
            // Segments are read row by row where they are not whole
            // locally (`SegmentsAt::get_batch`): in small blocks,
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
            // Arrays are read row by row where they are not whole locally
            // (`ArraysAt::row`): in blocks of their own.
            Some(StoreKind::MemmapArray) => StoreFiles {
                by_blocks: memmap_by_blocks,
                block_size: memmap_block_size,
                ..StoreFiles::PLAIN
            },
            // A page file is read a run (page) at a time, by a plan or a
            // random read: in blocks of a page, under leases.
            Some(StoreKind::PageAlloc) => StoreFiles {
                by_blocks: pages_by_blocks,
                block_size: page_block_size,
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
        let any = StoreFiles::ANY_STORE;
        for (rel, size) in [("data.pages", PAGE_BLOCK_SIZE), ("x.bin", ARRAY_BLOCK_SIZE)] {
            assert!((any.by_blocks)(rel, 1) && (any.block_size)(rel, 1) == Some(size));
        }
        assert_eq!((any.block_size)(seg, 1), Some(SEGMENT_BLOCK_SIZE));
        assert!(!(any.by_blocks)("metadata.json", 1) && !(any.private)("locks/a.lock"));
    }

    #[test]
    fn page_and_array_files_are_listed_in_blocks_of_their_own() {
        let tier = remote_tier::TierConfig::new("/nonexistent", 1 << 30);
        let list = |files: StoreFiles, rel: &str, size: u64, left: &mut u64| {
            files.block_list_size(rel, size, &tier, left)
        };
        let pages = StoreFiles::for_kind(StoreKind::PageAlloc);
        let arrays = StoreFiles::for_kind(StoreKind::MemmapArray);
        let mut left = 1 << 18;
        // Whatever their size: a page file of one page is still listed in
        // page blocks, not fetched whole as one block of the tier's size.
        for size in [1, PAGE_BLOCK_SIZE, 5 << 20, 100 << 20] {
            assert_eq!(
                list(pages, "data.pages", size, &mut left),
                Some(PAGE_BLOCK_SIZE)
            );
            assert_eq!(
                list(arrays, "x.bin", size, &mut left),
                Some(ARRAY_BLOCK_SIZE)
            );
        }
        assert_eq!(list(pages, "data.json", 5 << 20, &mut left), None);
        assert_eq!(list(arrays, "sub/x.bin", 5 << 20, &mut left), None);
        // The same files pushed by a tool that knows no store kind.
        let mut left = 1 << 18;
        assert_eq!(
            list(StoreFiles::ANY_STORE, "data.pages", 5 << 20, &mut left),
            Some(PAGE_BLOCK_SIZE)
        );
        assert_eq!(
            list(StoreFiles::PLAIN, "data.pages", 5 << 20, &mut left),
            None
        );
    }

    #[test]
    fn small_blocks_are_doubled_to_fit_the_commits_hashes_then_the_tiers() {
        let mut tier = remote_tier::TierConfig::new("/nonexistent", 1 << 30);
        let pages = StoreFiles::for_kind(StoreKind::PageAlloc);
        let size = 1000 * PAGE_BLOCK_SIZE;
        // Room for all its hashes: its own block, each hash taken.
        let mut left = 1000;
        assert_eq!(
            pages.block_list_size("a.pages", size, &tier, &mut left),
            Some(PAGE_BLOCK_SIZE)
        );
        assert_eq!(left, 0);
        // Room for a third: blocks of four pages, 250 hashes taken.
        let mut left = 400;
        let got = pages.block_list_size("a.pages", size, &tier, &mut left);
        assert_eq!((got, left), (Some(4 * PAGE_BLOCK_SIZE), 150));
        // No room even in the tier's block: the tier's, no hash taken.
        let mut left = 0;
        let got = pages.block_list_size("a.pages", size, &tier, &mut left);
        assert_eq!((got, left), (Some(tier.block_size), 0));
        // A publisher's tier of smaller blocks asks for smaller ones.
        tier.block_size = 8 << 10;
        let mut left = 1 << 20;
        assert_eq!(
            pages.block_list_size("a.pages", size, &tier, &mut left),
            Some(8 << 10)
        );
        let segments = StoreFiles::for_kind(StoreKind::SegmentStore);
        let seg = "segments/segment_000001.arrow";
        assert_eq!(
            segments.block_list_size(seg, size, &tier, &mut left),
            Some(SEGMENT_BLOCK_SIZE)
        );
    }
}

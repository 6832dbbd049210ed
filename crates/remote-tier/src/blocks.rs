//! Per-block BLAKE3 of an object read by blocks: what a publisher records
//! and what the tier checks every fetched block against.
//!
//! An object is cut into fixed-size blocks (the last may be short) and
//! each block hashed on its own, so a reader can check one block as it
//! arrives instead of the whole object once all of it is local. Records
//! carry the list as JSON ([`BlockList`]):
//!
//! ```text
//! {"version":1,"block_size":8388608,"blake3":["<64 hex>", ...]}
//! ```
//!
//! `blake3[i]` is the hash of bytes `i * block_size .. min((i + 1) *
//! block_size, size)`. A list is checked before use ([`BlockList::check`]):
//! its version, a block size within [`MIN_BLOCK_SIZE`]..=[`MAX_BLOCK_SIZE`],
//! one hash per block of the object's size (at most [`MAX_BLOCKS`]), each
//! 32 bytes of hex.

use std::ops::Range;

use serde::{Deserialize, Serialize};

/// The block list format version this build writes and reads.
pub const BLOCK_LIST_VERSION: u32 = 1;
/// The smallest block a list may use (a page).
pub const MIN_BLOCK_SIZE: u64 = 4 << 10;
/// The largest block a list may use: a reader holds one block in memory
/// per fetch in flight (checked before a byte of it is written), so a
/// record must not make it ask for gigabytes. With [`MAX_BLOCKS`] this
/// still covers objects of 16 TiB.
pub const MAX_BLOCK_SIZE: u64 = 64 << 20;
/// The most blocks a list may have (about 17 MB of JSON; 2 TiB in 8 MiB
/// blocks, larger objects get larger blocks).
pub const MAX_BLOCKS: u64 = 1 << 18;

/// A block list as records store it (JSON). Check it with
/// [`BlockList::check`] before trusting anything in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockList {
    /// Format version ([`BLOCK_LIST_VERSION`]).
    pub version: u32,
    /// Bytes per block (the last block may be shorter).
    pub block_size: u64,
    /// The BLAKE3 of each block, hex, in block order.
    pub blake3: Vec<String>,
}

impl BlockList {
    /// The hashes this list records for an object of `size` bytes; the
    /// error says what is wrong (for the caller's own `Corrupt` error,
    /// which names the record and the file).
    pub fn check(&self, size: u64) -> Result<BlockHashes, String> {
        if self.version != BLOCK_LIST_VERSION {
            return Err(format!(
                "block list version {}, this build reads {BLOCK_LIST_VERSION}",
                self.version
            ));
        }
        check_shape(self.block_size, size, self.blake3.len())?;
        let mut hashes = Vec::with_capacity(self.blake3.len());
        for (i, hex) in self.blake3.iter().enumerate() {
            let hash = blake3::Hash::from_hex(hex)
                .map_err(|_| format!("block {i}: `{hex}` is not a BLAKE3 hash (64 hex digits)"))?;
            hashes.push(*hash.as_bytes());
        }
        BlockHashes::new(self.block_size, size, hashes)
    }
}

/// The checked BLAKE3 of every block of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockHashes {
    block_size: u64,
    size: u64,
    hashes: Vec<[u8; 32]>,
    digest: [u8; 32],
}

impl BlockHashes {
    /// The hashes of an object of `size` bytes in `block_size` blocks; the
    /// error says what does not fit (block size out of bounds, a count that
    /// does not match the size).
    pub fn new(block_size: u64, size: u64, hashes: Vec<[u8; 32]>) -> Result<BlockHashes, String> {
        check_shape(block_size, size, hashes.len())?;
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"cachex block list");
        hasher.update(&block_size.to_le_bytes());
        hasher.update(&size.to_le_bytes());
        for h in &hashes {
            hasher.update(h);
        }
        Ok(BlockHashes {
            block_size,
            size,
            hashes,
            digest: *hasher.finalize().as_bytes(),
        })
    }

    /// The block size a publisher uses for an object of `size` bytes when
    /// it would like `wanted`: `wanted` kept within the bounds, doubled
    /// while the object would have more than [`MAX_BLOCKS`] blocks. `None`
    /// for an object too large for any list.
    pub fn block_size_for(size: u64, wanted: u64) -> Option<u64> {
        let mut block_size = wanted.clamp(MIN_BLOCK_SIZE, MAX_BLOCK_SIZE);
        while size.div_ceil(block_size) > MAX_BLOCKS {
            if block_size >= MAX_BLOCK_SIZE {
                return None;
            }
            block_size = (block_size * 2).min(MAX_BLOCK_SIZE);
        }
        Some(block_size)
    }

    /// Bytes per block (the last block may be shorter).
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// The object's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// How many blocks (and hashes) there are.
    pub fn blocks(&self) -> u64 {
        self.hashes.len() as u64
    }

    /// The recorded hash of block `i`.
    pub fn hash(&self, i: u64) -> Option<&[u8; 32]> {
        self.hashes.get(usize::try_from(i).ok()?)
    }

    /// The byte range of block `i`.
    pub fn range(&self, i: u64) -> Range<u64> {
        let start = i.saturating_mul(self.block_size).min(self.size);
        start..start.saturating_add(self.block_size).min(self.size)
    }

    /// Whether `bytes` are block `i` as recorded; the hash they have.
    pub fn check_block(&self, i: u64, bytes: &[u8]) -> (bool, [u8; 32]) {
        let got = *blake3::hash(bytes).as_bytes();
        (self.hash(i) == Some(&got), got)
    }

    /// One BLAKE3 over the whole list (block size, size, every hash): what
    /// a local block map records to say its blocks were checked against
    /// this very list.
    pub fn digest(&self) -> [u8; 32] {
        self.digest
    }

    /// The list as records store it.
    pub fn to_list(&self) -> BlockList {
        BlockList {
            version: BLOCK_LIST_VERSION,
            block_size: self.block_size,
            blake3: self
                .hashes
                .iter()
                .map(|h| blake3::Hash::from_bytes(*h).to_hex().to_string())
                .collect(),
        }
    }
}

/// Whether `count` hashes of `block_size`-byte blocks fit `size` bytes.
fn check_shape(block_size: u64, size: u64, count: usize) -> Result<(), String> {
    if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) {
        return Err(format!(
            "block size {block_size} outside {MIN_BLOCK_SIZE}..={MAX_BLOCK_SIZE}"
        ));
    }
    let blocks = size.div_ceil(block_size);
    if blocks > MAX_BLOCKS {
        return Err(format!(
            "{blocks} blocks of {block_size} bytes, limit {MAX_BLOCKS}"
        ));
    }
    if count as u64 != blocks {
        return Err(format!(
            "{count} block hashes for {size} bytes in {block_size}-byte blocks, which are {blocks}"
        ));
    }
    Ok(())
}

/// Hashes a stream of bytes block by block (feed it the bytes in order,
/// in chunks of any size), beside whatever else hashes them.
#[derive(Debug, Clone)]
pub struct BlockHasher {
    block_size: u64,
    current: blake3::Hasher,
    in_block: u64,
    size: u64,
    hashes: Vec<[u8; 32]>,
}

impl BlockHasher {
    /// A hasher of `block_size`-byte blocks (see
    /// [`BlockHashes::block_size_for`]).
    pub fn new(block_size: u64) -> BlockHasher {
        BlockHasher {
            block_size: block_size.max(1),
            current: blake3::Hasher::new(),
            in_block: 0,
            size: 0,
            hashes: Vec::new(),
        }
    }

    /// Adds the next bytes.
    pub fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let room = self.block_size - self.in_block;
            let n = usize::try_from(room).map_or(data.len(), |r| r.min(data.len()));
            self.current.update(&data[..n]);
            self.in_block += n as u64;
            self.size += n as u64;
            data = &data[n..];
            if self.in_block == self.block_size {
                self.hashes.push(*self.current.finalize().as_bytes());
                self.current.reset();
                self.in_block = 0;
            }
        }
    }

    /// The hashes of every block fed; the error says why they make no
    /// list (a block size out of bounds, too many blocks).
    pub fn finalize(mut self) -> Result<BlockHashes, String> {
        if self.in_block > 0 {
            self.hashes.push(*self.current.finalize().as_bytes());
        }
        BlockHashes::new(self.block_size, self.size, self.hashes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_by_block_round_trip_through_the_list() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut hasher = BlockHasher::new(MIN_BLOCK_SIZE);
        for chunk in bytes.chunks(1000) {
            hasher.update(chunk);
        }
        let hashes = hasher.finalize().unwrap();
        assert_eq!(hashes.blocks(), 3);
        assert_eq!(hashes.range(2), 8192..10_000);
        for i in 0..3 {
            let r = hashes.range(i);
            let block = &bytes[r.start as usize..r.end as usize];
            assert_eq!(hashes.hash(i), Some(blake3::hash(block).as_bytes()));
            assert!(hashes.check_block(i, block).0);
        }
        let back = hashes.to_list().check(10_000).unwrap();
        assert_eq!(back, hashes);
        assert_eq!(back.digest(), hashes.digest());
    }

    #[test]
    fn every_malformed_list_is_refused_with_its_problem() {
        let good = BlockHasher::new(MIN_BLOCK_SIZE);
        let mut good = good;
        good.update(&[1u8; 5000]);
        let list = good.finalize().unwrap().to_list();
        let refused = |l: &BlockList, size: u64, what: &str| {
            let err = l.check(size).unwrap_err();
            assert!(err.contains(what), "{err} lacks {what}");
        };
        refused(&list, 9000, "2 block hashes for 9000 bytes");
        refused(&list, 4000, "2 block hashes for 4000 bytes");
        let mut newer = list.clone();
        newer.version = 2;
        refused(&newer, 5000, "version 2, this build reads 1");
        let mut short_hash = list.clone();
        short_hash.blake3[1].truncate(62);
        refused(&short_hash, 5000, "block 1: ");
        let mut not_hex = list.clone();
        not_hex.blake3[0] = "z".repeat(64);
        refused(&not_hex, 5000, "block 0: ");
        for block_size in [0, 512, MAX_BLOCK_SIZE + 1] {
            let mut odd = list.clone();
            odd.block_size = block_size;
            refused(&odd, 5000, "block size");
        }
        let too_many = BlockList {
            version: 1,
            block_size: MIN_BLOCK_SIZE,
            blake3: Vec::new(),
        };
        refused(&too_many, MIN_BLOCK_SIZE * (MAX_BLOCKS + 1), "limit");
    }

    #[test]
    fn large_objects_get_larger_blocks() {
        assert_eq!(BlockHashes::block_size_for(10, 1), Some(MIN_BLOCK_SIZE));
        assert_eq!(BlockHashes::block_size_for(1 << 30, 8 << 20), Some(8 << 20));
        let huge = (8u64 << 20) * MAX_BLOCKS * 3;
        assert_eq!(BlockHashes::block_size_for(huge, 8 << 20), Some(32 << 20));
        assert_eq!(
            BlockHashes::block_size_for(MAX_BLOCK_SIZE * MAX_BLOCKS + 1, 8 << 20),
            None
        );
    }
}

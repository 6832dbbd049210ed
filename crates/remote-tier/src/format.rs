//! The block map: which fixed-size blocks of a block-fetched object are in
//! its local sparse file. Written whole, atomically, after the blocks it
//! marks are fsynced, so a set bit always means durable bytes.
//!
//! ```text
//! offset  size  field
//! 0       8     magic  "CXBLKMAP"
//! 8       4     version (u32 LE): 1, or 2 for an object checked by blocks
//! 12      8     block size (u64 LE, > 0)
//! 20      8     object size (u64 LE)
//! 28      4     etag length E (u32 LE, <= 1024)
//! 32      E     the object's etag when first fetched (UTF-8; may be empty)
//! 32+E    L     version 2 only (L = 32, else 0): the digest of the block list
//!               (`BlockHashes::digest`) every marked block was checked against
//! 32+E+L  B     bitmap, B = ceil(blocks / 8); bit i of byte i/8 = block i present
//! +B      32    BLAKE3 of all the bytes before
//! ```
//!
//! A map without a list digest is written as version 1, byte for byte as
//! before, so builds that know only version 1 keep sharing such tiers.

/// The magic bytes a block map starts with.
pub const MAGIC: &[u8; 8] = b"CXBLKMAP";
/// The block map version of objects without a block list.
pub const VERSION: u32 = 1;
/// The block map version of objects whose blocks are checked against a
/// block list (the newest this build reads).
pub const VERSION_CHECKED: u32 = 2;
/// The longest etag a block map stores.
pub const MAX_ETAG: usize = 1024;
/// A block map is never larger than this (a 1 TiB object in 64 KiB blocks).
pub const MAX_MAP_BYTES: u64 = 4 << 20;

/// The in-memory block map of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMap {
    /// Bytes per block (the last block may be shorter).
    pub block_size: u64,
    /// The object's size in bytes.
    pub size: u64,
    /// The object's etag when its first block was fetched.
    pub etag: String,
    /// The digest of the block list each marked block was checked
    /// against; `None` when blocks are checked by size and etag only.
    pub checked: Option<[u8; 32]>,
    bits: Vec<u8>,
}

impl BlockMap {
    /// An empty map (no block present).
    pub fn new(block_size: u64, size: u64, etag: String, checked: Option<[u8; 32]>) -> BlockMap {
        let blocks = block_count(size, block_size);
        BlockMap {
            block_size,
            size,
            etag,
            checked,
            bits: vec![0; blocks.div_ceil(8) as usize],
        }
    }

    /// How many blocks the object has.
    pub fn blocks(&self) -> u64 {
        block_count(self.size, self.block_size)
    }

    /// Whether block `i` is present.
    pub fn has(&self, i: u64) -> bool {
        self.bits
            .get((i / 8) as usize)
            .is_some_and(|b| b & (1 << (i % 8)) != 0)
    }

    /// Marks block `i` present.
    pub fn set(&mut self, i: u64) {
        if let Some(b) = self.bits.get_mut((i / 8) as usize) {
            *b |= 1 << (i % 8);
        }
    }

    /// Whether `other` describes the same local copy the same way (size,
    /// block size, etag and block list), so that its bits may be merged.
    pub fn same_copy(&self, other: &BlockMap) -> bool {
        self.size == other.size
            && self.block_size == other.block_size
            && self.etag == other.etag
            && self.checked == other.checked
    }

    /// Marks present every block `other` has (same object assumed).
    pub fn merge(&mut self, other: &BlockMap) {
        for (a, b) in self.bits.iter_mut().zip(&other.bits) {
            *a |= b;
        }
    }

    /// How many blocks are present.
    pub fn present(&self) -> u64 {
        (0..self.blocks()).filter(|&i| self.has(i)).count() as u64
    }

    /// The byte range of block `i`.
    pub fn block_range(&self, i: u64) -> std::ops::Range<u64> {
        let start = i.saturating_mul(self.block_size).min(self.size);
        start..start.saturating_add(self.block_size).min(self.size)
    }

    /// The encoded map.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.etag.len() + self.bits.len());
        out.extend_from_slice(MAGIC);
        let version = match self.checked {
            Some(_) => VERSION_CHECKED,
            None => VERSION,
        };
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&self.block_size.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&(self.etag.len() as u32).to_le_bytes());
        out.extend_from_slice(self.etag.as_bytes());
        if let Some(digest) = &self.checked {
            out.extend_from_slice(digest);
        }
        out.extend_from_slice(&self.bits);
        let hash = blake3::hash(&out);
        out.extend_from_slice(hash.as_bytes());
        out
    }

    /// Parses an encoded map; the error says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<BlockMap, String> {
        let body_len = bytes
            .len()
            .checked_sub(32)
            .ok_or_else(|| format!("{} bytes, shorter than a block map", bytes.len()))?;
        let (body, hash) = bytes.split_at(body_len);
        if blake3::hash(body).as_bytes() != hash {
            return Err("checksum mismatch".into());
        }
        if body.len() < 32 || &body[..8] != MAGIC {
            return Err("not a block map (bad magic)".into());
        }
        let u32_at =
            |at: usize| u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&body[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let version = u32_at(8);
        if version != VERSION && version != VERSION_CHECKED {
            return Err(format!(
                "version {version}, this build reads {VERSION} and {VERSION_CHECKED}"
            ));
        }
        let list_len = if version == VERSION_CHECKED { 32 } else { 0 };
        let block_size = u64_at(12);
        let size = u64_at(20);
        let etag_len = u32_at(28) as usize;
        if block_size == 0 {
            return Err("block size 0".into());
        }
        if etag_len > MAX_ETAG {
            return Err(format!("etag of {etag_len} bytes, limit {MAX_ETAG}"));
        }
        let bits_len = usize::try_from(block_count(size, block_size).div_ceil(8))
            .map_err(|_| "bitmap too large".to_string())?;
        let want = 32usize
            .checked_add(etag_len)
            .and_then(|n| n.checked_add(list_len))
            .and_then(|n| n.checked_add(bits_len))
            .ok_or("length overflow")?;
        if body.len() != want {
            return Err(format!(
                "{} bytes where an object of {size} bytes in {block_size}-byte blocks needs {want}",
                body.len()
            ));
        }
        let etag = std::str::from_utf8(&body[32..32 + etag_len])
            .map_err(|_| "etag is not UTF-8".to_string())?
            .to_string();
        let bits_at = 32 + etag_len + list_len;
        let checked = (list_len > 0).then(|| {
            let mut digest = [0u8; 32];
            digest.copy_from_slice(&body[32 + etag_len..bits_at]);
            digest
        });
        Ok(BlockMap {
            block_size,
            size,
            etag,
            checked,
            bits: body[bits_at..].to_vec(),
        })
    }
}

/// How many `block_size` blocks cover `size` bytes.
pub fn block_count(size: u64, block_size: u64) -> u64 {
    size.div_ceil(block_size.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_truncation_or_flip_refused() {
        for checked in [None, Some([7u8; 32])] {
            let mut map = BlockMap::new(8, 100, "\"abc\"".into(), checked);
            map.set(0);
            map.set(12);
            let bytes = map.encode();
            let version = if checked.is_some() { 2u32 } else { 1 };
            assert_eq!(bytes[8..12], version.to_le_bytes());
            let back = BlockMap::decode(&bytes).unwrap();
            assert_eq!(back, map);
            assert!(back.has(12) && !back.has(11) && back.present() == 2);
            assert_eq!(back.block_range(12), 96..100);
            for cut in 0..bytes.len() {
                assert!(BlockMap::decode(&bytes[..cut]).is_err(), "cut {cut}");
            }
            for i in 0..bytes.len() {
                let mut bad = bytes.clone();
                bad[i] ^= 0x40;
                assert!(BlockMap::decode(&bad).is_err(), "flip {i}");
            }
        }
    }
}

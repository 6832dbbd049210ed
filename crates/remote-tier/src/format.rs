//! The block map: which fixed-size blocks of a block-fetched object are in
//! its local sparse file. Written whole, atomically (write, rename).
//!
//! ```text
//! offset  size  field
//! 0       8     magic  "CXBLKMAP"
//! 8       4     version (u32 LE): 1, 2 for an object checked by blocks,
//!               3 for a map with unsynced blocks
//! 12      8     block size (u64 LE, > 0)
//! 20      8     object size (u64 LE)
//! 28      4     etag length E (u32 LE, <= 1024)
//! 32      E     the object's etag when first fetched (UTF-8; may be empty)
//! version 1 and 2:
//! 32+E    L     version 2 only (L = 32, else 0): the digest of the block list
//!               (`BlockHashes::digest`) every marked block was checked against
//! 32+E+L  B     bitmap, B = ceil(blocks / 8); bit i of byte i/8 = block i present
//! version 3:
//! 32+E    1     flags: bit 0 = checked (the list digest follows); others 0
//! 33+E    L     the list digest when checked (L = 32, else 0)
//! 33+E+L  16    the boot id (Linux `/proc/sys/kernel/random/boot_id`) the
//!               unsynced blocks were written under
//! 49+E+L  B     bitmap of durable blocks
//! 49+E+L+B B    bitmap of unsynced blocks
//! then    32    BLAKE3 of all the bytes before
//! ```
//!
//! A **durable** block's bytes were fsynced before its bit was set, so it
//! is present whatever happened since. An **unsynced** block's bytes were
//! written but not fsynced: they are in the page cache of the boot that
//! wrote them, which every process of that boot reads, so a reader of the
//! same boot uses them and a reader of another boot (after a power cut or
//! a reboot) drops them and fetches them again. A fetch therefore never
//! waits for the disk; the handle that wrote unsynced blocks makes them
//! durable when it is closed (fsync the file, then set their durable bits).
//! A map written without fsync may be lost or torn by a power cut: the
//! checksum refuses a torn one, and a missing one only means fetching
//! again. A map with no unsynced block is written as version 1 or 2 (no
//! flags, boot id or second bitmap): every version is one this build
//! writes.

/// The magic bytes a block map starts with.
pub const MAGIC: &[u8; 8] = b"CXBLKMAP";
/// The block map version of objects without a block list.
pub const VERSION: u32 = 1;
/// The block map version of objects whose blocks are checked against a
/// block list.
pub const VERSION_CHECKED: u32 = 2;
/// The block map version of a map with unsynced blocks (the newest this
/// build reads).
pub const VERSION_UNSYNCED: u32 = 3;
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
    /// Blocks written but not fsynced, and the boot they were written in.
    unsynced: Option<Unsynced>,
}

/// The unsynced blocks of a map: present only for readers of `boot`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unsynced {
    boot: [u8; 16],
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
            unsynced: None,
        }
    }

    /// How many blocks the object has.
    pub fn blocks(&self) -> u64 {
        block_count(self.size, self.block_size)
    }

    /// Whether block `i` is present (durable, or unsynced).
    pub fn has(&self, i: u64) -> bool {
        bit(&self.bits, i) || self.unsynced.as_ref().is_some_and(|u| bit(&u.bits, i))
    }

    /// Marks block `i` present and durable (its bytes fsynced).
    pub fn set(&mut self, i: u64) {
        set_bit(&mut self.bits, i);
        if let Some(u) = &mut self.unsynced {
            clear_bit(&mut u.bits, i);
        }
        self.drop_empty_unsynced();
    }

    /// Marks block `i` present but not durable: its bytes were written in
    /// boot `boot` and not fsynced. A durable block stays durable.
    pub fn set_unsynced(&mut self, i: u64, boot: [u8; 16]) {
        if bit(&self.bits, i) {
            return;
        }
        let len = self.bits.len();
        let u = self.unsynced.get_or_insert_with(|| Unsynced {
            boot,
            bits: vec![0; len],
        });
        if u.boot != boot {
            *u = Unsynced {
                boot,
                bits: vec![0; len],
            };
        }
        set_bit(&mut u.bits, i);
    }

    /// Marks block `i` absent (durable and unsynced bits both cleared).
    pub fn clear(&mut self, i: u64) {
        clear_bit(&mut self.bits, i);
        if let Some(u) = &mut self.unsynced {
            clear_bit(&mut u.bits, i);
        }
        self.drop_empty_unsynced();
    }

    /// Whether block `i` is present but not yet durable.
    pub fn is_unsynced(&self, i: u64) -> bool {
        self.unsynced.as_ref().is_some_and(|u| bit(&u.bits, i))
    }

    /// The unsynced blocks and the boot they were written in.
    pub fn unsynced(&self) -> Option<([u8; 16], Vec<u64>)> {
        let u = self.unsynced.as_ref()?;
        let blocks = (0..self.blocks()).filter(|&i| bit(&u.bits, i)).collect();
        Some((u.boot, blocks))
    }

    /// Forgets the unsynced blocks unless they were written in boot
    /// `boot`: another boot's page cache is gone, and with it their bytes.
    pub fn keep_unsynced_of(&mut self, boot: Option<[u8; 16]>) {
        if self.unsynced.as_ref().is_some_and(|u| Some(u.boot) != boot) {
            self.unsynced = None;
        }
    }

    fn drop_empty_unsynced(&mut self) {
        if self
            .unsynced
            .as_ref()
            .is_some_and(|u| u.bits.iter().all(|&b| b == 0))
        {
            self.unsynced = None;
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

    /// Marks present every block `other` has (same object assumed): its
    /// durable blocks durable, its unsynced ones unsynced (those of
    /// another boot than this map's unsynced ones are not taken).
    pub fn merge(&mut self, other: &BlockMap) {
        for (a, b) in self.bits.iter_mut().zip(&other.bits) {
            *a |= b;
        }
        if let Some(theirs) = &other.unsynced {
            for i in (0..self.blocks()).filter(|&i| bit(&theirs.bits, i)) {
                if self.unsynced.as_ref().is_none_or(|u| u.boot == theirs.boot) {
                    self.set_unsynced(i, theirs.boot);
                }
            }
        }
        // A block durable now is no longer unsynced.
        if let Some(u) = &mut self.unsynced {
            for (x, d) in u.bits.iter_mut().zip(&self.bits) {
                *x &= !d;
            }
        }
        self.drop_empty_unsynced();
    }

    /// How many blocks are present (durable or unsynced).
    pub fn present(&self) -> u64 {
        let blocks = self.blocks();
        let full = (blocks / 8) as usize;
        let byte = |i: usize| self.bits[i] | self.unsynced.as_ref().map_or(0, |u| u.bits[i]);
        // Whole bytes at once; the last byte's bits past the object's
        // blocks do not count.
        let whole: u64 = (0..full.min(self.bits.len()))
            .map(|i| u64::from(byte(i).count_ones()))
            .sum();
        let tail = (full as u64 * 8..blocks).filter(|&i| self.has(i)).count() as u64;
        whole + tail
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
        let version = match (&self.unsynced, self.checked) {
            (Some(_), _) => VERSION_UNSYNCED,
            (None, Some(_)) => VERSION_CHECKED,
            (None, None) => VERSION,
        };
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&self.block_size.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&(self.etag.len() as u32).to_le_bytes());
        out.extend_from_slice(self.etag.as_bytes());
        if self.unsynced.is_some() {
            out.push(u8::from(self.checked.is_some()));
        }
        if let Some(digest) = &self.checked {
            out.extend_from_slice(digest);
        }
        if let Some(u) = &self.unsynced {
            out.extend_from_slice(&u.boot);
        }
        out.extend_from_slice(&self.bits);
        if let Some(u) = &self.unsynced {
            out.extend_from_slice(&u.bits);
        }
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
        if !(VERSION..=VERSION_UNSYNCED).contains(&version) {
            return Err(format!(
                "version {version}, this build reads {VERSION} to {VERSION_UNSYNCED}"
            ));
        }
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
        let mut at = 32usize;
        let take = |at: &mut usize, n: usize| -> Result<&[u8], String> {
            let end = at.checked_add(n).ok_or("length overflow")?;
            let got = body.get(*at..end).ok_or_else(|| {
                format!(
                    "{} bytes, too short for an object of {size} bytes in {block_size}-byte blocks",
                    body.len()
                )
            })?;
            *at = end;
            Ok(got)
        };
        let etag = std::str::from_utf8(take(&mut at, etag_len)?)
            .map_err(|_| "etag is not UTF-8".to_string())?
            .to_string();
        let checked = match version {
            VERSION => false,
            VERSION_CHECKED => true,
            _ => match take(&mut at, 1)?[0] {
                0 => false,
                1 => true,
                flags => return Err(format!("unknown flags {flags:#04x}")),
            },
        };
        let checked = match checked {
            true => {
                let mut digest = [0u8; 32];
                digest.copy_from_slice(take(&mut at, 32)?);
                Some(digest)
            }
            false => None,
        };
        let boot = match version {
            VERSION_UNSYNCED => {
                let mut boot = [0u8; 16];
                boot.copy_from_slice(take(&mut at, 16)?);
                Some(boot)
            }
            _ => None,
        };
        let bits = take(&mut at, bits_len)?.to_vec();
        let unsynced = match boot {
            Some(boot) => Some(Unsynced {
                boot,
                bits: take(&mut at, bits_len)?.to_vec(),
            }),
            None => None,
        };
        if at != body.len() {
            return Err(format!(
                "{} bytes where an object of {size} bytes in {block_size}-byte blocks needs {at}",
                body.len()
            ));
        }
        if let Some(u) = &unsynced {
            if u.bits.iter().all(|&b| b == 0) {
                return Err("a version 3 map without unsynced blocks".into());
            }
            if u.bits.iter().zip(&bits).any(|(x, d)| x & d != 0) {
                return Err("a block both durable and unsynced".into());
            }
        }
        Ok(BlockMap {
            block_size,
            size,
            etag,
            checked,
            bits,
            unsynced,
        })
    }
}

fn bit(bits: &[u8], i: u64) -> bool {
    bits.get((i / 8) as usize)
        .is_some_and(|b| b & (1 << (i % 8)) != 0)
}

fn set_bit(bits: &mut [u8], i: u64) {
    if let Some(b) = bits.get_mut((i / 8) as usize) {
        *b |= 1 << (i % 8);
    }
}

fn clear_bit(bits: &mut [u8], i: u64) {
    if let Some(b) = bits.get_mut((i / 8) as usize) {
        *b &= !(1 << (i % 8));
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

    #[test]
    fn unsynced_blocks_round_trip_and_are_kept_only_in_their_boot() {
        for checked in [None, Some([7u8; 32])] {
            let (boot, other) = ([1u8; 16], [2u8; 16]);
            let mut map = BlockMap::new(8, 100, "\"abc\"".into(), checked);
            map.set(0);
            map.set_unsynced(3, boot);
            map.set_unsynced(0, boot);
            assert!(map.has(0) && map.has(3) && !map.has(4));
            assert_eq!(map.unsynced(), Some((boot, vec![3])));
            let bytes = map.encode();
            assert_eq!(bytes[8..12], VERSION_UNSYNCED.to_le_bytes());
            let back = BlockMap::decode(&bytes).unwrap();
            assert_eq!(back, map);
            for cut in 0..bytes.len() {
                assert!(BlockMap::decode(&bytes[..cut]).is_err(), "cut {cut}");
            }
            for i in 0..bytes.len() {
                let mut bad = bytes.clone();
                bad[i] ^= 0x40;
                assert!(BlockMap::decode(&bad).is_err(), "flip {i}");
            }
            // Read in another boot: the unsynced block is gone.
            let mut later = back.clone();
            later.keep_unsynced_of(Some(other));
            assert!(later.has(0) && !later.has(3));
            assert_eq!(later.encode()[8..12], map_version(checked).to_le_bytes());
            let mut same = back.clone();
            same.keep_unsynced_of(Some(boot));
            assert!(same.has(3));
            // Made durable: the map is a version 1 or 2 map again.
            same.set(3);
            assert_eq!(same.unsynced(), None);
            assert_eq!(same.encode()[8..12], map_version(checked).to_le_bytes());
            // Merging takes unsynced blocks as unsynced, durable as durable.
            let mut fresh = BlockMap::new(8, 100, "\"abc\"".into(), checked);
            fresh.merge(&map);
            assert_eq!(fresh, map);
            fresh.merge(&same);
            assert_eq!(fresh.unsynced(), None);
            assert!(fresh.has(3));
        }
    }

    fn map_version(checked: Option<[u8; 32]>) -> u32 {
        match checked {
            Some(_) => VERSION_CHECKED,
            None => VERSION,
        }
    }
}

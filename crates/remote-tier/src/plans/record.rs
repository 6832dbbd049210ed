//! A plan record's bytes: one registrant's record, little-endian, every
//! field at its natural alignment up to the first object:
//! ```text
//! 0   magic "CXPLAN\0\0"
//! 8   version u32 = 1
//! 12  flags u32 = 0
//! 16  progress u64        the registrant's position: written in place (one
//!                         aligned 8-byte pwrite) after each batch
//! 24  epoch_len u64       L: positions 0..L are this epoch, L..2L the next
//! 32  objects u64         K
//! 40  K × object:
//!       key_len u16, key (UTF-8, the tier's escaped object key),
//!       block_size u64, n u32,
//!       n × { block u32, first u32, last u32, next_first u32 }
//!                         (u32::MAX = none; first ≤ last < L; L ≤ next_first < 2L)
//! end BLAKE3 (32 bytes) of every byte before it except progress
//! ```
//! A record that does not check (another version, a torn or altered
//! file, positions out of their epoch) does not decode: its reader counts
//! its blocks as unplanned.
//!
//! The distance of a block at progress `p` ([`BlockUse::distance`]):
//! while this epoch still reads it (`first` set and `p ≤ last`),
//! `first − p` (0 = in use now); otherwise, when the next epoch reads it,
//! `next_first − p`; otherwise none.

/// A position no use has (`first`, `last` or `next_first` unset).
pub(crate) const NONE: u32 = u32::MAX;

/// The first bytes of every plan record.
const MAGIC: &[u8; 8] = b"CXPLAN\0\0";

/// The record version this build writes and reads.
const VERSION: u32 = 1;

/// Where the progress is, in a record.
pub(crate) const PROGRESS_AT: u64 = 16;

/// The fixed part of a record, before its objects.
const HEADER_LEN: usize = 40;

/// The bytes of one block's uses.
const USE_LEN: usize = 16;

/// One block's uses in one reader's plan, in the reader's batch clock:
/// positions `0..epoch_len` are this epoch, `epoch_len..2·epoch_len` the
/// next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockUse {
    /// The block's index in its object (offset / block size).
    pub block: u32,
    /// Its first use this epoch, or `u32::MAX` (none).
    pub first: u32,
    /// Its last use this epoch, or `u32::MAX` (none).
    pub last: u32,
    /// Its first use in the next epoch (a position ≥ `epoch_len`), or
    /// `u32::MAX` (none).
    pub next_first: u32,
}

impl BlockUse {
    /// A block with no use yet.
    pub(crate) fn unused(block: u32) -> BlockUse {
        BlockUse {
            block,
            first: NONE,
            last: NONE,
            next_first: NONE,
        }
    }

    /// Adds a use at `position` (`epoch_len` tells this epoch's from the
    /// next one's).
    pub(crate) fn add(&mut self, position: u32, epoch_len: u64) {
        if u64::from(position) < epoch_len {
            self.first = if self.first == NONE {
                position
            } else {
                self.first.min(position)
            };
            self.last = if self.last == NONE {
                position
            } else {
                self.last.max(position)
            };
        } else {
            self.next_first = self.next_first.min(position);
        }
    }

    /// How many batches after `progress` the block is read next, `None`
    /// when this plan does not read it again.
    pub(crate) fn distance(&self, progress: u64) -> Option<u64> {
        if self.first != NONE && progress <= u64::from(self.last) {
            return Some(u64::from(self.first).saturating_sub(progress));
        }
        if self.next_first != NONE && progress <= u64::from(self.next_first) {
            return Some(u64::from(self.next_first) - progress);
        }
        None
    }

    /// Whether the positions lie where a record of `epoch_len` allows.
    fn fits(&self, epoch_len: u64) -> bool {
        let this = match (self.first, self.last) {
            (NONE, NONE) => true,
            (NONE, _) | (_, NONE) => false,
            (first, last) => first <= last && u64::from(last) < epoch_len,
        };
        let next = self.next_first == NONE
            || (epoch_len..epoch_len.saturating_mul(2)).contains(&u64::from(self.next_first));
        this && next
    }
}

/// A record's fixed fields, read from its first bytes alone (not
/// checked against its checksum, which covers the whole record): what a
/// report shows of a record without reading its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    /// The registrant's position in its batch clock.
    pub(crate) progress: u64,
    /// The batches of this epoch (`L`).
    pub(crate) epoch_len: u64,
    /// The objects the record plans.
    pub(crate) objects: u64,
}

impl RecordHeader {
    /// Reads the header of the record `file`, or says what is wrong.
    pub(crate) fn read(file: &std::fs::File) -> std::result::Result<RecordHeader, String> {
        use std::os::unix::fs::FileExt;
        let mut bytes = [0u8; HEADER_LEN];
        file.read_exact_at(&mut bytes, 0)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => "shorter than any record".to_string(),
                _ => format!("read: {e}"),
            })?;
        RecordHeader::parse(&bytes)
    }

    /// Parses the header at the start of `bytes` (at least [`HEADER_LEN`]
    /// long): its magic, version and fixed fields, not its checksum.
    fn parse(bytes: &[u8]) -> std::result::Result<RecordHeader, String> {
        if &bytes[..8] != MAGIC {
            return Err("not a plan record (bad magic)".into());
        }
        let mut cur = Cursor { bytes, at: 8 };
        let version = cur.u32()?;
        if version != VERSION {
            return Err(format!("version {version}, this build reads {VERSION}"));
        }
        let _flags = cur.u32()?;
        Ok(RecordHeader {
            progress: cur.u64()?,
            epoch_len: cur.u64()?,
            objects: cur.u64()?,
        })
    }
}

/// The plan of one object in a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ObjectPlan {
    /// The object's key in the tier (its escaped name).
    pub(crate) key: String,
    /// The block size the block indices count in.
    pub(crate) block_size: u64,
    /// The planned blocks, each once.
    pub(crate) uses: Vec<BlockUse>,
}

/// One registrant's record, as written and read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlanRecord {
    /// The registrant's position in its batch clock.
    pub(crate) progress: u64,
    /// The batches of this epoch (`L`).
    pub(crate) epoch_len: u64,
    /// The objects it reads.
    pub(crate) objects: Vec<ObjectPlan>,
}

impl PlanRecord {
    /// The record's bytes (see the module docs).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let body: usize = self
            .objects
            .iter()
            .map(|o| 2 + o.key.len() + 8 + 4 + o.uses.len() * USE_LEN)
            .sum();
        let mut out = Vec::with_capacity(HEADER_LEN + body + 32);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.progress.to_le_bytes());
        out.extend_from_slice(&self.epoch_len.to_le_bytes());
        out.extend_from_slice(&(self.objects.len() as u64).to_le_bytes());
        for o in &self.objects {
            out.extend_from_slice(&(o.key.len() as u16).to_le_bytes());
            out.extend_from_slice(o.key.as_bytes());
            out.extend_from_slice(&o.block_size.to_le_bytes());
            out.extend_from_slice(&(o.uses.len() as u32).to_le_bytes());
            for u in &o.uses {
                for v in [u.block, u.first, u.last, u.next_first] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        let sum = checksum(&out);
        out.extend_from_slice(&sum);
        out
    }

    /// Reads a record, or says what is wrong with it.
    pub(crate) fn decode(bytes: &[u8]) -> std::result::Result<PlanRecord, String> {
        if bytes.len() < HEADER_LEN + 32 {
            return Err(format!("{} bytes, shorter than any record", bytes.len()));
        }
        let (data, sum) = bytes.split_at(bytes.len() - 32);
        let RecordHeader {
            progress,
            epoch_len,
            objects: count,
        } = RecordHeader::parse(data)?;
        if checksum(data) != sum {
            return Err("checksum mismatch (torn or altered)".into());
        }
        let mut cur = Cursor {
            bytes: data,
            at: HEADER_LEN,
        };
        if epoch_len.saturating_mul(2) > u64::from(NONE) {
            return Err(format!("epoch length {epoch_len} too large"));
        }
        let mut objects = Vec::new();
        for _ in 0..count {
            let key_len = usize::from(cur.u16()?);
            let key = std::str::from_utf8(cur.take(key_len)?)
                .map_err(|_| "an object key is not UTF-8".to_string())?
                .to_string();
            let block_size = cur.u64()?;
            if block_size == 0 {
                return Err(format!("{key}: block size 0"));
            }
            let n = cur.u32()? as usize;
            if n > cur.left() / USE_LEN {
                return Err(format!("{key}: {n} blocks past the record's end"));
            }
            let mut uses = Vec::with_capacity(n);
            for _ in 0..n {
                let u = BlockUse {
                    block: cur.u32()?,
                    first: cur.u32()?,
                    last: cur.u32()?,
                    next_first: cur.u32()?,
                };
                if !u.fits(epoch_len) {
                    return Err(format!(
                        "{key}: block {} has positions outside its epochs of {epoch_len}",
                        u.block
                    ));
                }
                uses.push(u);
            }
            objects.push(ObjectPlan {
                key,
                block_size,
                uses,
            });
        }
        if cur.left() != 0 {
            return Err(format!("{} bytes after the last object", cur.left()));
        }
        Ok(PlanRecord {
            progress,
            epoch_len,
            objects,
        })
    }
}

/// BLAKE3 of a record's bytes (checksum excluded) but its progress.
fn checksum(data: &[u8]) -> [u8; 32] {
    let progress = PROGRESS_AT as usize..PROGRESS_AT as usize + 8;
    let mut h = blake3::Hasher::new();
    h.update(&data[..progress.start]);
    h.update(&data[progress.end..]);
    *h.finalize().as_bytes()
}

/// Reads a record's fields in order.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> std::result::Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("ends inside a field at byte {}", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u16(&mut self) -> std::result::Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An object's plan of 4 KiB blocks: `(block, first, last, next_first)`
    /// each.
    pub(crate) fn plan(key: &str, uses: &[(u32, u32, u32, u32)]) -> ObjectPlan {
        ObjectPlan {
            key: key.into(),
            block_size: 4096,
            uses: uses
                .iter()
                .map(|&(block, first, last, next_first)| BlockUse {
                    block,
                    first,
                    last,
                    next_first,
                })
                .collect(),
        }
    }

    #[test]
    fn a_record_round_trips_and_progress_is_outside_its_checksum() {
        let record = PlanRecord {
            progress: 3,
            epoch_len: 10,
            objects: vec![
                plan(
                    "a%2Fpages",
                    &[(0, 0, 4, 12), (7, 2, 2, NONE), (9, NONE, NONE, 10)],
                ),
                plan("b", &[]),
            ],
        };
        let mut bytes = record.encode();
        assert_eq!(PlanRecord::decode(&bytes), Ok(record.clone()));
        bytes[PROGRESS_AT as usize..][..8].copy_from_slice(&7u64.to_le_bytes());
        let moved = PlanRecord::decode(&bytes).unwrap();
        assert_eq!(moved.progress, 7);
        assert_eq!(moved.objects, record.objects);
    }

    #[test]
    fn a_torn_or_altered_record_does_not_decode() {
        let bytes = PlanRecord {
            progress: 0,
            epoch_len: 4,
            objects: vec![plan("a", &[(1, 0, 1, 5)])],
        }
        .encode();
        for cut in [0, 8, HEADER_LEN, bytes.len() - 1] {
            assert!(PlanRecord::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut altered = bytes.clone();
        altered[HEADER_LEN + 4] ^= 1;
        assert!(PlanRecord::decode(&altered).is_err());
        let mut newer = bytes;
        newer[8] = 2;
        let err = PlanRecord::decode(&newer).unwrap_err();
        assert!(err.contains("version 2"), "{err}");
    }

    #[test]
    fn positions_outside_their_epoch_do_not_decode() {
        for bad in [
            (0, 3, 1, NONE),
            (0, 1, 4, NONE),
            (0, NONE, NONE, 3),
            (0, 1, NONE, NONE),
        ] {
            let bytes = PlanRecord {
                progress: 0,
                epoch_len: 4,
                objects: vec![plan("a", &[bad])],
            }
            .encode();
            assert!(PlanRecord::decode(&bytes).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn distance_follows_progress_through_this_epoch_into_the_next() {
        let u = BlockUse {
            block: 0,
            first: 2,
            last: 5,
            next_first: 9,
        };
        let at: Vec<Option<u64>> = [0, 2, 4, 5, 6, 9, 10].map(|p| u.distance(p)).into();
        assert_eq!(
            at,
            [Some(2), Some(0), Some(0), Some(0), Some(3), Some(0), None]
        );
        let only_next = BlockUse {
            next_first: 7,
            ..BlockUse::unused(1)
        };
        assert_eq!(only_next.distance(1), Some(6));
        assert_eq!(BlockUse::unused(2).distance(0), None);
    }
}

//! The on-disk format, written down once.
//!
//! ```text
//! <cache_dir>/
//!   segments/segment_000000.arrow   Arrow IPC *file*, immutable, one record batch
//!   segments/segment_000001.arrow   (ids grow; parsed numerically, may exceed 6 digits)
//!   schema.json                     torchcachex's shape: fields, metadata, output_structure
//!   segment-index.log               append-only index of this crate (below)
//!   segment-store.lock              fs2 lock: the single writer's (exclusive),
//!                                   or every multi-writer's (shared)
//!   writers/writer-0003.log         multi-writer 3's own index log (version 3)
//!   writers/writer-0003.lock        multi-writer 3's own lock
//!   *.tmp                           in-flight writes; removed on open
//! ```
//!
//! # Segments
//! Columns follow torchcachex: `key` (utf8), then per tensor `data`
//! (`list<T>`) and `shape` (`list<int64>`) — prefixed `{name}_` in a dict
//! and `item{i}_` in a tuple/list — and `blob` / `{name}_blob` (binary) for
//! opaque bytes. Schema metadata: `torch_dtype` (single tensor),
//! `tensor_keys` (dict, JSON list), and this crate's `cachex_parts` (JSON list
//! of `{"name", "dtype", "rank"}` or `{"name", "blob": true}`, which keeps
//! bf16 — stored as `uint16` — and each tensor's rank) and `cachex_format`
//! (= [`SEGMENT_FORMAT`]). Bool tensors are Arrow booleans (bit-packed), as
//! pyarrow writes them.
//!
//! # Index log (`segment-index.log`), little-endian
//! ```text
//! header  16 B   magic b"CXSEGIDX" | version u32 (= 2) | flags u32 (= 0)
//! group   40 B   magic b"CXG1" | segment_id u32 | count u32 | reserved u32 (= 0)
//!                | segment_len u64 | segment_hash u64 | checksum u64
//!         count x u64  key hash of row 0, 1, ... of that segment
//! ```
//! One group is appended (and fsynced) per segment, only after the segment
//! is durable under its final name. `segment_len` and `segment_hash` (the
//! first 8 bytes of BLAKE3 of the whole file) stamp the segment: a length
//! mismatch excludes it on open, a content mismatch is found by `verify`
//! (Arrow IPC has no checksum of its own, and hashing every segment on the
//! read path would make reads O(segment)). `checksum` is the first 8 bytes of
//! BLAKE3 over the group's first 32 header bytes followed by the hashes; a
//! group that is short or fails its checksum ends the log (a torn tail,
//! truncated on open). A key hash is XXH3-64 (seed 0) of the key's UTF-8
//! bytes: every lookup hashes its key, and on short keys XXH3 costs a few
//! nanoseconds where BLAKE3 costs over a hundred. The hash only places a
//! key; each hit is confirmed against the segment's `key` column, so a
//! collision costs a probe, never a wrong record. (Version 1 stored the
//! first 8 bytes of BLAKE3; a version-1 log is rebuilt from the segments
//! like a lost one, and a writer rewrites it as version 2.) Groups are in
//! segment-id order, and later rows win when keys repeat. Segments with ids above the log's last
//! group are indexed on open; a directory without a log (a torchcachex
//! cache) is indexed from the segments' `key` columns.
//!
//! # Several writers (format version 3)
//! In multi-writer mode (`Options::writer_id`) writer `w` (0 to
//! [`MAX_WRITER_ID`]) writes only files no other writer can name, so
//! writers never share a mutable file and need no lock between them
//! (which `flock` on NFS or Lustre could not be trusted for):
//! - its segments have ids `w`, `w + 4096`, `w + 2 * 4096`, ... (residue
//!   `w` modulo [`WRITER_STRIDE`]), each above every id of the shared log
//!   and of its own earlier segments; the names stay
//!   `segment_{id:06}.arrow`, which torchcachex reads;
//! - its index log is `writers/writer-{w:04}.log`: the version-2 layout
//!   with header `magic | version u32 (= 3) | writer u32 (= w)`, every
//!   group's segment in residue class `w`.
//!
//! A reader merges the shared log and every writer log. A key in several
//! places resolves to its greatest (segment id, row): the same answer on
//! every rank and every open whatever order the logs are read in, and the
//! one torchcachex's rebuild gives (it sorts the ids numerically and lets
//! later rows win). Writers that overlap in time are thereby ordered by
//! their flush count, then their id. A segment in no log is adopted only
//! by its owner: writer `w` on open indexes (and logs) its own segments
//! newer than its log and the shared log, the single writer those newer
//! than every log; readers ignore such a segment (a write in flight, or a
//! crashed writer's that it adopts when it comes back), so that every
//! reader gives the same answer. Each writer cleans only its own temp
//! files. A multi-writer cache is compacted by a single writer, into the
//! shared log (the commit point), after which the writer logs are removed.
//! Locks (`flock`, advisory): each writer holds `writers/writer-{w:04}.lock`
//! (the same rank started twice is refused) and `segment-store.lock`
//! *shared* (many holders, none waits on another), which keeps out the
//! single writer and compaction, who hold it exclusively. Where `flock`
//! is unreliable these two checks weaken, never the writes themselves.
//! A build before format version 3 ignores `writers/`: it reads only the
//! shared log's keys.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Folder of the segment files.
pub const SEGMENTS_DIR: &str = "segments";
/// File name of the schema.
pub const SCHEMA_FILE: &str = "schema.json";
/// File name of the index log.
pub const INDEX_FILE: &str = "segment-index.log";
/// File name of the cache's lock: the single writer (and compaction) holds
/// it exclusively, each multi-writer shared.
pub const LOCK_FILE: &str = "segment-store.lock";
/// Folder of the multi-writer index logs and locks.
pub const WRITERS_DIR: &str = "writers";
/// Segment ids of writer `w` are `w`, `w + WRITER_STRIDE`, `w + 2 *
/// WRITER_STRIDE`, ...: the writers' residue classes modulo this stride.
pub const WRITER_STRIDE: u32 = 4096;
/// Largest multi-writer id.
pub const MAX_WRITER_ID: u32 = WRITER_STRIDE - 1;
/// Suffix of in-flight files.
pub const TMP_SUFFIX: &str = durable_fs::TMP_SUFFIX;
/// `cachex_format` metadata value of the segments this version writes.
pub const SEGMENT_FORMAT: &str = "1";

/// Magic of the index log header.
pub const INDEX_MAGIC: [u8; 8] = *b"CXSEGIDX";
/// Version of the shared index log (`segment-index.log`).
pub const INDEX_VERSION: u32 = 2;
/// Version of a writer's index log (`writers/writer-NNNN.log`): the
/// version-2 layout, the header's last word holding the writer id.
pub const WRITER_LOG_VERSION: u32 = 3;
/// Bytes of the index log header.
pub const INDEX_HEADER_LEN: usize = 16;
/// Magic of a group header.
pub const GROUP_MAGIC: [u8; 4] = *b"CXG1";
/// Bytes of a group header.
pub const GROUP_HEADER_LEN: usize = 40;

/// The file name of segment `id`.
pub fn segment_name(id: u32) -> String {
    format!("segment_{id:06}.arrow")
}

/// The path of segment `id` under a cache directory.
pub fn segment_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(SEGMENTS_DIR).join(segment_name(id))
}

/// Whether `path` (relative to a cache directory, `/`-separated) names a
/// segment file: what a reader may read in parts, row by row.
pub fn is_segment_file(path: &str) -> bool {
    path.strip_prefix(SEGMENTS_DIR)
        .and_then(|p| p.strip_prefix('/'))
        .is_some_and(|name| parse_segment_name(name).is_some())
}

/// The id of a segment file name, or `None` for any other name.
pub fn parse_segment_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("segment_")?.strip_suffix(".arrow")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The 64-bit hash of a key that the index stores.
pub fn key_hash(key: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key.as_bytes())
}

/// The index log header.
pub fn encode_index_header() -> [u8; INDEX_HEADER_LEN] {
    let mut h = [0u8; INDEX_HEADER_LEN];
    h[..8].copy_from_slice(&INDEX_MAGIC);
    h[8..12].copy_from_slice(&INDEX_VERSION.to_le_bytes());
    h
}

/// The header of writer `writer`'s index log.
pub fn encode_writer_log_header(writer: u32) -> [u8; INDEX_HEADER_LEN] {
    let mut h = [0u8; INDEX_HEADER_LEN];
    h[..8].copy_from_slice(&INDEX_MAGIC);
    h[8..12].copy_from_slice(&WRITER_LOG_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&writer.to_le_bytes());
    h
}

/// The writer whose residue class segment `id` is in.
pub fn writer_of(id: u32) -> u32 {
    id % WRITER_STRIDE
}

/// The smallest segment id of `writer` above `above` (any id when `None`),
/// or `None` when the writer's ids are exhausted.
pub fn next_writer_segment(writer: u32, above: Option<u32>) -> Option<u32> {
    let Some(above) = above else {
        return Some(writer);
    };
    let lo = u64::from(above) + 1;
    let k = u64::from(WRITER_STRIDE);
    let id = lo.div_ceil(k) * k + u64::from(writer);
    let id = if id - k >= lo { id - k } else { id };
    u32::try_from(id).ok()
}

/// The file name of writer `writer`'s index log (under [`WRITERS_DIR`]).
pub fn writer_log_name(writer: u32) -> String {
    format!("writer-{writer:04}.log")
}

/// The file name of writer `writer`'s lock (under [`WRITERS_DIR`]).
pub fn writer_lock_name(writer: u32) -> String {
    format!("writer-{writer:04}.lock")
}

/// The writer of a writer log file name, or `None` for any other name.
pub fn parse_writer_log_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("writer-")?.strip_suffix(".log")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&w| w <= MAX_WRITER_ID)
}

/// The first 8 bytes of BLAKE3 of `bytes`, little-endian (segment stamps).
pub fn content_hash(bytes: &[u8]) -> u64 {
    let h = blake3::hash(bytes);
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.as_bytes()[..8]);
    u64::from_le_bytes(b)
}

/// One group (header and hashes) of the index log.
pub fn encode_group(
    segment_id: u32,
    segment_len: u64,
    segment_hash: u64,
    hashes: &[u64],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(GROUP_HEADER_LEN + hashes.len() * 8);
    out.extend_from_slice(&GROUP_MAGIC);
    out.extend_from_slice(&segment_id.to_le_bytes());
    // Callers never build a segment of more than u32::MAX rows.
    out.extend_from_slice(&(hashes.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&segment_len.to_le_bytes());
    out.extend_from_slice(&segment_hash.to_le_bytes());
    out.extend_from_slice(&[0u8; 8]);
    for h in hashes {
        out.extend_from_slice(&h.to_le_bytes());
    }
    let sum = group_checksum(&out[..32], &out[GROUP_HEADER_LEN..]);
    out[32..40].copy_from_slice(&sum.to_le_bytes());
    out
}

fn group_checksum(head: &[u8], hashes: &[u8]) -> u64 {
    let mut hasher = blake3::Hasher::new();
    hasher.update(head);
    hasher.update(hashes);
    let mut b = [0u8; 8];
    b.copy_from_slice(&hasher.finalize().as_bytes()[..8]);
    u64::from_le_bytes(b)
}

/// A group header parsed from the index log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The segment the group indexes.
    pub segment_id: u32,
    /// The segment's length in bytes when it was indexed.
    pub segment_len: u64,
    /// [`content_hash`] of the segment when it was indexed.
    pub segment_hash: u64,
    /// Number of rows (hashes).
    pub count: usize,
}

/// The key hashes of a group body.
pub fn hashes_of(body: &[u8]) -> impl ExactSizeIterator<Item = u64> + '_ {
    body.chunks_exact(8)
        .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
}

/// The parsed index log.
#[derive(Debug, Clone, Default)]
pub struct ParsedLog {
    /// Valid groups, in file order.
    pub groups: Vec<Group>,
    /// Bytes of the valid prefix (header plus whole, checked groups).
    pub valid_len: u64,
    /// Why parsing stopped before the end of the file, if it did.
    pub torn: Option<String>,
    /// The segment of the last valid group.
    pub last_id: Option<u32>,
    /// The writer whose log this is (`None`: the shared log).
    pub writer: Option<u32>,
}

/// Checks an index log header: `Ok(None)` for the shared log (version 2),
/// `Ok(Some(w))` for writer `w`'s log (version 3), `Err(why)` otherwise.
pub fn parse_index_header(head: &[u8; INDEX_HEADER_LEN]) -> Result<Option<u32>, String> {
    if head[..8] != INDEX_MAGIC {
        return Err("bad magic (not a segment-store index log)".into());
    }
    let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    let word = u32::from_le_bytes([head[12], head[13], head[14], head[15]]);
    match version {
        1 => Err("index version 1 (BLAKE3 key hashes); this build uses version 2 (XXH3)".into()),
        INDEX_VERSION if word != 0 => Err(format!(
            "index flags {word:#x}: this build knows none (a newer writer, or damage)"
        )),
        INDEX_VERSION => Ok(None),
        WRITER_LOG_VERSION if word > MAX_WRITER_ID => Err(format!(
            "writer log of writer {word}, above the largest id {MAX_WRITER_ID}"
        )),
        WRITER_LOG_VERSION => Ok(Some(word)),
        v => Err(format!(
            "index version {v}, this build reads {INDEX_VERSION} and {WRITER_LOG_VERSION}"
        )),
    }
}

/// Reads an index log of `file_len` bytes from `r` in one sequential pass,
/// handing each checked group and its hash bytes to `visit`. A bad header
/// is `Ok(Err(why))`; anything wrong after it ends the log there (a torn
/// tail). Memory use is bounded by the largest group, which is bounded by
/// `file_len`.
pub fn read_index(
    mut r: impl std::io::Read,
    file_len: u64,
    visit: impl FnMut(&Group, &[u8]),
) -> std::io::Result<Result<ParsedLog, String>> {
    if file_len < INDEX_HEADER_LEN as u64 {
        return Ok(Err(format!(
            "{file_len} bytes, shorter than the {INDEX_HEADER_LEN}-byte header"
        )));
    }
    let mut head = [0u8; INDEX_HEADER_LEN];
    r.read_exact(&mut head)?;
    let writer = match parse_index_header(&head) {
        Ok(w) => w,
        Err(why) => return Ok(Err(why)),
    };
    let mut out = read_groups(r, INDEX_HEADER_LEN as u64, file_len, None, writer, visit)?;
    out.writer = writer;
    Ok(Ok(out))
}

/// Reads the groups of an index log from byte `start` (just past the header,
/// or where an earlier read stopped: [`ParsedLog::valid_len`]) up to
/// `file_len`, `r` positioned at `start`. `last_id` is the segment of the
/// group before `start`; in writer `writer`'s log every segment id must be
/// of that writer. A short or bad group ends the read (a torn tail, or a
/// group still being appended).
pub fn read_groups(
    r: impl std::io::Read,
    start: u64,
    file_len: u64,
    mut last_id: Option<u32>,
    writer: Option<u32>,
    mut visit: impl FnMut(&Group, &[u8]),
) -> std::io::Result<ParsedLog> {
    let mut r = std::io::BufReader::with_capacity(1 << 18, r);
    let mut out = ParsedLog {
        valid_len: start,
        last_id,
        writer,
        ..ParsedLog::default()
    };
    let mut pos = start;
    let mut body_buf = Vec::new();
    while pos < file_len {
        let rest = file_len - pos;
        if rest < GROUP_HEADER_LEN as u64 {
            out.torn = Some(format!("{rest} trailing bytes at offset {pos}"));
            break;
        }
        let mut gh = [0u8; GROUP_HEADER_LEN];
        if let Err(e) = r.read_exact(&mut gh) {
            out.torn = Some(format!("read at offset {pos}: {e}"));
            break;
        }
        let u32_at = |o: usize| u32::from_le_bytes([gh[o], gh[o + 1], gh[o + 2], gh[o + 3]]);
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&gh[o..o + 8]);
            u64::from_le_bytes(b)
        };
        if gh[..4] != GROUP_MAGIC {
            out.torn = Some(format!("no group magic at offset {pos}"));
            break;
        }
        let segment_id = u32_at(4);
        let count = u32_at(8) as u64;
        let body = count * 8;
        if body > rest - GROUP_HEADER_LEN as u64 {
            out.torn = Some(format!(
                "group at offset {pos} claims {count} hashes, beyond the end of the file"
            ));
            break;
        }
        // Bounded by the file length checked just above.
        body_buf.resize(body as usize, 0);
        if let Err(e) = r.read_exact(&mut body_buf) {
            out.torn = Some(format!("read at offset {pos}: {e}"));
            break;
        }
        if group_checksum(&gh[..32], &body_buf) != u64_at(32) {
            out.torn = Some(format!("group at offset {pos} fails its checksum"));
            break;
        }
        if let Some(l) = last_id
            && segment_id <= l
        {
            out.torn = Some(format!(
                "group at offset {pos} indexes segment {segment_id} after segment {l}"
            ));
            break;
        }
        if let Some(w) = writer
            && writer_of(segment_id) != w
        {
            out.torn = Some(format!(
                "group at offset {pos} indexes segment {segment_id}, not one of writer {w}"
            ));
            break;
        }
        last_id = Some(segment_id);
        let group = Group {
            segment_id,
            segment_len: u64_at(16),
            segment_hash: u64_at(24),
            count: count as usize,
        };
        visit(&group, &body_buf);
        out.groups.push(group);
        pos += GROUP_HEADER_LEN as u64 + body;
        out.valid_len = pos;
        out.last_id = last_id;
    }
    Ok(out)
}

/// [`read_index`] over bytes in memory.
pub fn parse_index(bytes: &[u8], visit: impl FnMut(&Group, &[u8])) -> Result<ParsedLog, String> {
    match read_index(bytes, bytes.len() as u64, visit) {
        Ok(r) => r,
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(segment_name(3), "segment_000003.arrow");
        assert_eq!(parse_segment_name("segment_1234567.arrow"), Some(1234567));
        assert_eq!(parse_segment_name("segment_000003.arrow.tmp"), None);
        assert_eq!(parse_segment_name("segment_.arrow"), None);
        assert_eq!(parse_segment_name("segment_+1.arrow"), None);
    }

    /// The key hash is part of the index format: pinned to XXH3-64.
    #[test]
    fn key_hash_is_pinned() {
        assert_eq!(key_hash(""), 0x2d06_8005_38d3_94c2);
        assert_eq!(
            key_hash("sample_0"),
            xxhash_rust::xxh3::xxh3_64(b"sample_0")
        );
    }

    #[test]
    fn writer_ids_interleave() {
        assert_eq!(next_writer_segment(3, None), Some(3));
        assert_eq!(next_writer_segment(3, Some(2)), Some(3));
        assert_eq!(next_writer_segment(3, Some(3)), Some(3 + WRITER_STRIDE));
        assert_eq!(next_writer_segment(0, Some(0)), Some(WRITER_STRIDE));
        assert_eq!(
            next_writer_segment(5, Some(WRITER_STRIDE * 7 + 9)),
            Some(WRITER_STRIDE * 8 + 5)
        );
        assert_eq!(next_writer_segment(5, Some(u32::MAX - 1)), None);
        assert_eq!(writer_of(WRITER_STRIDE * 9 + 17), 17);
        assert_eq!(parse_writer_log_name(&writer_log_name(17)), Some(17));
        assert_eq!(parse_writer_log_name("writer-4096.log"), None);
        assert_eq!(parse_writer_log_name("writer-0001.lock"), None);
    }

    #[test]
    fn writer_log_checks_its_writer() {
        let mut log = encode_writer_log_header(2).to_vec();
        log.extend(encode_group(2, 100, 11, &[1]));
        log.extend(encode_group(WRITER_STRIDE + 2, 100, 11, &[2]));
        let full = log.len();
        log.extend(encode_group(2 * WRITER_STRIDE + 3, 100, 11, &[3]));
        let parsed = parse_index(&log, |_, _| {}).unwrap();
        assert_eq!(parsed.writer, Some(2));
        assert_eq!(parsed.groups.len(), 2);
        assert_eq!(parsed.valid_len, full as u64);
        assert_eq!(parsed.last_id, Some(WRITER_STRIDE + 2));
        assert!(parsed.torn.unwrap().contains("not one of writer 2"));
    }

    #[test]
    fn log_round_trip_and_torn_tail() {
        let mut log = encode_index_header().to_vec();
        log.extend(encode_group(0, 100, 11, &[1, 2, 3]));
        log.extend(encode_group(2, 50, 12, &[9]));
        let full = log.len();
        log.extend(&encode_group(3, 7, 13, &[4, 5])[..20]);
        let mut seen = Vec::new();
        let parsed = parse_index(&log, |g, body| {
            seen.push((g.segment_id, hashes_of(body).collect::<Vec<_>>()))
        })
        .unwrap();
        assert_eq!(parsed.groups.len(), 2);
        assert_eq!(parsed.valid_len, full as u64);
        assert!(parsed.torn.is_some());
        assert_eq!(seen, vec![(0, vec![1, 2, 3]), (2, vec![9])]);
    }
}

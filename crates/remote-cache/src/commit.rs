//! The records of a commit log in object storage — commit records and
//! checkpoints: their format, their names, and the checks every record
//! read gets before a byte of it is applied.

use remote_tier::{BlockList, RemoteTier};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Where piece objects live under the URL.
pub const OBJECTS: &str = "objects";
/// Where commit records live under the URL.
pub const COMMITS: &str = "commits";
/// Where checkpoints live under the URL.
pub const CHECKPOINTS: &str = "checkpoints";
/// The commit record format version.
pub const COMMIT_VERSION: u32 = 3;
/// The checkpoint format version.
pub const CHECKPOINT_VERSION: u32 = 1;
/// The local state directory inside a working directory (never published).
pub const STATE_DIR: &str = ".cachex-remote";
/// A commit record or checkpoint is never larger than this.
pub(crate) const MAX_RECORD: usize = 64 << 20;
/// No file a record describes ends beyond this byte (the largest offset a
/// local file takes).
const MAX_FILE_END: u64 = i64::MAX as u64;

/// Bytes of one file in a commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    /// The file, relative to the cache directory, `/`-separated.
    pub path: String,
    /// Where the bytes start in the file.
    pub offset: u64,
    /// How many bytes.
    pub size: u64,
    /// BLAKE3 of the bytes, hex: the object `objects/<blake3>` holds them.
    pub blake3: String,
    /// The bytes are the whole file (offset 0), replacing what it held.
    #[serde(default)]
    pub replace: bool,
    /// For a whole file that readers read by blocks: the BLAKE3 of each
    /// fixed-size block, checked as each block is fetched. Absent for
    /// other files, and for one too large for a list
    /// ([`BlockList`]'s limits): its blocks are checked by size and etag,
    /// the file by its BLAKE3 once all of it is local.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<BlockList>,
}

impl Piece {
    /// The object that holds the piece's bytes.
    pub fn object(&self) -> String {
        format!("{OBJECTS}/{}", self.blake3)
    }
}

/// One commit record.
///
/// ```text
/// <url>/objects/<blake3 hex>          one piece's bytes
/// <url>/commits/<seq, 20 digits>.json
///     {"version":3,"seq":N,"writer":"<host-pid-time>",
///      "pieces":[{"path","offset","size","blake3","replace","blocks"?}],
///      "removed":["<path>", ...],
///      "log":"<id>",
///      "checksum":"<BLAKE3 of the record without it>"}
///     "removed" (absent when empty): the files the writer removed
///     "blocks" (optional): {"version":1,"block_size":B,"blake3":["<hex>", ...]}
///     "log": the id of the log in `<url>/log.json` (see [`LOG_OBJECT`](crate::LOG_OBJECT))
/// <url>/checkpoints/<seq, 20 digits>.json
///     {"version":1,"seq":C,"writer":"<host-pid-time>",
///      "pieces":[{"path","offset","size","blake3","blocks"?}],
///      "checksum":"<BLAKE3 of the record without it>"}
/// ```
///
/// A **commit** lists the pieces it adds — the bytes `offset..offset +
/// size` of a file, stored under their BLAKE3, either extending the file
/// or (`replace`) standing for all of it — and the files its writer
/// removed (`removed`: a compaction's old segments, a file deleted).
/// Readers apply the pieces, then the removals. A store's local evictions
/// (a disk budget's) are never published as removals.
///
/// A **checkpoint** `C` is the whole file state after commit `C`: every
/// file as the pieces that make it, in order (the first at offset 0, each
/// next one where the previous ended). `gc` writes it (see
/// [`gc`](crate::gc())); a cold open reads the newest checkpoint and the
/// commits after it, so an open costs the same few requests after a
/// million commits as after ten. A checkpoint refers to nothing but its
/// objects: there is no chain of references a record could loop through,
/// and the sequence number its name promises is checked against the one
/// it carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    /// Format version ([`COMMIT_VERSION`]).
    pub version: u32,
    /// Its sequence number (commits apply in this order).
    pub seq: u64,
    /// Who published it (host, process, time): unique per publish.
    pub writer: String,
    /// The pieces, in the order they apply.
    pub pieces: Vec<Piece>,
    /// Files the writer removed, applied after the pieces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// The id of the log it belongs to (`<url>/log.json`, see
    /// [`LOG_OBJECT`](crate::LOG_OBJECT)).
    pub log: String,
}

impl crate::record::SeqRecord for Commit {
    const KIND: &'static str = "commit record";
    const VERSION: u32 = COMMIT_VERSION;
    const MAX_BYTES: usize = MAX_RECORD;
    fn version(&self) -> u32 {
        self.version
    }
    fn seq(&self) -> u64 {
        self.seq
    }
}

/// The whole file state of a commit log after commit `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Format version ([`CHECKPOINT_VERSION`]).
    pub version: u32,
    /// The commit whose state it is.
    pub seq: u64,
    /// Who wrote it (host, process, time).
    pub writer: String,
    /// Every file, as the pieces that make it, in order (`replace` is
    /// not used).
    pub pieces: Vec<Piece>,
}

impl crate::record::SeqRecord for Checkpoint {
    const KIND: &'static str = "checkpoint";
    const VERSION: u32 = CHECKPOINT_VERSION;
    const MAX_BYTES: usize = MAX_RECORD;
    fn version(&self) -> u32 {
        self.version
    }
    fn seq(&self) -> u64 {
        self.seq
    }
}

/// The name of commit `seq`.
pub fn commit_name(seq: u64) -> String {
    format!("{COMMITS}/{seq:020}.json")
}

/// The sequence number after `last`, the last commit of the log at `url`
/// (a log whose last number is `u64::MAX` is refused as corrupt).
pub(crate) fn next_seq(url: &str, last: u64) -> Result<u64> {
    last.checked_add(1).ok_or_else(|| Error::Corrupt {
        url: url.to_string(),
        name: commit_name(last),
        problem: "the last sequence number there is: no commit can follow".into(),
    })
}

/// The name of checkpoint `seq`.
pub fn checkpoint_name(seq: u64) -> String {
    format!("{CHECKPOINTS}/{seq:020}.json")
}

/// The sequence number a well-formed record name under `dir` carries:
/// `<dir>/` + exactly 20 decimal digits + `.json`, within `u64`.
pub fn parse_record_name(dir: &str, name: &str) -> Option<u64> {
    let digits = name
        .strip_prefix(dir)?
        .strip_prefix('/')?
        .strip_suffix(".json")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A writer's name: host, process and time, unique per publish.
pub(crate) fn writer_name() -> String {
    format!(
        "{}-{}-{}",
        std::env::var("HOSTNAME").unwrap_or_else(|_| "host".into()),
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}

/// Whether `path` may name a file of a working directory in a record: a
/// relative path inside it (no `..`, no root, no `.`, no empty
/// component, no backslash), not in the state directory.
pub(crate) fn is_cache_path(path: &str) -> bool {
    // Written as publishers write them: no empty or `.` components either,
    // so one file has one name.
    crate::record::is_relative_inside(path)
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
        && path.split('/').next() != Some(STATE_DIR)
        && !path.contains('\\')
}

/// The record `record` as stored bytes (with its checksum).
pub(crate) fn encode<T>(tier: &RemoteTier, name: &str, record: &T) -> Result<Vec<u8>>
where
    T: crate::record::SeqRecord + Serialize,
{
    crate::record::encode_record(record).map_err(|e| Error::Corrupt {
        url: tier.url().to_string(),
        name: name.to_string(),
        problem: format!("cannot encode: {e}"),
    })
}

/// Checks a decoded commit: every path inside the cache, every hash a
/// BLAKE3, every range within a file's reach, every block list sound, no
/// file both written and removed. `problem` names what is wrong.
pub(crate) fn check_commit(c: &Commit) -> std::result::Result<(), String> {
    if !crate::log_id::is_log_id(&c.log) {
        return Err(format!("log `{}` is not a log id (32 hex digits)", c.log));
    }
    for p in &c.pieces {
        check_piece(p)?;
        if p.replace && p.offset != 0 {
            return Err(format!("{}: bad range {}+{}", p.path, p.offset, p.size));
        }
    }
    for path in &c.removed {
        if !is_cache_path(path) {
            return Err(format!(
                "removes `{path}`, which is not a relative path inside the cache"
            ));
        }
        if c.pieces.iter().any(|p| &p.path == path) {
            return Err(format!("{path}: both written and removed"));
        }
    }
    Ok(())
}

/// Checks a decoded checkpoint: pieces as [`check_commit`] checks them,
/// and each file's pieces contiguous from byte 0.
pub(crate) fn check_checkpoint(c: &Checkpoint) -> std::result::Result<(), String> {
    let mut ends: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for p in &c.pieces {
        check_piece(p)?;
        let at = ends.get(p.path.as_str()).copied().unwrap_or(0);
        if p.offset != at {
            return Err(format!(
                "{}: a piece at byte {}, where the file so far ends at {at}",
                p.path, p.offset
            ));
        }
        ends.insert(&p.path, p.offset + p.size);
    }
    Ok(())
}

fn check_piece(p: &Piece) -> std::result::Result<(), String> {
    if !is_cache_path(&p.path) {
        return Err(format!(
            "`{}` is not a relative path inside the cache",
            p.path
        ));
    }
    if blake3::Hash::from_hex(&p.blake3).is_err() {
        return Err(format!("{}: `{}` is not a BLAKE3 hash", p.path, p.blake3));
    }
    match p.offset.checked_add(p.size) {
        Some(end) if end <= MAX_FILE_END => {}
        _ => {
            return Err(format!(
                "{}: bad range {}+{} (beyond the largest file)",
                p.path, p.offset, p.size
            ));
        }
    }
    if let Some(list) = &p.blocks {
        if p.offset != 0 {
            return Err(format!(
                "{}: a block list on bytes that do not start the file (offset {})",
                p.path, p.offset
            ));
        }
        list.check(p.size)
            .map_err(|problem| format!("{}: {problem}", p.path))?;
    }
    Ok(())
}

/// Reads and checks commit `seq`; `None` when it was not published.
pub(crate) fn read_commit(tier: &RemoteTier, seq: u64) -> Result<Option<Commit>> {
    read_record(tier, &commit_name(seq), seq, check_commit)
}

/// Reads and checks checkpoint `seq`; `None` when there is none (or gc
/// removed it meanwhile, a newer one standing for it).
pub(crate) fn read_checkpoint(tier: &RemoteTier, seq: u64) -> Result<Option<Checkpoint>> {
    read_record(tier, &checkpoint_name(seq), seq, check_checkpoint)
}

/// Reads record `seq` under `name`, decodes it and checks it with
/// `check`; `None` when there is no such object.
fn read_record<T: crate::record::SeqRecord>(
    tier: &RemoteTier,
    name: &str,
    seq: u64,
    check: fn(&T) -> std::result::Result<(), String>,
) -> Result<Option<T>> {
    let bytes = match tier.read_remote_capped(name, MAX_RECORD as u64) {
        Ok(b) => b,
        Err(remote_tier::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let corrupt = |problem: String| Error::Corrupt {
        url: tier.url().to_string(),
        name: name.to_string(),
        problem,
    };
    let record: T = crate::record::decode_record(&bytes, seq).map_err(corrupt)?;
    check(&record).map_err(corrupt)?;
    Ok(Some(record))
}

/// The checkpoints after `seq`, newest first (one listing).
pub(crate) fn checkpoints_after(tier: &RemoteTier, seq: u64) -> Result<Vec<u64>> {
    let listed = if seq == 0 {
        tier.list(CHECKPOINTS)?
    } else {
        tier.list_after(CHECKPOINTS, &checkpoint_name(seq))?
    };
    let mut seqs: Vec<u64> = listed
        .iter()
        .filter_map(|o| parse_record_name(CHECKPOINTS, &o.name))
        .filter(|&s| s > seq)
        .collect();
    seqs.sort_unstable_by(|a, b| b.cmp(a));
    seqs.dedup();
    Ok(seqs)
}

/// The newest checkpoint after `seq` that reads, if any. One that is gone
/// by the time it is read (gc removed it after writing a newer one) is
/// passed over for the next listing; one that does not check is an error
/// naming it.
pub(crate) fn newest_checkpoint_after(tier: &RemoteTier, seq: u64) -> Result<Option<Checkpoint>> {
    for _ in 0..3 {
        let seqs = checkpoints_after(tier, seq)?;
        if seqs.is_empty() {
            return Ok(None);
        }
        for s in seqs {
            if let Some(c) = read_checkpoint(tier, s)? {
                return Ok(Some(c));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log id.
    const LOG: &str = "0123456789abcdef0123456789abcdef";

    fn piece(path: &str, offset: u64, size: u64) -> Piece {
        Piece {
            path: path.into(),
            offset,
            size,
            blake3: blake3::hash(b"x").to_hex().to_string(),
            replace: false,
            blocks: None,
        }
    }

    #[test]
    fn record_names_carry_their_number() {
        assert_eq!(parse_record_name(COMMITS, &commit_name(7)), Some(7));
        assert_eq!(
            parse_record_name(CHECKPOINTS, &checkpoint_name(u64::MAX)),
            Some(u64::MAX)
        );
        for bad in [
            "commits/7.json",
            "commits/99999999999999999999.json",
            "checkpoints/00000000000000000007.json",
        ] {
            assert_eq!(parse_record_name(COMMITS, bad), None, "{bad}");
        }
    }

    #[test]
    fn paths_leaving_the_cache_are_refused_in_pieces_and_removals() {
        for bad in [
            "../x",
            "/etc/passwd",
            "a/./b",
            "a//b",
            "a/../../x",
            "",
            ".",
            ".cachex-remote/applied.jsonl",
            "a\\..\\b",
        ] {
            let c = Commit {
                version: COMMIT_VERSION,
                seq: 1,
                writer: "w".into(),
                pieces: vec![piece(bad, 0, 1)],
                removed: vec![],
                log: LOG.into(),
            };
            assert!(check_commit(&c).is_err(), "{bad:?}");
            let c = Commit {
                pieces: vec![],
                removed: vec![bad.into()],
                ..c
            };
            assert!(check_commit(&c).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn huge_ranges_and_gapped_checkpoints_are_refused() {
        let c = Commit {
            version: COMMIT_VERSION,
            seq: 1,
            writer: "w".into(),
            pieces: vec![piece("a", u64::MAX - 1, 10)],
            removed: vec![],
            log: LOG.into(),
        };
        assert!(check_commit(&c).is_err());
        let c = Commit {
            pieces: vec![piece("a", 1 << 63, 1)],
            ..c
        };
        assert!(check_commit(&c).is_err());
        let cp = Checkpoint {
            version: CHECKPOINT_VERSION,
            seq: 3,
            writer: "w".into(),
            pieces: vec![piece("a", 0, 10), piece("a", 12, 1)],
        };
        assert!(check_checkpoint(&cp).unwrap_err().contains("ends at 10"));
        let written_and_removed = Commit {
            version: COMMIT_VERSION,
            seq: 1,
            writer: "w".into(),
            pieces: vec![piece("a", 0, 1)],
            removed: vec!["a".into()],
            log: LOG.into(),
        };
        assert!(check_commit(&written_and_removed).is_err());
    }
}

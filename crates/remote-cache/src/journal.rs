//! [`RemoteDir`]: a local working directory kept in step with a commit log
//! in object storage — materialised from it on open and on
//! [`refresh`](RemoteDir::refresh), published to it by
//! [`publish`](RemoteDir::publish).
//!
//! The stores write files that are immutable (segments, shards, `.bin`
//! arrays, page files), append-only (index logs) or replaced whole by a
//! rename (`metadata.json`). A commit therefore lists *pieces*: the bytes
//! `offset..offset + size` of a file, stored under their BLAKE3, either
//! extending the file or (`replace`) standing for all of it. Publishing
//! costs O(new bytes); a reader applies only the commits after the last
//! one it saw.
//!
//! ```text
//! <url>/objects/<blake3 hex>          one piece's bytes
//! <url>/commits/<seq, 20 digits>.json
//!     {"version":2,"seq":N,"writer":"<host-pid-time>",
//!      "pieces":[{"path","offset","size","blake3","replace","blocks"?}],
//!      "checksum":"<BLAKE3 of the record without it>"}  (version 1: none)
//!     "blocks" (optional): {"version":1,"block_size":B,"blake3":["<hex>", ...]}
//! <work dir>/.cachex-remote/
//!   lock                              flock: one handle per working directory
//!   applied.jsonl                     per applied commit: seq, each file's length and inode
//!   blocks/<blake3>.json              the block list of each linked file that has one
//! ```
//!
//! **Block lists.** A piece that is a whole file readers may read by
//! blocks (`.bin` arrays, page files: any whole file larger than the
//! publisher's tier fetches whole, and those its `by_blocks` picks — which
//! files a reader links is the reader's choice, so the publisher does not
//! rely on knowing it) carries the BLAKE3 of each `block_size`-byte block
//! of it: the last may be short; `block_size` is the publisher's tier
//! block size, or the store's own for files it reads in small parts
//! (`StoreFiles::block_size`: segments, 4 KiB, up to 2^18 hashes a
//! commit), doubled as needed to keep at most
//! `remote_tier::blocks::MAX_BLOCKS` blocks. A reader links a file with
//! a block size of its store's own whatever its size. It lives inside the piece,
//! so it is committed atomically with it and read with the one GET of the
//! commit; the field is optional, so commits without it (published before
//! it existed) still read, and readers that do not know it ignore it. The
//! list has its own version: a reader that meets a newer one refuses the
//! commit ([`Error::Corrupt`]), as it does a list whose count does not
//! match `size` and `block_size`, a hash that is not 32 bytes of hex, a
//! block size outside 4 KiB..=64 MiB, or a list on bytes appended to a file.
//! A reader that links the file fetches it in the list's block size (one
//! sparse local file, zero-copy as before) and checks every block against
//! its hash before it is kept (see `remote_tier::RemoteTier::open_verified`);
//! a file without a list is checked by size and etag as its blocks arrive.
//! The list is kept in the state directory so that the file, linked again
//! on the next open, is checked the same way without reading its commit.
//!
//! Rules that make it safe:
//! - **Commit last, conditionally.** Pieces are uploaded first; the commit
//!   record is created with `PutMode::Create` under the next sequence
//!   number. A writer killed before that leaves only unreferenced objects:
//!   the remote cache stays at its last commit.
//! - **No file claimed twice.** Before it commits, and again each time
//!   another writer took the number it tried, a writer applies the
//!   commits it has not seen. One that writes a file this writer changed
//!   locally and has not published is a [`Error::Conflict`]: of two
//!   writers that claimed one segment id, exactly one publishes.
//! - **Numbers without gaps.** A writer claims `seq + 1` only after it
//!   applied `seq`, so the commits are `1..=N` and a reader learns that
//!   nothing newer exists from one GET of `N + 1` that finds nothing (no
//!   listing). A commit taken meanwhile is either found by that GET or
//!   published after it: a reader never sees a later commit without the
//!   earlier ones.
//! - **Never half a commit.** A reader applies whole commits in sequence
//!   order, every piece verified against its BLAKE3 (or, for files read by
//!   blocks, each block against its own BLAKE3 as it is fetched — or its
//!   size and etag, for commits without a block list), and records each
//!   applied commit only after its files are durable; re-applying one
//!   after a crash finds the bytes in place and skips them.
//! - **Read by blocks.** Large files a store maps and reads in parts
//!   (`.bin` arrays, page files) may be left in the local tier as sparse
//!   files, linked into the working directory; [`RemoteDir::ensure`]
//!   fetches the blocks of a byte range before the store reads it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use durable_fs::FileLock;
use remote_tier::{BlockHasher, BlockHashes, BlockList, Expected, RemoteFile, RemoteTier};
use serde::{Deserialize, Serialize};

use crate::files::StoreFiles;
use crate::{Error, Result, prefetch};

/// Where piece objects live under the URL.
pub const OBJECTS: &str = "objects";
/// Where commit records live under the URL.
pub const COMMITS: &str = "commits";
/// The commit record format version: 2 carries a checksum of the record
/// (`remote_tier::record`); 1, without it, is still read.
pub const COMMIT_VERSION: u32 = 2;
/// The local state directory inside a working directory (never published).
pub const STATE_DIR: &str = ".cachex-remote";
/// A commit record is never larger than this.
const MAX_COMMIT: usize = 64 << 20;
/// How often a publisher tries the next number when others take its own.
const MAX_COMMIT_RACES: u32 = 64;
/// The most block hashes one commit lists in the block sizes stores ask
/// for (`StoreFiles::block_size`): about 17 MB of the record (a quarter of
/// [`MAX_COMMIT`]), 1 GiB of segments in 4 KiB blocks.
const STORE_BLOCK_HASHES: u64 = 1 << 18;
/// Pieces up to this size are read into memory and sent in one request.
const IN_MEMORY_PIECE: u64 = 64 << 20;

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
    /// fixed-size block, checked as each block is fetched. Absent in
    /// commits published before it existed (those blocks are checked by
    /// size and etag, the file by its BLAKE3 once all of it is local).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<BlockList>,
}

/// One commit record.
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
}

impl remote_tier::record::SeqRecord for Commit {
    const KIND: &'static str = "commit record";
    const VERSION: u32 = COMMIT_VERSION;
    const MIN_VERSION: u32 = 1;
    const CHECKSUMMED_FROM: u32 = 2;
    const MAX_BYTES: usize = MAX_COMMIT;
    fn version(&self) -> u32 {
        self.version
    }
    fn seq(&self) -> u64 {
        self.seq
    }
}

/// What [`RemoteDir::refresh`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefreshReport {
    /// The last commit applied (0: none published).
    pub seq: u64,
    /// Commits applied by this call.
    pub commits: u64,
    /// Pieces whose bytes were written locally (the others were in place
    /// or are read by blocks).
    pub fetched: u64,
}

/// What [`RemoteDir::publish`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// The commit written, or `None` when there was nothing new.
    pub seq: Option<u64>,
    /// Pieces in it.
    pub pieces: u64,
    /// Pieces uploaded (the others were in the store already).
    pub uploaded: u64,
    /// Bytes uploaded.
    pub bytes_uploaded: u64,
}

/// A local file as this handle last left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Known {
    /// Its length.
    len: u64,
    /// Its inode; 0 for a file read by blocks (a link into the tier).
    ino: u64,
    /// A file read by blocks whose commit recorded a block list: kept in
    /// `.cachex-remote/blocks/<blake3>.json` for when the file is linked
    /// again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    blocks: bool,
}

/// One line of `applied.jsonl`.
#[derive(Debug, Serialize, Deserialize)]
struct Applied {
    seq: u64,
    files: BTreeMap<String, Known>,
}

#[derive(Debug)]
struct State {
    seq: u64,
    files: HashMap<String, Known>,
    by_blocks: HashMap<String, RemoteFile>,
    log: File,
    /// The length of `log`'s whole records: a failed append is cut back
    /// to it.
    log_len: u64,
}

/// A local working directory materialised from, and published to, a
/// commit log at an object-store URL (see the [module docs](self)).
#[derive(Debug)]
pub struct RemoteDir {
    tier: RemoteTier,
    dir: PathBuf,
    writer: String,
    files: StoreFiles,
    state: Mutex<State>,
    _lock: FileLock,
}

impl RemoteDir {
    /// Opens the working directory `dir` (created if needed) for the
    /// commit log at `tier`'s URL and applies every commit not applied
    /// there yet. `files` says which of the store's files are read by
    /// blocks and which never travel.
    pub fn open(tier: RemoteTier, dir: &Path, files: StoreFiles) -> Result<RemoteDir> {
        let remote = RemoteDir::open_unapplied(tier, dir, files)?;
        remote.refresh()?;
        Ok(remote)
    }

    /// Opens the working directory `dir` as [`open`](RemoteDir::open)
    /// does, but applies nothing: it holds the commits applied there
    /// before. The caller learns what was published since with
    /// [`fetch_next`](RemoteDir::fetch_next) and applies it with
    /// [`refresh_from`](RemoteDir::refresh_from) — meanwhile it may read
    /// the directory (a reader opening its store), since nothing changes
    /// there until then.
    pub fn open_unapplied(
        tier: RemoteTier,
        dir: &Path,
        store_files: StoreFiles,
    ) -> Result<RemoteDir> {
        let state_dir = dir.join(STATE_DIR);
        std::fs::create_dir_all(&state_dir).map_err(Error::io("create directory", &state_dir))?;
        let lock =
            FileLock::try_exclusive(&state_dir.join("lock"))?.ok_or_else(|| Error::Busy {
                path: dir.to_path_buf(),
            })?;
        let log_path = state_dir.join("applied.jsonl");
        let (seq, files, log_len) = read_applied(&log_path)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(Error::io("open", &log_path))?;
        let on_disk = log.metadata().map_err(Error::io("stat", &log_path))?.len();
        if on_disk != log_len {
            cut_log(&log, &log_path, log_len)?;
        }
        let writer = format!(
            "{}-{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "host".into()),
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        let remote = RemoteDir {
            tier,
            dir: dir.to_path_buf(),
            writer,
            files: store_files,
            state: Mutex::new(State {
                seq,
                files,
                by_blocks: HashMap::new(),
                log,
                log_len,
            }),
            _lock: lock,
        };
        {
            let mut state = remote.lock();
            // Files read by blocks are links into the tier: open (pin) each
            // again, since the tier may have evicted it while nobody had it.
            let linked: Vec<String> = state
                .files
                .iter()
                .filter(|(_, k)| k.ino == 0)
                .map(|(p, _)| p.clone())
                .collect();
            for path in linked {
                remote.relink(&mut state, &path)?;
            }
        }
        Ok(remote)
    }

    /// The commit after the last one applied, fetched and checked but not
    /// applied (`None`: nothing newer was published). No lock is held
    /// while it waits for the server.
    pub fn fetch_next(&self) -> Result<Option<Commit>> {
        let seq = self.lock().seq;
        self.read_after(seq)
    }

    /// Applies `next` (an answer of [`fetch_next`](RemoteDir::fetch_next))
    /// and every commit published after it, as
    /// [`refresh`](RemoteDir::refresh) does; `None` applies nothing. A
    /// commit this handle applied meanwhile is not applied twice.
    pub fn refresh_from(&self, next: Option<Commit>) -> Result<RefreshReport> {
        let mut state = self.lock();
        let next = match next {
            Some(c) if Some(c.seq) == state.seq.checked_add(1) => Some(c),
            Some(_) => self.read_after(state.seq)?,
            None => None,
        };
        self.apply_from(&mut state, next)
    }

    /// The working directory the store opens.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The tier (URL and local tier) behind it.
    pub fn tier(&self) -> &RemoteTier {
        &self.tier
    }

    /// The last commit applied here (0: none).
    pub fn seq(&self) -> u64 {
        self.lock().seq
    }

    /// Applies the commits published since the last one applied: their
    /// files appear in the working directory, whole commits at a time.
    /// Cost: one GET per new commit and one for the number after the last
    /// (the answer that nothing newer was published), plus the new bytes.
    pub fn refresh(&self) -> Result<RefreshReport> {
        let mut state = self.lock();
        self.refresh_locked(&mut state)
    }

    /// Publishes what the store wrote in the working directory since the
    /// last commit (new files, bytes appended, files replaced): pieces
    /// first, then the commit record, conditionally, under the next
    /// sequence number. Call it only after the store made its files
    /// durable (a flush). Commits of other writers are applied first;
    /// one that wrote a file this writer also changed is an
    /// [`Error::Conflict`] and nothing of this writer's is committed.
    pub fn publish(&self) -> Result<PublishReport> {
        let mut state = self.lock();
        self.refresh_locked(&mut state)?;
        let (pieces, after) = self.changes(&state)?;
        let mut report = PublishReport {
            pieces: pieces.len() as u64,
            ..PublishReport::default()
        };
        if pieces.is_empty() {
            return Ok(report);
        }
        for (piece, source) in &pieces {
            if let Some(bytes) = self.upload(piece, source)? {
                report.uploaded += 1;
                report.bytes_uploaded += bytes;
            }
        }
        let pieces: Vec<Piece> = pieces.into_iter().map(|(p, _)| p).collect();
        for _ in 0..MAX_COMMIT_RACES {
            let seq = state.seq.checked_add(1).ok_or_else(|| Error::Corrupt {
                url: self.tier.url().to_string(),
                name: commit_name(state.seq),
                problem: "the last sequence number there is: no commit can follow".into(),
            })?;
            let commit = Commit {
                version: COMMIT_VERSION,
                seq,
                writer: self.writer.clone(),
                pieces: pieces.clone(),
            };
            let name = commit_name(seq);
            let bytes =
                remote_tier::record::encode_record(&commit).map_err(|e| Error::Corrupt {
                    url: self.tier.url().to_string(),
                    name: name.clone(),
                    problem: format!("cannot encode the commit: {e}"),
                })?;
            match self.tier.commit(&name, bytes) {
                Ok(()) => {
                    self.record(&mut state, seq, after)?;
                    report.seq = Some(seq);
                    return Ok(report);
                }
                // Another writer took the number: learn its commit (which
                // also tells whether it claimed one of our files) and try
                // the next.
                Err(remote_tier::Error::CommitTaken { .. }) => {
                    self.refresh_locked(&mut state)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(remote_tier::Error::CommitTaken {
            url: self.tier.url().to_string(),
            name: format!(
                "{COMMITS}/ ({MAX_COMMIT_RACES} sequence numbers taken by other writers meanwhile)"
            ),
        }
        .into())
    }

    /// Makes the bytes `range` of `path` local (a no-op for files copied
    /// whole): call before the store reads them from a file read by blocks.
    pub fn ensure(&self, path: &str, range: Range<u64>) -> Result<()> {
        let file = self.lock().by_blocks.get(path).cloned();
        match file {
            Some(f) => Ok(f.ensure(range)?),
            None => Ok(()),
        }
    }

    /// The tier object that `path`, a file read by blocks, is linked to
    /// now (`None` for files copied whole). A store that maps `path` keeps
    /// it and ensures through it: the handle keeps that copy from eviction
    /// and fetches into the very file mapped, whatever a later commit
    /// links `path` to.
    pub fn object(&self, path: &str) -> Option<RemoteFile> {
        self.lock().by_blocks.get(path).cloned()
    }

    /// Whether `path` is read by blocks (a link into the local tier).
    pub fn is_by_blocks(&self, path: &str) -> bool {
        self.lock().by_blocks.contains_key(path)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn refresh_locked(&self, state: &mut State) -> Result<RefreshReport> {
        let next = self.read_after(state.seq)?;
        self.apply_from(state, next)
    }

    /// Applies `next`, the commit after `state`'s last, and the ones after.
    fn apply_from(&self, state: &mut State, mut next: Option<Commit>) -> Result<RefreshReport> {
        let mut report = RefreshReport {
            seq: state.seq,
            ..RefreshReport::default()
        };
        // Commits are numbered without gaps (a writer claims `seq + 1` only
        // once it has applied `seq`), so the first number that is not there
        // ends the log: one GET finds the next commit, or that there is
        // none, where a listing would cost a LIST and then a GET.
        while let Some(commit) = next {
            let seq = commit.seq;
            let (files, fetched) = self.apply(state, &commit)?;
            self.record(state, seq, files)?;
            report.commits += 1;
            report.fetched += fetched;
            report.seq = seq;
            next = self.read_after(state.seq)?;
        }
        if report.commits > 0 {
            self.prune_block_lists(state);
        }
        if report.fetched > 0 {
            // Copies made while still open were kept over budget; the
            // working directory holds those bytes now.
            self.tier.evict()?;
        }
        Ok(report)
    }

    /// The commit after `seq`, if published (none follows `u64::MAX`).
    fn read_after(&self, seq: u64) -> Result<Option<Commit>> {
        match seq.checked_add(1) {
            Some(next) => self.read_commit(next),
            None => Ok(None),
        }
    }

    /// Reads and checks commit `seq`; `None` when it was not published.
    fn read_commit(&self, seq: u64) -> Result<Option<Commit>> {
        let name = commit_name(seq);
        let bytes = match self.tier.read_remote_capped(&name, MAX_COMMIT as u64) {
            Ok(b) => b,
            Err(remote_tier::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let corrupt = |problem: String| Error::Corrupt {
            url: self.tier.url().to_string(),
            name: name.clone(),
            problem,
        };
        let c: Commit = remote_tier::record::decode_record(&bytes, seq).map_err(corrupt)?;
        for p in &c.pieces {
            if !remote_tier::record::is_relative_inside(&p.path) || p.path.starts_with(STATE_DIR) {
                return Err(corrupt(format!(
                    "`{}` is not a relative path inside the cache",
                    p.path
                )));
            }
            if blake3::Hash::from_hex(&p.blake3).is_err() {
                return Err(corrupt(format!(
                    "{}: `{}` is not a BLAKE3 hash",
                    p.path, p.blake3
                )));
            }
            if p.offset.checked_add(p.size).is_none() || (p.replace && p.offset != 0) {
                return Err(corrupt(format!(
                    "{}: bad range {}+{}",
                    p.path, p.offset, p.size
                )));
            }
            if let Some(list) = &p.blocks {
                if p.offset != 0 {
                    return Err(corrupt(format!(
                        "{}: a block list on bytes that do not start the file (offset {})",
                        p.path, p.offset
                    )));
                }
                list.check(p.size)
                    .map_err(|problem| corrupt(format!("{}: {problem}", p.path)))?;
            }
        }
        Ok(Some(c))
    }

    /// Applies one commit's pieces; returns the files it left and how many
    /// pieces were written locally.
    fn apply(&self, state: &mut State, c: &Commit) -> Result<(BTreeMap<String, Known>, u64)> {
        let mut files = BTreeMap::new();
        let mut fetched = 0;
        let (ahead, ahead_of) = self.fetched_whole(c);
        let windows = prefetch::windows(&ahead, self.tier.config().budget_bytes);
        let mut next_window = 0;
        for (i, p) in c.pieces.iter().enumerate() {
            if let (Some(k), Some(w)) = (ahead_of[i], windows.get(next_window))
                && k == w.start
            {
                prefetch::fetch_window(&self.tier, &ahead[w.clone()]);
                next_window += 1;
            }
            let local = self.dir.join(&p.path);
            let end = p.offset + p.size;
            let known = state.files.get(&p.path).copied();
            // A link into the tier is never local work: a new piece for its
            // path replaces it (or, re-applied after a crash, relinks it).
            let meta = std::fs::symlink_metadata(&local)
                .ok()
                .filter(|m| !m.file_type().is_symlink());
            if meta.is_none() && known.is_none_or(|k| k.ino == 0) {
                state.by_blocks.remove(&p.path);
            }
            // A re-applied commit (a crash before it was recorded): the
            // bytes are in place already.
            if let Some(m) = &meta
                && m.is_file()
                && m.len() >= end
                && (!p.replace || m.len() == end)
                && hash_range(&local, p.offset, p.size)? == p.blake3
            {
                let k = Known {
                    len: m.len().max(known.map_or(0, |k| k.len)),
                    ino: m.ino(),
                    blocks: false,
                };
                state.files.insert(p.path.clone(), k);
                files.insert(p.path.clone(), k);
                continue;
            }
            // Local bytes not published by this handle: another writer wrote
            // a file this one also writes.
            let unpublished = match (&meta, known) {
                (None, _) => false,
                (Some(_), Some(k)) if k.ino == 0 => true,
                (Some(m), Some(k)) => m.ino() != k.ino || m.len() != k.len,
                (Some(_), None) => true,
            };
            if unpublished {
                return Err(Error::Conflict {
                    url: self.tier.url().to_string(),
                    path: p.path.clone(),
                    seq: c.seq,
                    writer: c.writer.clone(),
                });
            }
            let object = format!("{OBJECTS}/{}", p.blake3);
            let new_file = meta.is_none() || p.replace;
            if new_file && self.linked(p) {
                let hashes = match &p.blocks {
                    Some(list) => Some(self.keep_block_list(c.seq, p, list)?),
                    None => None,
                };
                let k = Known {
                    len: p.size,
                    ino: 0,
                    blocks: hashes.is_some(),
                };
                self.link(state, &p.path, &object, k, hashes)?;
                files.insert(p.path.clone(), k);
                continue;
            }
            if known.is_some_and(|k| k.ino == 0) && !p.replace {
                return Err(Error::Corrupt {
                    url: self.tier.url().to_string(),
                    name: commit_name(c.seq),
                    problem: format!("{}: a file published whole grew afterwards", p.path),
                });
            }
            let expected = Expected {
                size: Some(p.size),
                blake3: Some(*parse_hash(&self.tier, &p.blake3)?.as_bytes()),
            };
            let have = meta.as_ref().map_or(0, |m| m.len());
            if !new_file && p.offset != have {
                return Err(Error::Corrupt {
                    url: self.tier.url().to_string(),
                    name: commit_name(c.seq),
                    problem: format!(
                        "{}: appends at byte {} to a file of {have} bytes here",
                        p.path, p.offset
                    ),
                });
            }
            if new_file && p.offset != 0 {
                return Err(Error::Corrupt {
                    url: self.tier.url().to_string(),
                    name: commit_name(c.seq),
                    problem: format!(
                        "{}: starts at byte {}, but the file is not here",
                        p.path, p.offset
                    ),
                });
            }
            let source = if p.size == 0 {
                None
            } else {
                Some(self.tier.fetch(&object, &expected)?)
            };
            let ino = if new_file {
                write_new(&local, source.as_ref(), p.size)?
            } else {
                append(&local, source.as_ref(), p.offset, p.size)?
            };
            fetched += 1;
            let k = Known {
                len: end,
                ino,
                blocks: false,
            };
            state.files.insert(p.path.clone(), k);
            files.insert(p.path.clone(), k);
        }
        Ok((files, fetched))
    }

    /// The objects of `c` that applying it will fetch whole (not linked to
    /// be read by blocks, not already in place), with their sizes; and for
    /// each piece, its index in that list.
    fn fetched_whole(&self, c: &Commit) -> (Vec<(prefetch::Ahead, u64)>, Vec<Option<usize>>) {
        let mut ahead = Vec::new();
        let of = c
            .pieces
            .iter()
            .map(|p| {
                let linked = self.linked(p);
                let local = self.dir.join(&p.path);
                if p.size == 0 || linked || prefetch::in_place(&local, p.offset + p.size) {
                    return None;
                }
                let hash = parse_hash(&self.tier, &p.blake3).ok()?;
                ahead.push((
                    prefetch::Ahead {
                        object: format!("{OBJECTS}/{}", p.blake3),
                        expected: Expected {
                            size: Some(p.size),
                            blake3: Some(*hash.as_bytes()),
                        },
                    },
                    p.size,
                ));
                Some(ahead.len() - 1)
            })
            .collect();
        (ahead, of)
    }

    /// Whether piece `p` is linked into the tier and read by blocks rather
    /// than copied whole: a whole file the store reads by blocks, larger
    /// than the tier fetches whole or read in blocks of its own size.
    fn linked(&self, p: &Piece) -> bool {
        p.offset == 0
            && p.size > 0
            && (self.files.by_blocks)(&p.path, p.size)
            && (p.size > self.tier_whole_max()
                || (self.files.block_size)(&p.path, p.size).is_some())
    }

    fn tier_whole_max(&self) -> u64 {
        // The tier fetches objects up to its whole-file size in one piece;
        // only larger ones are worth reading by blocks.
        self.tier.config().whole_file_max
    }

    /// Keeps the checked block list of piece `p` (of commit `seq`) in the
    /// state directory, durably, for when its file is linked again after
    /// this commit was recorded as applied.
    fn keep_block_list(&self, seq: u64, p: &Piece, list: &BlockList) -> Result<Arc<BlockHashes>> {
        let hashes = list.check(p.size).map_err(|problem| Error::Corrupt {
            url: self.tier.url().to_string(),
            name: commit_name(seq),
            problem: format!("{}: {problem}", p.path),
        })?;
        let path = self.block_list_path(&p.blake3);
        let dir = durable_fs::parent_dir(&path).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(Error::io("create directory", &dir))?;
        let bytes = serde_json::to_vec(list).map_err(|e| Error::Corrupt {
            url: self.dir.display().to_string(),
            name: path.display().to_string(),
            problem: format!("cannot encode the block list: {e}"),
        })?;
        durable_fs::write_atomic(&path, &bytes)?;
        Ok(Arc::new(hashes))
    }

    /// Where the block list of the piece `blake3` is kept locally.
    fn block_list_path(&self, blake3: &str) -> PathBuf {
        self.dir
            .join(STATE_DIR)
            .join("blocks")
            .join(format!("{blake3}.json"))
    }

    /// The block list kept for the piece `blake3` of `size` bytes.
    fn kept_block_list(&self, blake3: &str, size: u64) -> Result<Arc<BlockHashes>> {
        let path = self.block_list_path(blake3);
        let corrupt = |problem: String| Error::Corrupt {
            url: self.dir.display().to_string(),
            name: path.display().to_string(),
            problem,
        };
        let bytes = durable_fs::read_capped(&path, MAX_COMMIT as u64)
            .map_err(|e| corrupt(format!("the block list of a linked file: {e}")))?;
        let list: BlockList = serde_json::from_slice(&bytes)
            .map_err(|e| corrupt(format!("not a block list: {e}")))?;
        Ok(Arc::new(list.check(size).map_err(corrupt)?))
    }

    /// Removes the kept block lists that no linked file uses any more (a
    /// commit replaced the file). Only once every linked file with a list
    /// is open here, so a list still needed is never taken for garbage.
    fn prune_block_lists(&self, state: &State) {
        let mut used = HashSet::new();
        for (path, k) in &state.files {
            if !k.blocks {
                continue;
            }
            let object = state.by_blocks.get(path).map(|f| f.name());
            match object.and_then(|o| o.strip_prefix(&format!("{OBJECTS}/"))) {
                Some(blake3) => used.insert(format!("{blake3}.json")),
                None => return,
            };
        }
        let dir = self.dir.join(STATE_DIR).join("blocks");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".json") && !used.contains(&name) {
                // Garbage either way: a failed removal is retried by the
                // next commit applied.
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// Opens `object` through the tier (pinned while this handle lives;
    /// every block checked against `hashes` when given) and links `path`
    /// to its local file.
    fn link(
        &self,
        state: &mut State,
        path: &str,
        object: &str,
        known: Known,
        hashes: Option<Arc<BlockHashes>>,
    ) -> Result<()> {
        let size = known.len;
        let file = match hashes {
            // Read in blocks of the store's own size: sparse whatever its size.
            Some(h) if (self.files.block_size)(path, size).is_some() => {
                self.tier.open_by_blocks(object, h)?
            }
            Some(h) => self.tier.open_verified(object, h)?,
            None => self.tier.open_object(object)?,
        };
        if file.len() != size {
            return Err(remote_tier::Error::Corrupt {
                url: self.tier.url().to_string(),
                name: object.to_string(),
                problem: format!("{} bytes, the commit says {size}", file.len()),
            }
            .into());
        }
        let local = self.dir.join(path);
        // An absolute target: the working directory and the tier may be
        // named relative to different places.
        let target =
            std::fs::canonicalize(file.path()).map_err(Error::io("resolve", file.path()))?;
        // A warm open finds the link in place (made durable when it was
        // made): no new link, no directory fsync.
        if std::fs::read_link(&local).ok().as_deref() != Some(target.as_path()) {
            let parent = durable_fs::parent_dir(&local).to_path_buf();
            std::fs::create_dir_all(&parent).map_err(Error::io("create directory", &parent))?;
            let tmp = durable_fs::unique_temp_path(&parent, "link");
            std::os::unix::fs::symlink(&target, &tmp).map_err(Error::io("symlink", &tmp))?;
            durable_fs::rename_and_sync(&tmp, &local)?;
        }
        state.files.insert(path.to_string(), known);
        state.by_blocks.insert(path.to_string(), file);
        Ok(())
    }

    /// Re-opens a file read by blocks (on open: the tier may have evicted
    /// it, or moved it) and points its link at the local copy.
    fn relink(&self, state: &mut State, path: &str) -> Result<()> {
        let local = self.dir.join(path);
        let target = std::fs::read_link(&local).ok();
        let name = target
            .as_ref()
            .and_then(|t| t.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // The tier names local copies by the escaped object name.
        let object = name
            .strip_suffix(".sparse")
            .or_else(|| name.strip_suffix(".whole"))
            .map(|k| k.replace("%2F", "/").replace("%25", "%"))
            .filter(|o| o.starts_with(&format!("{OBJECTS}/")));
        let Some(object) = object else {
            return Err(Error::Corrupt {
                url: self.dir.display().to_string(),
                name: path.to_string(),
                problem: "a file read by blocks that is no longer a link into the tier".into(),
            });
        };
        let known = state.files.get(path).copied().unwrap_or(Known {
            len: 0,
            ino: 0,
            blocks: false,
        });
        // Linked by a handle whose store reads it by blocks, opened now by
        // one whose store maps it whole (another store kind on the URL's
        // working directory: `cachex inspect` after a Python reader): made
        // whole here, so no store maps bytes never fetched.
        if !(self.files.by_blocks)(path, known.len) {
            return self.make_whole(state, path, &object, known.len);
        }
        let hashes = if known.blocks {
            let blake3 = object
                .strip_prefix(&format!("{OBJECTS}/"))
                .unwrap_or_default();
            Some(self.kept_block_list(blake3, known.len)?)
        } else {
            None
        };
        self.link(state, path, &object, known, hashes)
    }

    /// Replaces the link `path` to `object` (`len` bytes) by a whole local
    /// copy, verified against the BLAKE3 the object is named by, and
    /// records it as a file of the working directory.
    fn make_whole(&self, state: &mut State, path: &str, object: &str, len: u64) -> Result<()> {
        let blake3 = object
            .strip_prefix(&format!("{OBJECTS}/"))
            .unwrap_or_default();
        let expected = Expected {
            size: Some(len),
            blake3: Some(*parse_hash(&self.tier, blake3)?.as_bytes()),
        };
        let copy = self.tier.fetch(object, &expected)?;
        let ino = write_new(&self.dir.join(path), Some(&copy), len)?;
        state.by_blocks.remove(path);
        let known = Known {
            len,
            ino,
            blocks: false,
        };
        let seq = state.seq;
        self.record(state, seq, BTreeMap::from([(path.to_string(), known)]))
    }

    /// Appends the applied commit to the local record (after its files are
    /// durable) and takes its files as known.
    fn record(&self, state: &mut State, seq: u64, files: BTreeMap<String, Known>) -> Result<()> {
        for (path, k) in &files {
            state.files.insert(path.clone(), *k);
        }
        let mut line = serde_json::to_vec(&Applied { seq, files }).map_err(|e| Error::Corrupt {
            url: self.dir.display().to_string(),
            name: "applied.jsonl".into(),
            problem: e.to_string(),
        })?;
        line.push(b'\n');
        let path = self.dir.join(STATE_DIR).join("applied.jsonl");
        let written = state
            .log
            .write_all(&line)
            .map_err(Error::io("append", &path))
            .and_then(|()| state.log.sync_data().map_err(Error::io("fsync", &path)));
        if let Err(e) = written {
            // Half a record must not stay in front of the next one; if
            // even the cut fails, the next open cuts it.
            let _ = cut_log(&state.log, &path, state.log_len);
            return Err(e);
        }
        state.log_len += line.len() as u64;
        state.seq = seq;
        Ok(())
    }

    /// The pieces that publish what changed locally, with the file handle
    /// each is read from, and the files as they will be once committed.
    #[allow(clippy::type_complexity)]
    fn changes(
        &self,
        state: &State,
    ) -> Result<(Vec<(Piece, (File, PathBuf))>, BTreeMap<String, Known>)> {
        let mut pieces = Vec::new();
        let mut after = BTreeMap::new();
        // Block hashes listed in this commit in a store's own block size.
        let mut listed = 0u64;
        for (rel, path) in local_files(&self.dir, self.files.private)? {
            let file = File::open(&path).map_err(Error::io("open", &path))?;
            let m = file.metadata().map_err(Error::io("stat", &path))?;
            let (len, ino) = (m.len(), m.ino());
            let known = state.files.get(&rel).copied();
            let (offset, replace) = match known {
                Some(k) if k.ino == 0 => continue,
                Some(k) if k.ino == ino && k.len == len => continue,
                Some(k) if k.ino == ino && len > k.len => (k.len, false),
                Some(_) => (0, true),
                None => (0, false),
            };
            let size = len - offset;
            // Whole files a reader may read by blocks get a hash per block,
            // in the same pass, so each block can be checked as it arrives.
            // Which files a reader links is its own choice (its store, its
            // tier's whole-file size), so every whole file this tier would
            // not fetch whole gets one, besides those `by_blocks` picks.
            let may_link = (self.files.by_blocks)(&rel, size) || size > self.tier_whole_max();
            let block_size = if offset == 0 && size > 0 && may_link {
                // A store's small blocks cost a hash each in the record:
                // past a budget the rest get the tier's, so that a large
                // publish stays a record every reader accepts.
                let wanted = (self.files.block_size)(&rel, size)
                    .filter(|b| listed + size.div_ceil(*b) <= STORE_BLOCK_HASHES);
                listed += wanted.map_or(0, |b| size.div_ceil(b));
                BlockHashes::block_size_for(size, wanted.unwrap_or(self.tier.config().block_size))
            } else {
                None
            };
            let (hash, blocks) = hash_open(&file, &path, offset, size, block_size)?;
            pieces.push((
                Piece {
                    path: rel.clone(),
                    offset,
                    size,
                    blake3: hash,
                    replace,
                    blocks: blocks.map(|b| b.to_list()),
                },
                (file, path),
            ));
            after.insert(
                rel,
                Known {
                    len,
                    ino,
                    blocks: false,
                },
            );
        }
        // Whole new files before the bytes appended to logs that point at
        // them (readers apply in order).
        pieces.sort_by_key(|(p, _)| (p.offset != 0, p.path.clone()));
        Ok((pieces, after))
    }

    /// Uploads a piece unless its object exists; returns the bytes sent.
    fn upload(&self, piece: &Piece, (file, path): &(File, PathBuf)) -> Result<Option<u64>> {
        let object = format!("{OBJECTS}/{}", piece.blake3);
        match self.tier.head(&object) {
            Ok(info) if info.size == piece.size => return Ok(None),
            Ok(_) | Err(remote_tier::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if piece.size <= IN_MEMORY_PIECE || piece.offset != 0 {
            let mut bytes = vec![0u8; piece.size as usize];
            file.read_exact_at(&mut bytes, piece.offset)
                .map_err(Error::io("read", path))?;
            if blake3::hash(&bytes).to_hex().as_str() != piece.blake3 {
                return Err(changed(path));
            }
            self.tier.put_bytes(&object, bytes)?;
        } else {
            let sent = self.tier.put_file(&object, path)?;
            let now = std::fs::metadata(path).map_err(Error::io("stat", path))?;
            let then = file.metadata().map_err(Error::io("stat", path))?;
            if sent != piece.size || now.ino() != then.ino() {
                return Err(changed(path));
            }
        }
        Ok(Some(piece.size))
    }
}

fn changed(path: &Path) -> Error {
    Error::io("read (the file changed while it was published)", path)(
        std::io::ErrorKind::InvalidData.into(),
    )
}

/// The name of commit `seq`.
pub fn commit_name(seq: u64) -> String {
    format!("{COMMITS}/{seq:020}.json")
}

fn parse_hash(tier: &RemoteTier, hex: &str) -> Result<blake3::Hash> {
    blake3::Hash::from_hex(hex).map_err(|e| Error::Corrupt {
        url: tier.url().to_string(),
        name: hex.to_string(),
        problem: format!("not a BLAKE3 hash: {e}"),
    })
}

/// The applied commits recorded in a working directory: the last seq,
/// each file as it was left, and the length of the log's whole lines. A
/// torn tail (a crash, or a failed write, while recording) ends the log
/// there: that commit is applied again, finding its bytes in place, and
/// the caller cuts the tail off so the next record does not land behind
/// it.
fn read_applied(path: &Path) -> Result<(u64, HashMap<String, Known>, u64)> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(Error::io("read", path)(e)),
    };
    let mut seq = 0;
    let mut files = HashMap::new();
    let mut good = 0usize;
    let mut rest = &bytes[..];
    // Only lines ended by their newline count: a record is written with
    // its newline in one write, so a line without one is torn.
    while let Some(end) = rest.iter().position(|&b| b == b'\n') {
        let line = &rest[..end];
        if !line.is_empty() {
            let Ok(a) = serde_json::from_slice::<Applied>(line) else {
                break;
            };
            seq = seq.max(a.seq);
            files.extend(a.files);
        }
        good += end + 1;
        rest = &rest[end + 1..];
    }
    Ok((seq, files, good as u64))
}

/// Cuts `log` (at `path`) back to `len` bytes, durably: what lies beyond
/// is a torn record.
fn cut_log(log: &File, path: &Path, len: u64) -> Result<()> {
    log.set_len(len).map_err(Error::io("truncate", path))?;
    log.sync_all().map_err(Error::io("fsync", path))?;
    Ok(())
}

/// Every file of `dir` a commit may hold, with its relative path: not the
/// state directory, locks, temporary files, links into the tier, or what
/// `private` names.
fn local_files(dir: &Path, private: fn(&str) -> bool) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(Error::io("list directory", &d))?;
        for entry in entries {
            let entry = entry.map_err(Error::io("list directory", &d))?;
            let path = entry.path();
            let kind = entry.file_type().map_err(Error::io("stat", &path))?;
            let Ok(rel) = path.strip_prefix(dir) else {
                continue;
            };
            let rel: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let rel = rel.join("/");
            if rel == STATE_DIR || private(&rel) {
                continue;
            }
            if kind.is_dir() {
                stack.push(path);
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if !kind.is_file() || name.ends_with(".lock") || name.ends_with(durable_fs::TMP_SUFFIX)
            {
                continue;
            }
            out.push((rel, path));
        }
    }
    out.sort();
    Ok(out)
}

/// BLAKE3 (hex) of `size` bytes of `path` at `offset`.
fn hash_range(path: &Path, offset: u64, size: u64) -> Result<String> {
    let file = File::open(path).map_err(Error::io("open", path))?;
    Ok(hash_open(&file, path, offset, size, None)?.0)
}

/// BLAKE3 (hex) of `size` bytes of `file` at `offset` and, given a block
/// size, the BLAKE3 of each block of them, in one read.
fn hash_open(
    file: &File,
    path: &Path,
    offset: u64,
    size: u64,
    block_size: Option<u64>,
) -> Result<(String, Option<BlockHashes>)> {
    let mut by_block = block_size.map(BlockHasher::new);
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; (1 << 20).min(size.max(1)) as usize];
    let mut at = offset;
    let end = offset + size;
    while at < end {
        let n = (end - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)
            .map_err(Error::io("read", path))?;
        hasher.update(&buf[..n]);
        if let Some(b) = &mut by_block {
            b.update(&buf[..n]);
        }
        at += n as u64;
    }
    let blocks = match by_block {
        Some(b) => Some(b.finalize().map_err(|problem| {
            Error::io("hash by blocks", path)(std::io::Error::other(problem))
        })?),
        None => None,
    };
    Ok((hasher.finalize().to_hex().to_string(), blocks))
}

/// Writes a new file (temp, fsync, rename, dir fsync) from `source`;
/// returns its inode.
fn write_new(dest: &Path, source: Option<&RemoteFile>, size: u64) -> Result<u64> {
    let parent = durable_fs::parent_dir(dest).to_path_buf();
    std::fs::create_dir_all(&parent).map_err(Error::io("create directory", &parent))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = durable_fs::unique_temp_path(&parent, &name);
    let out = durable_fs::create_temp(&tmp)?;
    let copied = match source {
        Some(src) => copy_at(src, &out, &tmp, 0, size),
        None => Ok(()),
    };
    let ino = out.metadata().map_err(Error::io("stat", &tmp))?.ino();
    if let Err(e) = copied.and_then(|()| Ok(durable_fs::commit_temp(out, &tmp, dest)?)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    durable_fs::sync_dir(&parent)?;
    Ok(ino)
}

/// Appends `size` bytes of `source` at `offset` of `dest`, fsynced;
/// returns its inode.
fn append(dest: &Path, source: Option<&RemoteFile>, offset: u64, size: u64) -> Result<u64> {
    let out = std::fs::OpenOptions::new()
        .write(true)
        .open(dest)
        .map_err(Error::io("open", dest))?;
    if let Some(src) = source {
        copy_at(src, &out, dest, offset, size)?;
    }
    out.sync_data().map_err(Error::io("fsync", dest))?;
    Ok(out.metadata().map_err(Error::io("stat", dest))?.ino())
}

/// Copies the object `from` (whole, `size` bytes) to `offset` of `to`.
fn copy_at(from: &RemoteFile, to: &File, to_path: &Path, offset: u64, size: u64) -> Result<()> {
    let mut buf = vec![0u8; (4 << 20).min(size.max(1)) as usize];
    let mut at = 0u64;
    while at < size {
        let n = (size - at).min(buf.len() as u64) as usize;
        from.file()
            .read_exact_at(&mut buf[..n], at)
            .map_err(Error::io("read", from.path()))?;
        to.write_all_at(&buf[..n], offset + at)
            .map_err(Error::io("write", to_path))?;
        at += n as u64;
    }
    to.sync_data().map_err(Error::io("fsync", to_path))?;
    Ok(())
}

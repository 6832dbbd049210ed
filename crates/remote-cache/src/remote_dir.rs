//! [`RemoteDir`]: a local working directory kept in step with a commit log
//! in object storage — materialised from it on open and on
//! [`refresh`](RemoteDir::refresh), published to it by
//! [`publish`](RemoteDir::publish).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, RwLock};

use durable_fs::FileLock;
use remote_tier::{Expected, RemoteFile, RemoteTier};

use crate::commit::{
    COMMIT_VERSION, COMMITS, Checkpoint, Commit, OBJECTS, Piece, STATE_DIR, commit_name,
    newest_checkpoint_after, read_commit, writer_name,
};
use crate::files::StoreFiles;
use crate::hooks::{self, Stage};
use crate::lease::{Lease, PUBLISH_LEASE};
use crate::log_id::{self, read_log_id};
use crate::upload;
use crate::workdir::{
    Applied, Known, append, cut_log, hash_open, hash_range, local_files, read_applied, write_new,
};
use crate::{Error, Result, prefetch};

mod apply;
mod checkpoint;
mod other_log;
mod publish;

/// How often a publisher tries the next number when others take its own.
const MAX_COMMIT_RACES: u32 = 64;
/// The most block hashes one commit lists in the block sizes stores ask
/// for (`StoreFiles::block_size`): about 17 MB of the record (a quarter of
/// [`MAX_COMMIT`]), 1 GiB of segments in 4 KiB blocks.
pub(crate) const STORE_BLOCK_HASHES: u64 = 1 << 18;

/// What a reader applies next: a commit, or the checkpoint that stands
/// for the commits it missed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// The commit after the last one applied.
    Commit(Commit),
    /// A checkpoint after the last one applied: the whole file state.
    Checkpoint(Checkpoint),
}

impl Next {
    /// Its sequence number.
    pub fn seq(&self) -> u64 {
        match self {
            Next::Commit(c) => c.seq,
            Next::Checkpoint(c) => c.seq,
        }
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
    /// Files removed from the working directory.
    pub removed: u64,
    /// Checkpoints applied (a cold open, or a reader that fell behind).
    pub checkpoints: u64,
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
    /// Files published as removed.
    pub removed: u64,
}

/// What a handle knows of its working directory, under its lock.
#[derive(Debug)]
pub(crate) struct State {
    /// The last commit applied.
    pub(crate) seq: u64,
    /// Every file as this handle last left it.
    pub(crate) files: HashMap<String, Known>,
    /// The files read by blocks: their tier objects, open (pinned).
    pub(crate) by_blocks: HashMap<String, RemoteFile>,
    log: File,
    /// The length of `log`'s whole records: a failed append is cut back
    /// to it.
    log_len: u64,
    /// An object this directory needs is gone from the store (gc): the
    /// next refresh moves to the newest checkpoint.
    behind: bool,
    /// Directories with renames (links, block lists) not yet fsynced: one
    /// fsync each before the next record says their commit was applied.
    pub(crate) dirs_to_sync: std::collections::BTreeSet<PathBuf>,
    /// The id of the log whose commits are applied here (`None`: none
    /// recorded yet — nothing applied, or the log's `log.json` not seen
    /// yet, or no log at the URL since the directory started over).
    log_id: Option<String>,
}

impl State {
    /// Fsyncs each directory of [`dirs_to_sync`](Self::dirs_to_sync).
    pub(crate) fn sync_dirs(&mut self) -> Result<()> {
        while let Some(dir) = self.dirs_to_sync.pop_first() {
            if let Err(e) = durable_fs::sync_dir(&dir) {
                self.dirs_to_sync.insert(dir);
                return Err(e.into());
            }
        }
        Ok(())
    }
}

/// What a refresh does when the URL holds another log than the one
/// applied here (see [`LOG_OBJECT`](crate::LOG_OBJECT)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnOtherLog {
    /// Drop every file and record of the working directory and apply the
    /// bucket's log from scratch: when no store has the directory open.
    StartOver,
    /// Fail, and keep failing ([`Error::OtherLog`]): a store maps the
    /// directory's files.
    Refuse,
}

/// A local working directory materialised from, and published to, a
/// commit log at an object-store URL (see below).
///
/// Two locks: `state`, held by a refresh or a publish for all its work
/// (network requests included), serialises them; `view`, what reads
/// need (the files read by blocks), is updated under it once per commit
/// applied and held by a read only to look a file up — so a read never
/// waits for the server on a refresh's behalf, and sees whole commits.
///
/// [`RemoteDir`]: a local working directory kept in step with a commit log
/// in object storage — materialised from it on open and on
/// [`refresh`](RemoteDir::refresh), published to it by
/// [`publish`](RemoteDir::publish).
///
/// The stores write files that are immutable (segments, shards, `.bin`
/// arrays, page files), append-only (index logs) or replaced whole by a
/// rename (`metadata.json`), and remove files they no longer need (a
/// compaction's old segments). A commit therefore lists *pieces* — the
/// bytes `offset..offset + size` of a file, stored under their BLAKE3,
/// either extending the file or (`replace`) standing for all of it — and
/// the files removed. Publishing costs O(new bytes); a reader applies only
/// the commits after the last one it saw. The records are described in
/// [`Commit`](crate::Commit):
///
/// ```text
/// <url>/objects/<blake3 hex>          one piece's bytes
/// <url>/commits/<seq, 20 digits>.json a commit: pieces, then removals
/// <url>/checkpoints/<seq>.json        the whole file state after commit seq (gc)
/// <url>/log.json                      the log's identity (see [`LOG_OBJECT`](crate::LOG_OBJECT))
/// <work dir>/.cachex-remote/
///   lock                              flock: one handle per working directory
///   log.json                          the identity of the log applied here
///   applied.jsonl                     per applied commit: seq, each file's length and
///                                     inode, the files removed
///   blocks/<blake3>.json              the block list of each linked file that has one
/// ```
///
/// A whole file a reader may read by blocks carries a BLAKE3 per block in
/// its commit ([`Piece::blocks`]), checked as each block is fetched; the
/// list is kept in the state directory for when the file is linked again.
/// Its block size is the publisher's tier block size, or the store's own
/// for files it reads in small parts (`StoreFiles::block_size`: segments,
/// 4 KiB, up to 2^18 hashes a commit); a reader links a file with a block
/// size of its store's own whatever its size.
///
/// Rules that make it safe:
/// - **Commit last, conditionally.** Pieces are uploaded first; the commit
///   record is created with `PutMode::Create` under the next sequence
///   number. A writer killed before that leaves only unreferenced objects:
///   the remote cache stays at its last commit.
/// - **Bytes, not paths.** A piece's bytes are read from the file handle
///   it was hashed from and hashed again as they are sent; the object is
///   stored only when they hash to its name (a multipart upload is
///   aborted otherwise), so a file changed after it was hashed is refused
///   with [`remote_tier::Error::SourceChanged`] naming it, and no object
///   ever holds bytes other than its name says.
/// - **A publish in flight is visible to gc.** Before it uploads, a
///   publisher writes a lease naming every object its commit will name
///   (`lease.rs`), renews it while it uploads and deletes it
///   once its commit landed; gc keeps what a live lease names. Just
///   before the commit every piece is checked to be in the store (HEAD)
///   and sent again if not: a commit never names an object that is not
///   there.
/// - **No file claimed twice.** Before it commits, and again each time
///   another writer took the number it tried, a writer applies the
///   commits it has not seen. One that writes a file this writer changed
///   locally and has not published is a [`Error::Conflict`]: of two
///   writers that claimed one segment id, exactly one publishes.
/// - **Numbers without gaps.** A writer claims `seq + 1` only after it
///   applied `seq`, so the commits are `1..=N` and a reader learns that
///   nothing newer exists from one GET of `N + 1` that finds nothing (no
///   listing). A commit taken meanwhile is either found by that GET or
///   published after it: a reader never sees a later commit without the
///   earlier ones.
/// - **Never half a commit.** A reader applies whole commits in sequence
///   order, every piece verified against its BLAKE3 (or, for files read by
///   blocks, each block against its own BLAKE3 as it is fetched — or its
///   size and etag, for commits without a block list), and records each
///   applied commit only after its files are durable; re-applying one
///   after a crash finds the bytes in place and skips them.
/// - **Removals are meant, evictions are not.** A file this handle had
///   and no longer finds is published as removed, unless the store says
///   its removal is a local eviction ([`StoreFiles::evicted_locally`]:
///   shard-store's disk budget), which stays on this machine. A reader
///   removes a removed file from its working directory after the commit's
///   pieces are in place (its store still maps what it had open), checked
///   as a piece is: a file changed here and not published is a
///   [`Error::Conflict`], and paths are checked to stay inside the
///   working directory.
/// - **Checkpoints.** A working directory with nothing applied yet starts
///   from the newest checkpoint, if gc wrote one, and applies the commits
///   after it. One that is behind a checkpoint and finds an object of its
///   next commit gone (gc keeps only what the retention window needs)
///   moves to the checkpoint instead: every file of it written, every file
///   it had and the checkpoint has not removed.
/// - **One log.** A refresh asks for the log's identity with the next
///   commit; a directory that holds another log's commits starts over
///   when opened, and an open handle refuses it ([`Error::OtherLog`]):
///   see [`LOG_OBJECT`](crate::LOG_OBJECT).
/// - **Reads never wait for the server.** A refresh or a publish holds the
///   directory's state for all its requests; what reads need (the files
///   read by blocks) is swapped in under a lock of its own once each
///   commit is applied, so they answer at local speed meanwhile and see
///   whole commits.
/// - **Read by blocks.** Large files a store maps and reads in parts
///   (`.bin` arrays, page files) may be left in the local tier as sparse
///   files, linked into the working directory; [`RemoteDir::ensure`]
///   fetches the blocks of a byte range before the store reads it.
#[derive(Debug)]
pub struct RemoteDir {
    pub(crate) tier: RemoteTier,
    pub(crate) dir: PathBuf,
    writer: String,
    pub(crate) files: StoreFiles,
    state: Mutex<State>,
    /// The files read by blocks as of the last commit applied: what reads
    /// look up.
    view: RwLock<HashMap<String, RemoteFile>>,
    /// The bytes of the files of `view` read under leases (see
    /// [`leased_bytes`](RemoteDir::leased_bytes)).
    leased: AtomicU64,
    /// The tier's claim for keeping every leased file whole (see
    /// [`may_keep_whole`](RemoteDir::may_keep_whole)).
    whole: Mutex<WholeRoom>,
    /// The last commit applied (as `state.seq`, read without its lock).
    applied: AtomicU64,
    /// Set once this handle found another log at its URL: (the log it
    /// holds, the log found).
    other_log: OnceLock<(Option<String>, Option<String>)>,
    _lock: FileLock,
}

/// A handle's claim for keeping its leased files whole, and its last
/// refusal (the bytes asked, when).
#[derive(Debug, Default)]
struct WholeRoom {
    claim: Option<remote_tier::Claim>,
    refused: Option<(u64, std::time::Instant)>,
}

/// How long a refused claim stands before the tier is asked again.
const WHOLE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

impl RemoteDir {
    /// Opens the working directory `dir` (created if needed) for the
    /// commit log at `tier`'s URL and applies every commit not applied
    /// there yet — from scratch, every file of it dropped first, when the
    /// directory holds another log's commits ([`LOG_OBJECT`](crate::LOG_OBJECT)).
    /// `files` says which of the store's files are read by blocks and
    /// which never travel.
    pub fn open(tier: RemoteTier, dir: &Path, files: StoreFiles) -> Result<RemoteDir> {
        let remote = RemoteDir::open_unapplied(tier, dir, files)?;
        remote.refresh_at_open()?;
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
        let log_id = log_id::read_local(&state_dir)?;
        let writer = writer_name();
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
                behind: false,
                dirs_to_sync: Default::default(),
                log_id,
            }),
            view: RwLock::default(),
            leased: AtomicU64::new(0),
            whole: Mutex::new(WholeRoom::default()),
            applied: AtomicU64::new(seq),
            other_log: OnceLock::new(),
            _lock: lock,
        };
        remote.sweep_leftovers();
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
                match remote.relink(&mut state, &path) {
                    Ok(()) => {}
                    // gc removed its object: this directory is behind the
                    // retention window, and moves to the newest checkpoint
                    // on its next refresh.
                    Err(e) if is_gone(&e) => state.behind = true,
                    Err(e) => return Err(e),
                }
            }
            remote.reset_view(&state);
        }
        Ok(remote)
    }

    /// What follows the last commit applied — the next commit, or, for a
    /// directory with nothing applied yet, the newest checkpoint —
    /// fetched and checked but not applied (`None`: nothing newer was
    /// published). No lock is held while it waits for the server.
    ///
    /// The log's identity is asked for at the same time: when the URL
    /// holds another log than the one applied here, this is
    /// [`Error::OtherLog`] (and nothing is applied or marked: the caller,
    /// having no store open on the directory, may start over with
    /// [`open`](RemoteDir::open)'s refresh).
    pub fn fetch_next(&self) -> Result<Option<Next>> {
        self.check_log()?;
        let (seq, had) = {
            let state = self.lock();
            (state.seq, state.log_id.clone())
        };
        let (found, next) = self.read_log_and_after(seq)?;
        let other = match &next {
            Some(Next::Commit(c)) => of_other_log(&had, c),
            _ => false,
        };
        if other || had.as_ref().is_some_and(|h| found.as_ref() != Some(h)) {
            return Err(self.other_log_error(had, found));
        }
        Ok(next)
    }

    /// Applies `next` (an answer of [`fetch_next`](RemoteDir::fetch_next))
    /// and every commit published after it, as
    /// [`refresh`](RemoteDir::refresh) does; `None` applies nothing. A
    /// commit this handle applied meanwhile is not applied twice.
    pub fn refresh_from(&self, next: Option<Next>) -> Result<RefreshReport> {
        self.check_log()?;
        let mut state = self.lock();
        let next = match next {
            Some(Next::Commit(c)) if Some(c.seq) == state.seq.checked_add(1) => {
                Some(Next::Commit(c))
            }
            Some(Next::Checkpoint(c)) if c.seq > state.seq => Some(Next::Checkpoint(c)),
            Some(_) => self.read_after(state.seq)?,
            None => None,
        };
        self.apply_logged(&mut state, next, OnOtherLog::Refuse)
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
        self.applied.load(Ordering::Acquire)
    }

    /// The id of the log whose commits are applied here (`None`: none
    /// recorded; see [`LOG_OBJECT`](crate::LOG_OBJECT)).
    pub fn log_id(&self) -> Option<String> {
        self.lock().log_id.clone()
    }

    /// [`Error::OtherLog`] once this handle found another log at its URL
    /// than the one applied here: its store's files are the old log's,
    /// and must not be served. A store's reads call it first.
    pub fn check_log(&self) -> Result<()> {
        match self.other_log.get() {
            Some((had, found)) => Err(self.other_log_error(had.clone(), found.clone())),
            None => Ok(()),
        }
    }

    /// Applies the commits published since the last one applied: their
    /// files appear in the working directory, whole commits at a time.
    /// Cost: one GET per new commit and one for the number after the last
    /// (the answer that nothing newer was published), plus the new bytes;
    /// a directory with nothing applied yet first lists `checkpoints/`
    /// and reads the newest, if any (then the commits after it).
    ///
    /// When the URL holds another log than the one applied here (see
    /// [`LOG_OBJECT`](crate::LOG_OBJECT)), this handle refuses it: this and every later
    /// refresh, publish and read fail with [`Error::OtherLog`]; opening
    /// the directory again starts over from the bucket's log.
    pub fn refresh(&self) -> Result<RefreshReport> {
        let mut state = self.lock();
        self.refresh_locked(&mut state, OnOtherLog::Refuse)
    }

    /// As [`refresh`](RemoteDir::refresh), for a directory no store has
    /// open yet: when the URL holds another log, every file and record
    /// here is dropped and that log applied from scratch.
    pub(crate) fn refresh_at_open(&self) -> Result<RefreshReport> {
        let mut state = self.lock();
        self.refresh_locked(&mut state, OnOtherLog::StartOver)
    }

    /// Publishes what the store wrote in the working directory since the
    /// last commit (new files, bytes appended, files replaced, files
    /// removed — but not those the store evicts locally): pieces first,
    /// then the commit record, conditionally, under the next sequence
    /// number. Call it only after the store made its files
    /// durable (a flush). Commits of other writers are applied first;
    /// one that wrote a file this writer also changed is an
    /// [`Error::Conflict`] and nothing of this writer's is committed.
    pub fn publish(&self) -> Result<PublishReport> {
        self.publish_locked(self.lock())
    }

    /// [`publish`](RemoteDir::publish) when the store wrote or removed
    /// anything since the last commit applied here, and nothing (not a
    /// request) otherwise: a background publisher's period costs an idle
    /// writer a directory listing, not a round trip.
    pub fn publish_if_changed(&self) -> Result<PublishReport> {
        let state = self.lock();
        if !self.changed_locally(&state)? {
            return Ok(PublishReport::default());
        }
        self.publish_locked(state)
    }

    /// Makes the bytes `range` of `path` local (a no-op for files copied
    /// whole): call before the store reads them from a file read by blocks.
    pub fn ensure(&self, path: &str, range: Range<u64>) -> Result<()> {
        let file = self.object(path);
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
        self.view().get(path).cloned()
    }

    /// Whether every file read by blocks is whole in the local tier now.
    pub fn all_complete(&self) -> bool {
        self.view().values().all(|f| f.is_complete())
    }

    /// Whether `path` is read by blocks (a link into the local tier).
    pub fn is_by_blocks(&self, path: &str) -> bool {
        self.view().contains_key(path)
    }

    /// The bytes of the linked files read under leases
    /// ([`StoreFiles::evict_blocks`](crate::StoreFiles::evict_blocks)), as
    /// of the last commit applied: were all of them whole at once, the
    /// tier would hold this much of them.
    pub fn leased_bytes(&self) -> u64 {
        self.leased.load(Ordering::Acquire)
    }

    /// Whether the store may keep every file it reads under leases whole
    /// at once (map them): only while the tier grants a claim of
    /// [`leased_bytes`](Self::leased_bytes)
    /// ([`RemoteTier::claim_whole`]), which this handle holds for its
    /// life — so the stores and processes sharing a tier never map more
    /// than its budget between them. Asked again when the bytes grow, and
    /// at most once a second after a refusal.
    pub fn may_keep_whole(&self) -> bool {
        let bytes = self.leased_bytes();
        if bytes == 0 {
            return true;
        }
        let mut room = self.whole.lock().unwrap_or_else(|p| p.into_inner());
        if room.claim.as_ref().is_some_and(|c| c.bytes() >= bytes) {
            return true;
        }
        if let Some((refused, at)) = room.refused
            && refused == bytes
            && at.elapsed() < WHOLE_RETRY
        {
            return false;
        }
        // Given back before asking for more: a claim never counts twice.
        room.claim = None;
        match self.tier.claim_whole(bytes) {
            Ok(Some(claim)) => {
                room.claim = Some(claim);
                room.refused = None;
                true
            }
            Ok(None) | Err(_) => {
                room.refused = Some((bytes, std::time::Instant::now()));
                false
            }
        }
    }

    /// Counts [`leased_bytes`](Self::leased_bytes) of `view` anew.
    fn count_leased(&self, view: &HashMap<String, RemoteFile>) {
        let bytes = view
            .values()
            .filter(|f| f.is_leased())
            .map(RemoteFile::len)
            .sum();
        self.leased.store(bytes, Ordering::Release);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn view(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, RemoteFile>> {
        self.view.read().unwrap_or_else(|p| p.into_inner())
    }

    fn view_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, RemoteFile>> {
        self.view.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes what reads see what `state` holds (after an open, or a
    /// commit that failed half-way).
    fn reset_view(&self, state: &State) {
        let mut view = self.view_mut();
        *view = state.by_blocks.clone();
        self.count_leased(&view);
        drop(view);
        self.applied.store(state.seq, Ordering::Release);
    }

    /// Appends the applied commit to the local record (after its files are
    /// durable) and takes its files as known.
    fn record(
        &self,
        state: &mut State,
        seq: u64,
        files: BTreeMap<String, Known>,
        removed: Vec<String>,
    ) -> Result<()> {
        // What the record says is in place must be durably so first.
        state.sync_dirs()?;
        for (path, k) in &files {
            state.files.insert(path.clone(), *k);
        }
        for path in &removed {
            state.files.remove(path);
            state.by_blocks.remove(path);
        }
        // Reads see the commit's files read by blocks all at once, with
        // the commit recorded.
        let mut view = self.view_mut();
        for path in files.keys().chain(&removed) {
            match state.by_blocks.get(path) {
                Some(f) => view.insert(path.clone(), f.clone()),
                None => view.remove(path),
            };
        }
        self.count_leased(&view);
        drop(view);
        let applied = Applied {
            seq,
            files,
            removed,
        };
        let mut line = serde_json::to_vec(&applied).map_err(|e| Error::Corrupt {
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
        self.applied.store(seq, Ordering::Release);
        Ok(())
    }
}

/// Whether `e` says an object the commit log names is gone from the
/// store (gc removed it): a checkpoint stands for its commit.
fn is_gone(e: &Error) -> bool {
    matches!(e, Error::Tier(remote_tier::Error::NotFound { .. }))
}

/// Whether commit `c` names another log than `had` (none recorded: any
/// log is the directory's until it records one).
fn of_other_log(had: &Option<String>, c: &Commit) -> bool {
    had.as_ref().is_some_and(|had| *had != c.log)
}

//! A whole cache directory published as one commit of the commit log
//! ([`push_dir`]: a snapshot is a commit), and a commit log materialised
//! into a directory ([`pull_dir`]).

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use remote_tier::RemoteTier;

use crate::StoreFiles;
use crate::commit::{COMMIT_VERSION, Commit, Piece, STATE_DIR, commit_name, encode, writer_name};
use crate::hooks::{self, Stage};
use crate::lease::{Lease, PUBLISH_LEASE};
use crate::log_state::LogState;
use crate::remote_dir::{RefreshReport, RemoteDir, STORE_BLOCK_HASHES};
use crate::upload;
use crate::workdir::{hash_open, local_entries};
use crate::{Error, Result};

/// How often a push tries the next number when others take its own.
const MAX_COMMIT_RACES: u32 = 64;

/// What [`push_dir`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushReport {
    /// The commit written (`None`: the log already held the directory as
    /// it is).
    pub seq: Option<u64>,
    /// Files in the directory.
    pub files: u64,
    /// Files published (new or changed).
    pub changed: u64,
    /// Files published as removed.
    pub removed: u64,
    /// Objects uploaded (the others were in the store already).
    pub uploaded: u64,
    /// Bytes uploaded.
    pub bytes_uploaded: u64,
}

/// Publishes the cache directory `dir` (no writer may be changing it) as
/// the next commit of the commit log at `tier`'s URL; `progress(files
/// hashed, files in all)` is called after each file. Files the store
/// keeps private (locks, scratch space) and a pulled directory's state
/// directory are not published; a symbolic link is refused
/// ([`Error::BadLocation`]), since what it points at may be a sparse copy
/// of a file not all fetched.
///
/// A whole cache directory published as one commit of the commit log
/// ([`push_dir`]: a snapshot is a commit), and a commit log materialised
/// into a directory ([`pull_dir`]).
///
/// A push publishes the directory as it is: every file whose bytes differ
/// from the log's file of that name (each a whole-file piece, `replace`),
/// and as removed every file the log holds and the directory does not.
/// Its commit is claimed like any other (conditionally, the next number,
/// again after another writer's); readers of the log apply it like any
/// other. A pull is a working directory of its own, in the destination:
/// pulling again applies only what was published since, and removes what
/// commits removed.
pub fn push_dir(
    tier: &RemoteTier,
    dir: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PushReport> {
    let private = StoreFiles::for_kind(None).private;
    let (listed, links) = local_entries(dir, private)?;
    // A link may stand for a file not all there (a working directory's
    // links into its tier are sparse): its bytes cannot be trusted.
    if let Some(link) = links.first() {
        return Err(Error::BadLocation {
            root: dir.display().to_string(),
            problem: format!(
                "{link} is a symbolic link: push publishes regular files (copy the cache, or pull \
                 it, into a directory of its own first)"
            ),
        });
    }
    let total = listed.len() as u64;
    let mut entries: Vec<(Piece, PathBuf)> = Vec::with_capacity(listed.len());
    let mut hashes_left = STORE_BLOCK_HASHES;
    for (done, (rel, path)) in listed.into_iter().enumerate() {
        let file = File::open(&path).map_err(Error::io("open", &path))?;
        let size = file.metadata().map_err(Error::io("stat", &path))?.len();
        // As the publish of the store that reads it by blocks does.
        let block_size =
            StoreFiles::ANY_STORE.block_list_size(&rel, size, tier.config(), &mut hashes_left);
        let (blake3, blocks) = hash_open(&file, &path, 0, size, block_size)?;
        let piece = Piece {
            path: rel,
            offset: 0,
            size,
            blake3,
            replace: true,
            blocks: blocks.map(|b| b.to_list()),
        };
        entries.push((piece, path));
        progress(done as u64 + 1, total);
    }
    hooks::reached(tier, Stage::Hashed);
    let names: HashSet<&str> = entries.iter().map(|(p, _)| p.path.as_str()).collect();
    let mut report = PushReport {
        files: total,
        ..PushReport::default()
    };
    let mut state = LogState::read(tier)?;
    let mut uploaded = HashSet::new();
    let writer = writer_name();
    let mut log_id: Option<String> = None;
    // Taken on first need (a push of nothing new writes nothing), kept
    // until the commit landed: gc keeps what it names meanwhile.
    let mut lease: Option<Lease> = None;
    for _ in 0..MAX_COMMIT_RACES {
        let changed: Vec<&(Piece, PathBuf)> =
            entries.iter().filter(|(p, _)| !holds(&state, p)).collect();
        let removed: Vec<String> = state
            .files
            .keys()
            .filter(|p| !names.contains(p.as_str()) && !private(p))
            .cloned()
            .collect();
        if changed.is_empty() && removed.is_empty() {
            return Ok(report);
        }
        // The log's identity before its first commit.
        let log = match &log_id {
            Some(id) => id.clone(),
            None => {
                let id = crate::log_id::ensure_log_id(tier, crate::log_id::read_log_id(tier)?)?;
                log_id = Some(id.clone());
                id
            }
        };
        if lease.is_none() {
            let objects = entries.iter().map(|(p, _)| p.object());
            lease = Some(Lease::take(tier, PUBLISH_LEASE, objects)?);
        }
        let Some(lease) = lease.as_mut() else {
            unreachable!("taken above")
        };
        // Each file is opened as it is sent (a directory may hold more
        // files than a process may open); what is sent is checked against
        // the hash taken above, whatever happened to the file since.
        for (piece, path) in &changed {
            // A lease that may have lapsed is checked again below anyway.
            let _ = lease.renew_if_due()?;
            if uploaded.insert(piece.object())
                && upload::put_piece(tier, piece, &open(path)?, path)?
            {
                report.uploaded += 1;
                report.bytes_uploaded += piece.size;
            }
        }
        hooks::reached(tier, Stage::Uploaded);
        // A commit never names an object that is not there.
        // Checked again while the lease may have lapsed during the check.
        let _ = lease.renew_if_due()?;
        loop {
            for (piece, path) in &changed {
                if upload::ensure_present(tier, piece, &open(path)?, path)? {
                    report.uploaded += 1;
                    report.bytes_uploaded += piece.size;
                }
            }
            if !lease.renew_if_due()? {
                break;
            }
        }
        let seq = crate::commit::next_seq(tier.url(), state.seq)?;
        let commit = Commit {
            version: COMMIT_VERSION,
            seq,
            writer: writer.clone(),
            pieces: changed.iter().map(|(p, _)| p.clone()).collect(),
            removed,
            log: log.clone(),
        };
        let name = commit_name(seq);
        match tier.commit(&name, encode(tier, &name, &commit)?) {
            Ok(()) => {
                report.seq = Some(seq);
                report.changed = commit.pieces.len() as u64;
                report.removed = commit.removed.len() as u64;
                return Ok(report);
            }
            // Another writer took the number: publish against its state.
            Err(remote_tier::Error::CommitTaken { .. }) => state.read_after(tier, &mut |_| {})?,
            Err(e) => return Err(e.into()),
        }
    }
    Err(remote_tier::Error::CommitTaken {
        url: tier.url().to_string(),
        name: format!(
            "{} ({MAX_COMMIT_RACES} sequence numbers taken by other writers meanwhile)",
            crate::commit::COMMITS
        ),
    }
    .into())
}

fn open(path: &Path) -> Result<File> {
    File::open(path).map_err(Error::io("open", path))
}

/// Whether the log's file of `piece`'s name holds exactly its bytes.
fn holds(state: &LogState, piece: &Piece) -> bool {
    matches!(
        state.files.get(&piece.path).map(Vec::as_slice),
        Some([one]) if one.blake3 == piece.blake3 && one.size == piece.size
    )
}

/// Materialises the commit log at `tier`'s URL into `dest` (created if
/// needed): a working directory of its own there (`.cachex-remote/`
/// records what was applied), every file copied whole and checked
/// against its BLAKE3. Pulling again applies only the commits published
/// since. Files of `dest` that no commit names are left alone; one that a
/// commit writes or removes and that is not as a pull left it is an
/// [`Error::Conflict`]. The directory holds one log: pulling a URL whose
/// log is another one than it holds (the prefix rebuilt, the same URL on
/// another endpoint; see [`LOG_OBJECT`](crate::LOG_OBJECT)) is [`Error::OtherLog`],
/// naming both, and changes nothing in it.
pub fn pull_dir(tier: &RemoteTier, dest: &Path) -> Result<RefreshReport> {
    let dir = RemoteDir::open_unapplied(tier.clone(), dest, StoreFiles::for_kind(None))?;
    // The directory holds the commits of one URL: another's would be
    // taken for this one's.
    let source = dest.join(STATE_DIR).join(PULLED_FROM);
    match std::fs::read(&source) {
        Ok(url) if url == tier.url().as_bytes() => {}
        Ok(url) => return Err(pulled_from_elsewhere(dest, &String::from_utf8_lossy(&url))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if dir.seq() > 0 {
                return Err(pulled_from_elsewhere(dest, "another URL"));
            }
            durable_fs::write_atomic(&source, tier.url().as_bytes())?;
        }
        Err(e) => return Err(Error::io("read", &source)(e)),
    }
    dir.refresh()
}

/// The file of a pulled directory's state that names the URL it holds.
const PULLED_FROM: &str = "pulled-from";

fn pulled_from_elsewhere(dest: &Path, other: &str) -> Error {
    Error::BadLocation {
        root: dest.display().to_string(),
        problem: format!(
            "holds a pull of {other}: pull into a directory of its own (or an empty one)"
        ),
    }
}

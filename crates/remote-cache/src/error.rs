//! The crate's one error type.

use std::path::PathBuf;

/// What opening, refreshing or publishing a remote cache can fail with.
/// Every variant names the URL (without credentials) or the local file,
/// and the problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The object store or the local tier failed (request, verification,
    /// local file).
    #[error(transparent)]
    Tier(#[from] remote_tier::Error),
    /// A durable local step (temp + rename, fsync, lock) failed.
    #[error(transparent)]
    Local(#[from] durable_fs::Error),
    /// A local file-system call failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The local file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Another writer published the file this one also wrote (two writers
    /// claimed one segment id, one shard, one file): this writer's copy
    /// is left local and unpublished.
    #[error(
        "{url}: {path}: commit {seq} by {writer} wrote this file, which this writer also changed \
         locally and has not published (two writers claimed one file; give each writer its own \
         writer id)"
    )]
    Conflict {
        /// The store URL.
        url: String,
        /// The file, relative to the cache directory.
        path: String,
        /// The commit that claimed it first.
        seq: u64,
        /// Who wrote that commit.
        writer: String,
    },
    /// A commit record, or the local record of applied commits, is not
    /// what it must be.
    #[error("{url}: {name}: {problem}")]
    Corrupt {
        /// The store URL (or the local working directory).
        url: String,
        /// The record.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// The commit log at the URL is another one than the one a directory
    /// holds (the prefix was wiped and written again, or the URL names
    /// another endpoint): nothing of either is mixed. An open handle
    /// refuses it (a new open starts over from the bucket's log); a
    /// pulled directory refuses it.
    #[error(
        "{url}: holds commit log {}, but {} holds commit log {} (the log at the URL was \
         rebuilt, or the URL names another endpoint): open it again to start over from the \
         log there, or pull into a directory of its own",
        shown_log(found), dir.display(), shown_log(had)
    )]
    OtherLog {
        /// The store URL.
        url: String,
        /// The working (or pulled) directory.
        dir: PathBuf,
        /// The log the directory holds (`None`: none recorded).
        had: Option<String>,
        /// The log the URL holds now (`None`: none, no `log.json`).
        found: Option<String>,
    },
    /// The local working directory is in use by another process.
    #[error("{}: in use by another process (one handle per working directory)", path.display())]
    Busy {
        /// The working directory.
        path: PathBuf,
    },
    /// A cache root that is neither a local path nor a URL this crate opens,
    /// or a local-tier setting that does not parse.
    #[error("{root}: {problem}")]
    BadLocation {
        /// The root as given (a URL shown without credentials).
        root: String,
        /// What is wrong.
        problem: String,
    },
    /// segment-store failed.
    #[error(transparent)]
    Segment(#[from] segment_store::Error),
    /// shard-store failed.
    #[error(transparent)]
    Shard(#[from] shard_store::Error),
    /// memmap-array failed.
    #[error(transparent)]
    Array(#[from] memmap_array::Error),
    /// page-alloc failed.
    #[error(transparent)]
    Page(#[from] page_alloc::Error),
}

/// A log id as an error shows it.
fn shown_log(id: &Option<String>) -> String {
    match id {
        Some(id) => id.clone(),
        None => "(none: no log.json)".into(),
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::Io`] maker for `map_err`.
    pub(crate) fn io(
        op: &'static str,
        path: impl AsRef<std::path::Path>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.as_ref().to_path_buf();
        move |source| Error::Io { op, path, source }
    }
}

//! The crate's one error type.

use std::path::PathBuf;
use std::time::Duration;

/// What a remote-tier call can fail with. Every variant names the store
/// URL (credentials and query removed) or the local file, and the problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL is not one this crate opens, or its store could not be built.
    #[error("{url}: cannot open this store: {reason}")]
    BadUrl {
        /// The URL, without credentials or query.
        url: String,
        /// Why.
        reason: String,
    },
    /// An option key that the URL's store does not know.
    #[error("{url}: `{key}` is not an option of this store")]
    BadOption {
        /// The URL, without credentials or query.
        url: String,
        /// The unknown key.
        key: String,
    },
    /// An object name that is not a valid relative object path.
    #[error("{url}: `{name}` is not a valid object name: {reason}")]
    BadName {
        /// The store URL.
        url: String,
        /// The name given.
        name: String,
        /// Why.
        reason: String,
    },
    /// The object does not exist in the store.
    #[error("{url}: {name}: no such object")]
    NotFound {
        /// The store URL.
        url: String,
        /// The object name, relative to the URL.
        name: String,
    },
    /// A request failed; `attempts` says how often it was tried (requests
    /// that are safe to repeat are retried, others are tried once).
    #[error("{url}: {name}: {op} failed after {attempts} attempt(s): {source}")]
    Remote {
        /// The store URL.
        url: String,
        /// The object name (or prefix) concerned.
        name: String,
        /// The request (`"get"`, `"put"`, `"list"`, ...).
        op: &'static str,
        /// How many times it was tried.
        attempts: u32,
        /// The store's error.
        #[source]
        source: Box<object_store::Error>,
    },
    /// A request did not answer in time, on every attempt.
    #[error("{url}: {name}: {op} timed out ({timeout:?} per attempt) after {attempts} attempt(s)")]
    TimedOut {
        /// The store URL.
        url: String,
        /// The object name concerned.
        name: String,
        /// The request.
        op: &'static str,
        /// How many times it was tried.
        attempts: u32,
        /// The time allowed to each attempt.
        timeout: Duration,
    },
    /// A call waited past its bound ([`RetryPolicy::call_timeout`](crate::RetryPolicy::call_timeout))
    /// without an answer: its request never finished (a runtime gone, a
    /// server that holds the connection).
    #[error("{url}: {name}: {op}: no answer within {waited:?}")]
    NoAnswer {
        /// The store URL.
        url: String,
        /// The object name concerned.
        name: String,
        /// The request.
        op: &'static str,
        /// How long the caller waited.
        waited: Duration,
    },
    /// An object is larger than what may be read of it: nothing past
    /// `cap + 1` bytes was read.
    #[error("{url}: {name}: {seen} bytes or more, where at most {cap} may be read")]
    TooLarge {
        /// The store URL.
        url: String,
        /// The object name.
        name: String,
        /// Bytes the server announced or sent before the read stopped.
        seen: u64,
        /// The most bytes this object may have.
        cap: u64,
    },
    /// The server accepted a second put-if-absent (`If-None-Match: *`) of
    /// one name: it does not honour conditional puts, so two writers
    /// could both claim one commit and one would be lost. Nothing was
    /// published.
    #[error(
        "{url}: the server does not honour conditional puts (a second put-if-absent of {probe} \
         was accepted), so two writers could claim one commit; nothing was published. Use a \
         server that honours `If-None-Match: *`, or set `single_publisher` \
         (TierConfig::single_publisher) if only one writer ever publishes here"
    )]
    ConditionalPutIgnored {
        /// The store URL (without credentials).
        url: String,
        /// The probe object that was put twice.
        probe: String,
    },
    /// A commit record of this name exists already: another writer claimed it.
    #[error("{url}: {name}: already committed by another writer")]
    CommitTaken {
        /// The store URL.
        url: String,
        /// The commit record's name.
        name: String,
    },
    /// The store cannot do what was asked (say a conditional put on an S3
    /// endpoint configured without it).
    #[error("{url}: {name}: {op} is not supported by this store: {source}")]
    Unsupported {
        /// The store URL.
        url: String,
        /// The object name.
        name: String,
        /// The request.
        op: &'static str,
        /// The store's error.
        #[source]
        source: Box<object_store::Error>,
    },
    /// Fetched bytes are not what they must be (wrong size, wrong BLAKE3,
    /// or an object that changed although files here are immutable).
    /// Nothing of them was kept in the local tier.
    #[error("{url}: {name}: {problem}")]
    Corrupt {
        /// The store URL.
        url: String,
        /// The object name.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// A local file uploaded as a content-addressed object did not hold
    /// the bytes its name says (it changed after it was hashed): nothing
    /// was stored under the name (a multipart upload was aborted before
    /// it completed).
    #[error(
        "{}: changed while it was uploaded as {url}/{name}: the bytes read do not hash to the \
         name (nothing was stored)",
        path.display()
    )]
    SourceChanged {
        /// The local file.
        path: PathBuf,
        /// The store URL.
        url: String,
        /// The object name.
        name: String,
    },
    /// A block fetched for a read does not hash to what the object's
    /// publisher recorded for it, on the first fetch and on the retry.
    /// Nothing of it was kept: the block stays absent from the local copy.
    #[error("{0}")]
    BlockMismatch(Box<BlockMismatch>),
    /// A byte range beyond the end of the object.
    #[error("{url}: {name}: bytes {start}..{end} lie beyond the object's {size} bytes")]
    OutOfRange {
        /// The store URL.
        url: String,
        /// The object name.
        name: String,
        /// Start of the range asked for.
        start: u64,
        /// End (exclusive) of the range asked for.
        end: u64,
        /// The object's size.
        size: u64,
    },
    /// A path that holds no tier: no directory with a `tier.state` (no
    /// tier was ever opened there).
    #[error("{}: not a tier directory (it has no tier.state)", path.display())]
    NotATier {
        /// The directory.
        path: PathBuf,
    },
    /// A `tier.state` this build does not read: cut short, another
    /// version, or not a tier state at all. The next process to open the
    /// tier rewrites it and counts the tier again.
    #[error("{}: not a tier state file this build reads: {problem}", path.display())]
    DamagedState {
        /// The `tier.state` file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
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
    /// A durable local step (temp + rename, fsync, lock) failed.
    #[error(transparent)]
    Local(#[from] durable_fs::Error),
    /// The crate's own I/O runtime could not be started or has stopped.
    #[error("remote tier runtime: {0}")]
    Runtime(String),
}

/// Where and how a fetched block differs from its recorded hash
/// ([`Error::BlockMismatch`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{url}: {name}: block {block} (bytes {start}..{end}) of the local copy {}: BLAKE3 {got}, \
     the publisher recorded {expected} (fetched twice; not kept)",
    path.display()
)]
pub struct BlockMismatch {
    /// The store URL.
    pub url: String,
    /// The object name.
    pub name: String,
    /// The local file the block was for.
    pub path: PathBuf,
    /// The block's index.
    pub block: u64,
    /// Start of the block's bytes in the object.
    pub start: u64,
    /// End (exclusive) of the block's bytes.
    pub end: u64,
    /// The hash the publisher recorded, hex.
    pub expected: String,
    /// The hash of the bytes the store sent (on the retry), hex.
    pub got: String,
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

/// The error for block `i` of `name` whose bytes hash to `got`.
pub(crate) fn block_mismatch(
    url: &str,
    name: &str,
    path: &std::path::Path,
    hashes: &crate::BlockHashes,
    i: u64,
    got: [u8; 32],
) -> Error {
    let hex = |h: [u8; 32]| blake3::Hash::from_bytes(h).to_hex().to_string();
    let range = hashes.range(i);
    Error::BlockMismatch(Box::new(BlockMismatch {
        url: url.to_string(),
        name: name.to_string(),
        path: path.to_path_buf(),
        block: i,
        start: range.start,
        end: range.end,
        expected: hashes.hash(i).map(|h| hex(*h)).unwrap_or_default(),
        got: hex(got),
    }))
}

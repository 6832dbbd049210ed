//! The one error type of the crate.

use std::path::PathBuf;

/// Everything that can go wrong in `shard-store`.
///
/// `Display` names the file (or root) concerned and what is wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O call on `path` failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `metadata.json` exists but is not valid loadit metadata.
    #[error("{}: bad metadata: {reason}", path.display())]
    BadMetadata {
        /// The metadata file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The options given to `open` contradict the metadata stored in the root.
    #[error("{}: option {option} is {requested} but the store holds {stored}", path.display())]
    OptionMismatch {
        /// The metadata file.
        path: PathBuf,
        /// Which option.
        option: &'static str,
        /// The value asked for.
        requested: String,
        /// The value on disk.
        stored: String,
    },
    /// An option value is invalid on its own (e.g. a shard length of 0).
    #[error("invalid option {option}: {reason}")]
    InvalidOption {
        /// Which option.
        option: &'static str,
        /// Why it is refused.
        reason: String,
    },
    /// A shard file is truncated, undecodable or holds the wrong item count.
    #[error("{}: corrupt shard: {reason}", path.display())]
    CorruptShard {
        /// The shard file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A shard holds a pickled Python object (a class instance, a global)
    /// that cannot be read without running Python code; it is refused.
    #[error("{}: unsupported pickle content at byte {offset}: {what}", path.display())]
    UnsupportedPickle {
        /// The shard file.
        path: PathBuf,
        /// Byte offset of the offending opcode in the (decompressed) stream.
        offset: usize,
        /// What was found (e.g. "global numpy.core.multiarray._reconstruct").
        what: String,
    },
    /// A pickled shard decodes, but not into the requested item type.
    #[error("{}: items do not match the requested type: {source}", path.display())]
    ItemType {
        /// The shard file.
        path: PathBuf,
        /// The decoder's error.
        #[source]
        source: serde_pickle::Error,
    },
    /// An item could not be encoded as pickle.
    #[error("{}: cannot pickle item: {source}", path.display())]
    Encode {
        /// The shard being written.
        path: PathBuf,
        /// The encoder's error.
        #[source]
        source: serde_pickle::Error,
    },
    /// An index is outside the sequence.
    #[error("index {index} out of range for length {len}")]
    IndexOutOfRange {
        /// The index asked for (negative: counted from the end).
        index: i64,
        /// The length of the sequence.
        len: usize,
    },
    /// The item is not cached and the store has no source to generate it.
    #[error("{}: item {index} is not cached and the store has no source", root.display())]
    NotCached {
        /// The store root.
        root: PathBuf,
        /// The index asked for.
        index: usize,
    },
    /// The length is needed but unknown, and there is no source to find it.
    #[error("{}: length unknown and the store has no source to find it", root.display())]
    LengthUnknown {
        /// The store root.
        root: PathBuf,
    },
    /// The source yielded different data on a replay (it must be deterministic).
    #[error("{}: the source is not deterministic: {reason}", root.display())]
    NondeterministicSource {
        /// The store root.
        root: PathBuf,
        /// What differed.
        reason: String,
    },
    /// The length of an unbounded sequence (e.g. `Repeat::forever`) was asked for.
    #[error("the sequence is unbounded")]
    Unbounded,
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error of `op` on `path`, for `map_err`.
    pub(crate) fn io(
        op: &'static str,
        path: impl AsRef<std::path::Path>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.as_ref().to_path_buf();
        move |source| Error::Io { path, op, source }
    }

    /// Maps an error of the durable file-system layer. The store only
    /// waits for its locks, so "held by another process" means a lock
    /// could not be taken at all.
    pub(crate) fn durable(e: durable_fs::Error) -> Error {
        match e {
            durable_fs::Error::Io { op, path, source } => Error::Io { path, op, source },
            durable_fs::Error::TooLarge { path, cap } => Error::BadMetadata {
                path,
                reason: format!("larger than the {cap}-byte limit for this file"),
            },
            other => Error::Io {
                path: other.path().to_path_buf(),
                op: "lock",
                source: std::io::Error::other(other),
            },
        }
    }
}

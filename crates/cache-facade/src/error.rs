//! The crate's one error type.

use std::path::PathBuf;

/// What can go wrong opening a cache or calling through it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FacadeError {
    /// `CachedFn::call` got a different number of ids than inputs.
    #[error("{inputs} inputs but {ids} ids: every input needs a stable id")]
    MissingIds {
        /// Number of inputs.
        inputs: usize,
        /// Number of ids.
        ids: usize,
    },
    /// An input's id is the empty string.
    #[error("input {index} has an empty id: every input needs a stable id")]
    EmptyId {
        /// Position of the input.
        index: usize,
    },
    /// The wrapped computation failed.
    #[error("the wrapped computation failed: {0}")]
    Compute(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The wrapped computation returned the wrong number of outputs.
    #[error("the wrapped computation returned {got} outputs for {expected} inputs")]
    ComputeCount {
        /// Inputs passed.
        expected: usize,
        /// Outputs returned.
        got: usize,
    },
    /// Object storage (a config whose root is a URL) failed.
    #[error(transparent)]
    Remote(Box<remote_cache::Error>),
    /// A backend broke its contract (e.g. answered the wrong number of slots).
    #[error("backend: {0}")]
    Backend(String),
    /// The config is not usable.
    #[error("config: {0}")]
    Config(String),
    /// The root directory of a config does not exist.
    #[error("{}: cache root does not exist (create it, or set create_root)", .0.display())]
    MissingRoot(PathBuf),
    /// The directory holds a cache of another kind than the config names.
    #[error("{}: holds a {found} cache, but the config asks for {expected}", dir.display())]
    KindMismatch {
        /// The cache directory.
        dir: PathBuf,
        /// What is there.
        found: String,
        /// What the config names.
        expected: String,
    },
    /// The cache was built from other sources or an older format.
    #[error("{}: {stale}; open with OnStale::Rebuild to rebuild it", dir.display())]
    Stale {
        /// The cache directory.
        dir: PathBuf,
        /// Why it is stale.
        stale: fingerprint::Stale,
    },
    /// A file-system operation failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// What was being done ("open", "create directory", ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The backend cannot serve this call (a put on a built page file, a
    /// string key on a shard store); the message says what can.
    #[error("{}: {backend} cannot {op}: {why}", dir.display())]
    Unsupported {
        /// The cache directory.
        dir: PathBuf,
        /// The backend's name.
        backend: &'static str,
        /// The operation asked for.
        op: &'static str,
        /// Why not, and what to do instead.
        why: &'static str,
    },
    /// An index beyond the values held.
    #[error("{}: index {index} out of range for {len} values", dir.display())]
    IndexOutOfRange {
        /// The cache directory.
        dir: PathBuf,
        /// The index asked for.
        index: i64,
        /// Values held.
        len: u64,
    },
    /// A build-once cache (memmap-array, page-alloc) is not built, or must
    /// be rebuilt, and no source to build it from was given.
    #[error("{}: {backend} cache {what}; open it with open_with_source to build it", dir.display())]
    NotBuilt {
        /// The cache directory.
        dir: PathBuf,
        /// The backend's name.
        backend: &'static str,
        /// "is not built" / "is stale (...)".
        what: String,
    },
    /// A stale cache cannot be cleared: a writer of the store holds it.
    #[error("{}: stale, but a writer holds {}; close it before rebuilding", dir.display(), lock.display())]
    InUse {
        /// The cache directory.
        dir: PathBuf,
        /// The store's lock file that is held.
        lock: PathBuf,
    },
    /// A value does not fit the backend (a tensor where a page file needs
    /// named fields, a dict of other fields than the first sample's).
    #[error("{}: {why}", dir.display())]
    BadValue {
        /// The cache directory.
        dir: PathBuf,
        /// What is wrong with the value.
        why: String,
    },
    /// The source failed to produce a value.
    #[error("{}: the source failed on {id:?}: {source}", dir.display())]
    Source {
        /// The cache directory being built.
        dir: PathBuf,
        /// The id (or index) of the item.
        id: String,
        /// The source's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A key argument that this kind of cache cannot take.
    #[error("{}: {key:?} is not an index (this kind of cache is addressed by index)", path.display())]
    BadKey {
        /// The cache.
        path: PathBuf,
        /// The argument.
        key: String,
    },
    /// The record asked for is not in the cache.
    #[error("{}: {what}", path.display())]
    NoSuchRecord {
        /// The cache.
        path: PathBuf,
        /// What is absent (`no record with key "x"`).
        what: String,
    },
    /// The memmap-array backend failed.
    #[error(transparent)]
    Memmap(#[from] memmap_array::Error),
    /// The segment-store backend failed.
    #[error(transparent)]
    Segment(#[from] segment_store::Error),
    /// The shard-store backend failed.
    #[error(transparent)]
    Shard(#[from] shard_store::Error),
    /// The page-alloc backend failed.
    #[error(transparent)]
    Page(#[from] page_alloc::Error),
    /// A value read from a store is not a valid tensor.
    #[error(transparent)]
    Tensor(#[from] tensor_core::TensorError),
    /// Keys, fingerprints and stamps.
    #[error(transparent)]
    Fingerprint(#[from] fingerprint::FingerprintError),
}

impl FacadeError {
    /// An [`FacadeError::Io`] maker for `map_err` (the demo and the
    /// `cachex` tool make theirs with it too).
    pub fn io(
        op: &'static str,
        path: impl AsRef<std::path::Path>,
    ) -> impl FnOnce(std::io::Error) -> FacadeError {
        let path = path.as_ref().to_path_buf();
        move |source| FacadeError::Io { op, path, source }
    }

    /// Maps an error of the shared durability layer (its path and
    /// operation kept in the message).
    pub(crate) fn durable(e: durable_fs::Error) -> FacadeError {
        match e {
            durable_fs::Error::Io { op, path, source } => FacadeError::Io { op, path, source },
            other => FacadeError::Io {
                op: "durable write",
                path: other.path().to_path_buf(),
                source: std::io::Error::other(other),
            },
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = FacadeError> = std::result::Result<T, E>;

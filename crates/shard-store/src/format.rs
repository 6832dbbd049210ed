//! The on-disk format, written down once: loadit 0.0.8's directory layout.
//!
//! ```text
//! root/
//!   metadata.json              {"max_shard_length": int, "length": int,
//!                               "length_final": bool, "compression": str|null,
//!                               "version": 4, "info": any JSON}
//!   completed                  empty flag: the length is final and every shard is present
//!   shards/<start>.<end>.shard.pickle[.zstd]
//!                              a pickled Python list; element k is item start+k
//!   locks/writer_lock.lock     the root-wide lock (flock; loadit's `filelock` takes the same)
//!   locks/shard-<start>.lock   held while shard <start> is generated (shard-store only)
//!   scratch/                   temporary files, renamed into shards/ when durable
//!   quarantine/                corrupt shards moved aside (shard-store only; loadit ignores it)
//! ```
//!
//! Rules (loadit's, which we keep so that both tools share one root):
//! - Shard starts are multiples of `max_shard_length`; a shard holds at most
//!   `max_shard_length` items, and a shorter one is the last (it fixes the
//!   length). Empty shards are never written.
//! - Several shard files with the same start: the one with the largest end wins.
//! - `length` is a lower bound until `length_final` is true.
//! - `metadata.json` holds exactly these six keys (loadit builds a
//!   `NamedTuple` from it and refuses any other key). `version` is 4.
//! - Compression is `null` or `"zstd"` (then the shard name ends in `.zstd`
//!   and the file is one zstd frame around the pickle).
//!
//! Pickles are decoded without running anything: before decoding, every
//! opcode is checked by [`check_pickle`], which refuses class instances,
//! persistent ids, extension codes and every global except the few builtins
//! that plain data uses (`set`, `frozenset`, `bytearray`, `list`, and
//! `_codecs.encode` for bytes in protocol 2).

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::pickle_check::plan_pickle;
pub use crate::pickle_check::{MAX_EXPANSION, MAX_PICKLE_DEPTH, check_pickle};

/// The loadit metadata version this crate reads and writes.
pub const FORMAT_VERSION: u64 = 4;
/// The metadata file name.
pub const METADATA_FILE: &str = "metadata.json";
/// The flag file written when the length is final and every shard exists.
pub const COMPLETED_FILE: &str = "completed";
/// The shard directory.
pub const SHARDS_DIR: &str = "shards";
/// The lock directory.
pub const LOCKS_DIR: &str = "locks";
/// The scratch directory for files being written.
pub const SCRATCH_DIR: &str = "scratch";
/// Where corrupt shards are moved.
pub const QUARANTINE_DIR: &str = "quarantine";
/// Whether `path` (relative to a root, `/`-separated) is the machine's
/// own — locks, scratch space, quarantined shards — never published when
/// the root is kept in object storage.
pub fn is_private(path: &str) -> bool {
    [LOCKS_DIR, SCRATCH_DIR, QUARANTINE_DIR].iter().any(|d| {
        path == *d
            || path
                .strip_prefix(d)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// Whether `path` is a shard file, which a disk budget may evict from one
/// machine (and the source regenerate): its removal there is local, never
/// a removal of the published shard.
pub fn is_shard(path: &str) -> bool {
    path.strip_prefix(SHARDS_DIR)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// The root-wide lock file (shared with loadit).
pub const WRITER_LOCK_FILE: &str = "writer_lock.lock";
/// The suffix of an uncompressed shard file.
pub const SHARD_SUFFIX: &str = "shard.pickle";
/// Items pickled to estimate the item size for a byte-sized shard target.
pub const SIZE_ESTIMATE_ITEMS: usize = 128;
/// Largest shard file read into memory (guards against absurd files).
pub const MAX_SHARD_FILE_BYTES: u64 = 1 << 34;
/// Largest `metadata.json` read (its `info` is the user's, but small):
/// a larger one is refused as corrupt before it is read whole.
pub const MAX_METADATA_BYTES: u64 = 64 << 20;
/// Largest decompressed shard accepted (guards against decompression bombs).
pub const MAX_DECOMPRESSED_BYTES: u64 = 1 << 32;

/// Shard compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Plain pickle.
    #[default]
    None,
    /// One zstd frame around the pickle (loadit/fsspec name `"zstd"`).
    Zstd,
}

impl Compression {
    /// The name stored in `metadata.json` (`None` for no compression).
    pub fn name(self) -> Option<&'static str> {
        match self {
            Compression::None => None,
            Compression::Zstd => Some("zstd"),
        }
    }

    /// Parses a stored name.
    pub fn from_name(name: Option<&str>) -> Option<Compression> {
        match name {
            None => Some(Compression::None),
            Some("zstd") => Some(Compression::Zstd),
            Some(_) => None,
        }
    }

    /// The shard file suffix, e.g. `shard.pickle.zstd`.
    pub fn suffix(self) -> String {
        match self.name() {
            None => SHARD_SUFFIX.to_string(),
            Some(n) => format!("{SHARD_SUFFIX}.{n}"),
        }
    }
}

/// The content of `metadata.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Items per full shard.
    pub max_shard_length: u64,
    /// Items known to exist (final when `length_final`).
    pub length: u64,
    /// Whether `length` is the true length.
    pub length_final: bool,
    /// `null` or `"zstd"`.
    pub compression: Option<String>,
    /// Always [`FORMAT_VERSION`].
    pub version: u64,
    /// Free user JSON.
    #[serde(default)]
    pub info: serde_json::Value,
}

impl Metadata {
    /// Parses and validates `metadata.json` text read from `path`.
    pub fn parse(path: &Path, text: &[u8]) -> Result<Metadata> {
        let bad = |reason: String| Error::BadMetadata {
            path: path.to_path_buf(),
            reason,
        };
        let m: Metadata = serde_json::from_slice(text).map_err(|e| bad(e.to_string()))?;
        if m.version != FORMAT_VERSION {
            return Err(bad(format!(
                "version {} (this reader knows {FORMAT_VERSION})",
                m.version
            )));
        }
        if m.max_shard_length == 0 {
            return Err(bad("max_shard_length is 0".into()));
        }
        if Compression::from_name(m.compression.as_deref()).is_none() {
            return Err(bad(format!(
                "compression {:?} is not supported (only null or \"zstd\")",
                m.compression
            )));
        }
        Ok(m)
    }

    /// The compression, validated by [`Metadata::parse`].
    pub fn compression(&self) -> Compression {
        Compression::from_name(self.compression.as_deref()).unwrap_or_default()
    }

    /// The JSON text written to disk.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing this struct cannot fail: every field is plain JSON.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A parsed shard file name `<start>.<end>.<suffix>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardName {
    /// First item index.
    pub start: u64,
    /// One past the last item index.
    pub end: u64,
}

impl ShardName {
    /// The file name for `compression`.
    pub fn file_name(&self, compression: Compression) -> String {
        format!("{}.{}.{}", self.start, self.end, compression.suffix())
    }

    /// Number of items in the shard.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the shard is empty (never true for a parsed name).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// Parses a file name; `None` when it is not a shard of `compression`.
    pub fn parse(name: &str, compression: Compression) -> Option<ShardName> {
        let rest = name.strip_suffix(&compression.suffix())?;
        let rest = rest.strip_suffix('.')?;
        let (start, end) = rest.split_once('.')?;
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(start) || !digits(end) {
            return None;
        }
        let start: u64 = start.parse().ok()?;
        let end: u64 = end.parse().ok()?;
        (start < end).then_some(ShardName { start, end })
    }
}

/// What a store item must be: shareable across threads, and encodable as
/// the pickle of a shard (a list of items) and back — the store's codec.
///
/// Every `Serialize + DeserializeOwned` type is a store item through
/// serde-pickle (plain data only; shards holding Python objects are
/// refused). A type that pickles some other way — e.g. a language
/// binding's handle to a foreign object, pickled by the foreign runtime —
/// implements the two methods itself; the store still does the files,
/// compression, locks, eviction and bookkeeping.
pub trait StoreItem: Send + Sync + Sized + 'static {
    /// The uncompressed bytes of a shard file holding `items`: a pickled
    /// list. `path` names the shard for errors.
    fn encode_shard_items(path: &Path, items: &[Self]) -> Result<Vec<u8>>;

    /// The items of shard `name` from its uncompressed bytes; exactly
    /// `name.len()` of them, else [`Error::CorruptShard`].
    fn decode_shard_items(path: &Path, name: ShardName, pickle: &[u8]) -> Result<Vec<Self>>;
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> StoreItem for T {
    fn encode_shard_items(path: &Path, items: &[T]) -> Result<Vec<u8>> {
        encode_pickle(path, items)
    }

    fn decode_shard_items(path: &Path, name: ShardName, pickle: &[u8]) -> Result<Vec<T>> {
        decode_pickle(path, name, pickle)
    }
}

/// Encodes a shard: the pickled list (by the item type's codec,
/// [`StoreItem`]), compressed when asked.
pub fn encode_shard<T: StoreItem>(
    path: &Path,
    items: &[T],
    compression: Compression,
) -> Result<Vec<u8>> {
    let pickled = T::encode_shard_items(path, items)?;
    match compression {
        Compression::None => Ok(pickled),
        Compression::Zstd => {
            zstd::bulk::compress(&pickled, 3).map_err(Error::io("zstd compress", path))
        }
    }
}

/// Undoes the compression of a shard file's bytes.
pub fn decompress(path: &Path, bytes: Vec<u8>, compression: Compression) -> Result<Vec<u8>> {
    match compression {
        Compression::None => Ok(bytes),
        Compression::Zstd => {
            let mut out = Vec::new();
            // Streaming decode: the frame's declared size never drives an allocation.
            let mut dec =
                zstd::stream::read::Decoder::new(&bytes[..]).map_err(|e| Error::CorruptShard {
                    path: path.to_path_buf(),
                    reason: format!("zstd: {e}"),
                })?;
            // Read one byte past the cap to tell "at the cap" from "beyond it".
            let mut capped = std::io::Read::take(&mut dec, MAX_DECOMPRESSED_BYTES + 1);
            std::io::copy(&mut capped, &mut out).map_err(|e| Error::CorruptShard {
                path: path.to_path_buf(),
                reason: format!("zstd: {e}"),
            })?;
            if out.len() as u64 > MAX_DECOMPRESSED_BYTES {
                return Err(Error::CorruptShard {
                    path: path.to_path_buf(),
                    reason: format!("decompresses to more than {MAX_DECOMPRESSED_BYTES} bytes"),
                });
            }
            Ok(out)
        }
    }
}

/// Decodes the (decompressed) pickle of shard `name` by the item type's
/// codec ([`StoreItem`]), which checks that it holds exactly `name.len()`
/// items.
pub fn decode_shard<T: StoreItem>(path: &Path, name: ShardName, pickle: &[u8]) -> Result<Vec<T>> {
    T::decode_shard_items(path, name, pickle)
}

/// The serde codec's encoding: `items` pickled as a list by serde-pickle.
pub fn encode_pickle<T: Serialize>(path: &Path, items: &[T]) -> Result<Vec<u8>> {
    serde_pickle::to_vec(&items, serde_pickle::SerOptions::new()).map_err(|source| Error::Encode {
        path: path.to_path_buf(),
        source,
    })
}

/// The serde codec's decoding: checks that the pickle is plain data and
/// holds exactly `name.len()` items. Streams written by serde-pickle decode
/// without an intermediate value tree (see `stream.rs`); any other stream
/// decodes with serde-pickle.
pub fn decode_pickle<T: DeserializeOwned>(
    path: &Path,
    name: ShardName,
    pickle: &[u8],
) -> Result<Vec<T>> {
    let plan = plan_pickle(path, pickle)?;
    if plan.count != Some(name.len()) {
        return Err(Error::CorruptShard {
            path: path.to_path_buf(),
            reason: match plan.count {
                Some(c) => format!("holds {c} items, its name says {}", name.len()),
                None => "the pickle is not a list".into(),
            },
        });
    }
    if plan.streamable
        && let Ok(items) = crate::stream::decode_list(pickle, &plan.closers, name.len())
    {
        return Ok(items);
    }
    serde_pickle::from_slice(pickle, serde_pickle::DeOptions::new()).map_err(
        |source| match source {
            serde_pickle::Error::Io(_) | serde_pickle::Error::Eval(..) => Error::CorruptShard {
                path: path.to_path_buf(),
                reason: source.to_string(),
            },
            serde_pickle::Error::Syntax(_) => Error::ItemType {
                path: path.to_path_buf(),
                source,
            },
        },
    )
}

//! Open-or-build: find the cache of a config, check its fingerprint, and
//! build, resume or rebuild it as needed.

use std::fmt;
use std::path::{Path, PathBuf};

use fingerprint::{Fingerprint, SourceStamp, Stale};
use serde::Serialize;

use crate::format::{LOCK_FILE, MANIFEST_FILE, Schema};
use crate::reader::MemmapArray;
use crate::recover::read_manifest_header;
use crate::writer::{RowWriter, WriterOptions, take_lock};
use crate::{Error, Result};

/// The cache version of this store, recorded in every fingerprint: bumping
/// it makes every existing cache stale.
pub const CACHE_VERSION: u32 = 1;

/// The backend name in a cache's identity ([`fingerprint::cache_identity`]).
pub const BACKEND_NAME: &str = "memmap-array";

/// Why [`open_or_build`] threw an existing cache (or half-built cache) away.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RebuildReason {
    /// The fingerprint differs: config, source files or versions changed.
    Stale(Stale),
    /// The cache could not be read (the error says why).
    Unreadable(String),
    /// A half-built cache was started with another schema.
    SchemaChanged(String),
}

impl fmt::Display for RebuildReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RebuildReason::Stale(stale) => write!(f, "stale: {stale}"),
            RebuildReason::Unreadable(e) => write!(f, "unreadable: {e}"),
            RebuildReason::SchemaChanged(e) => write!(f, "schema changed: {e}"),
        }
    }
}

/// What [`open_or_build`] did; its `Display` is the line to log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// A complete cache with a matching fingerprint was opened.
    Hit,
    /// There was no cache: it was built.
    Built,
    /// A half-built cache was resumed after this many committed rows.
    Resumed {
        /// Rows that were already committed (the builder skipped them).
        committed_rows: u64,
    },
    /// A cache existed but could not be used: it was deleted and rebuilt.
    Rebuilt {
        /// Why it could not be used.
        why: RebuildReason,
    },
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Hit => f.write_str("cache hit"),
            Outcome::Built => f.write_str("cache built"),
            Outcome::Resumed { committed_rows } => {
                write!(f, "cache resumed after {committed_rows} committed rows")
            }
            Outcome::Rebuilt { why } => write!(f, "cache rebuilt ({why})"),
        }
    }
}

/// A cache opened by [`open_or_build`].
#[derive(Debug)]
pub struct Opened {
    /// The open cache.
    pub cache: MemmapArray,
    /// What was done to get it.
    pub outcome: Outcome,
    /// Its directory, `root/<name>/<key>`.
    pub dir: PathBuf,
}

/// Opens the cache `name` of `config` under `root` — in
/// `root/<name>/<key>`, the key and the fingerprint's config being
/// [`fingerprint::cache_identity`]`("memmap-array", name, config)`, exactly
/// as `cache-facade` keys a memmap-array cache with that name and options,
/// so a cache built one way is found the other — building it with `build` when it is missing, resuming it when a previous
/// build stopped half-way, and deleting and rebuilding it when its
/// fingerprint (config, `sources`, [`CACHE_VERSION`]) no longer matches.
/// [`Outcome`] says which happened and why.
///
/// `build` gets the writer and writes every row whose source is not in
/// [`RowWriter::resume_keys`]; `open_or_build` finalizes. A concurrent
/// builder of the same cache gets [`Error::Locked`].
///
/// ```
/// use memmap_array::{NewRow, Outcome, Schema, open_or_build};
/// use tensor_core::{DType, Tensor};
///
/// let root = tempfile::tempdir().unwrap();
/// let schema = Schema::builder().array("x", DType::F32, [2]).build()?;
/// let config = serde_json::json!({"features": "mfcc", "dim": 2});
/// let build = |w: &mut memmap_array::RowWriter| -> memmap_array::Result<()> {
///     for i in 0..3 {
///         let id = format!("item{i}");
///         if w.resume_key_set().contains(id.as_str()) { continue; }
///         let t = Tensor::from_vec([2], vec![i as f32; 2]).unwrap();
///         w.write(&NewRow::new(&id).array("x", t.view()))?;
///     }
///     Ok(())
/// };
/// let first = open_or_build(root.path(), "feats", &config, Vec::new(), &schema, build)?;
/// assert_eq!(first.outcome, Outcome::Built);
/// assert!(first.dir.starts_with(root.path().join("feats")));
/// let again = open_or_build(root.path(), "feats", &config, Vec::new(), &schema, build)?;
/// assert_eq!(again.outcome, Outcome::Hit);
/// assert_eq!(again.cache.len(), 3);
/// # Ok::<(), memmap_array::Error>(())
/// ```
pub fn open_or_build<C, E, F>(
    root: &Path,
    name: &str,
    config: &C,
    sources: Vec<SourceStamp>,
    schema: &Schema,
    build: F,
) -> std::result::Result<Opened, E>
where
    C: Serialize + ?Sized,
    E: From<Error>,
    F: FnOnce(&mut RowWriter) -> std::result::Result<(), E>,
{
    open_or_build_with(
        root,
        name,
        config,
        sources,
        schema,
        WriterOptions::default(),
        build,
    )
}

/// [`open_or_build`] with explicit writer options.
pub fn open_or_build_with<C, E, F>(
    root: &Path,
    name: &str,
    config: &C,
    sources: Vec<SourceStamp>,
    schema: &Schema,
    options: WriterOptions,
    build: F,
) -> std::result::Result<Opened, E>
where
    C: Serialize + ?Sized,
    E: From<Error>,
    F: FnOnce(&mut RowWriter) -> std::result::Result<(), E>,
{
    let identity = fingerprint::cache_identity(BACKEND_NAME, name, config).map_err(Error::from)?;
    let dir = fingerprint::named_cache_dir(root, name, &identity).map_err(Error::from)?;
    let current =
        fingerprint::compute_fingerprint(&identity, sources, CACHE_VERSION).map_err(Error::from)?;

    // Fast path, no lock: a complete cache that matches.
    let mut why = None;
    if fingerprint::is_complete(&dir) {
        match fingerprint::check_dir(&dir, &current) {
            Ok(()) => match MemmapArray::open(&dir) {
                Ok(cache) => match cache.schema().difference(schema) {
                    None => {
                        return Ok(Opened {
                            cache,
                            outcome: Outcome::Hit,
                            dir,
                        });
                    }
                    Some(diff) => why = Some(RebuildReason::SchemaChanged(diff)),
                },
                Err(e) => why = Some(RebuildReason::Unreadable(e.to_string())),
            },
            Err(stale) => why = Some(RebuildReason::Stale(stale)),
        }
    }

    std::fs::create_dir_all(&dir).map_err(Error::io("create directory", &dir))?;
    let lock = take_lock(&dir)?;
    let manifest = dir.join(MANIFEST_FILE);
    if why.is_none() && !fingerprint::is_complete(&dir) && manifest.is_file() {
        why = match read_manifest_header(&manifest) {
            Err(e) => Some(RebuildReason::Unreadable(e.to_string())),
            Ok((stored_schema, stored_fp)) => {
                match serde_json::from_value::<Fingerprint>(stored_fp) {
                    Err(e) => Some(RebuildReason::Unreadable(format!(
                        "{}: fingerprint in the header: {e}",
                        manifest.display()
                    ))),
                    Ok(stored) => match fingerprint::validate(&stored, &current) {
                        Err(stale) => Some(RebuildReason::Stale(stale)),
                        Ok(()) => stored_schema
                            .difference(schema)
                            .map(RebuildReason::SchemaChanged),
                    },
                }
            }
        };
    }
    if why.is_some() {
        clear_dir(&dir)?;
    }
    let resumable = why.is_none() && manifest.is_file();
    let mut writer = match RowWriter::open_locked(dir.clone(), lock, schema, &current, options) {
        Ok(w) => w,
        // Damage the header check could not see (a corrupt row line, a
        // short .bin): start over rather than fail, and say why.
        Err(e) if resumable => {
            let reason = RebuildReason::Unreadable(e.to_string());
            why = Some(reason);
            let lock = take_lock(&dir)?;
            clear_dir(&dir)?;
            RowWriter::open_locked(dir.clone(), lock, schema, &current, options)?
        }
        Err(e) => return Err(e.into()),
    };
    let committed_rows = writer.committed_rows();
    build(&mut writer)?;
    writer.finalize()?;
    let cache = MemmapArray::open(&dir)?;
    let outcome = match why {
        Some(why) => Outcome::Rebuilt { why },
        None if resumable => Outcome::Resumed { committed_rows },
        None => Outcome::Built,
    };
    Ok(Opened {
        cache,
        outcome,
        dir,
    })
}

/// Deletes everything in `dir` but the lock file (held by the caller),
/// `_COMPLETE` first so no reader trusts a half-deleted cache.
fn clear_dir(dir: &Path) -> Result<()> {
    fingerprint::clear_complete(dir)?;
    for entry in std::fs::read_dir(dir).map_err(Error::io("list", dir))? {
        let entry = entry.map_err(Error::io("list", dir))?;
        if entry.file_name() == LOCK_FILE {
            continue;
        }
        let path = entry.path();
        let result = if entry
            .file_type()
            .map_err(Error::io("stat", &path))?
            .is_dir()
        {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        result.map_err(Error::io("remove", &path))?;
    }
    durable_fs::sync_dir(dir).map_err(Error::durable)
}

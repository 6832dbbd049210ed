//! The registry of the kinds of cache cachex reads at a path: one
//! [`KindSpec`] per kind (each in its store's file under `backends/`),
//! listed once in [`KINDS`]. [`detect`], [`verify`] and the `cachex`
//! tool's `inspect`, `get` and `stats` all go through it; no other code
//! chooses by kind.

use std::io::Read;
use std::path::Path;

use cache_check::{Problem, ProblemKind, Summary};
use serde_json::Value;

use crate::backends::{memmap, pages, segment, shards};
use crate::{Detected, FacadeError, Result};

/// What cachex knows of one kind of cache at a path: how to recognise it
/// from its files, check it, describe it and read one record of it,
/// without opening it through a config.
pub trait KindSpec: Sync {
    /// The kind (and the peer format, for another tool's files).
    fn kind(&self) -> Detected;
    /// Whether the files at the probed path are of this kind (cheaply:
    /// names of files, the first bytes of a file).
    fn detect(&self, probe: &Probe<'_>) -> bool;
    /// Every problem of the cache at `path`, each naming its file (empty
    /// when sound); a cache that does not open is a problem.
    fn verify(&self, path: &Path) -> Vec<Problem>;
    /// What the cache holds: schema, counts, per-file tables.
    fn inspect(&self, path: &Path) -> Result<Summary>;
    /// One record, by key or index (negative from the end), as JSON
    /// ([`crate::json`]).
    fn get(&self, path: &Path, key: &str) -> Result<Value>;
    /// Counters and ratios `inspect` does not print: bytes per item, dead
    /// or absent data, fill and dedup ratios.
    fn stats(&self, path: &Path) -> Result<Summary>;
}

/// Every kind, in the order [`detect`] tries them (a directory of
/// segments is a segment-store with our index log, else torchcachex's).
pub static KINDS: &[&dyn KindSpec] = &[
    &segment::SEGMENT_STORE,
    &segment::TORCHCACHEX,
    &memmap::MEMMAP_ARRAY,
    &shards::SHARD_STORE,
    &pages::PAGE_ALLOC,
    &pages::BETON,
];

/// A path as the kinds' [`KindSpec::detect`] look at it: whether it is a
/// directory or a file, and a file's length and first bytes.
#[derive(Debug)]
pub struct Probe<'a> {
    /// The path.
    pub path: &'a Path,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// A readable file's length and its first [`Probe::HEAD_LEN`] bytes
    /// (fewer for a shorter file); `None` for a directory or a file that
    /// does not read.
    pub file: Option<(u64, Vec<u8>)>,
}

impl Probe<'_> {
    /// How many bytes of a file the probe reads: the longest header a
    /// kind looks at (FFCV's).
    pub const HEAD_LEN: usize = page_alloc::beton::HEADER_LEN;

    /// Looks at `path`.
    pub fn new(path: &Path) -> Probe<'_> {
        let meta = std::fs::metadata(path).ok();
        let is_file = meta.as_ref().is_some_and(|m| m.is_file());
        Probe {
            path,
            is_dir: meta.as_ref().is_some_and(|m| m.is_dir()),
            file: meta
                .filter(|_| is_file)
                .and_then(|m| Some((m.len(), head(path)?))),
        }
    }
}

/// The first [`Probe::HEAD_LEN`] bytes of the file at `path`.
fn head(path: &Path) -> Option<Vec<u8>> {
    let mut head = Vec::with_capacity(Probe::HEAD_LEN);
    let f = std::fs::File::open(path).ok()?;
    f.take(Probe::HEAD_LEN as u64).read_to_end(&mut head).ok()?;
    Some(head)
}

/// The kind of cache at `path`, or `None` when it is none we know.
pub fn detect(path: &Path) -> Option<Detected> {
    spec_at(path).map(|s| s.kind())
}

/// The registry's entry for the cache at `path`, or `None` when it is none
/// we know.
pub fn spec_at(path: &Path) -> Option<&'static dyn KindSpec> {
    let probe = Probe::new(path);
    KINDS.iter().copied().find(|s| s.detect(&probe))
}

/// The registry's entry for `kind`, or `None` for a pairing of store and
/// peer format that does not exist.
pub fn spec(kind: Detected) -> Option<&'static dyn KindSpec> {
    KINDS.iter().copied().find(|s| s.kind() == kind)
}

/// Every problem of the cache or file at `path`, of kind `kind` (as
/// [`detect`] found it), each naming its file: what `cachex verify` and
/// `cachex.verify` report. A path, not an open store, so it also checks
/// what cannot open (a damaged file, a half-built memmap-array cache).
pub fn verify(kind: Detected, path: &Path) -> Vec<Problem> {
    match spec(kind) {
        Some(s) => s.verify(path),
        None => vec![Problem::new(
            path,
            ProblemKind::Structure,
            format!(
                "no store reads {} files as {}",
                kind.kind.name(),
                kind.name()
            ),
        )],
    }
}

/// An index argument: `0 <= i < len`, or negative from the end.
pub(crate) fn parse_index(path: &Path, key: &str, len: u64) -> Result<u64> {
    let i: i64 = key.parse().map_err(|_| FacadeError::BadKey {
        path: path.to_path_buf(),
        key: key.to_owned(),
    })?;
    let resolved = if i < 0 {
        i128::from(len) + i128::from(i)
    } else {
        i128::from(i)
    };
    if resolved < 0 || resolved >= i128::from(len) {
        return Err(FacadeError::NoSuchRecord {
            path: path.to_path_buf(),
            what: format!("index {i} out of range for {len} items"),
        });
    }
    // In 0..len, so it fits.
    Ok(resolved as u64)
}

/// `a / b` as a JSON number, `null` when `b` is 0.
pub(crate) fn ratio(a: u64, b: u64) -> Value {
    if b == 0 {
        Value::Null
    } else {
        serde_json::json!(a as f64 / b as f64)
    }
}

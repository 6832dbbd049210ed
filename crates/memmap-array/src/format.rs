//! The on-disk format, written down once.
//!
//! ```text
//! <cache_dir>/<key>/
//!   <array>.bin        (N, *shape) C-order little-endian elements, no header:
//!                      row i of an array starts at byte i * row_bytes
//!   index.parquet      one row per cache row, columns (in this order):
//!                        row       int64   0, 1, ... N-1
//!                        source    utf8    the source id the row was built from
//!                        has_<a>   bool    per array: false = row stored zero-filled, read as None
//!                        key_<s>   int64?  per sidecar: key into <s>.json, null = no value
//!                        meta_json utf8?   the row's metadata JSON text
//!                      key-value metadata "memmap_array.version" = "1"
//!   <sidecar>.json     {"0": "<string>", "1": "<string>", ...}: each distinct
//!                      sidecar string once, keys dense from 0 in first-use order
//!   shapes.json        {"format": "memmap-array", "version": 1, "rows": N,
//!                       "arrays": [{"name", "dtype" (numpy string, e.g. "<i2"),
//!                                   "shape", "row_bytes", "nullable"}],
//!                       "sidecars": ["<name>", ...]}
//!   fingerprint.json   the fingerprint the writer was given (any JSON)
//!   _COMPLETE          empty sentinel: every file above is durable
//!   manifest.jsonl     commit log while writing (see below); gone once complete
//!   .writer.lock       advisory lock file of the one writer (fs2)
//! ```
//!
//! `manifest.jsonl` holds a header line
//! `{"format": "memmap-array/manifest", "version": 1, "schema": {..},
//! "fingerprint": ..}` and then one line per committed row:
//! `{"row": i, "source": "..", "present": [bool per array],
//! "sidecars": [key or null per sidecar], "new": [[sidecar index, key,
//! "value"], ..], "meta": "json text" or null}`. A sidecar value is spelled
//! out (`new`) on the first row that uses it and referred to by key after
//! that. Row `i`'s bytes are in every `.bin` before its line is written. Only
//! the last line may be torn (no newline, or not JSON); recovery drops it.
//!
//! Everything read from disk is validated before use: version, names,
//! dtypes, shapes (overflow-checked), row byte counts, file sizes, row
//! numbering, sidecar keys.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tensor_core::{DType, Shape};

use crate::{Error, Result};

/// The format version written and read by this crate.
pub const FORMAT_VERSION: u64 = 1;
/// `format` field of `shapes.json`.
pub const SHAPES_FORMAT: &str = "memmap-array";
/// `format` field of the manifest header line.
pub const MANIFEST_FORMAT: &str = "memmap-array/manifest";
/// The row index file.
pub const INDEX_FILE: &str = "index.parquet";
/// The shapes and schema file.
pub const SHAPES_FILE: &str = "shapes.json";
/// The fingerprint file.
pub const FINGERPRINT_FILE: &str = "fingerprint.json";
/// The commit log of an unfinished cache.
pub const MANIFEST_FILE: &str = "manifest.jsonl";
/// The sentinel of a finished cache.
pub const COMPLETE_FILE: &str = "_COMPLETE";
/// The writer's advisory lock file.
pub const LOCK_FILE: &str = ".writer.lock";
/// Suffix of temporary files, renamed into place once durable.
pub const TMP_SUFFIX: &str = durable_fs::TMP_SUFFIX;
/// Parquet key-value metadata key holding the format version.
pub const INDEX_VERSION_KEY: &str = "memmap_array.version";
/// Index column: row number.
pub const COL_ROW: &str = "row";
/// Index column: source id.
pub const COL_SOURCE: &str = "source";
/// Index column: metadata JSON text.
pub const COL_META: &str = "meta_json";

/// Largest `shapes.json` / `fingerprint.json` read (they are small).
pub(crate) const MAX_SMALL_JSON: u64 = 64 << 20;
/// Most arrays or sidecars a schema may declare.
pub const MAX_FIELDS: usize = 1024;
/// Most dimensions of a per-row shape.
pub const MAX_RANK: usize = 32;
/// Longest array or sidecar name.
pub const MAX_NAME_LEN: usize = 128;

/// Index column holding the presence flag of array `name`.
pub fn has_column(name: &str) -> String {
    format!("has_{name}")
}

/// Index column holding the key of sidecar `name`.
pub fn key_column(name: &str) -> String {
    format!("key_{name}")
}

/// The data file of array `name`.
pub fn bin_file(name: &str) -> String {
    format!("{name}.bin")
}

/// Whether `path` (relative to the cache directory) is an array file,
/// which a reader maps and reads rows of: readers that fetch files in
/// parts (remote-cache) read these by blocks.
pub fn is_array_file(path: &str) -> bool {
    !path.contains('/') && path.ends_with(".bin")
}

/// The file of sidecar `name`.
pub fn sidecar_file(name: &str) -> String {
    format!("{name}.json")
}

/// One named array of a schema: every row holds one tensor of `dtype` and
/// `shape` in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArraySpec {
    name: String,
    dtype: DType,
    shape: Shape,
    nullable: bool,
    row_bytes: usize,
}

impl ArraySpec {
    /// The array's name (its file is `<name>.bin`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Per-row shape (the file holds `(N, *shape)`).
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// Whether a row may lack this array.
    pub fn nullable(&self) -> bool {
        self.nullable
    }
    /// Bytes one row of this array occupies.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }
    /// The dtype as stored in `shapes.json`: the numpy string (`"<i2"`), or
    /// the canonical name for bfloat16, which numpy lacks.
    pub fn dtype_str(&self) -> &'static str {
        self.dtype.numpy_str().unwrap_or(self.dtype.name())
    }
}

/// The arrays and sidecars of a cache, declared when the writer is created.
///
/// ```
/// use memmap_array::Schema;
/// use tensor_core::DType;
///
/// let schema = Schema::builder()
///     .array("data", DType::I16, [3, 4096])
///     .nullable_array("annotation", DType::I8, [3, 4096])
///     .sidecar("loci")
///     .build()?;
/// assert_eq!(schema.arrays()[0].row_bytes(), 3 * 4096 * 2);
/// # Ok::<(), memmap_array::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    arrays: Vec<ArraySpec>,
    sidecars: Vec<String>,
}

/// Builds a [`Schema`]; names are checked by [`SchemaBuilder::build`].
#[derive(Debug, Default, Clone)]
pub struct SchemaBuilder {
    arrays: Vec<(String, DType, Shape, bool)>,
    sidecars: Vec<String>,
}

impl SchemaBuilder {
    /// Declares an array every row must have.
    pub fn array(mut self, name: &str, dtype: DType, shape: impl Into<Shape>) -> Self {
        self.arrays
            .push((name.to_owned(), dtype, shape.into(), false));
        self
    }
    /// Declares an array a row may lack (stored zero-filled, read as `None`).
    pub fn nullable_array(mut self, name: &str, dtype: DType, shape: impl Into<Shape>) -> Self {
        self.arrays
            .push((name.to_owned(), dtype, shape.into(), true));
        self
    }
    /// Declares a sidecar: a string per row (often a large JSON text shared
    /// by many rows), stored once per distinct value in `<name>.json`.
    pub fn sidecar(mut self, name: &str) -> Self {
        self.sidecars.push(name.to_owned());
        self
    }
    /// Checks names, shapes and sizes.
    pub fn build(self) -> Result<Schema> {
        let invalid = |reason: String| Error::InvalidSchema { reason };
        let mut arrays = Vec::with_capacity(self.arrays.len());
        for (name, dtype, shape, nullable) in self.arrays {
            arrays.push(ArraySpec::new(name, dtype, shape, nullable).map_err(invalid)?);
        }
        let schema = Schema {
            arrays,
            sidecars: self.sidecars,
        };
        schema.check().map_err(invalid)?;
        Ok(schema)
    }
}

impl ArraySpec {
    fn new(
        name: String,
        dtype: DType,
        shape: Shape,
        nullable: bool,
    ) -> std::result::Result<Self, String> {
        if shape.rank() > MAX_RANK {
            return Err(format!(
                "array {name:?}: {} dimensions, at most {MAX_RANK}",
                shape.rank()
            ));
        }
        let row_bytes = shape
            .byte_len(dtype)
            .map_err(|e| format!("array {name:?}: {e}"))?;
        Ok(ArraySpec {
            name,
            dtype,
            shape,
            nullable,
            row_bytes,
        })
    }
}

impl Schema {
    /// Starts a schema.
    pub fn builder() -> SchemaBuilder {
        SchemaBuilder::default()
    }
    /// The arrays, in declaration order.
    pub fn arrays(&self) -> &[ArraySpec] {
        &self.arrays
    }
    /// The sidecar names, in declaration order.
    pub fn sidecars(&self) -> &[String] {
        &self.sidecars
    }
    /// Position of array `name`.
    pub fn array_index(&self, name: &str) -> Option<usize> {
        self.arrays.iter().position(|a| a.name == name)
    }
    /// Position of sidecar `name`.
    pub fn sidecar_index(&self, name: &str) -> Option<usize> {
        self.sidecars.iter().position(|s| s == name)
    }
    /// Bytes one row occupies over all arrays (saturating).
    pub fn row_bytes(&self) -> u64 {
        self.arrays
            .iter()
            .fold(0u64, |acc, a| acc.saturating_add(a.row_bytes as u64))
    }

    fn check(&self) -> std::result::Result<(), String> {
        if self.arrays.is_empty() {
            return Err("a schema needs at least one array".into());
        }
        if self.arrays.len() > MAX_FIELDS || self.sidecars.len() > MAX_FIELDS {
            return Err(format!(
                "at most {MAX_FIELDS} arrays and {MAX_FIELDS} sidecars"
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for name in self
            .arrays
            .iter()
            .map(|a| a.name.as_str())
            .chain(self.sidecars.iter().map(String::as_str))
        {
            check_name(name)?;
            if !seen.insert(name) {
                return Err(format!("name {name:?} is declared twice"));
            }
        }
        for name in &self.sidecars {
            let file = sidecar_file(name);
            if [SHAPES_FILE, FINGERPRINT_FILE].contains(&file.as_str()) {
                return Err(format!("sidecar name {name:?} clashes with {file}"));
            }
        }
        Ok(())
    }

    /// The stored form (shapes.json / manifest header).
    pub(crate) fn to_stored(&self) -> StoredSchema {
        StoredSchema {
            arrays: self
                .arrays
                .iter()
                .map(|a| StoredArray {
                    name: a.name.clone(),
                    dtype: a.dtype_str().to_owned(),
                    shape: a.shape.dims().iter().map(|&d| d as u64).collect(),
                    row_bytes: a.row_bytes as u64,
                    nullable: a.nullable,
                })
                .collect(),
            sidecars: self.sidecars.clone(),
        }
    }

    /// Validates a stored schema read from `file`.
    pub(crate) fn from_stored(stored: StoredSchema, file: &Path) -> Result<Schema> {
        let bad = |reason: String| Error::corrupt(file, reason);
        if stored.arrays.len() > MAX_FIELDS || stored.sidecars.len() > MAX_FIELDS {
            return Err(bad(format!("more than {MAX_FIELDS} arrays or sidecars")));
        }
        let mut arrays = Vec::with_capacity(stored.arrays.len());
        for a in stored.arrays {
            let dtype =
                DType::from_str(&a.dtype).map_err(|e| bad(format!("array {:?}: {e}", a.name)))?;
            if a.shape.len() > MAX_RANK {
                return Err(bad(format!("array {:?}: rank above {MAX_RANK}", a.name)));
            }
            let dims = a
                .shape
                .iter()
                .map(|&d| usize::try_from(d))
                .collect::<std::result::Result<Vec<usize>, _>>()
                .map_err(|_| bad(format!("array {:?}: dimension overflows usize", a.name)))?;
            let spec =
                ArraySpec::new(a.name, dtype, Shape::from(dims), a.nullable).map_err(&bad)?;
            if spec.row_bytes as u64 != a.row_bytes {
                return Err(bad(format!(
                    "array {:?}: row_bytes {} but dtype {} and shape {} make {}",
                    spec.name, a.row_bytes, spec.dtype, spec.shape, spec.row_bytes
                )));
            }
            arrays.push(spec);
        }
        let schema = Schema {
            arrays,
            sidecars: stored.sidecars,
        };
        schema.check().map_err(bad)?;
        Ok(schema)
    }

    /// The first difference between two schemas, if any.
    pub(crate) fn difference(&self, other: &Schema) -> Option<String> {
        if self.arrays.len() != other.arrays.len() {
            return Some(format!(
                "{} arrays stored, {} given",
                self.arrays.len(),
                other.arrays.len()
            ));
        }
        for (a, b) in self.arrays.iter().zip(&other.arrays) {
            if a != b {
                return Some(format!(
                    "array {} {} {}{} stored, {} {} {}{} given",
                    a.name,
                    a.dtype,
                    a.shape,
                    if a.nullable { " nullable" } else { "" },
                    b.name,
                    b.dtype,
                    b.shape,
                    if b.nullable { " nullable" } else { "" },
                ));
            }
        }
        if self.sidecars != other.sidecars {
            return Some(format!(
                "sidecars {:?} stored, {:?} given",
                self.sidecars, other.sidecars
            ));
        }
        None
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.arrays.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}: {}{}", a.name, a.dtype, a.shape)?;
            if a.nullable {
                f.write_str("?")?;
            }
        }
        for s in &self.sidecars {
            write!(f, ", sidecar {s}")?;
        }
        Ok(())
    }
}

/// Array and sidecar names become file and column names: keep them plain.
fn check_name(name: &str) -> std::result::Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.';
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    if name.len() > MAX_NAME_LEN || !first_ok || !name.chars().all(ok_char) {
        return Err(format!(
            "name {name:?}: use 1 to {MAX_NAME_LEN} of [A-Za-z0-9_.-], not starting with '.' or '-'"
        ));
    }
    Ok(())
}

/// One array as stored in JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StoredArray {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub row_bytes: u64,
    pub nullable: bool,
}

/// A schema as stored in JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StoredSchema {
    pub arrays: Vec<StoredArray>,
    pub sidecars: Vec<String>,
}

/// `shapes.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ShapesFile {
    pub format: String,
    pub version: u64,
    pub rows: u64,
    #[serde(flatten)]
    pub schema: StoredSchema,
}

/// The validated content of `shapes.json`.
#[derive(Debug, Clone)]
pub(crate) struct Shapes {
    pub rows: u64,
    pub schema: Schema,
}

impl Shapes {
    pub(crate) fn to_json(&self) -> Vec<u8> {
        let file = ShapesFile {
            format: SHAPES_FORMAT.to_owned(),
            version: FORMAT_VERSION,
            rows: self.rows,
            schema: self.schema.to_stored(),
        };
        let mut out = serde_json::to_vec_pretty(&file).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// Parses and validates `shapes.json` bytes read from `file`.
    pub(crate) fn parse(bytes: &[u8], file: &Path) -> Result<Shapes> {
        let parsed: ShapesFile = serde_json::from_slice(bytes).map_err(|source| Error::Json {
            file: file.to_owned(),
            source,
        })?;
        if parsed.format != SHAPES_FORMAT {
            return Err(Error::corrupt(
                file,
                format!("format {:?}, expected {SHAPES_FORMAT:?}", parsed.format),
            ));
        }
        check_version(parsed.version, file)?;
        let schema = Schema::from_stored(parsed.schema, file)?;
        for a in &schema.arrays {
            if (a.row_bytes as u64).checked_mul(parsed.rows).is_none() {
                return Err(Error::corrupt(
                    file,
                    format!(
                        "{} rows of array {:?} overflow 64 bits",
                        parsed.rows, a.name
                    ),
                ));
            }
        }
        Ok(Shapes {
            rows: parsed.rows,
            schema,
        })
    }
}

pub(crate) fn check_version(found: u64, file: &Path) -> Result<()> {
    if found != FORMAT_VERSION {
        return Err(Error::UnsupportedVersion {
            file: file.to_owned(),
            found,
            supported: FORMAT_VERSION,
        });
    }
    Ok(())
}

/// The manifest's first line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ManifestHeader {
    pub format: String,
    pub version: u64,
    pub schema: StoredSchema,
    #[serde(default)]
    pub fingerprint: serde_json::Value,
}

/// One committed row of the manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ManifestRow {
    pub row: u64,
    pub source: String,
    pub present: Vec<bool>,
    pub sidecars: Vec<Option<u64>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub new: Vec<(usize, u64, String)>,
    #[serde(default)]
    pub meta: Option<String>,
}

/// Parses a sidecar file: `{"0": "..", "1": ".."}` with dense keys.
pub(crate) fn parse_sidecar(bytes: &[u8], file: &Path) -> Result<Vec<String>> {
    let map: std::collections::HashMap<String, String> =
        serde_json::from_slice(bytes).map_err(|source| Error::Json {
            file: file.to_owned(),
            source,
        })?;
    let mut values: Vec<Option<String>> = vec![None; map.len()];
    for (key, value) in map {
        let k: usize = key
            .parse()
            .ok()
            .filter(|&k| k < values.len())
            .ok_or_else(|| {
                Error::corrupt(
                    file,
                    format!("key {key:?} is not an integer below the entry count"),
                )
            })?;
        // Keys are unique JSON object keys, but "1" and "01" parse alike.
        if values[k].replace(value).is_some() {
            return Err(Error::corrupt(file, format!("key {k} appears twice")));
        }
    }
    // Every slot is filled: as many distinct keys below len as entries.
    Ok(values.into_iter().flatten().collect())
}

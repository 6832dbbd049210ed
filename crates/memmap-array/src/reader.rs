//! The reader: validated open, lazy memory maps, zero-copy rows.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tensor_core::TensorView;

use crate::format::{
    self, ArraySpec, COMPLETE_FILE, FINGERPRINT_FILE, INDEX_FILE, MAX_SMALL_JSON, SHAPES_FILE,
    Schema, Shapes,
};
use crate::index::{Index, NO_KEY, read_index};
use crate::{Error, Result};

/// Default share of physical RAM that [`MemmapArray::load_in_memory`] may use.
pub const DEFAULT_RAM_FRACTION: f64 = 0.5;

/// Where one array's bytes live.
enum Backing {
    /// A read-only map of the `.bin` file.
    Map(memmap2::Mmap),
    /// A copy in RAM, 8-byte aligned so typed access always works.
    Heap { words: Vec<u64>, len: usize },
    /// A zero-length array (no rows, or zero-size rows): nothing to map.
    Empty,
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(map) => map,
            Backing::Heap { words, len } => {
                // SAFETY: `words` holds at least `len` initialised bytes
                // (len.div_ceil(8) words, see `load_file`) and u8 has
                // alignment 1; the slice borrows self.
                unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), *len) }
            }
            Backing::Empty => &[],
        }
    }
}

struct ArrayFile {
    path: PathBuf,
    len: usize,
    backing: OnceLock<Backing>,
}

/// A finished cache, open for reading. `Send + Sync`: share it (e.g. in an
/// `Arc`) and read from many threads at once; after the first touch of
/// each array the hot path takes no lock.
pub struct MemmapArray {
    dir: PathBuf,
    rows: u64,
    schema: Schema,
    index: Index,
    arrays: Vec<ArrayFile>,
    sidecars: Vec<OnceLock<Vec<String>>>,
    fingerprint: serde_json::Value,
    /// Row numbers sorted by source id, built on the first lookup.
    by_source: OnceLock<Vec<u64>>,
}

impl std::fmt::Debug for MemmapArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemmapArray")
            .field("dir", &self.dir)
            .field("rows", &self.rows)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

/// One row of a cache: zero-copy views of its arrays, and its index entry.
#[derive(Debug, Clone)]
pub struct Row<'a> {
    cache: &'a MemmapArray,
    index: usize,
    arrays: Vec<Option<TensorView<'a>>>,
}

impl<'a> Row<'a> {
    /// The row number.
    pub fn index(&self) -> u64 {
        self.index as u64
    }
    /// The source id the row was built from.
    pub fn source(&self) -> &'a str {
        self.cache.index.sources.get(self.index).unwrap_or("")
    }
    /// The row's metadata JSON text, if it had any.
    pub fn meta_json(&self) -> Option<&'a str> {
        self.cache.index.meta.get(self.index)
    }
    /// Every array in schema order (`None` where the row lacks it).
    pub fn arrays(&self) -> &[Option<TensorView<'a>>] {
        &self.arrays
    }
    /// Array `name`: `Ok(None)` when the row lacks it, an error when the
    /// schema has no such array.
    pub fn get(&self, name: &str) -> Result<Option<&TensorView<'a>>> {
        let k = self.cache.array_position(name)?;
        Ok(self.arrays[k].as_ref())
    }
    /// The row's value of sidecar `name` (the sidecar file is read on
    /// first use and cached).
    pub fn sidecar(&self, name: &str) -> Result<Option<&'a str>> {
        self.cache.sidecar(name, self.index as u64)
    }
}

impl MemmapArray {
    /// Opens a finished cache: checks `_COMPLETE`, parses and validates
    /// `shapes.json`, checks every `.bin` size against it, and loads the
    /// index. The `.bin` files are mapped on first use.
    pub fn open(dir: impl AsRef<Path>) -> Result<MemmapArray> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.join(COMPLETE_FILE).is_file() {
            return Err(Error::Incomplete { dir });
        }
        let shapes = read_shapes(&dir)?;
        let arrays = check_bin_sizes(&dir, &shapes)?;
        let index = read_index(&dir.join(INDEX_FILE), &shapes.schema, shapes.rows)?;
        let fp_path = dir.join(FINGERPRINT_FILE);
        let fingerprint = serde_json::from_slice(
            &durable_fs::read_capped(&fp_path, MAX_SMALL_JSON).map_err(Error::durable)?,
        )
        .map_err(|source| Error::Json {
            file: fp_path,
            source,
        })?;
        Ok(MemmapArray {
            sidecars: shapes
                .schema
                .sidecars()
                .iter()
                .map(|_| OnceLock::new())
                .collect(),
            dir,
            rows: shapes.rows,
            schema: shapes.schema,
            index,
            arrays: arrays
                .into_iter()
                .map(|(path, len)| ArrayFile {
                    path,
                    len,
                    backing: OnceLock::new(),
                })
                .collect(),
            fingerprint,
            by_source: OnceLock::new(),
        })
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Number of rows.
    pub fn len(&self) -> u64 {
        self.rows
    }
    /// Whether the cache has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }
    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }
    /// The content of `fingerprint.json`.
    pub fn fingerprint(&self) -> &serde_json::Value {
        &self.fingerprint
    }
    /// Bytes the index occupies in memory.
    pub fn index_heap_bytes(&self) -> usize {
        self.index.heap_bytes()
    }

    /// The decoded index (for `inspect` and `verify`).
    pub(crate) fn index(&self) -> &Index {
        &self.index
    }

    /// Row `i`: a zero-copy view of every array (`None` where the row lacks
    /// a nullable array).
    pub fn row(&self, i: u64) -> Result<Row<'_>> {
        let index = self.check_row(i)?;
        let mut arrays = Vec::with_capacity(self.arrays.len());
        for k in 0..self.arrays.len() {
            arrays.push(self.view(k, index)?);
        }
        Ok(Row {
            cache: self,
            index,
            arrays,
        })
    }

    /// Array `name` of row `i` alone (no per-row allocation).
    pub fn array(&self, i: u64, name: &str) -> Result<Option<TensorView<'_>>> {
        let index = self.check_row(i)?;
        let k = self.array_position(name)?;
        self.view(k, index)
    }

    /// Array number `k` (schema order) of row `i`; see [`MemmapArray::array`].
    pub fn array_at(&self, i: u64, k: usize) -> Result<Option<TensorView<'_>>> {
        let index = self.check_row(i)?;
        if k >= self.arrays.len() {
            return Err(Error::UnknownName {
                kind: "array",
                name: format!("#{k}"),
            });
        }
        self.view(k, index)
    }

    /// Hints that row `i` will be read soon: asks the CPU to start loading
    /// its bytes into cache (a no-op where the architecture has no
    /// prefetch instruction, and for an out-of-range row). Call it for the
    /// next row of a random-order scan to overlap memory latency with work
    /// on the current one.
    pub fn prefetch(&self, i: u64) {
        let Ok(index) = self.check_row(i) else {
            return;
        };
        for k in 0..self.arrays.len() {
            if let Ok(Some(view)) = self.view(k, index) {
                prefetch_bytes(view.bytes());
            }
        }
    }

    /// The source id of row `i`.
    pub fn source(&self, i: u64) -> Result<&str> {
        let index = self.check_row(i)?;
        Ok(self.index.sources.get(index).unwrap_or(""))
    }

    /// The row built from source id `source` (the first one, if several
    /// rows share it). The first call sorts the row numbers by source
    /// (8 bytes per row); later calls are a binary search.
    pub fn find(&self, source: &str) -> Option<u64> {
        let sorted = self.by_source.get_or_init(|| {
            let mut rows: Vec<u64> = (0..self.rows).collect();
            rows.sort_by(|&a, &b| self.source_at(a).cmp(self.source_at(b)));
            rows
        });
        let at = sorted.partition_point(|&r| self.source_at(r) < source);
        sorted
            .get(at)
            .copied()
            .filter(|&r| self.source_at(r) == source)
    }

    fn source_at(&self, row: u64) -> &str {
        usize::try_from(row)
            .ok()
            .and_then(|i| self.index.sources.get(i))
            .unwrap_or("")
    }

    /// The value of sidecar `name` for row `i` (`None` if the row has none).
    pub fn sidecar(&self, name: &str, i: u64) -> Result<Option<&str>> {
        let index = self.check_row(i)?;
        let s = self.sidecar_position(name)?;
        let key = self.index.keys[s].get(index).copied().unwrap_or(NO_KEY);
        if key == NO_KEY {
            return Ok(None);
        }
        let values = self.sidecar_values_at(s)?;
        match values.get(key as usize) {
            Some(v) => Ok(Some(v)),
            None => Err(Error::corrupt(
                self.dir.join(format::sidecar_file(name)),
                format!(
                    "row {i} refers to key {key}, the file has {} entries",
                    values.len()
                ),
            )),
        }
    }

    /// Every distinct value of sidecar `name`, indexed by key.
    pub fn sidecar_values(&self, name: &str) -> Result<&[String]> {
        let s = self.sidecar_position(name)?;
        self.sidecar_values_at(s)
    }

    /// Copies every array into RAM (8-byte aligned) and reads from there
    /// from now on, refused with [`Error::TooLargeForRam`] when the arrays
    /// exceed [`DEFAULT_RAM_FRACTION`] of physical RAM.
    pub fn load_in_memory(&mut self) -> Result<()> {
        self.load_in_memory_with(DEFAULT_RAM_FRACTION)
    }

    /// [`MemmapArray::load_in_memory`] with another share of physical RAM
    /// (0.0 to 1.0).
    pub fn load_in_memory_with(&mut self, fraction: f64) -> Result<()> {
        let needed: u64 = self.arrays.iter().map(|a| a.len as u64).sum();
        let physical = physical_ram();
        let limit = (physical as f64 * fraction.clamp(0.0, 1.0)) as u64;
        if needed > limit {
            return Err(Error::TooLargeForRam {
                needed,
                limit,
                fraction: fraction * 100.0,
                physical,
            });
        }
        for array in &mut self.arrays {
            let backing = load_file(&array.path, array.len)?;
            array.backing = OnceLock::from(backing);
        }
        Ok(())
    }

    fn check_row(&self, i: u64) -> Result<usize> {
        if i >= self.rows {
            return Err(Error::RowOutOfRange {
                index: i,
                rows: self.rows,
            });
        }
        // rows * row_bytes fits in the address space (checked at open), so
        // every row index fits in usize.
        usize::try_from(i).map_err(|_| Error::RowOutOfRange {
            index: i,
            rows: self.rows,
        })
    }

    fn array_position(&self, name: &str) -> Result<usize> {
        self.schema
            .array_index(name)
            .ok_or_else(|| Error::UnknownName {
                kind: "array",
                name: name.to_owned(),
            })
    }

    fn sidecar_position(&self, name: &str) -> Result<usize> {
        self.schema
            .sidecar_index(name)
            .ok_or_else(|| Error::UnknownName {
                kind: "sidecar",
                name: name.to_owned(),
            })
    }

    fn view(&self, k: usize, index: usize) -> Result<Option<TensorView<'_>>> {
        if !self.index.has(k, index) {
            return Ok(None);
        }
        let spec = &self.schema.arrays()[k];
        let bytes = self.backing(k)?.bytes();
        let rb = spec.row_bytes();
        // index < rows and the mapped length is rows * row_bytes (checked
        // at open and at map time), so this range is in bounds; `get` keeps
        // it a checked access all the same.
        let start = index * rb;
        let row = bytes.get(start..start + rb).ok_or_else(|| {
            Error::corrupt(
                &self.arrays[k].path,
                format!("row {index} beyond the mapped file"),
            )
        })?;
        let view = TensorView::new(spec.dtype(), spec.shape().clone(), row)
            .map_err(|e| Error::corrupt(&self.arrays[k].path, e.to_string()))?;
        Ok(Some(view))
    }

    fn backing(&self, k: usize) -> Result<&Backing> {
        let array = &self.arrays[k];
        if let Some(b) = array.backing.get() {
            return Ok(b);
        }
        // Two threads may both map on first touch; one map wins, the other
        // is dropped. That is cheaper than a lock on every later read.
        let backing = map_file(&array.path, array.len)?;
        Ok(array.backing.get_or_init(|| backing))
    }

    fn sidecar_values_at(&self, s: usize) -> Result<&[String]> {
        let cell = &self.sidecars[s];
        if let Some(v) = cell.get() {
            return Ok(v);
        }
        let path = self
            .dir
            .join(format::sidecar_file(&self.schema.sidecars()[s]));
        let bytes = std::fs::read(&path).map_err(Error::io("read", &path))?;
        let values = format::parse_sidecar(&bytes, &path)?;
        if let Some(&bad) = self.index.keys[s]
            .iter()
            .find(|&&k| k != NO_KEY && k as usize >= values.len())
        {
            return Err(Error::corrupt(
                &path,
                format!(
                    "the index refers to key {bad}, the file has {} entries",
                    values.len()
                ),
            ));
        }
        Ok(cell.get_or_init(|| values))
    }
}

/// Reads and validates `dir/shapes.json`.
pub(crate) fn read_shapes(dir: &Path) -> Result<Shapes> {
    let path = dir.join(SHAPES_FILE);
    let bytes = durable_fs::read_capped(&path, MAX_SMALL_JSON).map_err(Error::durable)?;
    Shapes::parse(&bytes, &path)
}

/// Checks that every `.bin` holds exactly `rows * row_bytes` bytes and that
/// this fits the address space; returns each file's path and length.
pub(crate) fn check_bin_sizes(dir: &Path, shapes: &Shapes) -> Result<Vec<(PathBuf, usize)>> {
    shapes
        .schema
        .arrays()
        .iter()
        .map(|a| check_bin_size(dir, a, shapes.rows))
        .collect()
}

/// [`check_bin_sizes`] for one array.
pub(crate) fn check_bin_size(dir: &Path, a: &ArraySpec, rows: u64) -> Result<(PathBuf, usize)> {
    let path = dir.join(format::bin_file(a.name()));
    let actual = std::fs::metadata(&path)
        .map_err(Error::io("stat", &path))?
        .len();
    let row_bytes = a.row_bytes() as u64;
    // Shapes::parse checked that this product fits in u64.
    let expected = row_bytes.saturating_mul(rows);
    if actual != expected {
        return Err(Error::BinSize {
            file: path,
            expected,
            actual,
            rows,
            row_bytes,
        });
    }
    let len = usize::try_from(expected)
        .map_err(|_| Error::corrupt(&path, "larger than the address space"))?;
    Ok((path, len))
}

fn prefetch_bytes(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
        // SAFETY: SSE, which the intrinsic needs, is part of the x86_64
        // baseline; a prefetch never faults and changes no visible state,
        // and the pointer is in bounds of a live slice anyway.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

fn map_file(path: &Path, len: usize) -> Result<Backing> {
    if len == 0 {
        return Ok(Backing::Empty);
    }
    let file = File::open(path).map_err(Error::io("open", path))?;
    let actual = file.metadata().map_err(Error::io("stat", path))?.len();
    if actual != len as u64 {
        return Err(Error::corrupt(
            path,
            format!("{actual} bytes now, {len} when the cache was opened"),
        ));
    }
    // SAFETY: the map is read-only and we checked the file holds `len`
    // bytes. The cache is complete (`_COMPLETE` was present at open), and
    // this crate never writes to a complete cache: writers refuse to open
    // one, and a rebuild unlinks the old files (the map keeps the old
    // inode) instead of truncating them. So the bytes do not change under
    // the map. As with any mmap, a process outside this crate truncating
    // the file would break that; the format documents complete caches as
    // immutable.
    let map = unsafe { memmap2::MmapOptions::new().len(len).map(&file) }
        .map_err(Error::io("mmap", path))?;
    if map.len() != len {
        return Err(Error::corrupt(
            path,
            "mapped length differs from the file size",
        ));
    }
    Ok(Backing::Map(map))
}

fn load_file(path: &Path, len: usize) -> Result<Backing> {
    use std::io::Read;
    let mut words = vec![0u64; len.div_ceil(8)];
    // SAFETY: the u64 buffer holds len.div_ceil(8) * 8 >= len initialised
    // bytes; viewing them as u8 (alignment 1) is valid, and the slice is
    // the only access to `words` while it lives.
    let buf = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) };
    let mut file = File::open(path).map_err(Error::io("open", path))?;
    file.read_exact(buf).map_err(Error::io("read", path))?;
    Ok(Backing::Heap { words, len })
}

/// Physical RAM of the machine in bytes (0 when the OS does not say, which
/// makes `load_in_memory` refuse).
pub fn physical_ram() -> u64 {
    // SAFETY: sysconf only reads system configuration values.
    let (pages, page_size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page_size <= 0 {
        return 0;
    }
    (pages as u64).saturating_mul(page_size as u64)
}

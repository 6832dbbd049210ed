//! The streaming, resumable writer.
//!
//! # Durability
//!
//! Rows are appended to the `.bin` files as they come; their manifest lines
//! wait in memory. Every `sync_every` rows (and on [`RowWriter::flush`] and
//! [`RowWriter::finalize`]) the writer runs a *group commit*: fsync (data)
//! every `.bin`, then append the waiting lines to `manifest.jsonl` and fsync
//! it. A manifest line therefore never reaches the disk before the bytes it
//! commits, even across a power loss.
//!
//! What a crash (of the process or the machine) can lose:
//! - `sync_every = 1`: nothing that [`RowWriter::write`] returned for.
//! - `sync_every = n > 1` (default [`WriterOptions::DEFAULT_SYNC_EVERY`]):
//!   the rows written since the last group commit, at most `n - 1` rows.
//! - `sync_every = 0`: every row since the last explicit
//!   [`RowWriter::flush`] (or since the start).
//!
//! Committed rows are never lost: on resume every `.bin` is truncated to the
//! committed row count, the torn manifest tail is dropped, and
//! [`RowWriter::resume_keys`] lists the committed sources so the caller
//! skips them.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use durable_fs::FileLock;
use serde::Serialize;
use tensor_core::TensorView;

use crate::format::{
    self, COMPLETE_FILE, FINGERPRINT_FILE, FORMAT_VERSION, LOCK_FILE, MANIFEST_FILE,
    MANIFEST_FORMAT, ManifestHeader, Schema, Shapes,
};
use crate::index::IndexWriter;
use crate::recover::scan_manifest;
use crate::{Error, Result};

/// Bytes buffered per `.bin` before a write, at most: large writes give
/// the page cache large folios, which random reads through the maps later
/// walk with fewer TLB misses (W4 in `BENCHMARKS.md` reads them so).
const BIN_BUFFER_MAX: usize = 8 << 20;
/// Buffer bytes shared by all `.bin` files of a writer, so a schema with
/// many arrays does not allocate `BIN_BUFFER_MAX` for each.
const BIN_BUFFER_TOTAL: usize = 64 << 20;

/// A `.bin` file's appender: rows are gathered in a large buffer, and each
/// full buffer is written with one `write` and handed to the disk at once
/// ([`durable_fs::start_writeback`]) instead of waiting for the group commit.
struct BinOut {
    file: File,
    buf: Vec<u8>,
    /// File offset of `buf[0]` (the file's length as far as we wrote it).
    offset: u64,
}

impl BinOut {
    /// An appender writing at `offset` of `file` with a `cap`-byte buffer.
    fn new(mut file: File, offset: u64, cap: usize) -> std::io::Result<BinOut> {
        file.seek(SeekFrom::Start(offset))?;
        Ok(BinOut {
            file,
            buf: Vec::with_capacity(cap),
            offset,
        })
    }

    fn file(&self) -> &File {
        &self.file
    }

    /// Writes `bytes` at the end and starts their write-back.
    fn write_through(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_all(bytes)?;
        durable_fs::start_writeback(&self.file, self.offset, bytes.len());
        self.offset += bytes.len() as u64;
        Ok(())
    }

    fn drain(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let buf = std::mem::take(&mut self.buf);
        let result = self.write_through(&buf);
        self.buf = buf;
        self.buf.clear();
        result
    }
}

impl Write for BinOut {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let cap = self.buf.capacity();
        if self.buf.len() + bytes.len() > cap {
            self.drain()?;
        }
        if bytes.len() >= cap {
            self.write_through(bytes)?;
        } else {
            self.buf.extend_from_slice(bytes);
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.drain()
    }
}

fn bin_buffer(arrays: usize) -> usize {
    (BIN_BUFFER_TOTAL / arrays.max(1)).clamp(64 << 10, BIN_BUFFER_MAX)
}

/// How the writer trades durability for speed.
///
/// Rows are appended to the `.bin` files as they come; their manifest lines
/// wait in memory. Every `sync_every` rows (and on [`RowWriter::flush`] and
/// [`RowWriter::finalize`]) the writer runs a *group commit*: fsync (data)
/// every `.bin`, then append the waiting lines to `manifest.jsonl` and
/// fsync it. What a crash of the process or the machine can lose:
/// - `sync_every = 1`: nothing that [`RowWriter::write`] returned for.
/// - `sync_every = n > 1` (default [`WriterOptions::DEFAULT_SYNC_EVERY`]):
///   the rows written since the last group commit, at most `n - 1` rows.
/// - `sync_every = 0`: every row since the last explicit
///   [`RowWriter::flush`] (or since the writer was opened).
///
/// Committed rows are never lost, and never come back with bytes that were
/// not durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterOptions {
    /// Group-commit (fsync data, then the manifest) every this many rows;
    /// 0 commits only on `flush()` and `finalize()`. See the module docs
    /// for what a crash can lose under each setting.
    pub sync_every: usize,
}

impl WriterOptions {
    /// Default rows per group commit.
    pub const DEFAULT_SYNC_EVERY: usize = 1024;
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            sync_every: Self::DEFAULT_SYNC_EVERY,
        }
    }
}

/// One row to write: its source id, one tensor per array (or `None` for a
/// nullable array the row lacks), sidecar strings and metadata JSON.
///
/// Arrays and sidecars are given by name; an array the schema declares must
/// be given (possibly as null), a sidecar may be left out (stored as null).
#[derive(Debug, Clone)]
pub struct NewRow<'a> {
    source: &'a str,
    arrays: Vec<(&'a str, Option<TensorView<'a>>)>,
    sidecars: Vec<(&'a str, &'a str)>,
    meta: Option<&'a str>,
}

impl<'a> NewRow<'a> {
    /// A row built from `source` (a path or key; what `resume_keys` returns).
    pub fn new(source: &'a str) -> Self {
        NewRow {
            source,
            arrays: Vec::new(),
            sidecars: Vec::new(),
            meta: None,
        }
    }
    /// Sets array `name`.
    pub fn array(mut self, name: &'a str, tensor: TensorView<'a>) -> Self {
        self.arrays.push((name, Some(tensor)));
        self
    }
    /// Marks nullable array `name` as absent from this row.
    pub fn null(mut self, name: &'a str) -> Self {
        self.arrays.push((name, None));
        self
    }
    /// Sets sidecar `name` to `value` (stored once per distinct value).
    pub fn sidecar(mut self, name: &'a str, value: &'a str) -> Self {
        self.sidecars.push((name, value));
        self
    }
    /// Sets the row's metadata, a JSON text.
    pub fn meta(mut self, json: &'a str) -> Self {
        self.meta = Some(json);
        self
    }
}

/// The manifest line of one row, borrowed (the owned twin is
/// [`format::ManifestRow`]).
#[derive(Serialize)]
struct RowLine<'a> {
    row: u64,
    source: &'a str,
    present: &'a [bool],
    sidecars: &'a [Option<u64>],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    new: &'a [(usize, u64, &'a str)],
    meta: Option<&'a str>,
}

struct BinFile {
    path: PathBuf,
    out: BinOut,
}

/// Writes rows into a cache directory; see the module docs for durability.
///
/// Holds an exclusive advisory lock on the directory until dropped: a
/// second writer gets [`Error::Locked`].
pub struct RowWriter {
    dir: PathBuf,
    schema: Schema,
    fingerprint: serde_json::Value,
    options: WriterOptions,
    _lock: FileLock,
    bins: Vec<BinFile>,
    manifest_path: PathBuf,
    manifest: File,
    pending: Vec<u8>,
    pending_rows: usize,
    rows: u64,
    committed_rows: u64,
    interned: Vec<HashMap<String, u64>>,
    resume_keys: Vec<String>,
    broken: bool,
}

impl std::fmt::Debug for RowWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowWriter")
            .field("dir", &self.dir)
            .field("schema", &self.schema)
            .field("rows", &self.rows)
            .field("committed_rows", &self.committed_rows)
            .finish_non_exhaustive()
    }
}

impl RowWriter {
    /// Starts a cache in `dir` (created if needed), or resumes the one a
    /// previous writer left unfinished there, with default options.
    ///
    /// `fingerprint` is any serializable description of what the cache was
    /// built from; it is stored in `fingerprint.json`, and a resume with a
    /// different one (or another schema) is refused.
    pub fn create_or_resume(
        dir: impl AsRef<Path>,
        schema: &Schema,
        fingerprint: impl Serialize,
    ) -> Result<RowWriter> {
        Self::create_or_resume_with(dir, schema, fingerprint, WriterOptions::default())
    }

    /// [`RowWriter::create_or_resume`] with explicit options.
    pub fn create_or_resume_with(
        dir: impl AsRef<Path>,
        schema: &Schema,
        fingerprint: impl Serialize,
        options: WriterOptions,
    ) -> Result<RowWriter> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(Error::io("create directory", &dir))?;
        let lock = take_lock(&dir)?;
        Self::open_locked(dir, lock, schema, fingerprint, options)
    }

    /// Opens the writer of `dir` whose lock the caller already holds.
    pub(crate) fn open_locked(
        dir: PathBuf,
        lock: FileLock,
        schema: &Schema,
        fingerprint: impl Serialize,
        options: WriterOptions,
    ) -> Result<RowWriter> {
        let fingerprint = serde_json::to_value(fingerprint).map_err(|source| Error::Json {
            file: dir.join(FINGERPRINT_FILE),
            source,
        })?;
        if dir.join(COMPLETE_FILE).exists() {
            return Err(Error::AlreadyComplete { dir });
        }
        durable_fs::remove_temp_files(&dir).map_err(Error::durable)?;
        let manifest_path = dir.join(MANIFEST_FILE);
        let mut writer = if manifest_path.exists() {
            Self::resume(dir, schema, fingerprint, options, lock, manifest_path)?
        } else {
            Self::create(dir, schema, fingerprint, options, lock, manifest_path)?
        };
        writer
            .manifest
            .seek(SeekFrom::End(0))
            .map_err(Error::io("seek", &writer.manifest_path))?;
        Ok(writer)
    }

    fn create(
        dir: PathBuf,
        schema: &Schema,
        fingerprint: serde_json::Value,
        options: WriterOptions,
        lock: FileLock,
        manifest_path: PathBuf,
    ) -> Result<RowWriter> {
        let mut bins = Vec::with_capacity(schema.arrays().len());
        for a in schema.arrays() {
            let path = dir.join(format::bin_file(a.name()));
            // Unlink rather than truncate a leftover file: a reader that
            // still maps an old file keeps its inode and its bytes.
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io("remove", path)(e));
                }
                _ => {}
            }
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(Error::io("open", &path))?;
            file.sync_all().map_err(Error::io("fsync", &path))?;
            let out = BinOut::new(file, 0, bin_buffer(schema.arrays().len()))
                .map_err(Error::io("open", &path))?;
            bins.push(BinFile { path, out });
        }
        let header = ManifestHeader {
            format: MANIFEST_FORMAT.to_owned(),
            version: FORMAT_VERSION,
            schema: schema.to_stored(),
            fingerprint: fingerprint.clone(),
        };
        let mut line = serde_json::to_vec(&header).map_err(|source| Error::Json {
            file: manifest_path.clone(),
            source,
        })?;
        line.push(b'\n');
        // The header is renamed into place whole, so a manifest is never
        // seen without one.
        durable_fs::write_atomic(&manifest_path, &line).map_err(Error::durable)?;
        let manifest = open_append(&manifest_path)?;
        Ok(RowWriter {
            interned: vec![HashMap::new(); schema.sidecars().len()],
            dir,
            schema: schema.clone(),
            fingerprint,
            options,
            _lock: lock,
            bins,
            manifest_path,
            manifest,
            pending: Vec::new(),
            pending_rows: 0,
            rows: 0,
            committed_rows: 0,
            resume_keys: Vec::new(),
            broken: false,
        })
    }

    fn resume(
        dir: PathBuf,
        schema: &Schema,
        fingerprint: serde_json::Value,
        options: WriterOptions,
        lock: FileLock,
        manifest_path: PathBuf,
    ) -> Result<RowWriter> {
        let mut interned: Vec<HashMap<String, u64>> = vec![HashMap::new(); schema.sidecars().len()];
        let mut resume_keys = Vec::new();
        // Rows are checked against the stored schema; it is compared with
        // the given one below, before the tables built here are used.
        let scan = scan_manifest(&manifest_path, |row| {
            resume_keys.push(row.source.clone());
            for (s, key, value) in &row.new {
                if let Some(table) = interned.get_mut(*s) {
                    table.insert(value.clone(), *key);
                }
            }
            Ok(())
        })?;
        if let Some(reason) = scan.schema.difference(schema) {
            return Err(Error::SchemaMismatch {
                file: manifest_path,
                reason,
            });
        }
        if scan.fingerprint != fingerprint {
            return Err(Error::FingerprintMismatch {
                file: manifest_path,
            });
        }
        let manifest = open_append(&manifest_path)?;
        if scan.torn_len > 0 {
            manifest
                .set_len(scan.good_len)
                .and_then(|()| manifest.sync_all())
                .map_err(Error::io("truncate torn tail", &manifest_path))?;
        }
        let mut bins = Vec::with_capacity(schema.arrays().len());
        for a in schema.arrays() {
            let path = dir.join(format::bin_file(a.name()));
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(Error::io("open", &path))?;
            let actual = file.metadata().map_err(Error::io("stat", &path))?.len();
            let row_bytes = a.row_bytes() as u64;
            let expected = row_bytes.checked_mul(scan.rows).ok_or_else(|| {
                Error::corrupt(&manifest_path, "committed rows overflow a file size")
            })?;
            if actual < expected {
                // Committed bytes are fsynced before their manifest line:
                // a short file was damaged after the fact.
                return Err(Error::BinSize {
                    file: path,
                    expected,
                    actual,
                    rows: scan.rows,
                    row_bytes,
                });
            }
            if actual > expected {
                file.set_len(expected)
                    .map_err(Error::io("truncate", &path))?;
            }
            file.sync_all().map_err(Error::io("fsync", &path))?;
            let out = BinOut::new(file, expected, bin_buffer(schema.arrays().len()))
                .map_err(Error::io("open", &path))?;
            bins.push(BinFile { path, out });
        }
        durable_fs::sync_dir(&dir).map_err(Error::durable)?;
        Ok(RowWriter {
            dir,
            schema: schema.clone(),
            fingerprint,
            options,
            _lock: lock,
            bins,
            manifest_path,
            manifest,
            pending: Vec::new(),
            pending_rows: 0,
            rows: scan.rows,
            committed_rows: scan.rows,
            interned,
            resume_keys,
            broken: false,
        })
    }

    /// Source ids of the rows committed before this writer was opened, in
    /// row order: the caller skips these sources.
    pub fn resume_keys(&self) -> &[String] {
        &self.resume_keys
    }

    /// [`RowWriter::resume_keys`] as a set, for fast membership tests.
    pub fn resume_key_set(&self) -> HashSet<&str> {
        self.resume_keys.iter().map(String::as_str).collect()
    }

    /// Rows written so far (committed or waiting for the next group commit).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Rows that are durable.
    pub fn committed_rows(&self) -> u64 {
        self.committed_rows
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends one row. A row that does not fit the schema (missing,
    /// unknown or repeated array, wrong dtype or shape, null in a
    /// non-nullable array, unknown sidecar, metadata that is not JSON) is
    /// refused with [`Error::InvalidRow`] and nothing is written.
    ///
    /// After an I/O error the writer refuses further rows; drop it and
    /// resume, which restores the last committed state.
    pub fn write(&mut self, row: &NewRow<'_>) -> Result<()> {
        if self.broken {
            return Err(self.broken_error());
        }
        let invalid = |reason: String| Error::InvalidRow {
            source_id: row.source.to_owned(),
            reason,
        };
        let arrays = self.schema.arrays();
        let mut data: Vec<Option<&[u8]>> = vec![None; arrays.len()];
        let mut given = vec![false; arrays.len()];
        for (name, tensor) in &row.arrays {
            let k = self
                .schema
                .array_index(name)
                .ok_or_else(|| invalid(format!("unknown array {name:?}")))?;
            if std::mem::replace(&mut given[k], true) {
                return Err(invalid(format!("array {name:?} given twice")));
            }
            let spec = &arrays[k];
            match tensor {
                Some(t) => {
                    if t.dtype() != spec.dtype() || t.shape() != spec.shape() {
                        return Err(invalid(format!(
                            "array {name:?} is {} {}, the schema says {} {}",
                            t.dtype(),
                            t.shape(),
                            spec.dtype(),
                            spec.shape()
                        )));
                    }
                    data[k] = Some(t.bytes());
                }
                None if !spec.nullable() => {
                    return Err(invalid(format!("array {name:?} is not nullable")));
                }
                None => {}
            }
        }
        if let Some(k) = given.iter().position(|g| !g) {
            return Err(invalid(format!(
                "array {:?} is missing (use NewRow::null for an absent nullable array)",
                arrays[k].name()
            )));
        }
        let mut keys: Vec<Option<u64>> = vec![None; self.schema.sidecars().len()];
        let mut new: Vec<(usize, u64, &str)> = Vec::new();
        for (name, value) in &row.sidecars {
            let s = self
                .schema
                .sidecar_index(name)
                .ok_or_else(|| invalid(format!("unknown sidecar {name:?}")))?;
            if keys[s].is_some() {
                return Err(invalid(format!("sidecar {name:?} given twice")));
            }
            let key = match self.interned[s].get(*value) {
                Some(&key) => key,
                None => {
                    let key = self.interned[s].len() as u64;
                    new.push((s, key, value));
                    key
                }
            };
            keys[s] = Some(key);
        }
        if let Some(meta) = row.meta {
            serde_json::from_str::<serde::de::IgnoredAny>(meta)
                .map_err(|e| invalid(format!("metadata is not JSON: {e}")))?;
        }
        let present: Vec<bool> = data.iter().map(Option::is_some).collect();
        let line = RowLine {
            row: self.rows,
            source: row.source,
            present: &present,
            sidecars: &keys,
            new: &new,
            meta: row.meta,
        };
        let line_start = self.pending.len();
        if let Err(source) = serde_json::to_writer(&mut self.pending, &line) {
            self.pending.truncate(line_start);
            return Err(Error::Json {
                file: self.manifest_path.clone(),
                source,
            });
        }
        self.pending.push(b'\n');

        // Validation is over: from here on a failure leaves the files in a
        // state only resume can sort out.
        for (k, bytes) in data.iter().enumerate() {
            let bin = &mut self.bins[k];
            let result = match bytes {
                Some(b) => bin.out.write_all(b),
                None => write_zeros(&mut bin.out, arrays[k].row_bytes()),
            };
            if let Err(source) = result {
                self.broken = true;
                return Err(Error::io("write", &bin.path)(source));
            }
        }
        for (s, key, value) in new {
            self.interned[s].insert(value.to_owned(), key);
        }
        self.rows += 1;
        self.pending_rows += 1;
        if self.options.sync_every > 0 && self.pending_rows >= self.options.sync_every {
            self.flush()?;
        }
        Ok(())
    }

    /// Group commit: makes every row written so far durable (fsync the
    /// `.bin` files, then append and fsync their manifest lines).
    pub fn flush(&mut self) -> Result<()> {
        if self.broken {
            return Err(self.broken_error());
        }
        if self.pending_rows == 0 {
            return Ok(());
        }
        let result = self.group_commit();
        if result.is_err() {
            self.broken = true;
        }
        result
    }

    fn group_commit(&mut self) -> Result<()> {
        // Every buffer goes to the kernel (and starts its write-back) before
        // the first fsync, so the files' tails are written back together.
        for bin in &mut self.bins {
            bin.out.flush().map_err(Error::io("flush", &bin.path))?;
        }
        for bin in &self.bins {
            bin.out
                .file()
                .sync_data()
                .map_err(Error::io("fsync", &bin.path))?;
        }
        self.manifest
            .write_all(&self.pending)
            .and_then(|()| self.manifest.sync_data())
            .map_err(Error::io("append", &self.manifest_path))?;
        self.pending.clear();
        self.pending_rows = 0;
        self.committed_rows = self.rows;
        Ok(())
    }

    fn broken_error(&self) -> Error {
        Error::Io {
            path: self.dir.clone(),
            op: "write",
            source: std::io::Error::other(
                "an earlier write failed; drop this writer and resume to recover",
            ),
        }
    }

    /// Commits the last rows and turns the cache into its final form:
    /// `index.parquet` and the sidecars streamed from the manifest,
    /// `shapes.json`, `fingerprint.json`, then `_COMPLETE`, then the
    /// manifest is removed. Returns the row count.
    ///
    /// Each file is written under a temporary name, fsynced and renamed; the
    /// directory is fsynced before `_COMPLETE` is written, so `_COMPLETE`
    /// never exists without the files it vouches for. A crash before
    /// `_COMPLETE` leaves the manifest in place and a resumed writer can
    /// finalize again.
    pub fn finalize(mut self) -> Result<u64> {
        self.flush()?;
        let dir = self.dir.clone();
        let mut index = IndexWriter::create(&dir, &self.schema)?;
        let scan = scan_manifest(&self.manifest_path, |row| index.push(row))?;
        if scan.rows != self.committed_rows {
            return Err(Error::corrupt(
                &self.manifest_path,
                format!(
                    "holds {} rows, the writer committed {}",
                    scan.rows, self.committed_rows
                ),
            ));
        }
        index.finish()?;
        let shapes = Shapes {
            rows: self.committed_rows,
            schema: self.schema.clone(),
        };
        let shapes_path = dir.join(format::SHAPES_FILE);
        let shapes_tmp = durable_fs::temp_path(&shapes_path);
        durable_fs::write_synced(&shapes_tmp, &shapes.to_json())
            .and_then(|()| durable_fs::rename(&shapes_tmp, &shapes_path))
            .map_err(Error::durable)?;
        let mut fp =
            serde_json::to_vec_pretty(&self.fingerprint).map_err(|source| Error::Json {
                file: dir.join(FINGERPRINT_FILE),
                source,
            })?;
        fp.push(b'\n');
        let fp_path = dir.join(FINGERPRINT_FILE);
        let fp_tmp = durable_fs::temp_path(&fp_path);
        durable_fs::write_synced(&fp_tmp, &fp)
            .and_then(|()| durable_fs::rename(&fp_tmp, &fp_path))
            // One directory fsync makes the index, sidecars, shapes and
            // fingerprint renames durable before `_COMPLETE` vouches for them.
            .and_then(|()| durable_fs::sync_dir(&dir))
            .and_then(|()| durable_fs::write_atomic(&dir.join(COMPLETE_FILE), b""))
            .and_then(|()| durable_fs::remove_and_sync(&self.manifest_path))
            .map_err(Error::durable)?;
        Ok(self.committed_rows)
    }
}

/// Takes the exclusive writer lock of `dir` (which must exist).
pub(crate) fn take_lock(dir: &Path) -> Result<FileLock> {
    FileLock::writer(&dir.join(LOCK_FILE)).map_err(Error::durable)
}

fn open_append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(Error::io("open", path))
}

fn write_zeros(out: &mut impl Write, mut len: usize) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while len > 0 {
        let n = len.min(ZEROS.len());
        out.write_all(&ZEROS[..n])?;
        len -= n;
    }
    Ok(())
}

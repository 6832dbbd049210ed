//! Describing and checking a cache directory: [`inspect`] and [`verify`].

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use tensor_core::DType;

use crate::format::{
    self, COMPLETE_FILE, FINGERPRINT_FILE, MANIFEST_FILE, MAX_SMALL_JSON, Schema, TMP_SUFFIX,
};
use crate::index::{Index, NO_KEY};
use crate::reader::{DEFAULT_RAM_FRACTION, MemmapArray, check_bin_size, physical_ram, read_shapes};
use crate::recover::scan_manifest;
use crate::{Error, Result};
use cache_check::{Problem, ProblemKind, Summary};
use serde_json::json;

/// One file of the cache directory and its size on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    /// File name inside the cache directory.
    pub name: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// One array of the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayInfo {
    /// Array name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Per-row shape.
    pub shape: Vec<usize>,
    /// Whether rows may lack it.
    pub nullable: bool,
    /// Bytes per row.
    pub row_bytes: u64,
    /// Rows that lack it (stored zero-filled).
    pub absent_rows: u64,
    /// Bytes of its `.bin` on disk.
    pub file_bytes: u64,
}

/// One sidecar of the cache and how well it deduplicates.
#[derive(Debug, Clone, PartialEq)]
pub struct SidecarInfo {
    /// Sidecar name.
    pub name: String,
    /// Rows that have a value.
    pub rows_with_value: u64,
    /// Distinct values stored.
    pub unique_values: u64,
    /// Bytes of the distinct values (what is stored).
    pub unique_bytes: u64,
    /// Bytes the values would take stored once per row.
    pub logical_bytes: u64,
}

impl SidecarInfo {
    /// `logical_bytes / unique_bytes`: how many times deduplication shrinks
    /// the sidecar (1.0 when nothing repeats or it is empty).
    pub fn dedup_ratio(&self) -> f64 {
        if self.unique_bytes == 0 {
            1.0
        } else {
            self.logical_bytes as f64 / self.unique_bytes as f64
        }
    }
}

/// What [`inspect`] found; `Display` prints it as a table.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The cache directory.
    pub dir: PathBuf,
    /// Whether `_COMPLETE` is present (otherwise the numbers come from the
    /// manifest of the unfinished cache: committed rows only).
    pub complete: bool,
    /// Rows (committed rows for an unfinished cache).
    pub rows: u64,
    /// The schema.
    pub schema: Schema,
    /// Per array.
    pub arrays: Vec<ArrayInfo>,
    /// Per sidecar.
    pub sidecars: Vec<SidecarInfo>,
    /// Every file in the directory, by name.
    pub files: Vec<FileInfo>,
    /// Bytes `load_in_memory` would copy into RAM (all arrays).
    pub projected_ram_bytes: u64,
    /// Physical RAM of this machine.
    pub physical_ram_bytes: u64,
}

impl Inspection {
    /// Total bytes on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
    /// Whether `load_in_memory` with the default fraction would be allowed.
    pub fn fits_in_memory(&self) -> bool {
        (self.projected_ram_bytes as f64) <= self.physical_ram_bytes as f64 * DEFAULT_RAM_FRACTION
    }
}

/// Describes the cache in `dir`, finished or not: sizes on disk per file,
/// rows, schema, sidecar dedup, and the RAM `load_in_memory` would need.
/// A finished cache is opened (and so validated) first.
pub fn inspect(dir: impl AsRef<Path>) -> Result<Inspection> {
    let dir = dir.as_ref().to_path_buf();
    let files = list_files(&dir)?;
    let size_of = |name: &str| files.iter().find(|f| f.name == name).map_or(0, |f| f.bytes);
    let complete = dir.join(COMPLETE_FILE).is_file();
    let (rows, schema, absent, sidecars) = if complete {
        let cache = MemmapArray::open(&dir)?;
        let absent = absent_counts(cache.index(), cache.schema(), cache.len());
        let mut sidecars = Vec::new();
        for (s, name) in cache.schema().sidecars().iter().enumerate() {
            let values = cache.sidecar_values(name)?;
            let lens: Vec<u64> = values.iter().map(|v| v.len() as u64).collect();
            sidecars.push(sidecar_report(name, &lens, &cache.index().keys[s]));
        }
        (cache.len(), cache.schema().clone(), absent, sidecars)
    } else {
        let manifest = dir.join(MANIFEST_FILE);
        if !manifest.is_file() {
            return Err(Error::Incomplete { dir });
        }
        let mut absent: Vec<u64> = Vec::new();
        let mut lens: Vec<Vec<u64>> = Vec::new();
        let mut keys: Vec<Vec<u32>> = Vec::new();
        let scan = scan_manifest(&manifest, |row| {
            absent.resize(row.present.len(), 0);
            for (a, p) in absent.iter_mut().zip(&row.present) {
                *a += u64::from(!p);
            }
            lens.resize(row.sidecars.len(), Vec::new());
            keys.resize(row.sidecars.len(), Vec::new());
            for (s, _, value) in &row.new {
                lens[*s].push(value.len() as u64);
            }
            for (k, key) in keys.iter_mut().zip(&row.sidecars) {
                k.push(key.and_then(|k| u32::try_from(k).ok()).unwrap_or(NO_KEY));
            }
            Ok(())
        })?;
        absent.resize(scan.schema.arrays().len(), 0);
        lens.resize(scan.schema.sidecars().len(), Vec::new());
        keys.resize(scan.schema.sidecars().len(), Vec::new());
        let sidecars = scan
            .schema
            .sidecars()
            .iter()
            .enumerate()
            .map(|(s, name)| sidecar_report(name, &lens[s], &keys[s]))
            .collect();
        (scan.rows, scan.schema, absent, sidecars)
    };
    let arrays: Vec<ArrayInfo> = schema
        .arrays()
        .iter()
        .zip(&absent)
        .map(|(a, &absent_rows)| ArrayInfo {
            name: a.name().to_owned(),
            dtype: a.dtype(),
            shape: a.shape().dims().to_vec(),
            nullable: a.nullable(),
            row_bytes: a.row_bytes() as u64,
            absent_rows,
            file_bytes: size_of(&format::bin_file(a.name())),
        })
        .collect();
    let projected_ram_bytes = arrays
        .iter()
        .map(|a| a.row_bytes.saturating_mul(rows))
        .fold(0u64, u64::saturating_add);
    Ok(Inspection {
        dir,
        complete,
        rows,
        schema,
        arrays,
        sidecars,
        files,
        projected_ram_bytes,
        physical_ram_bytes: physical_ram(),
    })
}

fn absent_counts(index: &Index, schema: &Schema, rows: u64) -> Vec<u64> {
    (0..schema.arrays().len())
        .map(|k| match &index.present[k] {
            None => 0,
            Some(flags) => flags.iter().filter(|p| !**p).count() as u64,
        })
        .map(|absent| absent.min(rows))
        .collect()
}

fn sidecar_report(name: &str, lens: &[u64], keys: &[u32]) -> SidecarInfo {
    let mut rows_with_value = 0;
    let mut logical_bytes = 0u64;
    for &k in keys.iter().filter(|&&k| k != NO_KEY) {
        rows_with_value += 1;
        logical_bytes = logical_bytes.saturating_add(lens.get(k as usize).copied().unwrap_or(0));
    }
    SidecarInfo {
        name: name.to_owned(),
        rows_with_value,
        unique_values: lens.len() as u64,
        unique_bytes: lens.iter().sum(),
        logical_bytes,
    }
}

fn list_files(dir: &Path) -> Result<Vec<FileInfo>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(Error::io("list", dir))? {
        let entry = entry.map_err(Error::io("list", dir))?;
        let meta = entry.metadata().map_err(Error::io("stat", entry.path()))?;
        if meta.is_file() {
            files.push(FileInfo {
                name: entry.file_name().to_string_lossy().into_owned(),
                bytes: meta.len(),
            });
        }
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// Bytes in human units: `512 B`, `1.5 KiB`, `3.2 GiB`.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

impl Inspection {
    /// The report in the shared shape the `cachex` tool prints: rows,
    /// completeness, sizes, RAM, and tables of arrays, sidecars and files.
    pub fn summary(&self) -> Summary {
        let arrays = self
            .arrays
            .iter()
            .map(|a| {
                vec![
                    json!(a.name),
                    json!(a.dtype.name()),
                    json!(a.shape),
                    json!(a.nullable),
                    json!(a.row_bytes),
                    json!(a.absent_rows),
                    json!(a.file_bytes),
                ]
            })
            .collect();
        let sidecars = self
            .sidecars
            .iter()
            .map(|s| {
                vec![
                    json!(s.name),
                    json!(s.rows_with_value),
                    json!(s.unique_values),
                    json!(s.unique_bytes),
                    json!(s.logical_bytes),
                    json!(s.dedup_ratio()),
                ]
            })
            .collect();
        let files = self
            .files
            .iter()
            .map(|f| vec![json!(f.name), json!(f.bytes)])
            .collect();
        Summary::new("memmap-array", &self.dir)
            .fact("format_version", format::FORMAT_VERSION)
            .fact("complete", self.complete)
            .fact("rows", self.rows)
            .fact("disk_bytes", self.disk_bytes())
            .fact("projected_ram_bytes", self.projected_ram_bytes)
            .fact("fits_in_memory", self.fits_in_memory())
            .table(
                "arrays",
                [
                    "name",
                    "dtype",
                    "shape",
                    "nullable",
                    "row_bytes",
                    "absent_rows",
                    "file_bytes",
                ],
                arrays,
            )
            .table(
                "sidecars",
                [
                    "name",
                    "rows_with_value",
                    "unique_values",
                    "unique_bytes",
                    "logical_bytes",
                    "dedup_ratio",
                ],
                sidecars,
            )
            .table("files", ["name", "bytes"], files)
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "cache {} ({}, {} rows, format v{})",
            self.dir.display(),
            if self.complete {
                "complete"
            } else {
                "NOT complete: committed rows of the manifest"
            },
            self.rows,
            format::FORMAT_VERSION
        )?;
        writeln!(
            f,
            "\n{:<20} {:<9} {:<16} {:<8} {:>11} {:>8} {:>11}",
            "array", "dtype", "shape", "nullable", "row bytes", "absent", "on disk"
        )?;
        for a in &self.arrays {
            writeln!(
                f,
                "{:<20} {:<9} {:<16} {:<8} {:>11} {:>8} {:>11}",
                a.name,
                a.dtype.name(),
                tensor_core::Shape::from(a.shape.clone()).to_string(),
                if a.nullable { "yes" } else { "no" },
                a.row_bytes,
                a.absent_rows,
                human(a.file_bytes)
            )?;
        }
        if !self.sidecars.is_empty() {
            writeln!(
                f,
                "\n{:<20} {:>10} {:>8} {:>12} {:>13} {:>8}",
                "sidecar", "rows", "unique", "stored", "undeduped", "dedup"
            )?;
            for s in &self.sidecars {
                writeln!(
                    f,
                    "{:<20} {:>10} {:>8} {:>12} {:>13} {:>7.1}x",
                    s.name,
                    s.rows_with_value,
                    s.unique_values,
                    human(s.unique_bytes),
                    human(s.logical_bytes),
                    s.dedup_ratio()
                )?;
            }
        }
        writeln!(f, "\n{:<24} {:>12}", "file", "size")?;
        for file in &self.files {
            writeln!(f, "{:<24} {:>12}", file.name, human(file.bytes))?;
        }
        writeln!(
            f,
            "{:<24} {:>12}",
            "total on disk",
            human(self.disk_bytes())
        )?;
        let share = if self.physical_ram_bytes == 0 {
            f64::INFINITY
        } else {
            self.projected_ram_bytes as f64 / self.physical_ram_bytes as f64 * 100.0
        };
        write!(
            f,
            "\nload_in_memory: {} ({share:.1}% of {} physical RAM; {} under the default {:.0}% limit)",
            human(self.projected_ram_bytes),
            human(self.physical_ram_bytes),
            if self.fits_in_memory() {
                "allowed"
            } else {
                "refused"
            },
            DEFAULT_RAM_FRACTION * 100.0
        )
    }
}

/// The shared kind of problem an error of this crate is, for [`verify`].
fn kind_of(e: &Error) -> ProblemKind {
    match e {
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            ProblemKind::Missing
        }
        Error::Io { .. } | Error::Locked { .. } => ProblemKind::Io,
        Error::Incomplete { .. } => ProblemKind::Missing,
        Error::BinSize {
            actual, expected, ..
        } if actual < expected => ProblemKind::Truncated,
        Error::UnsupportedVersion { .. } => ProblemKind::ForeignVersion,
        Error::FingerprintMismatch { .. } | Error::Fingerprint { .. } => ProblemKind::Stale,
        _ => ProblemKind::Structure,
    }
}

/// `e` as a problem of the file it names (else `fallback`).
fn problem_of(e: &Error, fallback: &Path) -> Problem {
    let file = e.path().unwrap_or(fallback).to_path_buf();
    Problem::from_error(file, kind_of(e), e)
}

/// Checks the cache in `dir` and returns every problem found (empty when
/// it is sound): completeness, `shapes.json`, each `.bin` size, the index,
/// each sidecar and its keys, `fingerprint.json`, bool arrays holding only
/// 0/1, and leftovers of interrupted writes. It keeps going after a problem
/// wherever later checks do not depend on the failed one.
pub fn verify(dir: impl AsRef<Path>) -> Vec<Problem> {
    let dir = dir.as_ref();
    let mut problems = Vec::new();
    let entries = match list_files(dir) {
        Ok(files) => files,
        Err(e) => return vec![problem_of(&e, dir)],
    };
    for f in &entries {
        if f.name.ends_with(TMP_SUFFIX) {
            problems.push(Problem::new(
                dir.join(&f.name),
                ProblemKind::Interrupted,
                "leftover temporary file of an interrupted write",
            ));
        }
    }
    if !dir.join(COMPLETE_FILE).is_file() {
        problems.push(Problem::new(
            dir.join(COMPLETE_FILE),
            ProblemKind::Missing,
            "missing: the cache was never finalized",
        ));
        let manifest = dir.join(MANIFEST_FILE);
        if manifest.is_file() {
            match scan_manifest(&manifest, |_| Ok(())) {
                Ok(scan) => {
                    if scan.torn_len > 0 {
                        problems.push(Problem::new(
                            &manifest,
                            ProblemKind::Interrupted,
                            format!(
                                "{} bytes of a torn last line (dropped on resume)",
                                scan.torn_len
                            ),
                        ));
                    }
                    // Committed bytes must all be there; extra bytes are
                    // uncommitted rows that resume truncates.
                    for a in scan.schema.arrays() {
                        if let Err(e) = check_bin_size(dir, a, scan.rows) {
                            if matches!(&e, Error::BinSize { actual, expected, .. } if actual > expected)
                            {
                                continue;
                            }
                            problems.push(problem_of(&e, dir));
                        }
                    }
                }
                Err(e) => problems.push(problem_of(&e, &manifest)),
            }
        }
        return problems;
    }
    // A manifest beside `_COMPLETE` means finalize stopped after committing
    // and before deleting it: readers ignore it, so it is not a problem.
    let shapes = match read_shapes(dir) {
        Ok(s) => s,
        Err(e) => {
            problems.push(problem_of(&e, &dir.join(format::SHAPES_FILE)));
            return problems;
        }
    };
    let mut sizes_ok = true;
    for a in shapes.schema.arrays() {
        if let Err(e) = check_bin_size(dir, a, shapes.rows) {
            sizes_ok = false;
            problems.push(problem_of(&e, dir));
        }
    }
    let index_path = dir.join(format::INDEX_FILE);
    let index = match crate::index::read_index(&index_path, &shapes.schema, shapes.rows) {
        Ok(index) => Some(index),
        Err(e) => {
            problems.push(problem_of(&e, &index_path));
            None
        }
    };
    for (s, name) in shapes.schema.sidecars().iter().enumerate() {
        let path = dir.join(format::sidecar_file(name));
        let values = std::fs::read(&path)
            .map_err(Error::io("read", &path))
            .and_then(|bytes| format::parse_sidecar(&bytes, &path));
        match (values, &index) {
            (Err(e), _) => problems.push(problem_of(&e, &path)),
            (Ok(values), Some(index)) => {
                let missing = index.keys[s]
                    .iter()
                    .filter(|&&k| k != NO_KEY && k as usize >= values.len())
                    .count();
                if missing > 0 {
                    problems.push(Problem::new(
                        &path,
                        ProblemKind::Structure,
                        format!(
                            "{missing} rows refer to keys beyond its {} entries",
                            values.len()
                        ),
                    ));
                }
            }
            (Ok(_), None) => {}
        }
    }
    let fp = dir.join(FINGERPRINT_FILE);
    if let Err(e) = durable_fs::read_capped(&fp, MAX_SMALL_JSON)
        .map_err(Error::durable)
        .and_then(|bytes| {
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .map(|_| ())
                .map_err(|source| Error::Json {
                    file: fp.clone(),
                    source,
                })
        })
    {
        problems.push(problem_of(&e, &fp));
    }
    if sizes_ok {
        for a in shapes
            .schema
            .arrays()
            .iter()
            .filter(|a| a.dtype() == DType::Bool)
        {
            let path = dir.join(format::bin_file(a.name()));
            if let Some(problem) = check_bools(&path) {
                problems.push(problem);
            }
        }
    }
    problems
}

fn check_bools(path: &Path) -> Option<Problem> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return Some(Problem::new(path, ProblemKind::Io, e.to_string())),
    };
    let mut buf = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => n,
            Err(e) => return Some(Problem::new(path, ProblemKind::Io, e.to_string())),
        };
        if let Some(i) = buf[..n].iter().position(|&b| b > 1) {
            return Some(Problem::new(
                path,
                ProblemKind::Structure,
                format!("bool byte {:#04x} at offset {}", buf[i], offset + i as u64),
            ));
        }
        offset += n as u64;
    }
}

//! `verify` and `inspect`: what the `cachex` CLI reports about a page file.

use std::fmt;
use std::path::{Path, PathBuf};

use cache_check::{Problem, ProblemKind};
use serde_json::json;

use crate::format::{self, rd_u64};
use crate::reader::{Backing, PageReader};
use crate::validate::{self, Problems};
use crate::{Error, Result};

/// Most problems [`verify`] lists before it stops looking.
pub const MAX_PROBLEMS: usize = 1000;

/// Checks everything about the page file at `path` — footer, header,
/// tables, every allocation, and every page's checksum — and lists every
/// problem found (up to [`MAX_PROBLEMS`]), each naming the file and what
/// is wrong. An empty list means the file is sound.
pub fn verify(path: impl AsRef<Path>) -> Vec<Problem> {
    verify_errors(path.as_ref())
        .iter()
        .map(problem_of)
        .collect()
}

/// [`verify`] of a page file read through a local tier, which holds only
/// what was fetched: `hold` is called with each byte range of the pages
/// (and of the header's and tables' padding) before it is read, and what
/// it returns is kept until that range is checked, so a file larger than
/// the tier's budget is checked one run at a time. The header and tables
/// must be local already (a reader keeps them). An error from `hold` is
/// a problem of the file (kind `io`), and the check stops there.
pub fn verify_with<G>(
    path: impl AsRef<Path>,
    mut hold: impl FnMut(std::ops::Range<u64>) -> std::io::Result<G>,
) -> Vec<Problem> {
    let path = path.as_ref();
    let mut hold = |r: std::ops::Range<u64>| {
        hold(r).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            op: "fetch the pages of",
            source,
        })
    };
    verify_errors_holding(path, &mut hold)
        .iter()
        .map(problem_of)
        .collect()
}

fn verify_errors(path: &Path) -> Vec<Error> {
    verify_errors_holding(path, &mut |_| Ok(()))
}

fn verify_errors_holding<G>(
    path: &Path,
    hold: &mut dyn FnMut(std::ops::Range<u64>) -> Result<G>,
) -> Vec<Error> {
    let data = match Backing::map(path, false) {
        Ok(d) => d,
        Err(e) => return vec![e],
    };
    let bytes = data.bytes();
    let mut layout = match format::parse(bytes, path) {
        Ok(l) => l,
        Err(e) => return vec![e],
    };
    let mut problems = Problems::new(MAX_PROBLEMS);
    validate::check_runs(&mut layout, bytes, path, &mut problems);
    if !problems.full() {
        validate::check_page_hashes_holding(&layout, bytes, path, &mut problems, hold);
    }
    problems.list
}

/// An error of this crate as a problem in the shared shape: its file, its
/// kind, and its message without the file's name.
pub(crate) fn problem_of(e: &Error) -> Problem {
    let (path, kind) = match e {
        Error::Io { path, source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            (path, ProblemKind::Missing)
        }
        Error::Io { path, .. } | Error::Locked { path, .. } => (path, ProblemKind::Io),
        Error::Incomplete { path, .. } => (path, ProblemKind::Truncated),
        Error::Checksum { path, .. } => (path, ProblemKind::ChecksumMismatch),
        Error::UnsupportedVersion { path, .. } => (path, ProblemKind::ForeignVersion),
        Error::Corrupt { path, .. }
        | Error::UnsupportedField { path, .. }
        | Error::Invalid { path, .. }
        | Error::BadSample { path, .. }
        | Error::Source { path, .. }
        | Error::OutOfRange { path, .. }
        | Error::Field { path, .. }
        | Error::Tensor { path, .. }
        | Error::PoolTooSmall { path, .. } => (path, ProblemKind::Structure),
    };
    Problem::from_error(path.clone(), kind, e)
}

/// Per-field numbers of an [`Inspection`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldInfo {
    /// Field name.
    pub name: String,
    /// `int`, `float`, `bytes` or `array`.
    pub kind: &'static str,
    /// Bytes of this field's values in pages (0 for inline fields).
    pub total_bytes: u64,
    /// Largest value (0 for inline fields).
    pub max_bytes: u64,
}

/// What `cachex inspect` prints about a page file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// The file.
    pub path: PathBuf,
    /// Its format version (1: data at 4 KiB; 2: data aligned to the page size).
    pub format_version: u32,
    /// Its length.
    pub file_len: u64,
    /// Samples.
    pub num_samples: u64,
    /// Page size.
    pub page_size: u64,
    /// Allocation alignment.
    pub alignment: u64,
    /// Runs (pages or page runs).
    pub num_runs: u64,
    /// Pages spanned.
    pub num_pages: u64,
    /// Bytes of sample data in pages.
    pub data_bytes: u64,
    /// Bytes of metadata and run tables.
    pub table_bytes: u64,
    /// Fields.
    pub fields: Vec<FieldInfo>,
}

/// Opens (and so validates) the page file at `path` and summarises it.
pub fn inspect(path: impl AsRef<Path>) -> Result<Inspection> {
    let reader = PageReader::open(path)?;
    let layout = reader.layout();
    let bytes = reader.bytes();
    let h = &layout.header;
    let mut fields: Vec<FieldInfo> = layout
        .schema
        .fields()
        .iter()
        .enumerate()
        .map(|(f, field)| FieldInfo {
            name: field.name.clone(),
            kind: field.ty.kind_name(),
            total_bytes: 0,
            max_bytes: layout.max_sizes[f],
        })
        .collect();
    for i in 0..h.num_samples {
        let Some(row) = layout.row(bytes, i) else {
            break;
        };
        for (f, field) in layout.schema.fields().iter().enumerate() {
            if !field.ty.is_inline() {
                fields[f].total_bytes += rd_u64(row, layout.row_offsets[f] + 8);
            }
        }
    }
    Ok(Inspection {
        path: reader.path().to_path_buf(),
        format_version: h.version,
        file_len: bytes.len() as u64,
        num_samples: h.num_samples,
        page_size: h.page_size,
        alignment: h.alignment,
        num_runs: h.num_runs,
        num_pages: h.num_pages,
        data_bytes: layout.data_bytes,
        table_bytes: h.footer_offset - h.meta_offset,
        fields,
    })
}

impl Inspection {
    /// The summary in the shared shape the `cachex` tool prints: counts,
    /// page geometry, sizes and a table of fields.
    pub fn summary(&self) -> cache_check::Summary {
        let fields = self
            .fields
            .iter()
            .map(|f| {
                vec![
                    json!(f.name),
                    json!(f.kind),
                    json!(f.total_bytes),
                    json!(f.max_bytes),
                ]
            })
            .collect();
        cache_check::Summary::new("page-alloc", &self.path)
            .fact("format_version", self.format_version)
            .fact("file_len", self.file_len)
            .fact("num_samples", self.num_samples)
            .fact("page_size", self.page_size)
            .fact("alignment", self.alignment)
            .fact("num_runs", self.num_runs)
            .fact("num_pages", self.num_pages)
            .fact("data_bytes", self.data_bytes)
            .fact("table_bytes", self.table_bytes)
            .table(
                "fields",
                ["name", "kind", "total_bytes", "max_bytes"],
                fields,
            )
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: page-alloc file, format version {}",
            self.path.display(),
            self.format_version
        )?;
        writeln!(
            f,
            "  {} samples, {} bytes on disk ({:.1} per sample)",
            self.num_samples,
            self.file_len,
            self.file_len as f64 / self.num_samples.max(1) as f64
        )?;
        writeln!(
            f,
            "  pages: {} x {} B in {} runs, alignment {} B; sample data {} B ({:.1}% of page space)",
            self.num_pages,
            self.page_size,
            self.num_runs,
            self.alignment,
            self.data_bytes,
            100.0 * self.data_bytes as f64 / (self.num_pages.max(1) * self.page_size) as f64
        )?;
        writeln!(f, "  tables: {} B", self.table_bytes)?;
        for field in &self.fields {
            if field.kind == "int" || field.kind == "float" {
                writeln!(f, "  field {:?}: {} (inline)", field.name, field.kind)?;
            } else {
                writeln!(
                    f,
                    "  field {:?}: {}, {} B total, largest {} B",
                    field.name, field.kind, field.total_bytes, field.max_bytes
                )?;
            }
        }
        Ok(())
    }
}

//! The native on-disk format, written down once: constants, layouts, and
//! the parse/validate code every reader runs before touching a sample.
//!
//! All integers are little-endian; all offsets are absolute file offsets.
//!
//! ```text
//! offset 0            header            128 B fixed part + 96 B per field
//! data_offset         data pages        page k starts at data_offset + k * page_size
//!                                       (data_offset = header_len rounded up to
//!                                       min(page_size, 1 MiB))
//! meta_offset         metadata table    num_samples rows of row_len bytes
//! runs_offset         run table         num_runs entries of 72 B
//! footer_offset       footer            64 B, the commit record; ends the file
//! ```
//!
//! **Header, fixed part** (128 B):
//!
//! | at | type | field |
//! |---|---|---|
//! | 0 | `[u8; 8]` | magic `b"CXPAGES\0"` |
//! | 8 | u32 | format version ([`VERSION`]) |
//! | 12 | u32 | header_len = 128 + 96 * num_fields |
//! | 16 | u64 | page_size (power of two, 4 KiB ..= 4 GiB) |
//! | 24 | u32 | alignment of every allocation (power of two, 8 ..= 4096) |
//! | 28 | u32 | num_fields (..= 256) |
//! | 32 | u64 | num_samples |
//! | 40 | u64 | data_offset |
//! | 48 | u64 | num_runs |
//! | 56 | u64 | num_pages (pages spanned by all runs) |
//! | 64 | u64 | meta_offset |
//! | 72 | u64 | runs_offset |
//! | 80 | u64 | footer_offset |
//! | 88 | `[u8; 32]` | BLAKE3 of the bytes `meta_offset..footer_offset` (both tables) |
//! | 120 | `[u8; 8]` | reserved, zero |
//!
//! **Field descriptor** (96 B each, after the fixed part): kind u8 @0
//! (0 int, 1 float, 2 bytes, 3 array), dtype u8 @1 (arrays: index into
//! `tensor_core::DType::ALL`), ndim u8 @2 (..= 6), name_len u8 @3 (1 ..= 40),
//! 4 zero bytes, dims `[u64; 6]` @8, name `[u8; 40]` @56 (UTF-8, zero-padded).
//!
//! **Metadata row**: the fields in schema order; an int is an `i64`, a float
//! an `f64` (8 B each), a bytes or array field a `(ptr u64, size u64)` pair
//! (16 B) giving the absolute offset and length of its allocation.
//!
//! **Run** (72 B): a run is one page, or, for a sample larger than a page,
//! the contiguous pages that hold just that sample. first_page u64 @0,
//! pages u64 @8, len u64 @16 (bytes used from the run's start), first_sample
//! u64 @24, num_samples u64 @32, BLAKE3 of the run's `len` bytes @40.
//! Runs are in file order, cover the pages `0..num_pages` without gaps, and
//! hold consecutive samples: run k holds samples `first_sample ..
//! first_sample + num_samples`, and consecutive runs continue the count.
//! A run's bytes after `len`, rounded up to the alignment, are not written
//! (they read as zeros).
//!
//! **Allocations** of a run, walked in (sample, field) order, never go
//! backwards: each ptr is at or after the previous allocation's end, so no
//! two overlap; each ends within its run (so a sample never straddles
//! pages); each non-empty one is aligned; array values have exactly their
//! shape's size. The metadata table starts where the last run's bytes end
//! (rounded up to the alignment), or at data_offset when there is no run.
//!
//! **Footer** (64 B): BLAKE3 of the header bytes `0..header_len` @0,
//! file length u64 @32, version u32 @40, zero u32 @44, the first 8 bytes of
//! BLAKE3 of footer bytes `0..48` @48, magic `b"CXPGEND\0"` @56.
//!
//! **Versions**: version 2 starts the data pages at a multiple of the page
//! size (at least [`DATA_ALIGN`], at most [`MAX_DATA_ALIGN`]), so a remote
//! tier whose blocks divide that alignment holds whole pages, and no two
//! pages share a block; the padding after the header is a hole, never
//! written. Version 1 (data at the next 4 KiB) was never released and is
//! refused like any other version.
//!
//! Integrity: the footer commits the header; the header commits both
//! tables; each run entry commits its page bytes. Opening checks the
//! footer, header and tables (O(index)); [`crate::verify`] also hashes
//! every page.

use std::path::Path;

use tensor_core::{DType, Shape};

// The schema's limits are the header's too: its field descriptors are sized by them.
use crate::schema::{Field, FieldType, Schema};
pub use crate::schema::{MAX_DIMS, MAX_FIELDS, MAX_NAME_LEN};
use crate::{Error, Result};

/// Magic bytes that open a page file.
pub const MAGIC: [u8; 8] = *b"CXPAGES\0";
/// Magic bytes that end a committed page file.
pub const FOOTER_MAGIC: [u8; 8] = *b"CXPGEND\0";
/// The format version this crate writes (data pages aligned to the page size).
pub const VERSION: u32 = 2;
/// Size of the fixed part of the header.
pub const HEADER_FIXED_LEN: usize = 128;
/// Size of one field descriptor.
pub const FIELD_DESC_LEN: usize = 96;
/// Size of one run-table entry.
pub const RUN_LEN: usize = 72;
/// Size of the footer.
pub const FOOTER_LEN: usize = 64;
/// Data pages start at a multiple of this (so `O_DIRECT` can write them).
pub const DATA_ALIGN: u64 = 4096;
/// Largest alignment of the data start: a page size larger than this
/// aligns the data to it, so the padding after the header stays small.
pub const MAX_DATA_ALIGN: u64 = 1 << 20;
/// Smallest page size.
pub const MIN_PAGE_SIZE: u64 = 4096;
/// Largest page size.
pub const MAX_PAGE_SIZE: u64 = 1 << 32;
/// Default page size: 64 KiB. A reader of a file on a URL fetches a
/// sample's whole run (its page, or the pages of a sample larger than one)
/// before reading it, so a page of a few samples of tens of KiB keeps a
/// random read near its own bytes, where FFCV's 8 MiB fetched 8 MiB for
/// each; the price is the tail a page cannot fill (up to a sample's size,
/// or a page's for samples larger than one) and a 72 B run per page.
pub const DEFAULT_PAGE_SIZE: u64 = 64 << 10;
/// Smallest allocation alignment.
pub const MIN_ALIGNMENT: u32 = 8;
/// Largest allocation alignment.
pub const MAX_ALIGNMENT: u32 = 4096;
/// Default allocation alignment.
pub const DEFAULT_ALIGNMENT: u32 = 512;

/// Reads a little-endian u64 at `at`; 0 past the end (callers check lengths
/// first, so this never decides anything on its own).
pub(crate) fn rd_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = at.checked_add(8).and_then(|end| b.get(at..end)) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

/// Reads a little-endian u32 at `at` (0 past the end, as [`rd_u64`]).
pub(crate) fn rd_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = at.checked_add(4).and_then(|end| b.get(at..end)) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

/// Reads 32 bytes at `at` (zeros past the end).
fn rd_hash(b: &[u8], at: usize) -> [u8; 32] {
    let mut a = [0u8; 32];
    if let Some(s) = at.checked_add(32).and_then(|end| b.get(at..end)) {
        a.copy_from_slice(s);
    }
    a
}

/// `x` rounded up to a multiple of the power of two `to`, or `None` on overflow.
pub(crate) fn round_up(x: u64, to: u64) -> Option<u64> {
    let mask = to.checked_sub(1)?;
    Some(x.checked_add(mask)? & !mask)
}

/// What the data start of a file of `page_size` is a multiple of.
pub(crate) fn data_align(page_size: u64) -> u64 {
    page_size.clamp(DATA_ALIGN, MAX_DATA_ALIGN)
}

/// Where the data pages start for a header of `header_len` bytes in a file
/// of `page_size`.
pub(crate) fn data_offset_for(header_len: u64, page_size: u64) -> u64 {
    // header_len is at most 128 + 96 * 256 and the alignment at most 1 MiB: far from overflow.
    let align = data_align(page_size);
    header_len.div_ceil(align) * align
}

/// Length of the header for `num_fields` fields.
pub(crate) fn header_len_for(num_fields: usize) -> usize {
    HEADER_FIXED_LEN + FIELD_DESC_LEN * num_fields
}

/// Checks a page size and an alignment (writer options and file headers).
pub(crate) fn check_geometry(page_size: u64, alignment: u64) -> std::result::Result<(), String> {
    if !page_size.is_power_of_two() || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size) {
        return Err(format!(
            "page size {page_size} is not a power of two in {MIN_PAGE_SIZE}..={MAX_PAGE_SIZE}"
        ));
    }
    if !alignment.is_power_of_two()
        || !(u64::from(MIN_ALIGNMENT)..=u64::from(MAX_ALIGNMENT)).contains(&alignment)
    {
        return Err(format!(
            "alignment {alignment} is not a power of two in {MIN_ALIGNMENT}..={MAX_ALIGNMENT}"
        ));
    }
    Ok(())
}

/// The fixed header fields (everything but the schema).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub version: u32,
    pub page_size: u64,
    pub alignment: u64,
    pub num_samples: u64,
    pub data_offset: u64,
    pub num_runs: u64,
    pub num_pages: u64,
    pub meta_offset: u64,
    pub runs_offset: u64,
    pub footer_offset: u64,
    pub tables_hash: [u8; 32],
}

impl Header {
    /// The header bytes (fixed part and field descriptors).
    pub(crate) fn encode(&self, schema: &Schema) -> Vec<u8> {
        let len = header_len_for(schema.len());
        let mut b = vec![0u8; len];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(len as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.page_size.to_le_bytes());
        b[24..28].copy_from_slice(&(self.alignment as u32).to_le_bytes());
        b[28..32].copy_from_slice(&(schema.len() as u32).to_le_bytes());
        for (at, v) in [
            (32, self.num_samples),
            (40, self.data_offset),
            (48, self.num_runs),
            (56, self.num_pages),
            (64, self.meta_offset),
            (72, self.runs_offset),
            (80, self.footer_offset),
        ] {
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        b[88..120].copy_from_slice(&self.tables_hash);
        for (i, field) in schema.fields().iter().enumerate() {
            let d = &mut b[HEADER_FIXED_LEN + i * FIELD_DESC_LEN..][..FIELD_DESC_LEN];
            encode_field(field, d);
        }
        b
    }
}

fn encode_field(field: &Field, d: &mut [u8]) {
    let (kind, dtype, dims): (u8, u8, &[usize]) = match &field.ty {
        FieldType::Int => (0, 0, &[]),
        FieldType::Float => (1, 0, &[]),
        FieldType::Bytes => (2, 0, &[]),
        FieldType::Array { dtype, shape } => (3, dtype_code(*dtype), shape.dims()),
    };
    d[0] = kind;
    d[1] = dtype;
    d[2] = dims.len() as u8;
    d[3] = field.name.len() as u8;
    for (k, dim) in dims.iter().enumerate() {
        d[8 + 8 * k..16 + 8 * k].copy_from_slice(&(*dim as u64).to_le_bytes());
    }
    d[56..56 + field.name.len()].copy_from_slice(field.name.as_bytes());
}

fn dtype_code(dtype: DType) -> u8 {
    DType::ALL.iter().position(|d| *d == dtype).unwrap_or(0) as u8
}

fn decode_field(d: &[u8], i: usize, path: &Path) -> Result<Field> {
    let bad = |reason: String| Error::corrupt(path, format!("field descriptor {i}: {reason}"));
    let name_len = usize::from(d[3]);
    if name_len == 0 || name_len > MAX_NAME_LEN {
        return Err(bad(format!(
            "name length {name_len} not in 1..={MAX_NAME_LEN}"
        )));
    }
    let name = std::str::from_utf8(&d[56..56 + name_len])
        .map_err(|_| bad("name is not UTF-8".into()))?
        .to_owned();
    let ndim = usize::from(d[2]);
    let ty = match d[0] {
        0 => FieldType::Int,
        1 => FieldType::Float,
        2 => FieldType::Bytes,
        3 => {
            let dtype = *DType::ALL
                .get(usize::from(d[1]))
                .ok_or_else(|| bad(format!("unknown dtype code {}", d[1])))?;
            if ndim > MAX_DIMS {
                return Err(bad(format!("{ndim} dimensions, at most {MAX_DIMS}")));
            }
            let mut dims = Vec::with_capacity(ndim);
            for k in 0..ndim {
                let dim = usize::try_from(rd_u64(d, 8 + 8 * k))
                    .map_err(|_| bad("dimension overflows usize".into()))?;
                dims.push(dim);
            }
            let shape = Shape::new(dims);
            if shape.byte_len(dtype).is_err() {
                return Err(bad(format!("shape {shape} overflows")));
            }
            FieldType::Array { dtype, shape }
        }
        k => return Err(bad(format!("unknown field kind {k}"))),
    };
    Ok(Field { name, ty })
}

/// One run-table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Run {
    pub first_page: u64,
    pub pages: u64,
    pub len: u64,
    pub first_sample: u64,
    pub num_samples: u64,
    pub hash: [u8; 32],
}

impl Run {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        for v in [
            self.first_page,
            self.pages,
            self.len,
            self.first_sample,
            self.num_samples,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.hash);
    }

    pub(crate) fn decode(b: &[u8]) -> Run {
        Run {
            first_page: rd_u64(b, 0),
            pages: rd_u64(b, 8),
            len: rd_u64(b, 16),
            first_sample: rd_u64(b, 24),
            num_samples: rd_u64(b, 32),
            hash: rd_hash(b, 40),
        }
    }
}

/// The file name ending of a page file: readers that fetch files in parts
/// (remote-cache) read these by blocks, a sample's pages at a time.
pub const FILE_SUFFIX: &str = ".pages";

/// Whether `path` (inside a cache directory) is a page file.
pub fn is_page_file(path: &str) -> bool {
    path.ends_with(FILE_SUFFIX)
}

/// The byte ranges of a page file of `file_len` bytes that a reader opens
/// before any sample — the header and the tables with the footer — found
/// from the file's first [`HEADER_FIXED_LEN`] bytes `fixed` (fewer when
/// the file is shorter). For a reader that fetches the file in parts:
/// values that do not fit the file are clamped, left for
/// [`PageReader::open`](crate::PageReader::open) to report.
pub fn open_ranges(fixed: &[u8], file_len: u64) -> [std::ops::Range<u64>; 2] {
    let header_len = if fixed.len() >= 16 {
        u64::from(rd_u32(fixed, 12))
    } else {
        0
    };
    let meta_offset = if fixed.len() >= 72 {
        rd_u64(fixed, 64)
    } else {
        0
    };
    [
        0..header_len.min(file_len),
        meta_offset.min(file_len)..file_len,
    ]
}

/// Where the samples of one run lie in a page file: for a reader that
/// fetches a sample's pages before reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSpan {
    /// The run's first sample.
    pub first_sample: u64,
    /// The run's byte range in the file.
    pub bytes: std::ops::Range<u64>,
}

/// The footer bytes for a header hash and the final file length.
pub(crate) fn encode_footer(
    header_hash: &[u8; 32],
    file_len: u64,
    version: u32,
) -> [u8; FOOTER_LEN] {
    let mut f = [0u8; FOOTER_LEN];
    f[0..32].copy_from_slice(header_hash);
    f[32..40].copy_from_slice(&file_len.to_le_bytes());
    f[40..44].copy_from_slice(&version.to_le_bytes());
    let check = blake3::hash(&f[0..48]);
    f[48..56].copy_from_slice(&check.as_bytes()[..8]);
    f[56..64].copy_from_slice(&FOOTER_MAGIC);
    f
}

/// A parsed and validated file layout: everything a reader needs to find
/// a sample, computed from header, footer and tables.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub header: Header,
    pub schema: Schema,
    pub row_len: usize,
    pub row_offsets: Vec<usize>,
    /// Largest value of each field seen in the file (0 for inline fields).
    pub max_sizes: Vec<u64>,
    /// Sum of all allocation sizes.
    pub data_bytes: u64,
}

impl Layout {
    /// The metadata row of sample `i` (caller checked `i < num_samples`).
    pub(crate) fn row<'a>(&self, bytes: &'a [u8], i: u64) -> Option<&'a [u8]> {
        let start = usize::try_from(self.header.meta_offset).ok()?
            + usize::try_from(i).ok()?.checked_mul(self.row_len)?;
        bytes.get(start..start.checked_add(self.row_len)?)
    }

    /// Run entry `k` (caller checked `k < num_runs`).
    pub(crate) fn run(&self, bytes: &[u8], k: u64) -> Option<Run> {
        let start = usize::try_from(self.header.runs_offset).ok()?
            + usize::try_from(k).ok()?.checked_mul(RUN_LEN)?;
        bytes
            .get(start..start.checked_add(RUN_LEN)?)
            .map(Run::decode)
    }

    /// File offset of page `page`.
    pub(crate) fn page_offset(&self, page: u64) -> Option<u64> {
        page.checked_mul(self.header.page_size)?
            .checked_add(self.header.data_offset)
    }
}

/// Parses and checks footer, header, schema, table placement and the
/// tables' checksum. Returns the layout with `max_sizes`/`data_bytes` still
/// zero: `check_runs` (in `validate.rs`) fills them.
pub(crate) fn parse(bytes: &[u8], path: &Path) -> Result<Layout> {
    let file_len = bytes.len() as u64;
    let min = (HEADER_FIXED_LEN + FOOTER_LEN) as u64;
    if bytes.len() >= 8 && bytes[0..8] != MAGIC {
        return Err(Error::corrupt(path, "not a page file (bad magic)"));
    }
    if file_len < min {
        return Err(Error::incomplete(
            path,
            format!("{file_len} bytes, shorter than header and footer ({min} bytes)"),
        ));
    }
    let version = rd_u32(bytes, 8);
    if version != VERSION {
        return Err(Error::UnsupportedVersion {
            path: path.to_path_buf(),
            found: u64::from(version),
            supported: "2",
        });
    }
    // Footer: the commit record.
    let footer = &bytes[bytes.len() - FOOTER_LEN..];
    if footer[56..64] != FOOTER_MAGIC {
        return Err(Error::incomplete(
            path,
            "no commit footer at the end of the file",
        ));
    }
    let check = blake3::hash(&footer[0..48]);
    if footer[48..56] != check.as_bytes()[..8] {
        return Err(Error::checksum(path, "footer"));
    }
    if rd_u32(footer, 40) != version || rd_u32(footer, 44) != 0 {
        return Err(Error::corrupt(path, "footer version field mismatch"));
    }
    let footer_len_field = rd_u64(footer, 32);
    if footer_len_field != file_len {
        return Err(Error::corrupt(
            path,
            format!("footer records {footer_len_field} bytes, file has {file_len}"),
        ));
    }
    // Header.
    let header_len = rd_u32(bytes, 12) as usize;
    let num_fields = rd_u32(bytes, 28) as usize;
    if num_fields > MAX_FIELDS {
        return Err(Error::corrupt(
            path,
            format!("{num_fields} fields, at most {MAX_FIELDS}"),
        ));
    }
    if header_len != header_len_for(num_fields) {
        return Err(Error::corrupt(
            path,
            format!("header length {header_len} does not match {num_fields} fields"),
        ));
    }
    let header_bytes = bytes
        .get(..header_len)
        .filter(|_| header_len + FOOTER_LEN <= bytes.len())
        .ok_or_else(|| Error::corrupt(path, format!("header ({header_len} B) beyond the file")))?;
    if blake3::hash(header_bytes).as_bytes() != &footer[0..32] {
        return Err(Error::checksum(path, "header"));
    }
    let header = Header {
        version,
        page_size: rd_u64(bytes, 16),
        alignment: u64::from(rd_u32(bytes, 24)),
        num_samples: rd_u64(bytes, 32),
        data_offset: rd_u64(bytes, 40),
        num_runs: rd_u64(bytes, 48),
        num_pages: rd_u64(bytes, 56),
        meta_offset: rd_u64(bytes, 64),
        runs_offset: rd_u64(bytes, 72),
        footer_offset: rd_u64(bytes, 80),
        tables_hash: rd_hash(bytes, 88),
    };
    check_geometry(header.page_size, header.alignment).map_err(|r| Error::corrupt(path, r))?;
    if bytes[120..128] != [0u8; 8] {
        return Err(Error::corrupt(path, "reserved header bytes are not zero"));
    }
    let mut fields = Vec::with_capacity(num_fields);
    for i in 0..num_fields {
        let d = &header_bytes[HEADER_FIXED_LEN + i * FIELD_DESC_LEN..][..FIELD_DESC_LEN];
        fields.push(decode_field(d, i, path)?);
    }
    let schema = Schema::from_fields(fields);
    schema
        .validate(path)
        .map_err(|e| Error::corrupt(path, format!("schema: {e}")))?;
    // Table placement, all with checked arithmetic.
    let overflow = || Error::corrupt(path, "table offsets overflow");
    if header.data_offset != data_offset_for(header_len as u64, header.page_size) {
        return Err(Error::corrupt(
            path,
            format!(
                "data offset {} is not the header length rounded up to {}",
                header.data_offset,
                data_align(header.page_size)
            ),
        ));
    }
    let row_len = schema.row_len();
    let meta_len = header
        .num_samples
        .checked_mul(row_len as u64)
        .ok_or_else(overflow)?;
    let runs_len = header
        .num_runs
        .checked_mul(RUN_LEN as u64)
        .ok_or_else(overflow)?;
    if header.meta_offset < header.data_offset {
        return Err(Error::corrupt(
            path,
            format!(
                "metadata table at {} starts before the data pages at {}",
                header.meta_offset, header.data_offset
            ),
        ));
    }
    let runs_offset = header
        .meta_offset
        .checked_add(meta_len)
        .ok_or_else(overflow)?;
    if header.runs_offset != runs_offset {
        return Err(Error::corrupt(
            path,
            format!(
                "run table at {}, expected {runs_offset} after {} metadata rows",
                header.runs_offset, header.num_samples
            ),
        ));
    }
    let footer_offset = runs_offset.checked_add(runs_len).ok_or_else(overflow)?;
    if header.footer_offset != footer_offset
        || footer_offset.checked_add(FOOTER_LEN as u64) != Some(file_len)
    {
        return Err(Error::corrupt(
            path,
            format!(
                "tables end at {footer_offset}, footer recorded at {}, file has {file_len} bytes",
                header.footer_offset
            ),
        ));
    }
    if header.num_samples > 0 && header.num_runs == 0 {
        return Err(Error::corrupt(path, "samples but no runs"));
    }
    // Both offsets now fit in the file, hence in usize.
    let tables = &bytes[header.meta_offset as usize..footer_offset as usize];
    if blake3::hash(tables).as_bytes() != &header.tables_hash {
        return Err(Error::checksum(path, "metadata/run table"));
    }
    let max_sizes = vec![0; schema.len()];
    Ok(Layout {
        row_offsets: schema.row_offsets(),
        header,
        schema,
        row_len,
        max_sizes,
        data_bytes: 0,
    })
}

//! FFCV `.beton` files (format version 2): read and write, with the checks
//! FFCV does not make.
//!
//! All integers little-endian, all offsets absolute:
//!
//! ```text
//! 0                    header: version u16 (=2), num_fields u16, page_size u32,
//!                              num_samples u64, alloc_table_ptr u64   (24 B)
//! 24                   field descriptors, 1041 B each: type_id u8,
//!                              name [u8; 16] (ASCII, NUL-padded), arguments [u8; 1024]
//! 24 + 1041 * fields   metadata table: num_samples rows of an aligned numpy
//!                              struct (see below)
//! data_start           pages of exactly page_size bytes; data_start is the
//!                              metadata end rounded up to page_size
//! alloc_table_ptr      allocation table to the end of the file: rows of
//!                              sample_id u64, ptr u64, size u64
//! ```
//!
//! Metadata per field type (type id): Float (0) `<f8`, Int (1) `<i8`,
//! NDArray (4) `<u8` ptr — all aligned to 8 in the row; Bytes (3) and JSON
//! (5) a packed `{ptr <u8, size <u8}`, RGBImage (2) a packed `{mode u1,
//! width <u2, height <u2, data_ptr <u8}` — packed structs have numpy
//! alignment 1, so they sit unpadded. The row size is rounded up to the
//! largest alignment. NDArray arguments: shape `[u64; 32]` (trailing zeros
//! dropped), type_length u64 at 256, then the JSON of `dtype.descr`
//! (`[["", "<f4"]]`). JSON values are stored as text plus a NUL byte.
//! Readers take an allocation's size from the allocation table (looked up
//! by pointer). A file whose writer crashed has `alloc_table_ptr = 0`.
//!
//! **Checks made here and not by FFCV:** header sizes against the file,
//! page size a power of two, every allocation row inside the data region,
//! not straddling a page, not overlapping another, for an existing sample;
//! every metadata pointer matching exactly one unused allocation of its
//! sample with the size its type implies; RGB raw images of `w * h * 3`
//! bytes; JSON text UTF-8; NDArray dtype and shape parsed and sized with
//! checked arithmetic.
//!
//! The writer lays files out as FFCV's `DatasetWriter` does with one
//! worker (samples packed into pages in order, a sample that does not fit
//! restarts on a fresh page), so a file written here from the same values
//! is byte-identical to FFCV's; it writes under a temporary name and
//! renames after fsync. A sample larger than a page is an error, as in FFCV.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tensor_core::{DType, Shape, TensorView};

use crate::format::rd_u64;
use crate::reader::Backing;
use crate::recover::{lock_path, sync_parent_dir, temp_path};
use crate::{Error, Result};

/// The `.beton` format version read and written.
pub const BETON_VERSION: u16 = 2;
/// Size of the `.beton` header.
pub const HEADER_LEN: usize = 24;
/// Size of one field descriptor.
pub const FIELD_DESC_LEN: usize = 1041;
/// Size of a field name in a descriptor.
pub const NAME_LEN: usize = 16;
/// Size of a descriptor's arguments.
pub const ARGS_LEN: usize = 1024;
/// Size of one allocation-table row.
pub const ALLOC_ROW_LEN: usize = 24;
/// FFCV's smallest page size (2 MiB).
pub const MIN_PAGE_SIZE: u64 = 1 << 21;
/// FFCV's default page size (8 MiB).
pub const DEFAULT_PAGE_SIZE: u64 = 1 << 23;
/// NDArray arguments: 32 shape slots then the type length.
const ND_MAX_DIMS: usize = 32;
const ND_TYPE_AT: usize = 8 * ND_MAX_DIMS + 8;

/// The type of a `.beton` field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BetonType {
    /// `FloatField` (type id 0): an `f64` in the metadata row.
    Float,
    /// `IntField` (type id 1): an `i64` in the metadata row.
    Int,
    /// `RGBImageField` (type id 2): raw or JPEG bytes, with mode/width/height.
    RgbImage,
    /// `BytesField` (type id 3).
    Bytes,
    /// `NDArrayField` (type id 4): a fixed dtype and shape.
    NDArray {
        /// Element type.
        dtype: DType,
        /// Shape.
        shape: Shape,
    },
    /// `JSONField` (type id 5): JSON text (stored with a NUL terminator).
    Json,
}

impl BetonType {
    /// FFCV's type id.
    pub fn type_id(&self) -> u8 {
        match self {
            BetonType::Float => 0,
            BetonType::Int => 1,
            BetonType::RgbImage => 2,
            BetonType::Bytes => 3,
            BetonType::NDArray { .. } => 4,
            BetonType::Json => 5,
        }
    }

    /// (size, numpy alignment) of the field's metadata.
    fn meta_layout(&self) -> (usize, usize) {
        match self {
            BetonType::Float | BetonType::Int | BetonType::NDArray { .. } => (8, 8),
            BetonType::Bytes | BetonType::Json => (16, 1),
            BetonType::RgbImage => (13, 1),
        }
    }

    fn element_size(&self) -> Option<u64> {
        match self {
            BetonType::NDArray { dtype, shape } => shape.byte_len(*dtype).ok().map(|n| n as u64),
            _ => None,
        }
    }
}

/// A named `.beton` field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BetonField {
    /// Name (ASCII, at most 16 bytes).
    pub name: String,
    /// Type.
    pub ty: BetonType,
}

impl BetonField {
    /// A field called `name` of type `ty`.
    pub fn new(name: impl Into<String>, ty: BetonType) -> BetonField {
        BetonField {
            name: name.into(),
            ty,
        }
    }
}

/// One field value of a `.beton` sample: read (borrowed from the file) or
/// to be written.
#[derive(Debug, Clone, PartialEq)]
pub enum BetonValue<'a> {
    /// Float field.
    Float(f64),
    /// Int field.
    Int(i64),
    /// Bytes field.
    Bytes(&'a [u8]),
    /// NDArray field.
    NDArray(TensorView<'a>),
    /// JSON field: the text, without FFCV's NUL terminator.
    Json(&'a str),
    /// RGBImage field: header and stored bytes (raw `h*w*3` pixels for mode
    /// 1, JPEG for mode 0); never decoded here.
    RgbImage {
        /// 0 JPEG, 1 raw.
        mode: u8,
        /// Width in pixels.
        width: u16,
        /// Height in pixels.
        height: u16,
        /// The stored bytes.
        data: &'a [u8],
    },
}

/// Row layout: offset of each field, and the row size.
fn row_layout(fields: &[BetonField]) -> (Vec<usize>, usize) {
    let mut at: usize = 0;
    let mut max_align: usize = 1;
    let offsets = fields
        .iter()
        .map(|f| {
            let (size, align) = f.ty.meta_layout();
            at = at.div_ceil(align) * align;
            let here = at;
            at += size;
            max_align = max_align.max(align);
            here
        })
        .collect();
    (offsets, at.div_ceil(max_align) * max_align)
}

/// A validated `.beton` file, memory-mapped; values are borrowed from it.
#[derive(Debug)]
pub struct BetonFile {
    path: PathBuf,
    data: Backing,
    page_size: u64,
    num_samples: u64,
    alloc_table_ptr: u64,
    fields: Vec<BetonField>,
    row_offsets: Vec<usize>,
    row_size: usize,
    meta_start: usize,
    /// Per sample, per non-inline field: the resolved (ptr, size).
    allocs: Vec<(u64, u64)>,
    /// Position of each field among the non-inline fields.
    var_index: Vec<Option<usize>>,
    /// Number of non-inline fields.
    n_var: usize,
}

/// Opens and validates the `.beton` at `path`.
pub fn read(path: impl AsRef<Path>) -> Result<BetonFile> {
    let path = path.as_ref().to_path_buf();
    let data = Backing::map(&path, false)?;
    BetonFile::validate(path, data)
}

/// Checks the `.beton` at `path` and lists what is wrong with it (empty
/// when it is sound). Validation stops at the first problem, so the list
/// has at most one entry.
pub fn verify(path: impl AsRef<Path>) -> Vec<Error> {
    match read(path) {
        Ok(_) => Vec::new(),
        Err(e) => vec![e],
    }
}

impl BetonFile {
    /// Validates a `.beton` held in memory (`name` is used in errors).
    pub fn from_bytes(bytes: Vec<u8>, name: impl Into<PathBuf>) -> Result<BetonFile> {
        BetonFile::validate(name.into(), Backing::Owned(bytes))
    }

    fn validate(path: PathBuf, data: Backing) -> Result<BetonFile> {
        let b = data.bytes();
        let file_len = b.len() as u64;
        let corrupt = |reason: String| Error::corrupt(&path, reason);
        if b.len() < HEADER_LEN {
            return Err(Error::incomplete(
                &path,
                format!("{file_len} bytes, shorter than the 24-byte header"),
            ));
        }
        let version = u16::from_le_bytes([b[0], b[1]]);
        if version != BETON_VERSION {
            return Err(Error::UnsupportedVersion {
                path: path.clone(),
                found: u64::from(version),
                supported: "2",
            });
        }
        let num_fields = usize::from(u16::from_le_bytes([b[2], b[3]]));
        let page_size = u64::from(crate::format::rd_u32(b, 4));
        let num_samples = rd_u64(b, 8);
        let alloc_table_ptr = rd_u64(b, 16);
        if alloc_table_ptr == 0 {
            return Err(Error::incomplete(
                &path,
                "allocation table pointer is 0: the writer never finalized the file",
            ));
        }
        if !page_size.is_power_of_two() || page_size < 4096 {
            return Err(corrupt(format!(
                "page size {page_size} is not a power of two >= 4096"
            )));
        }
        let desc_end = HEADER_LEN + FIELD_DESC_LEN * num_fields;
        if desc_end as u64 > file_len {
            return Err(corrupt(format!(
                "{num_fields} field descriptors end at {desc_end}, beyond the file ({file_len} B)"
            )));
        }
        let mut fields = Vec::with_capacity(num_fields);
        for i in 0..num_fields {
            let d = &b[HEADER_LEN + i * FIELD_DESC_LEN..][..FIELD_DESC_LEN];
            fields.push(parse_descriptor(d, i, &path)?);
        }
        let (row_offsets, row_size) = row_layout(&fields);
        let meta_end = (row_size as u64)
            .checked_mul(num_samples)
            .and_then(|n| n.checked_add(desc_end as u64))
            .ok_or_else(|| corrupt(format!("{num_samples} metadata rows overflow")))?;
        if meta_end > alloc_table_ptr || alloc_table_ptr > file_len {
            return Err(corrupt(format!(
                "metadata ends at {meta_end}, allocation table at {alloc_table_ptr}, file has {file_len} bytes"
            )));
        }
        let table_len = file_len - alloc_table_ptr;
        if !table_len.is_multiple_of(ALLOC_ROW_LEN as u64) {
            return Err(corrupt(format!(
                "allocation table of {table_len} bytes is not a whole number of 24-byte rows"
            )));
        }
        let data_start = meta_end
            .checked_next_multiple_of(page_size)
            .ok_or_else(|| corrupt("data region start overflows".into()))?;
        // Allocation rows: inside the data region, within one page, for a
        // real sample; sorted by pointer, non-empty ones must not overlap.
        let table = &b[alloc_table_ptr as usize..];
        let mut rows: Vec<(u64, u64, u64)> = Vec::with_capacity(table.len() / ALLOC_ROW_LEN);
        for (r, row) in table.chunks_exact(ALLOC_ROW_LEN).enumerate() {
            let (sample, ptr, size) = (rd_u64(row, 0), rd_u64(row, 8), rd_u64(row, 16));
            let end = ptr.checked_add(size);
            let bad = if sample >= num_samples {
                Some(format!("sample {sample} beyond the {num_samples} samples"))
            } else if ptr < data_start || end.is_none_or(|e| e > alloc_table_ptr) {
                Some(format!(
                    "{size} bytes at {ptr} outside the data region {data_start}..{alloc_table_ptr}"
                ))
            } else if size > 0
                && (ptr - data_start) / page_size != (ptr - data_start + size - 1) / page_size
            {
                Some(format!("{size} bytes at {ptr} straddle a page boundary"))
            } else {
                None
            };
            if let Some(reason) = bad {
                return Err(corrupt(format!("allocation row {r}: {reason}")));
            }
            rows.push((ptr, size, sample));
        }
        rows.sort_unstable();
        let mut prev_end = 0u64;
        for &(ptr, size, sample) in &rows {
            if size == 0 {
                continue;
            }
            if ptr < prev_end {
                return Err(corrupt(format!(
                    "allocation of sample {sample} at {ptr} overlaps the previous one ending at {prev_end}"
                )));
            }
            prev_end = ptr + size;
        }
        // Resolve every metadata pointer to exactly one allocation.
        let var_fields: Vec<usize> = (0..fields.len())
            .filter(|&f| !matches!(fields[f].ty, BetonType::Int | BetonType::Float))
            .collect();
        let mut var_index = vec![None; fields.len()];
        for (k, &f) in var_fields.iter().enumerate() {
            var_index[f] = Some(k);
        }
        let n_alloc = (num_samples as usize)
            .checked_mul(var_fields.len())
            .filter(|n| *n <= rows.len())
            .ok_or_else(|| {
                corrupt(format!(
                    "{num_samples} samples with {} stored fields need more allocations than the {} in the table",
                    var_fields.len(),
                    rows.len()
                ))
            })?;
        let mut allocs = Vec::with_capacity(n_alloc);
        let mut used = vec![false; rows.len()];
        for s in 0..num_samples {
            let row_start = desc_end + s as usize * row_size;
            let row = &b[row_start..row_start + row_size];
            for &f in &var_fields {
                let at = row_offsets[f];
                let ty = &fields[f].ty;
                let (ptr, want) = match ty {
                    BetonType::Bytes | BetonType::Json => {
                        (rd_u64(row, at), Some(rd_u64(row, at + 8)))
                    }
                    BetonType::NDArray { .. } => (rd_u64(row, at), ty.element_size()),
                    _ => (rd_u64(row, at + 5), None),
                };
                let lo = rows.partition_point(|r| r.0 < ptr);
                let hi = rows.partition_point(|r| r.0 <= ptr);
                let found = (lo..hi)
                    .filter(|&r| rows[r].2 == s && !used[r] && want.is_none_or(|w| rows[r].1 == w))
                    .max_by_key(|&r| rows[r].1);
                let Some(r) = found else {
                    return Err(corrupt(format!(
                        "sample {s} field {:?}: pointer {ptr} matches no free allocation of this sample{}",
                        fields[f].name,
                        want.map(|w| format!(" with {w} bytes")).unwrap_or_default()
                    )));
                };
                used[r] = true;
                let size = rows[r].1;
                if let BetonType::RgbImage = ty {
                    let mode = row[at];
                    let width = u64::from(u16::from_le_bytes([row[at + 1], row[at + 2]]));
                    let height = u64::from(u16::from_le_bytes([row[at + 3], row[at + 4]]));
                    if mode > 1 {
                        return Err(corrupt(format!(
                            "sample {s} field {:?}: image mode {mode}",
                            fields[f].name
                        )));
                    }
                    if mode == 1 && width * height * 3 != size {
                        return Err(corrupt(format!(
                            "sample {s} field {:?}: raw {width}x{height} image needs {} bytes, has {size}",
                            fields[f].name,
                            width * height * 3
                        )));
                    }
                }
                allocs.push((ptr, size));
            }
        }
        Ok(BetonFile {
            path,
            data,
            page_size,
            num_samples,
            alloc_table_ptr,
            fields,
            row_offsets,
            row_size,
            meta_start: desc_end,
            allocs,
            n_var: var_fields.len(),
            var_index,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fields, in order.
    pub fn fields(&self) -> &[BetonField] {
        &self.fields
    }

    /// Index of the field called `name`.
    pub fn field_index(&self, name: &str) -> Result<usize> {
        self.fields
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| Error::field(&self.path, format!("{name:?}"), "no such field"))
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        usize::try_from(self.num_samples).unwrap_or(usize::MAX)
    }

    /// Whether there is no sample.
    pub fn is_empty(&self) -> bool {
        self.num_samples == 0
    }

    /// The page size.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// Where the allocation table starts.
    pub fn alloc_table_ptr(&self) -> u64 {
        self.alloc_table_ptr
    }

    /// Field `field` of sample `index`, borrowed from the file.
    pub fn get(&self, index: usize, field: usize) -> Result<BetonValue<'_>> {
        if index as u64 >= self.num_samples {
            return Err(Error::OutOfRange {
                path: self.path.clone(),
                index: index as u64,
                len: self.num_samples,
            });
        }
        let ty = &self
            .fields
            .get(field)
            .ok_or_else(|| Error::field(&self.path, field, "no such field"))?
            .ty;
        let b = self.data.bytes();
        let row_start = self.meta_start + index * self.row_size;
        let row = &b[row_start..row_start + self.row_size];
        let at = self.row_offsets[field];
        let stored = || -> Result<&[u8]> {
            let k = self.var_index[field].unwrap_or(0);
            let (ptr, size) = self.allocs[index * self.n_var + k];
            // Validated at open; checked again so this can never panic.
            b.get(ptr as usize..(ptr + size) as usize).ok_or_else(|| {
                Error::corrupt(
                    &self.path,
                    format!("sample {index}: allocation outside the file"),
                )
            })
        };
        Ok(match ty {
            BetonType::Float => BetonValue::Float(f64::from_bits(rd_u64(row, at))),
            BetonType::Int => BetonValue::Int(rd_u64(row, at) as i64),
            BetonType::Bytes => BetonValue::Bytes(stored()?),
            BetonType::NDArray { dtype, shape } => {
                BetonValue::NDArray(TensorView::new(*dtype, shape.clone(), stored()?).map_err(
                    |source| Error::Tensor {
                        path: self.path.clone(),
                        source,
                    },
                )?)
            }
            BetonType::Json => {
                let raw = stored()?;
                let text = raw.split(|c| *c == 0).next().unwrap_or(raw);
                BetonValue::Json(std::str::from_utf8(text).map_err(|_| {
                    Error::corrupt(
                        &self.path,
                        format!("sample {index} field {field}: JSON is not UTF-8"),
                    )
                })?)
            }
            BetonType::RgbImage => BetonValue::RgbImage {
                mode: row[at],
                width: u16::from_le_bytes([row[at + 1], row[at + 2]]),
                height: u16::from_le_bytes([row[at + 3], row[at + 4]]),
                data: stored()?,
            },
        })
    }

    /// Every field of sample `index`.
    pub fn sample(&self, index: usize) -> Result<Vec<BetonValue<'_>>> {
        (0..self.fields.len()).map(|f| self.get(index, f)).collect()
    }
}

fn parse_descriptor(d: &[u8], i: usize, path: &Path) -> Result<BetonField> {
    let name_bytes = &d[1..1 + NAME_LEN];
    let name_len = name_bytes.iter().position(|c| *c == 0).unwrap_or(NAME_LEN);
    let name = std::str::from_utf8(&name_bytes[..name_len])
        .ok()
        .filter(|s| s.is_ascii())
        .ok_or_else(|| Error::corrupt(path, format!("field {i}: name is not ASCII")))?
        .to_owned();
    let args = &d[1 + NAME_LEN..];
    let ty = match d[0] {
        0 => BetonType::Float,
        1 => BetonType::Int,
        2 => BetonType::RgbImage,
        3 => BetonType::Bytes,
        4 => parse_ndarray_args(args)
            .map_err(|r| Error::corrupt(path, format!("field {name:?}: {r}")))?,
        5 => BetonType::Json,
        type_id => {
            return Err(Error::UnsupportedField {
                path: path.to_path_buf(),
                field: name,
                type_id,
            });
        }
    };
    Ok(BetonField { name, ty })
}

fn parse_ndarray_args(args: &[u8]) -> std::result::Result<BetonType, String> {
    let mut dims: Vec<usize> = (0..ND_MAX_DIMS)
        .map(|k| usize::try_from(rd_u64(args, 8 * k)).unwrap_or(usize::MAX))
        .collect();
    while dims.last() == Some(&0) {
        dims.pop();
    }
    let type_len = rd_u64(args, 8 * ND_MAX_DIMS);
    let type_json = usize::try_from(type_len)
        .ok()
        .and_then(|n| args.get(ND_TYPE_AT..ND_TYPE_AT.checked_add(n)?))
        .ok_or_else(|| format!("dtype description of {type_len} bytes overflows the arguments"))?;
    let descr: Vec<(String, String)> = serde_json::from_slice(type_json)
        .map_err(|e| format!("dtype description is not [[name, type]] JSON: {e}"))?;
    let [(_, type_str)] = descr.as_slice() else {
        return Err(format!(
            "dtype description has {} entries, expected 1",
            descr.len()
        ));
    };
    let dtype = DType::from_numpy_str(type_str).map_err(|e| format!("dtype {type_str:?}: {e}"))?;
    let shape = Shape::new(dims);
    shape
        .byte_len(dtype)
        .map_err(|_| format!("shape {shape} of {type_str} overflows"))?;
    Ok(BetonType::NDArray { dtype, shape })
}

/// Writes `samples` (one value per field, in field order) as an FFCV
/// `.beton` at `path` with FFCV's default 8 MiB pages.
pub fn write(
    path: impl AsRef<Path>,
    fields: &[BetonField],
    samples: &[Vec<BetonValue<'_>>],
) -> Result<()> {
    write_with_page_size(path, fields, samples, DEFAULT_PAGE_SIZE)
}

/// [`write()`] with another page size (a power of two, 2 MiB ..< 4 GiB, as FFCV requires).
pub fn write_with_page_size(
    path: impl AsRef<Path>,
    fields: &[BetonField],
    samples: &[Vec<BetonValue<'_>>],
    page_size: u64,
) -> Result<()> {
    let path = path.as_ref();
    let invalid = |what: &'static str, reason: String| Error::invalid(path, what, reason);
    if !page_size.is_power_of_two() || !(MIN_PAGE_SIZE..1 << 32).contains(&page_size) {
        return Err(invalid(
            "page size",
            format!("{page_size} is not a power of two in 2 MiB ..< 4 GiB"),
        ));
    }
    if fields.len() > usize::from(u16::MAX) {
        return Err(invalid(
            "fields",
            format!("{} fields, at most 65535", fields.len()),
        ));
    }
    let mut descriptors = Vec::with_capacity(fields.len() * FIELD_DESC_LEN);
    for f in fields {
        if !f.name.is_ascii() || f.name.len() > NAME_LEN {
            return Err(invalid(
                "fields",
                format!("name {:?} must be ASCII of at most 16 bytes", f.name),
            ));
        }
        let mut d = [0u8; FIELD_DESC_LEN];
        d[0] = f.ty.type_id();
        d[1..1 + f.name.len()].copy_from_slice(f.name.as_bytes());
        if let BetonType::NDArray { dtype, shape } = &f.ty {
            if shape.rank() > ND_MAX_DIMS || shape.dims().contains(&0) {
                return Err(invalid(
                    "fields",
                    format!(
                        "field {:?}: shape {shape} needs 1..=32 non-zero dims",
                        f.name
                    ),
                ));
            }
            let args = &mut d[1 + NAME_LEN..];
            for (k, dim) in shape.dims().iter().enumerate() {
                args[8 * k..8 * k + 8].copy_from_slice(&(*dim as u64).to_le_bytes());
            }
            let np = dtype
                .numpy_str()
                .map_err(|e| invalid("fields", format!("field {:?}: {e}", f.name)))?;
            let descr = format!("[[\"\", \"{np}\"]]");
            args[8 * ND_MAX_DIMS..ND_TYPE_AT].copy_from_slice(&(descr.len() as u64).to_le_bytes());
            args[ND_TYPE_AT..ND_TYPE_AT + descr.len()].copy_from_slice(descr.as_bytes());
        }
        descriptors.extend_from_slice(&d);
    }
    let (row_offsets, row_size) = row_layout(fields);
    let desc_end = (HEADER_LEN + descriptors.len()) as u64;
    let meta_len = row_size
        .checked_mul(samples.len())
        .ok_or_else(|| invalid("samples", "metadata size overflows".into()))?;
    let data_start = (desc_end + meta_len as u64).next_multiple_of(page_size);

    let lock_file = lock_path(path);
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&lock_file)
        .map_err(|e| Error::io(&lock_file, "open lock file", e))?;
    if fs2::FileExt::try_lock_exclusive(&lock).is_err() {
        return Err(Error::Locked {
            path: path.to_path_buf(),
            lock: lock_file,
        });
    }
    let tmp = temp_path(path);
    let result = write_locked(
        path,
        &tmp,
        fields,
        samples,
        page_size,
        &descriptors,
        &row_offsets,
        row_size,
        data_start,
    );
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// FFCV's allocator, one worker: pages in order, a sample restarts on a
/// fresh page when one of its fields does not fit.
struct PagePacker<'f> {
    file: &'f File,
    tmp: &'f Path,
    page: Vec<u8>,
    data_start: u64,
    page_size: u64,
    my_page: Option<u64>,
    next_page: u64,
    offset: usize,
    allocations: Vec<(u64, u64, u64)>,
    current: u64,
}

/// A sample must restart on the fresh page.
struct Restart;

impl PagePacker<'_> {
    fn flush(&mut self) -> Result<()> {
        if let Some(p) = self.my_page {
            self.file
                .write_all_at(&self.page, self.data_start + p * self.page_size)
                .map_err(|e| Error::io(self.tmp, "write page", e))?;
        }
        Ok(())
    }

    /// Allocates `data.len()` bytes, copies `data` there, returns the ptr.
    fn malloc(&mut self, data: &[u8]) -> Result<std::result::Result<u64, Restart>> {
        let size = data.len();
        let space = if self.my_page.is_some() {
            self.page.len() - self.offset
        } else {
            0
        };
        if self.my_page.is_none() || size > space {
            self.flush()?;
            self.my_page = Some(self.next_page);
            self.next_page += 1;
            self.offset = 0;
            self.page.fill(0);
            let mut dropped = false;
            while self.allocations.last().is_some_and(|a| a.0 == self.current) {
                self.allocations.pop();
                dropped = true;
            }
            if dropped {
                return Ok(Err(Restart));
            }
        }
        let page = self.my_page.unwrap_or(0);
        let ptr = self.data_start + page * self.page_size + self.offset as u64;
        self.page[self.offset..self.offset + size].copy_from_slice(data);
        self.offset += size;
        self.allocations.push((self.current, ptr, size as u64));
        Ok(Ok(ptr))
    }
}

#[allow(clippy::too_many_arguments)]
fn write_locked(
    path: &Path,
    tmp: &Path,
    fields: &[BetonField],
    samples: &[Vec<BetonValue<'_>>],
    page_size: u64,
    descriptors: &[u8],
    row_offsets: &[usize],
    row_size: usize,
    data_start: u64,
) -> Result<()> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(tmp)
        .map_err(|e| Error::io(tmp, "create temporary file", e))?;
    let mut meta = vec![0u8; row_size * samples.len()];
    let mut packer = PagePacker {
        file: &file,
        tmp,
        page: vec![0u8; page_size as usize],
        data_start,
        page_size,
        my_page: None,
        next_page: 0,
        offset: 0,
        allocations: Vec::new(),
        current: 0,
    };
    let mut json_buf = Vec::new();
    for (i, values) in samples.iter().enumerate() {
        let bad = |reason: String| Error::BadSample {
            path: path.to_path_buf(),
            index: i as u64,
            reason,
        };
        if values.len() != fields.len() {
            return Err(bad(format!(
                "{} values for {} fields",
                values.len(),
                fields.len()
            )));
        }
        packer.current = i as u64;
        let row = &mut meta[i * row_size..(i + 1) * row_size];
        let mut attempt = 0;
        'retry: loop {
            attempt += 1;
            for (f, (field, value)) in fields.iter().zip(values).enumerate() {
                let at = row_offsets[f];
                let data: &[u8] = match (&field.ty, value) {
                    (BetonType::Float, BetonValue::Float(v)) => {
                        row[at..at + 8].copy_from_slice(&v.to_le_bytes());
                        continue;
                    }
                    (BetonType::Int, BetonValue::Int(v)) => {
                        row[at..at + 8].copy_from_slice(&v.to_le_bytes());
                        continue;
                    }
                    (BetonType::Bytes, BetonValue::Bytes(b)) => b,
                    (BetonType::NDArray { dtype, shape }, BetonValue::NDArray(t)) => {
                        if t.dtype() != *dtype || t.shape() != shape {
                            return Err(bad(format!(
                                "field {:?}: {} {} given, the field is {dtype} {shape}",
                                field.name,
                                t.dtype(),
                                t.shape()
                            )));
                        }
                        t.bytes()
                    }
                    (BetonType::Json, BetonValue::Json(text)) => {
                        if text.contains('\0') {
                            return Err(bad(format!(
                                "field {:?}: JSON text holds a NUL byte",
                                field.name
                            )));
                        }
                        serde_json::from_str::<serde_json::Value>(text)
                            .map_err(|e| bad(format!("field {:?}: not JSON: {e}", field.name)))?;
                        json_buf.clear();
                        json_buf.extend_from_slice(text.as_bytes());
                        json_buf.push(0);
                        &json_buf
                    }
                    (
                        BetonType::RgbImage,
                        BetonValue::RgbImage {
                            mode,
                            width,
                            height,
                            data,
                        },
                    ) => {
                        if *mode > 1
                            || (*mode == 1
                                && u64::from(*width) * u64::from(*height) * 3 != data.len() as u64)
                        {
                            return Err(bad(format!(
                                "field {:?}: mode {mode} image {width}x{height} with {} bytes",
                                field.name,
                                data.len()
                            )));
                        }
                        row[at] = *mode;
                        row[at + 1..at + 3].copy_from_slice(&width.to_le_bytes());
                        row[at + 3..at + 5].copy_from_slice(&height.to_le_bytes());
                        data
                    }
                    (ty, v) => {
                        return Err(bad(format!(
                            "field {:?}: {v:?} given for a {ty:?} field",
                            field.name
                        )));
                    }
                };
                if data.len() as u64 > page_size {
                    return Err(bad(format!(
                        "field {:?}: {} bytes exceed the page size {page_size} (FFCV cannot store it)",
                        field.name,
                        data.len()
                    )));
                }
                let ptr = match packer.malloc(data)? {
                    Ok(ptr) => ptr,
                    Err(Restart) if attempt == 1 => continue 'retry,
                    Err(Restart) => {
                        return Err(bad(format!(
                            "does not fit in one page of {page_size} bytes"
                        )));
                    }
                };
                match &field.ty {
                    BetonType::Bytes | BetonType::Json => {
                        row[at..at + 8].copy_from_slice(&ptr.to_le_bytes());
                        row[at + 8..at + 16].copy_from_slice(&(data.len() as u64).to_le_bytes());
                    }
                    BetonType::NDArray { .. } => {
                        row[at..at + 8].copy_from_slice(&ptr.to_le_bytes())
                    }
                    _ => row[at + 5..at + 13].copy_from_slice(&ptr.to_le_bytes()),
                }
            }
            break;
        }
    }
    packer.flush()?;
    let data_end = if packer.my_page.is_some() {
        data_start + packer.next_page * page_size
    } else {
        HEADER_LEN as u64 + descriptors.len() as u64 + meta.len() as u64
    };
    let io = |op: &'static str| move |e: std::io::Error| Error::io(tmp, op, e);
    let mut head = Vec::with_capacity(HEADER_LEN + descriptors.len() + meta.len());
    head.extend_from_slice(&BETON_VERSION.to_le_bytes());
    head.extend_from_slice(&(fields.len() as u16).to_le_bytes());
    head.extend_from_slice(&(page_size as u32).to_le_bytes());
    head.extend_from_slice(&(samples.len() as u64).to_le_bytes());
    head.extend_from_slice(&0u64.to_le_bytes()); // alloc_table_ptr: set last
    head.extend_from_slice(descriptors);
    head.extend_from_slice(&meta);
    file.write_all_at(&head, 0).map_err(io("write header"))?;
    let mut table = Vec::with_capacity(packer.allocations.len() * ALLOC_ROW_LEN);
    for (sample, ptr, size) in &packer.allocations {
        for v in [sample, ptr, size] {
            table.extend_from_slice(&v.to_le_bytes());
        }
    }
    file.write_all_at(&table, data_end)
        .map_err(io("write allocation table"))?;
    file.set_len(data_end + table.len() as u64)
        .map_err(io("set length"))?;
    file.sync_all().map_err(io("fsync"))?;
    // The commit: the allocation table pointer, only once all it points to is durable.
    file.write_all_at(&data_end.to_le_bytes(), 16)
        .map_err(io("write allocation table pointer"))?;
    file.sync_all().map_err(io("fsync"))?;
    std::fs::rename(tmp, path).map_err(|e| Error::io(path, "rename into place", e))?;
    sync_parent_dir(path)
}

/// JSON text as Python's `json.dumps(value)` writes it (separators
/// `", "` and `": "`, non-ASCII escaped), which is what FFCV's `JSONField`
/// stores. Object keys keep `serde_json`'s order (sorted unless its
/// `preserve_order` feature is on).
pub fn python_json(value: &serde_json::Value) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
    // Serialising a Value into a Vec cannot fail.
    if serde::Serialize::serialize(value, &mut ser).is_err() {
        return String::new();
    }
    String::from_utf8(out).unwrap_or_default()
}

struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }

    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        for c in fragment.chars() {
            if c.is_ascii() {
                w.write_all(&[c as u8])?;
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    write!(w, "\\u{u:04x}")?;
                }
            }
        }
        Ok(())
    }
}

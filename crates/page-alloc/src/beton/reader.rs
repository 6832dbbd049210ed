//! Reading and validating a `.beton`.

use std::path::{Path, PathBuf};

use cache_check::{Problem, Summary};
use serde_json::json;
use tensor_core::{DType, Shape, TensorView};

use super::format::{
    ALLOC_ROW_LEN, BETON_VERSION, BetonField, BetonType, BetonValue, FIELD_DESC_LEN, HEADER_LEN,
    NAME_LEN, ND_MAX_DIMS, ND_TYPE_AT, row_layout,
};
use crate::format::rd_u64;
use crate::reader::Backing;
use crate::{Error, Result};

/// A validated `.beton` file, memory-mapped; values are borrowed from it.
#[derive(Debug)]
pub struct BetonFile {
    path: PathBuf,
    data: Backing,
    page_size: u64,
    num_samples: u64,
    alloc_table_ptr: u64,
    /// Where the pages begin (a multiple of `page_size`).
    data_start: u64,
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
pub fn verify(path: impl AsRef<Path>) -> Vec<Problem> {
    match read(path) {
        Ok(_) => Vec::new(),
        Err(e) => vec![crate::inspect::problem_of(&e)],
    }
}

/// Whether the first [`HEADER_LEN`] bytes of a file of `file_len` bytes
/// are a plausible `.beton` header: version 2, at least one field, a page
/// size that is a power of two >= 4096, field descriptors and one metadata
/// row per sample inside the file, and an allocation table pointer that is
/// 0 (a writer that never finished) or inside the file, after the
/// descriptors, leaving whole 24-byte rows. FFCV files carry no magic
/// number, so this is how a file without the `.beton` extension is
/// recognised; [`read`] checks everything else.
pub fn is_beton_header(header: &[u8], file_len: u64) -> bool {
    let Some(b) = header.get(..HEADER_LEN) else {
        return false;
    };
    let version = u16::from_le_bytes([b[0], b[1]]);
    let num_fields = u64::from(u16::from_le_bytes([b[2], b[3]]));
    let page_size = u64::from(crate::format::rd_u32(b, 4));
    let num_samples = rd_u64(b, 8);
    let alloc_table_ptr = rd_u64(b, 16);
    // Every metadata row is at least 8 bytes (the smallest field type).
    let meta_end = (FIELD_DESC_LEN as u64)
        .checked_mul(num_fields)
        .and_then(|d| d.checked_add(HEADER_LEN as u64))
        .and_then(|d| num_samples.checked_mul(8)?.checked_add(d));
    let Some(meta_end) = meta_end else {
        return false;
    };
    version == BETON_VERSION
        && num_fields > 0
        && page_size.is_power_of_two()
        && page_size >= 4096
        && meta_end <= file_len
        && (alloc_table_ptr == 0
            || (meta_end <= alloc_table_ptr
                && alloc_table_ptr <= file_len
                && (file_len - alloc_table_ptr).is_multiple_of(ALLOC_ROW_LEN as u64)))
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
        // Without stored fields there is nothing to resolve (and rows may
        // be empty, so num_samples is not bounded by the file).
        let resolve = if var_fields.is_empty() {
            0
        } else {
            num_samples
        };
        for s in 0..resolve {
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
            data_start,
            fields,
            row_offsets,
            row_size,
            meta_start: desc_end,
            allocs,
            n_var: var_fields.len(),
            var_index,
        })
    }

    /// The file in the shared shape the `cachex` tool prints: samples,
    /// page size, size on disk and a table of fields.
    pub fn summary(&self) -> Summary {
        let fields = self
            .fields
            .iter()
            .map(|f| vec![json!(f.name), json!(f.ty.to_string())])
            .collect();
        Summary::new("beton", &self.path)
            .fact("format_version", BETON_VERSION)
            .fact("num_samples", self.num_samples)
            .fact("page_size", self.page_size)
            .fact("file_len", self.file_len())
            .fact("alloc_table_ptr", self.alloc_table_ptr)
            .table("fields", ["name", "type"], fields)
    }

    /// The file's length in bytes.
    pub fn file_len(&self) -> u64 {
        self.data.bytes().len() as u64
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

    /// The page each sample's stored values lie in, counted from the first
    /// page of the data region (the inverse of FFCV's `page_to_samples`,
    /// which its quasi-random order shuffles by): the page of the sample's
    /// first non-empty allocation. `None` for a sample with nothing stored
    /// in a page (ints and floats live in its metadata row).
    pub fn sample_pages(&self) -> Vec<Option<u64>> {
        let n = self.num_samples as usize;
        if self.n_var == 0 {
            return vec![None; n];
        }
        self.allocs
            .chunks_exact(self.n_var)
            .map(|fields| {
                fields
                    .iter()
                    .find(|(_, size)| *size > 0)
                    .map(|(ptr, _)| ptr.saturating_sub(self.data_start) / self.page_size)
            })
            .collect()
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

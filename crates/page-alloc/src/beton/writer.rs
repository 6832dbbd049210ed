//! Writing a `.beton` as FFCV's `DatasetWriter` does with one worker.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::format::{
    ALLOC_ROW_LEN, BETON_VERSION, BetonField, BetonType, BetonValue, DEFAULT_PAGE_SIZE,
    FIELD_DESC_LEN, HEADER_LEN, MIN_PAGE_SIZE, NAME_LEN, ND_MAX_DIMS, ND_TYPE_AT, row_layout,
};
use crate::{Error, Result};

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

    let _lock = crate::recover::lock_writer(path)?;
    let tmp = crate::temp_path(path);
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
                .map_err(Error::io("write page", self.tmp))?;
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
    let file = durable_fs::create_temp(tmp).map_err(Error::durable)?;
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
    let io = |op: &'static str| Error::io(op, tmp);
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
    // Two fsyncs (data, then the pointer that commits it), so the
    // rename-and-sync step is taken alone rather than `commit_temp`.
    durable_fs::rename(tmp, path)
        .and_then(|()| durable_fs::sync_parent_dir(path))
        .map_err(Error::durable)
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

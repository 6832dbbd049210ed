//! page-alloc behind the facade: samples by index in one page file, built
//! once from a [`Source`], then read zero-copy.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use page_alloc::{FieldType, PageReader, PageWriter, Schema, WriterOptions};
use tensor_core::{Shape, SharedBytes, SharedTensor, Tensor, Value};

use super::{Counters, resolve_index};
use crate::prepare::{DirState, Spec, clear, commit, prepare};
use crate::source::SourceKind;
use crate::{CacheBackend, CacheConfig, FacadeError, Operation, Result, Source, Stats, StoreKind};

/// The page file inside the cache directory.
pub const PAGE_FILE: &str = "data.pages";

/// The page-alloc backend: each sample is a dict [`Value`] of its fields —
/// arrays as tensor views and byte strings as blob views into the mapped
/// file; int and float fields (FFCV's inline fields) as 0-d `int64` /
/// `float64` tensors.
///
/// Options: `page_size` and `alignment` (page-alloc's writer options);
/// any other option is the dataset's config (it keys the cache).
///
/// Building infers the fields from the first value: a dict whose tensors
/// become array fields (fixed dtype and shape) and whose blobs become
/// bytes fields. Samples are addressed by index only; the file is never
/// written again — a put is [`FacadeError::Unsupported`].
pub struct PageBackend {
    reader: Arc<PageReader>,
    fields: Vec<(Arc<str>, FieldType)>,
    dir: PathBuf,
    counters: Counters,
}

fn spec(can_build: bool) -> Spec {
    Spec {
        kind: None,
        version: page_alloc::format::VERSION,
        can_build,
        complete: crate::prepare::fingerprinted,
        store_locks: |dir| vec![page_alloc::lock_path(&dir.join(PAGE_FILE))],
    }
}

impl PageBackend {
    /// Opens the built page file `config` names.
    pub fn open(config: &CacheConfig) -> Result<PageBackend> {
        check_kind(config)?;
        let prepared = prepare(config, &spec(false))?;
        let reader = PageReader::open(prepared.dir.join(PAGE_FILE))?;
        Ok(PageBackend::over(reader, prepared.dir))
    }

    /// Opens the page file `config` names, building it from `source` first
    /// when it is missing, unfinished, or stale (if `on_stale` allows).
    pub fn open_with_source(config: &CacheConfig, source: Source) -> Result<PageBackend> {
        check_kind(config)?;
        let prepared = prepare(config, &spec(true))?;
        let path = prepared.dir.join(PAGE_FILE);
        if !matches!(prepared.state, DirState::Fresh) {
            if matches!(prepared.state, DirState::Incomplete) {
                clear(&prepared.dir, &spec(true))?;
            }
            build(config, &prepared.dir, &path, &source)?;
            commit(&prepared)?;
        }
        let reader = PageReader::open(&path)?;
        drop(prepared);
        Ok(PageBackend::over(
            reader,
            path.parent().map(Path::to_path_buf).unwrap_or_default(),
        ))
    }

    fn over(reader: PageReader, dir: PathBuf) -> PageBackend {
        let fields = reader
            .schema()
            .fields()
            .iter()
            .map(|f| (Arc::from(f.name.as_str()), f.ty.clone()))
            .collect();
        PageBackend {
            reader: Arc::new(reader),
            fields,
            dir,
            counters: Counters::default(),
        }
    }

    /// The reader underneath (its own API: `fill_batch` into a
    /// `BufferPool`, `prefetch`, `quasi_random_order`).
    pub fn reader(&self) -> &PageReader {
        &self.reader
    }

    fn value(&self, index: usize) -> Result<Value> {
        let sample = self.reader.sample(index)?;
        let mut members = Vec::with_capacity(self.fields.len());
        for (f, (name, ty)) in self.fields.iter().enumerate() {
            let value = match ty {
                FieldType::Int => {
                    Value::from(Tensor::from_vec(Shape::scalar(), vec![sample.int(f)?])?)
                }
                FieldType::Float => {
                    Value::from(Tensor::from_vec(Shape::scalar(), vec![sample.float(f)?])?)
                }
                FieldType::Bytes => Value::Blob(self.project(index, f)?),
                FieldType::Array { dtype, shape } => Value::Tensor(SharedTensor::new(
                    *dtype,
                    shape.clone(),
                    self.project(index, f)?,
                )?),
            };
            members.push((Arc::clone(name), value));
        }
        Ok(Value::Dict(members))
    }

    /// Field `f` of sample `index`, borrowed from the mapped file.
    fn project(&self, index: usize, f: usize) -> Result<SharedBytes> {
        Ok(SharedBytes::try_project(Arc::clone(&self.reader), |r| {
            r.sample(index)?.bytes(f)
        })?)
    }
}

fn check_kind(config: &CacheConfig) -> Result<()> {
    if config.backend != StoreKind::PageAlloc {
        return Err(FacadeError::Config(format!(
            "PageBackend opened with a {} config",
            config.backend.name()
        )));
    }
    Ok(())
}

fn bad(dir: &Path, why: String) -> FacadeError {
    FacadeError::BadValue {
        dir: dir.to_path_buf(),
        why,
    }
}

/// The page schema of a sample value.
fn schema_of(dir: &Path, first: &Value) -> Result<Schema> {
    let Value::Dict(members) = first else {
        return Err(bad(
            dir,
            format!(
                "sample 0 is a {}: page-alloc samples are dicts of named fields",
                first.kind()
            ),
        ));
    };
    let mut schema = Schema::new();
    for (name, value) in members {
        schema = match value {
            Value::Tensor(t) => schema.array(name.to_string(), t.dtype(), t.shape().clone()),
            Value::Blob(_) => schema.bytes(name.to_string()),
            other => {
                return Err(bad(
                    dir,
                    format!(
                        "field {name:?} of sample 0 is a {}: fields are tensors or blobs",
                        other.kind()
                    ),
                ));
            }
        };
    }
    Ok(schema)
}

fn build(config: &CacheConfig, dir: &Path, path: &Path, source: &Source) -> Result<()> {
    let defaults = WriterOptions::default();
    let options = defaults
        .page_size(config.opt("page_size", page_alloc::format::DEFAULT_PAGE_SIZE)?)
        .alignment(config.opt("alignment", page_alloc::format::DEFAULT_ALIGNMENT)?);
    let mut values: Box<dyn Iterator<Item = Result<(String, Value)>>> = match &source.kind {
        SourceKind::Items(factory) => {
            Box::new(factory().enumerate().map(|(i, v)| Ok((i.to_string(), v))))
        }
        SourceKind::Keyed { ids, produce } => Box::new(ids.iter().map(move |id| {
            produce(id)
                .map(|v| (id.clone(), v))
                .map_err(|source| FacadeError::Source {
                    dir: dir.to_path_buf(),
                    id: id.clone(),
                    source,
                })
        })),
    };
    let Some(first) = values.next().transpose()? else {
        return Err(bad(
            dir,
            "the source is empty: a page file needs at least one sample".into(),
        ));
    };
    let schema = schema_of(dir, &first.1)?;
    let names: Vec<String> = schema.fields().iter().map(|f| f.name.clone()).collect();
    let mut writer = PageWriter::create(path, schema, options)?;
    for item in std::iter::once(Ok(first)).chain(values) {
        let (id, value) = item?;
        let fields = sample_fields(dir, &id, &value, &names)?;
        let fields: Vec<page_alloc::Value<'_>> =
            fields.iter().map(|b| page_alloc::Value::Bytes(b)).collect();
        writer.append(&fields)?;
    }
    writer.finalize()?;
    Ok(())
}

/// The bytes of each field of a sample, in schema order.
fn sample_fields<'v>(
    dir: &Path,
    id: &str,
    value: &'v Value,
    names: &[String],
) -> Result<Vec<&'v [u8]>> {
    let Value::Dict(members) = value else {
        return Err(bad(
            dir,
            format!("sample {id} is a {}, not a dict of fields", value.kind()),
        ));
    };
    if members.len() != names.len() {
        return Err(bad(
            dir,
            format!(
                "sample {id} has {} fields, the first sample {}",
                members.len(),
                names.len()
            ),
        ));
    }
    names
        .iter()
        .map(|name| match value.get(name) {
            Some(Value::Tensor(t)) => Ok(t.bytes()),
            Some(Value::Blob(b)) => Ok(b.as_slice()),
            Some(other) => Err(bad(
                dir,
                format!("sample {id}: field {name:?} is a {}", other.kind()),
            )),
            None => Err(bad(dir, format!("sample {id} lacks field {name:?}"))),
        })
        .collect()
}

impl CacheBackend for PageBackend {
    fn kind(&self) -> StoreKind {
        StoreKind::PageAlloc
    }

    fn supports(&self, op: Operation) -> bool {
        op == Operation::GetByIndex
    }

    fn get_indices(&self, indices: &[i64]) -> Result<Vec<Value>> {
        let len = self.reader.len() as u64;
        let mut values = Vec::with_capacity(indices.len());
        let mut bytes = 0;
        for &index in indices {
            let i = resolve_index(&self.dir, index, len)?;
            let value = self.value(i as usize)?;
            bytes += value.byte_len();
            values.push(value);
        }
        self.counters.lookup(indices.len(), 0, bytes);
        Ok(values)
    }

    fn prefetch(&self, indices: &[i64]) {
        let len = self.reader.len() as u64;
        let rows: Vec<usize> = indices
            .iter()
            .filter_map(|&i| resolve_index(&self.dir, i, len).ok())
            .map(|i| i as usize)
            .collect();
        // A hint: a failure to advise the kernel costs only speed.
        let _ = self.reader.prefetch(&rows);
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        Ok(self.reader.len() as u64)
    }

    fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    fn path(&self) -> &Path {
        &self.dir
    }
}

/// page-alloc files at a path (they start with the format's magic), for
/// [`crate::KINDS`].
pub(crate) struct PageKind;

pub(crate) static PAGE_ALLOC: PageKind = PageKind;

impl crate::KindSpec for PageKind {
    fn kind(&self) -> crate::Detected {
        crate::Detected::own(StoreKind::PageAlloc)
    }

    fn detect(&self, probe: &crate::Probe<'_>) -> bool {
        probe
            .file
            .as_ref()
            .is_some_and(|(_, head)| head.get(..8) == Some(&page_alloc::format::MAGIC[..]))
    }

    fn verify(&self, path: &Path) -> Vec<cache_check::Problem> {
        page_alloc::verify(path)
    }

    fn inspect(&self, path: &Path) -> Result<cache_check::Summary> {
        Ok(page_alloc::inspect(path)?.summary())
    }

    fn get(&self, path: &Path, key: &str) -> Result<serde_json::Value> {
        let reader = PageReader::open(path)?;
        let index = crate::kinds::parse_index(path, key, reader.len() as u64)?;
        Ok(sample_json(&reader, index as usize)?)
    }

    fn stats(&self, path: &Path) -> Result<cache_check::Summary> {
        use crate::kinds::ratio;
        let s = page_alloc::inspect(path)?;
        let page_space = s.num_pages.saturating_mul(s.page_size);
        Ok(cache_check::Summary::new(self.kind().name(), path)
            .fact("num_samples", s.num_samples)
            .fact("file_len", s.file_len)
            .fact("bytes_per_sample", ratio(s.file_len, s.num_samples))
            .fact("data_bytes_per_sample", ratio(s.data_bytes, s.num_samples))
            .fact("page_fill", ratio(s.data_bytes, page_space))
            .fact("unused_page_bytes", page_space.saturating_sub(s.data_bytes))
            .fact("samples_per_page", ratio(s.num_samples, s.num_pages))
            .fact("table_fraction", ratio(s.table_bytes, s.file_len)))
    }
}

/// Sample `index` as `{field: value}`.
fn sample_json(reader: &PageReader, index: usize) -> page_alloc::Result<serde_json::Value> {
    use crate::json::{bytes_json, tensor_json};
    use page_alloc::FieldValue;
    use serde_json::json;
    let sample = reader.sample(index)?;
    let mut out = serde_json::Map::new();
    for (i, field) in reader.schema().fields().iter().enumerate() {
        let v = match sample.get(i)? {
            FieldValue::Int(v) => json!(v),
            FieldValue::Float(v) => json!(v),
            FieldValue::Bytes(b) => bytes_json(b),
            FieldValue::Array(t) => tensor_json(&t),
        };
        out.insert(field.name.clone(), v);
    }
    Ok(serde_json::Value::Object(out))
}

/// FFCV `.beton` files at a path (read by page-alloc's FFCV reader), for
/// [`crate::KINDS`].
pub(crate) struct BetonKind;

pub(crate) static BETON: BetonKind = BetonKind;

impl crate::KindSpec for BetonKind {
    fn kind(&self) -> crate::Detected {
        crate::Detected::peer(crate::PeerFormat::Beton)
    }

    /// FFCV has no magic. A file named `.beton` is taken at its word when
    /// it starts with version 2 (so a damaged one is verified, not
    /// ignored); any other file needs a plausible whole header: version,
    /// counts, and pointers within the file.
    fn detect(&self, probe: &crate::Probe<'_>) -> bool {
        use page_alloc::beton;
        let Some((len, head)) = &probe.file else {
            return false;
        };
        let named = probe.path.extension().is_some_and(|e| e == "beton");
        let version_2 = head.get(..2) == Some(&beton::BETON_VERSION.to_le_bytes()[..]);
        (named && version_2) || beton::is_beton_header(head, *len)
    }

    fn verify(&self, path: &Path) -> Vec<cache_check::Problem> {
        page_alloc::beton::verify(path)
    }

    fn inspect(&self, path: &Path) -> Result<cache_check::Summary> {
        Ok(page_alloc::beton::read(path)?.summary())
    }

    fn get(&self, path: &Path, key: &str) -> Result<serde_json::Value> {
        let file = page_alloc::beton::read(path)?;
        let index = crate::kinds::parse_index(path, key, file.len() as u64)?;
        Ok(beton_sample_json(&file, index as usize)?)
    }

    fn stats(&self, path: &Path) -> Result<cache_check::Summary> {
        use crate::kinds::ratio;
        use page_alloc::beton;
        let file = beton::read(path)?;
        let file_len = file.file_len();
        let samples = file.len() as u64;
        let table = file_len.saturating_sub(file.alloc_table_ptr());
        let allocations = table / beton::ALLOC_ROW_LEN as u64;
        Ok(cache_check::Summary::new(self.kind().name(), path)
            .fact("num_samples", samples)
            .fact("file_len", file_len)
            .fact("bytes_per_sample", ratio(file_len, samples))
            .fact("allocations", allocations)
            .fact("allocations_per_sample", ratio(allocations, samples))
            .fact("alloc_table_bytes", table))
    }
}

/// Sample `index` of an FFCV file as `{field: value}`.
fn beton_sample_json(
    file: &page_alloc::beton::BetonFile,
    index: usize,
) -> page_alloc::Result<serde_json::Value> {
    use crate::json::{bytes_json, tensor_json};
    use page_alloc::beton::BetonValue;
    use serde_json::json;
    let values = file.sample(index)?;
    let mut out = serde_json::Map::new();
    for (field, v) in file.fields().iter().zip(values) {
        let v = match v {
            BetonValue::Int(v) => json!(v),
            BetonValue::Float(v) => json!(v),
            BetonValue::Bytes(b) => bytes_json(b),
            BetonValue::NDArray(t) => tensor_json(&t),
            BetonValue::Json(text) => serde_json::from_str(text).unwrap_or_else(|_| json!(text)),
            BetonValue::RgbImage {
                mode,
                width,
                height,
                data,
            } => json!({"mode": mode, "width": width, "height": height, "data": bytes_json(data)}),
        };
        out.insert(field.name.clone(), v);
    }
    Ok(serde_json::Value::Object(out))
}

//! memmap-array behind the facade: rows by source id or index, built from
//! a [`Source`] through memmap-array's own `open_or_build` (same layout,
//! same fingerprint, resumable).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap_array::{MemmapArray, NewRow, RowWriter, Schema};
use tensor_core::{DType, Shape, SharedBytes, SharedTensor, Value};

use super::{Counters, resolve_index};
use crate::Detected;
use crate::prepare::{DirState, Spec, prepare};
use crate::source::SourceKind;
use crate::{
    CacheBackend, CacheConfig, FacadeError, Lookup, Operation, Result, Source, Stats, StoreKind,
};

/// The memmap-array backend: each row is a dict [`Value`] of its arrays
/// (a nullable array the row lacks is left out), views into the mapped
/// `.bin` files; rows are found by source id (`get_batch`) or index
/// (`get_indices`).
///
/// The options are the dataset's config — anything JSON — and are what
/// memmap-array's `open_or_build` calls `config`: a cache built with
/// `memmap_array::open_or_build(root, name, &options, ..)` is the cache
/// this backend opens with the same root, name, options and sources, and
/// the other way round.
///
/// Building through the facade infers the schema from the first value
/// (every dict member a tensor; an array per member, none nullable).
/// Build with `memmap_array::RowWriter` or `open_or_build` for nullable
/// arrays, sidecars and per-row metadata.
pub struct MemmapBackend {
    cache: Arc<MemmapArray>,
    arrays: Vec<(Arc<str>, DType, Shape)>,
    dir: PathBuf,
    counters: Counters,
}

fn spec(can_build: bool) -> Spec {
    Spec {
        kind: Some(Detected::own(StoreKind::MemmapArray)),
        version: memmap_array::CACHE_VERSION,
        can_build,
        complete: fingerprint::is_complete,
        store_locks: |dir| vec![dir.join(memmap_array::LOCK_FILE)],
    }
}

impl MemmapBackend {
    /// Opens the finished cache `config` names.
    pub fn open(config: &CacheConfig) -> Result<MemmapBackend> {
        check_kind(config)?;
        let prepared = prepare(config, &spec(false))?;
        let cache = MemmapArray::open(&prepared.dir)?;
        Ok(MemmapBackend::over(cache, prepared.dir))
    }

    /// Opens the cache `config` names, building it from `source` when it is
    /// missing, resuming a build that stopped half-way (the rows already
    /// committed are not produced again) and rebuilding it when stale (if
    /// `on_stale` allows).
    pub fn open_with_source(config: &CacheConfig, source: Source) -> Result<MemmapBackend> {
        check_kind(config)?;
        let prepared = prepare(config, &spec(true))?;
        if matches!(prepared.state, DirState::Fresh) {
            let cache = MemmapArray::open(&prepared.dir)?;
            return Ok(MemmapBackend::over(cache, prepared.dir));
        }
        let dir = prepared.dir.clone();
        let (first_id, first, rest) = first_value(&dir, &source)?;
        let schema = schema_of(&dir, &first)?;
        let build = |w: &mut RowWriter| {
            let built = build_rows(&dir, w, &source, rest, &first_id, &first);
            if built.is_err() {
                // Commit the rows written so far, so a resumed build skips
                // them; if this fails too they are rebuilt, and the
                // source's error is the one worth reporting.
                let _ = w.flush();
            }
            built
        };
        let opened = memmap_array::open_or_build(
            &config.root,
            &config.name,
            &config.options,
            prepared.fingerprint.sources.clone(),
            &schema,
            build,
        )?;
        if opened.dir != dir {
            return Err(FacadeError::Backend(format!(
                "memmap-array built {} for the cache at {}",
                opened.dir.display(),
                dir.display()
            )));
        }
        drop(prepared);
        Ok(MemmapBackend::over(opened.cache, dir))
    }

    fn over(cache: MemmapArray, dir: PathBuf) -> MemmapBackend {
        let arrays = cache
            .schema()
            .arrays()
            .iter()
            .map(|a| (Arc::from(a.name()), a.dtype(), a.shape().clone()))
            .collect();
        MemmapBackend {
            cache: Arc::new(cache),
            arrays,
            dir,
            counters: Counters::default(),
        }
    }

    /// The cache underneath (its own zero-copy API: `row`, `array_at`,
    /// sidecars, metadata).
    pub fn cache(&self) -> &MemmapArray {
        &self.cache
    }

    /// Row `row` as a dict of views into the mapped arrays.
    fn value(&self, row: u64) -> Result<Value> {
        let mut members = Vec::with_capacity(self.arrays.len());
        for (k, (name, dtype, shape)) in self.arrays.iter().enumerate() {
            let bytes =
                SharedBytes::try_project(Arc::clone(&self.cache), |c| match c.array_at(row, k) {
                    Ok(Some(view)) => Ok(view.bytes()),
                    Ok(None) => Err(None),
                    Err(e) => Err(Some(e)),
                });
            match bytes {
                Ok(bytes) => members.push((
                    Arc::clone(name),
                    Value::Tensor(SharedTensor::new(*dtype, shape.clone(), bytes)?),
                )),
                Err(None) => {}
                Err(Some(e)) => return Err(e.into()),
            }
        }
        Ok(Value::Dict(members))
    }
}

fn check_kind(config: &CacheConfig) -> Result<()> {
    if config.backend != StoreKind::MemmapArray {
        return Err(FacadeError::Config(format!(
            "MemmapBackend opened with a {} config",
            config.backend.name()
        )));
    }
    Ok(())
}

/// The values after the first of an items source (one pass of it).
type Rest = Option<Box<dyn Iterator<Item = Value> + Send>>;

/// The first value of the source (its schema is the cache's), and for an
/// items source the rest of the same pass.
fn first_value(dir: &Path, source: &Source) -> Result<(String, Value, Rest)> {
    let empty = || FacadeError::BadValue {
        dir: dir.to_path_buf(),
        why: "the source is empty: a memmap-array cache needs at least one row".into(),
    };
    match &source.kind {
        SourceKind::Items(factory) => {
            let mut pass = factory();
            let first = pass.next().ok_or_else(empty)?;
            Ok(("0".to_owned(), first, Some(pass)))
        }
        SourceKind::Keyed { ids, produce } => {
            let id = ids.first().ok_or_else(empty)?;
            let value = produce(id).map_err(|source| FacadeError::Source {
                dir: dir.to_path_buf(),
                id: id.clone(),
                source,
            })?;
            Ok((id.clone(), value, None))
        }
    }
}

fn schema_of(dir: &Path, first: &Value) -> Result<Schema> {
    let Value::Dict(members) = first else {
        return Err(not_a_row(dir, "0", first));
    };
    let mut builder = Schema::builder();
    for (name, value) in members {
        let Value::Tensor(t) = value else {
            return Err(FacadeError::BadValue {
                dir: dir.to_path_buf(),
                why: format!(
                    "member {name:?} of the first row is a {}: memmap-array holds fixed-shape arrays",
                    value.kind()
                ),
            });
        };
        builder = builder.array(name, t.dtype(), t.shape().clone());
    }
    Ok(builder.build()?)
}

fn not_a_row(dir: &Path, id: &str, value: &Value) -> FacadeError {
    FacadeError::BadValue {
        dir: dir.to_path_buf(),
        why: format!(
            "row {id:?} is a {}: memmap-array rows are dicts of named arrays",
            value.kind()
        ),
    }
}

fn write_row(dir: &Path, w: &mut RowWriter, id: &str, value: &Value) -> Result<()> {
    let Value::Dict(members) = value else {
        return Err(not_a_row(dir, id, value));
    };
    let views: Vec<_> = members
        .iter()
        .map(|(name, v)| match v {
            Value::Tensor(t) => Ok((name, t.view())),
            other => Err(FacadeError::BadValue {
                dir: dir.to_path_buf(),
                why: format!(
                    "row {id:?}: member {name:?} is a {}, not a tensor",
                    other.kind()
                ),
            }),
        })
        .collect::<Result<_>>()?;
    let mut row = NewRow::new(id);
    for (name, view) in &views {
        row = row.array(name, view.clone());
    }
    w.write(&row)?;
    Ok(())
}

/// Writes every row of `source` not yet committed.
fn build_rows(
    dir: &Path,
    w: &mut RowWriter,
    source: &Source,
    rest: Rest,
    first_id: &str,
    first: &Value,
) -> Result<()> {
    let done: HashSet<String> = w.resume_keys().iter().cloned().collect();
    match &source.kind {
        SourceKind::Items(factory) => {
            if !done.contains(first_id) {
                write_row(dir, w, first_id, first)?;
            }
            let rest = rest.unwrap_or_else(|| Box::new(factory().skip(1)));
            for (i, value) in rest.enumerate() {
                let id = (i + 1).to_string();
                if !done.contains(&id) {
                    write_row(dir, w, &id, &value)?;
                }
            }
        }
        SourceKind::Keyed { ids, produce } => {
            for id in ids.iter() {
                if done.contains(id) {
                    continue;
                }
                if id == first_id {
                    write_row(dir, w, id, first)?;
                    continue;
                }
                let value = produce(id).map_err(|source| FacadeError::Source {
                    dir: dir.to_path_buf(),
                    id: id.clone(),
                    source,
                })?;
                write_row(dir, w, id, &value)?;
            }
        }
    }
    Ok(())
}

impl CacheBackend for MemmapBackend {
    fn kind(&self) -> StoreKind {
        StoreKind::MemmapArray
    }

    fn supports(&self, op: Operation) -> bool {
        matches!(op, Operation::GetByKey | Operation::GetByIndex)
    }

    fn get_batch(&self, keys: &[&str]) -> Result<Lookup> {
        let mut values = Vec::with_capacity(keys.len());
        let mut missing = Vec::new();
        let mut bytes = 0;
        for (i, key) in keys.iter().enumerate() {
            match self.cache.find(key) {
                Some(row) => {
                    let value = self.value(row)?;
                    bytes += value.byte_len();
                    values.push(Some(value));
                }
                None => {
                    missing.push(i);
                    values.push(None);
                }
            }
        }
        self.counters
            .lookup(keys.len() - missing.len(), missing.len(), bytes);
        Ok((values, missing))
    }

    fn get_indices(&self, indices: &[i64]) -> Result<Vec<Value>> {
        let len = self.cache.len();
        let mut values = Vec::with_capacity(indices.len());
        let mut bytes = 0;
        for &index in indices {
            let value = self.value(resolve_index(&self.dir, index, len)?)?;
            bytes += value.byte_len();
            values.push(value);
        }
        self.counters.lookup(indices.len(), 0, bytes);
        Ok(values)
    }

    fn prefetch(&self, indices: &[i64]) {
        let len = self.cache.len();
        for &index in indices {
            if let Ok(row) = resolve_index(&self.dir, index, len) {
                self.cache.prefetch(row);
            }
        }
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        Ok(self.cache.len())
    }

    fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    fn path(&self) -> &Path {
        &self.dir
    }
}

/// memmap-array directories, finished or being written, at a path, for
/// [`crate::KINDS`].
pub(crate) struct MemmapKind;

pub(crate) static MEMMAP_ARRAY: MemmapKind = MemmapKind;

impl crate::KindSpec for MemmapKind {
    fn kind(&self) -> crate::Detected {
        crate::Detected::own(StoreKind::MemmapArray)
    }

    fn detect(&self, probe: &crate::Probe<'_>) -> bool {
        probe.is_dir
            && (probe.path.join(memmap_array::SHAPES_FILE).is_file()
                || probe.path.join(memmap_array::MANIFEST_FILE).is_file())
    }

    fn verify(&self, path: &Path) -> Vec<cache_check::Problem> {
        memmap_array::verify(path)
    }

    fn inspect(&self, path: &Path) -> Result<cache_check::Summary> {
        Ok(memmap_array::inspect(path)?.summary())
    }

    /// By source path first, else by row index.
    fn get(&self, path: &Path, key: &str) -> Result<serde_json::Value> {
        let cache = memmap_array::MemmapArray::open(path)?;
        let row = match cache.find(key) {
            Some(i) => i,
            None if key.parse::<i64>().is_err() => {
                return Err(FacadeError::NoSuchRecord {
                    path: path.to_path_buf(),
                    what: format!("no row with source {key:?}"),
                });
            }
            None => crate::kinds::parse_index(path, key, cache.len())?,
        };
        Ok(row_json(&cache, row)?)
    }

    fn stats(&self, path: &Path) -> Result<cache_check::Summary> {
        use crate::kinds::ratio;
        let r = memmap_array::inspect(path)?;
        let array_bytes: u64 = r.arrays.iter().map(|a| a.file_bytes).sum();
        let cells = r.rows * r.arrays.len() as u64;
        let absent: u64 = r.arrays.iter().map(|a| a.absent_rows).sum();
        let stored: u64 = r.sidecars.iter().map(|s| s.unique_bytes).sum();
        let logical: u64 = r.sidecars.iter().map(|s| s.logical_bytes).sum();
        Ok(cache_check::Summary::new(self.kind().name(), path)
            .fact("rows", r.rows)
            .fact("complete", r.complete)
            .fact("files", r.files.len())
            .fact("disk_bytes", r.disk_bytes())
            .fact("bytes_per_row", ratio(r.disk_bytes(), r.rows))
            .fact("array_bytes", array_bytes)
            .fact("absent_cells", absent)
            .fact("absent_fraction", ratio(absent, cells))
            .fact("sidecar_bytes_stored", stored)
            .fact("sidecar_bytes_undeduplicated", logical)
            .fact("sidecar_dedup_ratio", ratio(logical, stored))
            .fact("projected_ram_bytes", r.projected_ram_bytes)
            .fact("physical_ram_bytes", r.physical_ram_bytes)
            .fact(
                "ram_fraction",
                ratio(r.projected_ram_bytes, r.physical_ram_bytes),
            ))
    }
}

/// Row `i`: source, arrays (null where absent), sidecar values and metadata.
fn row_json(cache: &memmap_array::MemmapArray, i: u64) -> memmap_array::Result<serde_json::Value> {
    use serde_json::{Map, Value, json};
    let row = cache.row(i)?;
    let mut arrays = Map::new();
    for (spec, view) in cache.schema().arrays().iter().zip(row.arrays()) {
        arrays.insert(
            spec.name().to_owned(),
            view.as_ref().map_or(Value::Null, crate::json::tensor_json),
        );
    }
    let mut sidecars = Map::new();
    for name in cache.schema().sidecars() {
        sidecars.insert(name.clone(), json!(row.sidecar(name)?));
    }
    let meta = row
        .meta_json()
        .map(|m| serde_json::from_str(m).unwrap_or_else(|_| json!(m)))
        .unwrap_or(Value::Null);
    Ok(json!({
        "row": i,
        "source": row.source(),
        "arrays": arrays,
        "sidecars": sidecars,
        "meta": meta,
    }))
}

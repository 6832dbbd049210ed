//! memmap-array directories.

use std::path::Path;

use cache_check::{Problem, Summary};
use cache_facade::{Detected, StoreKind};
use serde_json::{Map, Value, json};

use crate::adapter::{CacheAdapter, parse_index, ratio};
use crate::error::{CliError, Result};
use crate::json::tensor_json;

/// A memmap-array directory, finished or being written.
pub(crate) struct MemmapArray;

impl CacheAdapter for MemmapArray {
    fn kind(&self) -> Detected {
        Detected::own(StoreKind::MemmapArray)
    }

    fn inspect(&self, path: &Path) -> Result<Summary> {
        let report = memmap_array::inspect(path).map_err(CliError::store)?;
        Ok(report.summary())
    }

    fn verify(&self, path: &Path) -> Vec<Problem> {
        memmap_array::verify(path)
    }

    /// By source path first, else by row index.
    fn get(&self, path: &Path, key: &str) -> Result<Value> {
        let cache = memmap_array::MemmapArray::open(path).map_err(CliError::store)?;
        let row = match cache.find(key) {
            Some(i) => i,
            None if key.parse::<i64>().is_err() => {
                return Err(CliError::NotFound {
                    path: path.to_path_buf(),
                    what: format!("no row with source {key:?}"),
                });
            }
            None => parse_index(path, key, cache.len())?,
        };
        row_json(&cache, row).map_err(CliError::store)
    }

    fn stats(&self, path: &Path) -> Result<Summary> {
        let r = memmap_array::inspect(path).map_err(CliError::store)?;
        let array_bytes: u64 = r.arrays.iter().map(|a| a.file_bytes).sum();
        let cells = r.rows * r.arrays.len() as u64;
        let absent: u64 = r.arrays.iter().map(|a| a.absent_rows).sum();
        let stored: u64 = r.sidecars.iter().map(|s| s.unique_bytes).sum();
        let logical: u64 = r.sidecars.iter().map(|s| s.logical_bytes).sum();
        Ok(Summary::new(self.kind().name(), path)
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
fn row_json(cache: &memmap_array::MemmapArray, i: u64) -> memmap_array::Result<Value> {
    let row = cache.row(i)?;
    let mut arrays = Map::new();
    for (spec, view) in cache.schema().arrays().iter().zip(row.arrays()) {
        arrays.insert(
            spec.name().to_owned(),
            view.as_ref().map_or(Value::Null, tensor_json),
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

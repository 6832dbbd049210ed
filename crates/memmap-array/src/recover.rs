//! Reading the manifest back: the committed prefix, the torn tail, and the
//! checks that make a resumed writer safe.
//!
//! Only the last line of `manifest.jsonl` may be incomplete (a crash while
//! it was being appended): it lacks its newline or does not parse, and it is
//! dropped. Any earlier bad line, or a complete line that breaks the
//! numbering or the sidecar key sequence, is corruption and an error.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use crate::format::{MANIFEST_FORMAT, ManifestHeader, ManifestRow, Schema, check_version};
use crate::{Error, Result};

/// What a pass over the manifest found.
#[derive(Debug)]
pub(crate) struct ManifestScan {
    /// The schema in the header line.
    pub schema: Schema,
    /// The fingerprint in the header line.
    pub fingerprint: serde_json::Value,
    /// Committed rows.
    pub rows: u64,
    /// Bytes of the valid prefix (header and committed rows).
    pub good_len: u64,
    /// Bytes after the valid prefix (a torn last line), to be dropped.
    pub torn_len: u64,
    /// Distinct values seen per sidecar.
    pub sidecar_counts: Vec<u64>,
}

/// Reads `path`, checks every line, and hands each committed row to `visit`
/// in order.
pub(crate) fn scan_manifest(
    path: &Path,
    visit: impl FnMut(&ManifestRow) -> Result<()>,
) -> Result<ManifestScan> {
    let file = File::open(path).map_err(Error::io("open", path))?;
    scan_manifest_from(BufReader::with_capacity(1 << 20, file), path, visit)
}

/// [`scan_manifest`] over any reader; `path` names it in errors.
pub(crate) fn scan_manifest_from(
    mut reader: impl BufRead,
    path: &Path,
    mut visit: impl FnMut(&ManifestRow) -> Result<()>,
) -> Result<ManifestScan> {
    let mut line = Vec::new();

    let (n, schema, fingerprint) = read_header(&mut reader, &mut line, path)?;
    let mut scan = ManifestScan {
        sidecar_counts: vec![0; schema.sidecars().len()],
        schema,
        fingerprint,
        rows: 0,
        good_len: n as u64,
        torn_len: 0,
    };

    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(Error::io("read", path))?;
        if n == 0 {
            break;
        }
        let complete = line.last() == Some(&b'\n');
        let parsed = serde_json::from_slice::<ManifestRow>(&line);
        let at_end = reader
            .fill_buf()
            .map_err(Error::io("read", path))?
            .is_empty();
        let row = match parsed {
            Ok(row) if complete => row,
            _ if at_end => {
                scan.torn_len = n as u64;
                break;
            }
            // read_until stops without a newline only at the end of the file.
            Ok(_) => return Err(Error::corrupt(path, "line without newline before the end")),
            Err(e) => {
                return Err(Error::corrupt(
                    path,
                    format!(
                        "line {} (row {}) is not a valid row: {e}",
                        scan.rows + 2,
                        scan.rows
                    ),
                ));
            }
        };
        check_row(&row, &mut scan)
            .map_err(|reason| Error::corrupt(path, format!("line {}: {reason}", scan.rows + 2)))?;
        visit(&row)?;
        scan.rows += 1;
        scan.good_len += n as u64;
    }
    Ok(scan)
}

/// Reads only the header line of the manifest at `path`: the schema and
/// fingerprint the unfinished cache was started with.
pub(crate) fn read_manifest_header(path: &Path) -> Result<(Schema, serde_json::Value)> {
    let file = File::open(path).map_err(Error::io("open", path))?;
    let mut reader = BufReader::new(file);
    let (_, schema, fingerprint) = read_header(&mut reader, &mut Vec::new(), path)?;
    Ok((schema, fingerprint))
}

fn read_header(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    path: &Path,
) -> Result<(usize, Schema, serde_json::Value)> {
    let n = reader
        .read_until(b'\n', line)
        .map_err(Error::io("read", path))?;
    if n == 0 || line.last() != Some(&b'\n') {
        return Err(Error::corrupt(path, "header line is missing or incomplete"));
    }
    let header: ManifestHeader = serde_json::from_slice(line).map_err(|source| Error::Json {
        file: path.to_owned(),
        source,
    })?;
    if header.format != MANIFEST_FORMAT {
        return Err(Error::corrupt(
            path,
            format!("format {:?}, expected {MANIFEST_FORMAT:?}", header.format),
        ));
    }
    check_version(header.version, path)?;
    let schema = Schema::from_stored(header.schema, path)?;
    Ok((n, schema, header.fingerprint))
}

fn check_row(row: &ManifestRow, scan: &mut ManifestScan) -> std::result::Result<(), String> {
    if row.row != scan.rows {
        return Err(format!("row number {}, expected {}", row.row, scan.rows));
    }
    let arrays = scan.schema.arrays();
    if row.present.len() != arrays.len() {
        return Err(format!(
            "{} presence flags for {} arrays",
            row.present.len(),
            arrays.len()
        ));
    }
    if let Some(a) = arrays
        .iter()
        .zip(&row.present)
        .find(|(a, p)| !a.nullable() && !**p)
    {
        return Err(format!(
            "array {:?} is not nullable but marked absent",
            a.0.name()
        ));
    }
    if row.sidecars.len() != scan.sidecar_counts.len() {
        return Err(format!(
            "{} sidecar keys for {} sidecars",
            row.sidecars.len(),
            scan.sidecar_counts.len()
        ));
    }
    for (s, key, _) in &row.new {
        let count = scan
            .sidecar_counts
            .get_mut(*s)
            .ok_or_else(|| format!("new value for sidecar #{s}, which does not exist"))?;
        if *key != *count {
            return Err(format!("new sidecar key {key}, expected {count}"));
        }
        *count += 1;
    }
    for (s, key) in row.sidecars.iter().enumerate() {
        if let Some(key) = key
            && *key >= scan.sidecar_counts[s]
        {
            return Err(format!(
                "sidecar {:?} key {key} was never defined",
                scan.schema.sidecars()[s]
            ));
        }
    }
    Ok(())
}

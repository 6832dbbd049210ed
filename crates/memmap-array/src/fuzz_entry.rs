//! Entry points for fuzz targets, public so that a `fuzz/` crate and
//! ordinary tests run the same code over damaged inputs.
//!
//! Each takes arbitrary bytes and returns a count or an error: never a
//! panic, never an unbounded allocation.

use std::path::Path;

use crate::Result;
use crate::format::{Shapes, parse_sidecar};
use crate::recover::scan_manifest_from;

/// Parses and validates `bytes` as `shapes.json`; returns the row count.
pub fn shapes_json(bytes: &[u8]) -> Result<u64> {
    Shapes::parse(bytes, Path::new("<fuzz shapes.json>")).map(|s| s.rows)
}

/// Scans `bytes` as `manifest.jsonl` (header, row checks, torn tail);
/// returns the committed row count.
pub fn manifest_jsonl(bytes: &[u8]) -> Result<u64> {
    scan_manifest_from(bytes, Path::new("<fuzz manifest.jsonl>"), |_| Ok(())).map(|s| s.rows)
}

/// Parses `bytes` as a sidecar file; returns the number of values.
pub fn sidecar_json(bytes: &[u8]) -> Result<usize> {
    parse_sidecar(bytes, Path::new("<fuzz sidecar.json>")).map(|v| v.len())
}

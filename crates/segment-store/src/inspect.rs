//! `verify` and `inspect`: what the `cachex` CLI reports about a cache.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use cache_check::{Problem, ProblemKind, Summary};
use serde_json::json;

use crate::Error;
use crate::format::{self, INDEX_FILE, SCHEMA_FILE, WRITERS_DIR};
use crate::reader::{Segment, SegmentMaps};
use crate::record::Structure;
use crate::recover::{hint_of, list_segments, list_writer_logs};
use crate::schema::parse_schema_json;
use crate::store::SegmentStore;

/// One segment in an [`Inspection`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Segment id.
    pub id: u32,
    /// File size.
    pub bytes: u64,
    /// Rows in the file (`None` when it does not decode).
    pub rows: Option<usize>,
    /// Rows the index still points to.
    pub live_rows: usize,
}

/// What [`SegmentStore::inspect`] reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Inspection {
    /// The cache directory.
    pub dir: PathBuf,
    /// The record structure, once known.
    pub structure: Option<Structure>,
    /// `schema.json` as this crate would write it, once known.
    pub schema_json: Option<String>,
    /// Distinct keys.
    pub entries: usize,
    /// The segments in use.
    pub segments: Vec<SegmentInfo>,
    /// Bytes of all segments plus the index logs.
    pub disk_bytes: u64,
    /// Resident index bytes per key.
    pub index_bytes_per_entry: f64,
    /// The writers of a multi-writer cache (empty for a single-writer one).
    pub writers: Vec<WriterInfo>,
}

/// One multi-writer in an [`Inspection`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterInfo {
    /// Writer id (the residue class of its segment ids).
    pub id: u32,
    /// Bytes of its index log.
    pub log_bytes: u64,
    /// Segments its log lists (`None` when the log's header is bad).
    pub segments: Option<usize>,
    /// Whether a process holds its lock right now (an active writer).
    pub active: bool,
}

/// The writers of the cache in `dir`: each log's groups, and whether its
/// lock is held (probed, never kept).
fn writer_infos(dir: &Path) -> Vec<WriterInfo> {
    let Ok(logs) = list_writer_logs(dir) else {
        return Vec::new();
    };
    logs.into_iter()
        .map(|(id, path)| {
            let bytes = std::fs::read(&path).unwrap_or_default();
            let segments = format::parse_index(&bytes, |_, _| {})
                .ok()
                .map(|p| p.groups.len());
            let lock = dir.join(WRITERS_DIR).join(format::writer_lock_name(id));
            let active =
                lock.exists() && matches!(durable_fs::FileLock::try_exclusive(&lock), Ok(None));
            WriterInfo {
                id,
                log_bytes: bytes.len() as u64,
                segments,
                active,
            }
        })
        .collect()
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "cache: {}", self.dir.display())?;
        writeln!(
            f,
            "structure: {}",
            self.structure.map_or("(empty)", Structure::name)
        )?;
        writeln!(f, "entries: {}", self.entries)?;
        writeln!(f, "disk bytes: {}", self.disk_bytes)?;
        writeln!(f, "index bytes/entry: {:.1}", self.index_bytes_per_entry)?;
        writeln!(f, "segments: {}", self.segments.len())?;
        for s in &self.segments {
            let rows = s.rows.map_or("corrupt".to_owned(), |r| r.to_string());
            writeln!(
                f,
                "  {}  {} bytes  {} rows  {} live",
                format::segment_name(s.id),
                s.bytes,
                rows,
                s.live_rows
            )?;
        }
        if !self.writers.is_empty() {
            writeln!(f, "writers: {}", self.writers.len())?;
            for w in &self.writers {
                let segs = w.segments.map_or("bad log".to_owned(), |n| n.to_string());
                let state = if w.active { "active" } else { "idle" };
                writeln!(
                    f,
                    "  {}  {} bytes  {} segments  {state}",
                    format::writer_log_name(w.id),
                    w.log_bytes,
                    segs
                )?;
            }
        }
        if let Some(js) = &self.schema_json {
            writeln!(f, "schema.json:\n{js}")?;
        }
        Ok(())
    }
}

impl Inspection {
    /// The inspection in the shared shape the `cachex` tool prints:
    /// structure, entries, sizes, `schema.json`, and a table of segments.
    pub fn summary(&self) -> Summary {
        let schema = self
            .schema_json
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or(serde_json::Value::Null);
        let segments = self
            .segments
            .iter()
            .map(|s| {
                vec![
                    json!(format::segment_name(s.id)),
                    json!(s.bytes),
                    json!(s.rows),
                    json!(s.live_rows),
                ]
            })
            .collect();
        let summary = Summary::new("segment-store", &self.dir)
            .fact("structure", self.structure.map(Structure::name))
            .fact("entries", self.entries)
            .fact("disk_bytes", self.disk_bytes)
            .fact("index_bytes_per_entry", self.index_bytes_per_entry)
            .fact("schema", schema)
            .table("segments", ["file", "bytes", "rows", "live_rows"], segments);
        if self.writers.is_empty() {
            return summary;
        }
        summary.table(
            "writers",
            ["writer", "log", "log_bytes", "segments", "active"],
            self.writers
                .iter()
                .map(|w| {
                    vec![
                        json!(w.id),
                        json!(format::writer_log_name(w.id)),
                        json!(w.log_bytes),
                        json!(w.segments),
                        json!(w.active),
                    ]
                })
                .collect(),
        )
    }
}

/// Mappings `verify` keeps while it reads every segment once.
const VERIFY_MAPS: usize = 16;

/// Opens the cache in `dir` read-only and lists everything wrong with it
/// (empty when sound): what recovery found on open
/// ([`SegmentStore::problems`]) and what [`SegmentStore::verify`] finds,
/// sorted, without repeats. Never fails: a cache that does not open is a
/// problem naming `dir`. No index log of ours is no problem (a
/// torchcachex directory has none).
pub fn verify(dir: impl AsRef<std::path::Path>) -> Vec<Problem> {
    let dir = dir.as_ref();
    if !dir.is_dir() {
        // A read-only open would see an empty cache.
        return vec![Problem::new(
            dir,
            ProblemKind::Missing,
            "no such cache directory",
        )];
    }
    let opts = crate::Options {
        read_only: true,
        lru_bytes: 0,
        ..crate::Options::default()
    };
    match SegmentStore::open(dir, opts) {
        Err(e) => vec![match &e {
            Error::Io { path, .. } => Problem::from_error(path.clone(), ProblemKind::Io, &e),
            _ => Problem::from_error(dir, ProblemKind::Structure, &e),
        }],
        Ok(store) => {
            let mut all = store.problems();
            all.extend(store.verify());
            all.sort();
            all.dedup();
            all
        }
    }
}

impl SegmentStore {
    /// Checks every segment and index entry on disk now and lists what is
    /// wrong (empty when the cache is sound). Reads every row.
    pub fn verify(&self) -> Vec<Problem> {
        let inner = self.inner();
        let dir = &inner.dir;
        let mut out = Vec::new();
        let mut push = |path: PathBuf, kind: ProblemKind, detail: String| {
            out.push(Problem { path, kind, detail })
        };
        let st_schema = inner.state.read().schema.clone();
        let hint = hint_of(st_schema.as_ref());
        let schema_path = dir.join(SCHEMA_FILE);
        match crate::schema::read_schema_text(&schema_path) {
            Ok(text) => match parse_schema_json(&text) {
                Ok(s) if Some(&s) != st_schema.as_ref() => push(
                    schema_path,
                    ProblemKind::Structure,
                    "differs from the schema in use".into(),
                ),
                Ok(_) => {}
                Err(e) => push(
                    schema_path,
                    ProblemKind::Structure,
                    format!("unparseable: {e}"),
                ),
            },
            Err(_) if st_schema.is_none() => {}
            Err(e) => push(schema_path, ProblemKind::Io, format!("unreadable: {e}")),
        }
        // Every index log: the shared one and each writer's.
        let mut logs: Vec<PathBuf> = vec![dir.join(INDEX_FILE)];
        match list_writer_logs(dir) {
            Ok(w) => logs.extend(w.into_values()),
            Err(e) => push(dir.clone(), ProblemKind::Io, e.to_string()),
        }
        #[allow(clippy::type_complexity)]
        let mut expected: BTreeMap<u32, Option<(u64, u64, Vec<u64>)>> = BTreeMap::new();
        let mut any_log = false;
        for log in &logs {
            let bytes = match std::fs::read(log) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    push(log.clone(), ProblemKind::Io, e.to_string());
                    continue;
                }
            };
            any_log = true;
            let parsed = format::parse_index(&bytes, |g, body| {
                expected.insert(
                    g.segment_id,
                    Some((
                        g.segment_len,
                        g.segment_hash,
                        format::hashes_of(body).collect(),
                    )),
                );
            });
            match parsed {
                Ok(p) => {
                    if let Some(t) = &p.torn {
                        push(
                            log.clone(),
                            ProblemKind::Interrupted,
                            format!("torn tail: {t}"),
                        );
                    }
                }
                Err(e) => push(log.clone(), ProblemKind::Structure, e),
            }
        }
        // Listed after the logs are read: a segment a writer renames and
        // logs meanwhile is then found, never reported missing.
        let on_disk = match list_segments(dir) {
            Ok(s) => s,
            Err(e) => {
                push(dir.clone(), ProblemKind::Io, e.to_string());
                return out;
            }
        };
        if any_log {
            for id in on_disk.keys() {
                if !expected.contains_key(id) {
                    push(
                        format::segment_path(dir, *id),
                        ProblemKind::Unindexed,
                        "not in any index log".into(),
                    );
                }
            }
        } else {
            // No log: a torchcachex cache (or one opened read-only before
            // its first writer); every segment is checked on its own.
            for id in on_disk.keys() {
                expected.insert(*id, None);
            }
        }
        // Each segment is read once here: mappings of its own, so that
        // the store's hot ones stay.
        let maps = SegmentMaps::new(VERIFY_MAPS, inner.opts.whole_segment.clone());
        for (id, want) in expected {
            let path = format::segment_path(dir, id);
            let seg = match Segment::open(&path, id, &maps) {
                Ok(s) => s,
                Err(e) => {
                    let kind = if path.exists() {
                        ProblemKind::Structure
                    } else {
                        ProblemKind::Missing
                    };
                    push(
                        path,
                        kind,
                        format!("listed in the index but unreadable: {e}"),
                    );
                    continue;
                }
            };
            if let Some((len, content, _)) = &want {
                if seg.file_len() != *len {
                    let kind = if seg.file_len() < *len {
                        ProblemKind::Truncated
                    } else {
                        ProblemKind::Structure
                    };
                    push(
                        path.clone(),
                        kind,
                        format!("{} bytes, the index recorded {len}", seg.file_len()),
                    );
                } else {
                    match seg.content_hash() {
                        Ok(c) if c == *content => {}
                        Ok(_) => push(
                            path.clone(),
                            ProblemKind::ChecksumMismatch,
                            "content differs from the checksum the index recorded".into(),
                        ),
                        Err(e) => {
                            push(path, ProblemKind::Structure, e.to_string());
                            continue;
                        }
                    }
                }
            }
            let d = match seg.decoded(hint) {
                Ok(d) => d,
                Err(e) => {
                    push(path, ProblemKind::Structure, e.to_string());
                    continue;
                }
            };
            if let Some((_, _, hashes)) = &want
                && hashes.len() != d.rows()
            {
                push(
                    path.clone(),
                    ProblemKind::Structure,
                    format!("{} rows, the index recorded {}", d.rows(), hashes.len()),
                );
            }
            let structure = hint.unwrap_or(d.schema.structure);
            for row in 0..d.rows() {
                match d.key(row) {
                    None => push(
                        path.clone(),
                        ProblemKind::Structure,
                        format!("row {row}: null key"),
                    ),
                    Some(k) => {
                        if let Some((_, _, hashes)) = &want
                            && hashes.get(row).is_some_and(|h| *h != format::key_hash(k))
                        {
                            push(
                                path.clone(),
                                ProblemKind::Structure,
                                format!("row {row}: key {k:?} does not match its index hash"),
                            );
                        }
                    }
                }
                if let Err(e) = d.record(&path, row, structure) {
                    push(path.clone(), ProblemKind::Structure, e.to_string());
                }
            }
        }
        out
    }

    /// Every key the index holds, with where its row is: `(key, segment
    /// id, row)`, ordered by segment and row (torchcachex's `index` dict,
    /// answered from this store). Rows still pending a flush are not
    /// listed. Reads the key column of each segment holding a live row.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptSegment`] naming the segment whose keys cannot be decoded.
    pub fn key_locations(&self) -> crate::Result<Vec<(String, u32, u32)>> {
        let inner = self.inner();
        let (mut locs, segments, hint) = {
            let st = inner.state.read();
            let locs: Vec<_> = st.index.locations().collect();
            (locs, st.segments.clone(), hint_of(st.schema.as_ref()))
        };
        locs.sort_unstable();
        let mut out = Vec::with_capacity(locs.len());
        let mut at = 0;
        while at < locs.len() {
            let seg = locs[at].seg;
            let end = at + locs[at..].partition_point(|l| l.seg == seg);
            if let Some(segment) = segments.get(&seg) {
                let decoded = segment.decoded(hint)?;
                for loc in &locs[at..end] {
                    if let Some(key) = decoded.key(loc.row as usize) {
                        out.push((key.to_owned(), seg, loc.row));
                    }
                }
            }
            at = end;
        }
        Ok(out)
    }

    /// A summary of the cache: schema, entries, segments, sizes.
    pub fn inspect(&self) -> Inspection {
        let inner = self.inner();
        let entries = self.len();
        let st = inner.state.read();
        let hint = hint_of(st.schema.as_ref());
        let mut live: BTreeMap<u32, usize> = BTreeMap::new();
        for loc in st.index.locations() {
            *live.entry(loc.seg).or_default() += 1;
        }
        let segments: Vec<SegmentInfo> = st
            .segments
            .values()
            .map(|s| SegmentInfo {
                id: s.id,
                bytes: s.file_len(),
                rows: s.decoded(hint).ok().map(|d| d.rows()),
                live_rows: live.get(&s.id).copied().unwrap_or(0),
            })
            .collect();
        let writers = writer_infos(&inner.dir);
        let log_bytes = std::fs::metadata(inner.dir.join(INDEX_FILE)).map_or(0, |m| m.len())
            + writers.iter().map(|w| w.log_bytes).sum::<u64>();
        Inspection {
            writers,
            dir: inner.dir.clone(),
            structure: st.schema.as_ref().map(|s| s.structure),
            schema_json: st.schema.as_ref().map(crate::schema::to_schema_json),
            entries,
            disk_bytes: segments.iter().map(|s| s.bytes).sum::<u64>() + log_bytes,
            segments,
            index_bytes_per_entry: if st.index.is_empty() {
                0.0
            } else {
                st.index.resident_bytes() as f64 / st.index.len() as f64
            },
        }
    }
}

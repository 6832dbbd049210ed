//! Opening a cache directory: recovery of every crash point, and
//! rebuilding the index of a torchcachex cache (or a lost index).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::{self, INDEX_FILE, SCHEMA_FILE, SEGMENTS_DIR};
use crate::index::{KeyIndex, Loc, MAX_ROW, MAX_SEGMENT_ID};
use crate::reader::Segment;
use crate::record::Structure;
use crate::schema::{RecordSchema, parse_schema_json, to_schema_json};
use crate::writer::IndexLog;
use crate::{Error, Result};
use cache_check::{Problem, ProblemKind};

/// How many inserts ahead the home slot is prefetched while the table is
/// built, so that the cache misses overlap.
const PREFETCH_AHEAD: usize = 16;

/// What opening found.
pub struct Recovered {
    pub schema: Option<RecordSchema>,
    pub index: KeyIndex,
    pub segments: BTreeMap<u32, Arc<Segment>>,
    pub log: Option<IndexLog>,
    pub next_id: u32,
    pub problems: Vec<Problem>,
}

fn problem(path: &Path, kind: ProblemKind, detail: impl Into<String>) -> Problem {
    Problem {
        path: path.to_path_buf(),
        kind,
        detail: detail.into(),
    }
}

/// Removes leftover `*.tmp` files of `dir`.
fn remove_tmp(dir: &Path, problems: &mut Vec<Problem>) -> Result<()> {
    for p in durable_fs::remove_temp_files(dir).map_err(Error::durable)? {
        problems.push(problem(
            &p,
            ProblemKind::Interrupted,
            "leftover temp file removed",
        ));
    }
    Ok(())
}

/// The segment files of `dir`, by id.
pub fn list_segments(dir: &Path) -> Result<BTreeMap<u32, PathBuf>> {
    let seg_dir = dir.join(SEGMENTS_DIR);
    let mut out = BTreeMap::new();
    let entries = match std::fs::read_dir(&seg_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io(&seg_dir, "list segments", e)),
    };
    for e in entries {
        let e = e.map_err(|e| Error::io(&seg_dir, "list segments", e))?;
        if let Some(id) = e.file_name().to_str().and_then(format::parse_segment_name) {
            out.insert(id, e.path());
        }
    }
    Ok(out)
}

/// Opens (and, for a writer, repairs) the cache at `dir`.
pub fn recover(dir: &Path, writer: bool) -> Result<Recovered> {
    let mut problems = Vec::new();
    if writer {
        let seg_dir = dir.join(SEGMENTS_DIR);
        std::fs::create_dir_all(&seg_dir).map_err(|e| Error::io(&seg_dir, "create", e))?;
        remove_tmp(dir, &mut problems)?;
        remove_tmp(&seg_dir, &mut problems)?;
    }

    // schema.json: its structure says tuple or list; a bad one is re-derived.
    let schema_path = dir.join(SCHEMA_FILE);
    let mut schema_bad = false;
    let mut schema = match std::fs::read_to_string(&schema_path) {
        Ok(text) => match parse_schema_json(&text) {
            Ok(s) => Some(s),
            Err(detail) => {
                schema_bad = true;
                problems.push(problem(
                    &schema_path,
                    ProblemKind::Structure,
                    format!("unreadable, re-derived from the segments: {detail}"),
                ));
                None
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            schema_bad = true;
            problems.push(problem(
                &schema_path,
                ProblemKind::Structure,
                format!("unreadable, re-derived from the segments: {e}"),
            ));
            None
        }
    };
    let hint = schema.as_ref().map(|s| s.structure);

    let mut segments = BTreeMap::new();
    let mut max_seen: Option<u32> = None;
    for (id, path) in list_segments(dir)? {
        max_seen = Some(id);
        if id > MAX_SEGMENT_ID {
            problems.push(problem(
                &path,
                ProblemKind::Structure,
                format!("segment id {id} exceeds {MAX_SEGMENT_ID}; ignored"),
            ));
            continue;
        }
        match Segment::open(&path, id) {
            Ok(s) => {
                segments.insert(id, Arc::new(s));
            }
            Err(e) => problems.push(problem(&path, ProblemKind::Structure, e.to_string())),
        }
    }
    // The index log: one sequential read, hashes inserted as they stream
    // by (no key strings parsed), the home slot prefetched a few ahead.
    let index_path = dir.join(INDEX_FILE);
    let key_at = |segments: &BTreeMap<u32, Arc<Segment>>, loc: Loc| -> Option<String> {
        let d = segments.get(&loc.seg)?.decoded(hint).ok()?;
        d.key(loc.row as usize).map(str::to_owned)
    };
    let mut logged = std::collections::HashSet::new();
    let mut max_logged: Option<u32> = None;
    let mut index = KeyIndex::default();
    let parsed = match File::open(&index_path) {
        Ok(file) => {
            let len = file
                .metadata()
                .map_err(|e| Error::io(&index_path, "stat index", e))?
                .len();
            // The entry count is at most len / 8: sized by real bytes on disk.
            index = KeyIndex::with_entries(usize::try_from(len / 8).unwrap_or(0));
            let visit = |g: &format::Group, body: &[u8]| {
                max_logged = Some(g.segment_id);
                logged.insert(g.segment_id);
                let path = format::segment_path(dir, g.segment_id);
                let Some(seg) = segments.get(&g.segment_id) else {
                    problems.push(problem(
                        &path,
                        ProblemKind::Missing,
                        "listed in the index but missing; its keys are lost",
                    ));
                    return;
                };
                if seg.file_len() != g.segment_len {
                    let kind = if seg.file_len() < g.segment_len {
                        ProblemKind::Truncated
                    } else {
                        ProblemKind::Structure
                    };
                    problems.push(problem(
                        &path,
                        kind,
                        format!(
                            "{} bytes, the index recorded {}; excluded",
                            seg.file_len(),
                            g.segment_len
                        ),
                    ));
                    segments.remove(&g.segment_id);
                    return;
                }
                if g.count > MAX_ROW as usize + 1 {
                    problems.push(problem(
                        &path,
                        ProblemKind::Structure,
                        "more rows than an index location holds; excluded",
                    ));
                    segments.remove(&g.segment_id);
                    return;
                }
                let hashes: Vec<u64> = format::hashes_of(body).collect();
                for (row, &hash) in hashes.iter().enumerate() {
                    if let Some(&ahead) = hashes.get(row + PREFETCH_AHEAD) {
                        index.prefetch(ahead);
                    }
                    let loc = Loc {
                        seg: g.segment_id,
                        row: row as u32,
                    };
                    let mut new_key: Option<Option<String>> = None;
                    index.insert(hash, loc, |old| {
                        let nk = new_key.get_or_insert_with(|| key_at(&segments, loc));
                        nk.is_some() && *nk == key_at(&segments, old)
                    });
                }
            };
            match format::read_index(file, len, visit)
                .map_err(|e| Error::io(&index_path, "read index", e))?
            {
                Ok(p) => {
                    if let Some(t) = &p.torn {
                        problems.push(problem(
                            &index_path,
                            ProblemKind::Interrupted,
                            format!("torn tail dropped: {t}"),
                        ));
                    }
                    Some(p)
                }
                Err(detail) => {
                    problems.push(problem(
                        &index_path,
                        ProblemKind::Structure,
                        format!("rebuilt from the segments: {detail}"),
                    ));
                    index = KeyIndex::default();
                    None
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(&index_path, "open index", e)),
    };

    // Segments the log does not know: all of them without a log, else the
    // ones newer than its last group.
    let mut new_groups = Vec::new();
    let orphan_ids: Vec<u32> = segments
        .keys()
        .copied()
        .filter(|id| !logged.contains(id))
        .collect();
    for id in orphan_ids {
        let path = format::segment_path(dir, id);
        if max_logged.is_some_and(|m| id < m) {
            problems.push(problem(
                &path,
                ProblemKind::Stale,
                "older than the index and not in it (left by compaction?); ignored",
            ));
            segments.remove(&id);
            continue;
        }
        let Some(seg) = segments.get(&id).cloned() else {
            continue;
        };
        let decoded = match seg.decoded(hint) {
            Ok(d) => d.clone(),
            Err(e) => {
                problems.push(problem(
                    &path,
                    ProblemKind::Structure,
                    format!("excluded: {e}"),
                ));
                segments.remove(&id);
                continue;
            }
        };
        if decoded.rows() > MAX_ROW as usize + 1 {
            problems.push(problem(
                &path,
                ProblemKind::Structure,
                "more rows than an index location holds; excluded",
            ));
            segments.remove(&id);
            continue;
        }
        let mut hashes = Vec::with_capacity(decoded.rows());
        for row in 0..decoded.rows() {
            let Some(key) = decoded.key(row) else {
                problems.push(problem(
                    &path,
                    ProblemKind::Structure,
                    format!("row {row} has a null key; skipped"),
                ));
                hashes.push(0);
                continue;
            };
            let hash = format::key_hash(key);
            hashes.push(hash);
            let loc = Loc {
                seg: id,
                row: row as u32,
            };
            index.insert(hash, loc, |old| {
                key_at(&segments, old).as_deref() == Some(key)
            });
        }
        new_groups.push(format::encode_group(
            id,
            seg.file_len(),
            seg.content_hash(),
            &hashes,
        ));
        if parsed.is_some() {
            problems.push(problem(
                &path,
                ProblemKind::Unindexed,
                "newer than the index; indexed",
            ));
        }
    }

    if schema.is_none()
        && let Some(d) = segments.values().find_map(|s| s.decoded(hint).ok())
    {
        schema = Some(d.schema.clone());
        if writer {
            durable_fs::write_atomic(&schema_path, to_schema_json(&d.schema).as_bytes())
                .map_err(Error::durable)?;
        }
    } else if schema_bad && writer && schema.is_none() {
        // Nothing to derive it from: the first put writes a new one.
        let _ = std::fs::remove_file(&schema_path);
    }

    let log = if writer {
        Some(match &parsed {
            Some(p) => {
                let mut log = IndexLog::open(&index_path, p.valid_len)?;
                for g in &new_groups {
                    log.append(g)?;
                }
                log
            }
            None => IndexLog::create(&index_path, &new_groups)?,
        })
    } else {
        None
    };
    let next_id = max_seen.max(max_logged).map_or(0, |m| m.saturating_add(1));
    Ok(Recovered {
        schema,
        index,
        segments,
        log,
        next_id,
        problems,
    })
}

/// A structure hint for decoding, from a schema.
pub fn hint_of(schema: Option<&RecordSchema>) -> Option<Structure> {
    schema.map(|s| s.structure)
}

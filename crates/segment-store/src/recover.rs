//! Opening a cache directory: recovery of every crash point, and
//! rebuilding the index of a torchcachex cache (or a lost index).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::{self, INDEX_FILE, SCHEMA_FILE, SEGMENTS_DIR, WRITERS_DIR};
use crate::index::{KeyIndex, Loc, MAX_ROW};
use crate::reader::{Segment, SegmentMaps};
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
    /// Where each index log other than the handle's own was read up to.
    pub cursors: BTreeMap<PathBuf, LogCursor>,
    /// Whether the cache has (or this handle adds) writer logs.
    pub multi: bool,
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
        Err(e) => return Err(Error::io("list segments", &seg_dir)(e)),
    };
    for e in entries {
        let e = e.map_err(Error::io("list segments", &seg_dir))?;
        if let Some(id) = e.file_name().to_str().and_then(format::parse_segment_name) {
            out.insert(id, e.path());
        }
    }
    Ok(out)
}

/// Who opens a cache, which decides what recovery may repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Reads only; repairs nothing on disk.
    Reader,
    /// The single writer: owns every file (holds the exclusive lock).
    Single,
    /// Multi-writer `w`: owns its log and the segments of its residue class.
    Multi(u32),
}

/// Where a handle stopped reading one index log, so that a refresh reads
/// only what was appended since.
#[derive(Debug, Clone)]
pub struct LogCursor {
    /// Bytes read (header and whole groups).
    pub offset: u64,
    /// The segment of the last group read.
    pub last_id: Option<u32>,
    /// The writer of the log (`None`: the shared log).
    pub writer: Option<u32>,
    /// Device and inode of the file when it was read: compaction replaces
    /// the shared log, which a refresh notices by its new inode.
    pub file_id: (u64, u64),
}

/// The device and inode of an open file.
pub fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// The multi-writer index logs present in `dir`, by writer.
pub fn list_writer_logs(dir: &Path) -> Result<BTreeMap<u32, PathBuf>> {
    let wdir = dir.join(WRITERS_DIR);
    let mut out = BTreeMap::new();
    let entries = match std::fs::read_dir(&wdir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io("list writer logs", &wdir)(e)),
    };
    for e in entries {
        let e = e.map_err(Error::io("list writer logs", &wdir))?;
        if let Some(w) = e
            .file_name()
            .to_str()
            .and_then(format::parse_writer_log_name)
        {
            out.insert(w, e.path());
        }
    }
    Ok(out)
}

/// The key of row `loc` (for telling two keys with one tag apart).
fn key_at(
    segments: &BTreeMap<u32, Arc<Segment>>,
    hint: Option<Structure>,
    loc: Loc,
) -> Option<String> {
    let d = segments.get(&loc.seg)?.decoded(hint).ok()?;
    d.key(loc.row as usize).map(str::to_owned)
}

/// Indexes one group of an index log: checks its segment against the
/// group's stamp and inserts its keys; the later location of a key wins.
#[allow(clippy::too_many_arguments)]
pub fn index_group(
    dir: &Path,
    maps: &Arc<SegmentMaps>,
    segments: &mut BTreeMap<u32, Arc<Segment>>,
    index: &mut KeyIndex,
    hint: Option<Structure>,
    g: &format::Group,
    body: &[u8],
    problems: &mut Vec<Problem>,
) {
    let path = format::segment_path(dir, g.segment_id);
    if let std::collections::btree_map::Entry::Vacant(slot) = segments.entry(g.segment_id) {
        // The listing of `segments/` precedes the read of the logs: a
        // segment a writer renamed into place in between, and then
        // logged, is here now (and a refresh reaches its group only once).
        match Segment::open(&path, g.segment_id, maps) {
            Ok(seg) => {
                slot.insert(Arc::new(seg));
            }
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                problems.push(problem(
                    &path,
                    ProblemKind::Missing,
                    "listed in the index but missing; its keys are lost",
                ));
                return;
            }
            Err(e) => {
                problems.push(problem(
                    &path,
                    ProblemKind::Structure,
                    format!("listed in the index but unreadable; its keys are lost: {e}"),
                ));
                return;
            }
        }
    }
    let Some(seg) = segments.get(&g.segment_id) else {
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
            let nk = new_key.get_or_insert_with(|| key_at(segments, hint, loc));
            nk.is_some() && *nk == key_at(segments, hint, old)
        });
    }
}

/// Reads one whole index log into `index`; `Ok(None)` when it is absent,
/// `Ok(Some(Err(why)))` when its header is bad.
#[allow(clippy::too_many_arguments)]
fn read_log(
    dir: &Path,
    maps: &Arc<SegmentMaps>,
    path: &Path,
    segments: &mut BTreeMap<u32, Arc<Segment>>,
    index: &mut KeyIndex,
    hint: Option<Structure>,
    logged: &mut std::collections::HashSet<u32>,
    problems: &mut Vec<Problem>,
) -> Result<Option<std::result::Result<(format::ParsedLog, LogCursor), String>>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("open index", path)(e)),
    };
    let meta = file.metadata().map_err(Error::io("stat index", path))?;
    let len = meta.len();
    let mut found = Vec::new();
    let visit = |g: &format::Group, body: &[u8]| {
        logged.insert(g.segment_id);
        index_group(dir, maps, segments, index, hint, g, body, &mut found);
    };
    let parsed = format::read_index(file, len, visit).map_err(Error::io("read index", path))?;
    problems.extend(found);
    Ok(Some(parsed.map(|p| {
        let cursor = LogCursor {
            offset: p.valid_len,
            last_id: p.last_id,
            writer: p.writer,
            file_id: file_id(&meta),
        };
        (p, cursor)
    })))
}

/// Opens (and, for a writer, repairs) the cache at `dir`.
pub fn recover(dir: &Path, role: Role, maps: &Arc<SegmentMaps>) -> Result<Recovered> {
    let mut problems = Vec::new();
    let seg_dir = dir.join(SEGMENTS_DIR);
    match role {
        Role::Reader => {}
        Role::Single => {
            std::fs::create_dir_all(&seg_dir).map_err(Error::io("create", &seg_dir))?;
            remove_tmp(dir, &mut problems)?;
            remove_tmp(&seg_dir, &mut problems)?;
            remove_tmp(&dir.join(WRITERS_DIR), &mut problems)?;
        }
        Role::Multi(w) => {
            let wdir = dir.join(WRITERS_DIR);
            std::fs::create_dir_all(&seg_dir).map_err(Error::io("create", &seg_dir))?;
            std::fs::create_dir_all(&wdir).map_err(Error::io("create", &wdir))?;
            // Only this writer's own temp files: another writer's may be
            // in flight right now.
            remove_own_tmp(&seg_dir, w, &mut problems)?;
            remove_own_tmp(&wdir, w, &mut problems)?;
            durable_fs::remove_dead_temp_files(dir);
        }
    }

    // schema.json: its structure says tuple or list; a bad one is re-derived.
    let schema_path = dir.join(SCHEMA_FILE);
    let mut schema_bad = false;
    let mut schema = match crate::schema::read_schema_text(&schema_path) {
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
    let mut max_own_seen: Option<u32> = None;
    for (id, path) in list_segments(dir)? {
        max_seen = Some(id);
        if let Role::Multi(w) = role
            && format::writer_of(id) == w
        {
            max_own_seen = Some(id);
        }
        match Segment::open(&path, id, maps) {
            Ok(s) => {
                segments.insert(id, Arc::new(s));
            }
            Err(e) => problems.push(problem(&path, ProblemKind::Structure, e.to_string())),
        }
    }
    // The index logs: the shared one, then each writer's. Each is one
    // sequential read, hashes inserted as they stream by (no key strings
    // parsed); the order does not matter, the later location wins.
    let index_path = dir.join(INDEX_FILE);
    let writer_logs = list_writer_logs(dir)?;
    let multi = matches!(role, Role::Multi(_)) || !writer_logs.is_empty();
    let mut logged = std::collections::HashSet::new();
    // The entry count is at most the logs' bytes / 8: the table is sized
    // once, by real bytes on disk.
    let log_bytes: u64 = std::iter::once(&index_path)
        .chain(writer_logs.values())
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    let mut index = KeyIndex::with_entries(usize::try_from(log_bytes / 8).unwrap_or(0));
    let mut cursors: BTreeMap<PathBuf, LogCursor> = BTreeMap::new();
    let mut base_max: Option<u32> = None;
    let mut global_max: Option<u32> = None;
    let mut own: Option<(format::ParsedLog, LogCursor)> = None;
    let mut base_parsed = None;
    let logs = std::iter::once((None, index_path.clone()))
        .chain(writer_logs.iter().map(|(w, p)| (Some(*w), p.clone())));
    for (writer, path) in logs {
        let read = read_log(
            dir,
            maps,
            &path,
            &mut segments,
            &mut index,
            hint,
            &mut logged,
            &mut problems,
        )?;
        match read {
            None => {}
            Some(Ok((p, cursor))) if p.writer == writer => {
                if let Some(t) = &p.torn {
                    // Only a log's owner cuts its tail; to anyone else it
                    // may be a group being appended right now.
                    let owner = match writer {
                        None => role == Role::Single,
                        Some(w) => role == Role::Multi(w),
                    };
                    let what = if owner { "dropped" } else { "ignored" };
                    problems.push(problem(
                        &path,
                        ProblemKind::Interrupted,
                        format!("torn tail {what}: {t}"),
                    ));
                }
                global_max = global_max.max(p.last_id);
                if writer.is_none() {
                    base_max = p.last_id;
                    base_parsed = Some(p.clone());
                }
                cursors.insert(path.clone(), cursor.clone());
                if writer.is_some() && role == Role::Multi(writer.unwrap_or(u32::MAX)) {
                    own = Some((p, cursor));
                }
            }
            Some(Ok((p, _))) => problems.push(problem(
                &path,
                ProblemKind::Structure,
                format!(
                    "header names writer {:?}, the file name {writer:?}; ignored",
                    p.writer
                ),
            )),
            Some(Err(detail)) => problems.push(problem(
                &path,
                ProblemKind::Structure,
                if writer.is_none() {
                    format!("rebuilt from the segments: {detail}")
                } else {
                    format!("ignored (its writer rebuilds it when it reopens): {detail}")
                },
            )),
        }
    }
    let any_log = !cursors.is_empty();
    if let Role::Multi(w) = role
        && !any_log
        && segments.keys().any(|&id| format::writer_of(id) != w)
    {
        return Err(Error::InvalidInput(format!(
            "{}: segments without any index log (a torchcachex cache?): open it once \
             with a single writer to index it before writing with several",
            dir.display()
        )));
    }

    // Segments no log knows. A single-writer cache indexes the ones newer
    // than its log (all of them without a log) as it always did. In a
    // multi-writer cache only a segment's owner adopts it, so that every
    // reader gives the same answer whether or not a crashed writer comes
    // back: writer `w` adopts its own segments newer than its log and the
    // shared log; the single writer those newer than every log.
    let mut new_groups = Vec::new();
    let orphan_ids: Vec<u32> = segments
        .keys()
        .copied()
        .filter(|id| !logged.contains(id))
        .collect();
    let own_floor = own.as_ref().and_then(|(p, _)| p.last_id).max(base_max);
    for id in orphan_ids {
        let path = format::segment_path(dir, id);
        let adopt = if !multi {
            global_max.is_none_or(|m| id >= m)
        } else {
            match role {
                Role::Multi(w) => format::writer_of(id) == w && own_floor.is_none_or(|m| id >= m),
                Role::Single => global_max.is_none_or(|m| id >= m),
                Role::Reader => false,
            }
        };
        if !adopt {
            let detail = if global_max.is_some_and(|m| id < m) {
                "older than the index and not in it (left by compaction?); ignored"
            } else {
                "in no index log (a write in flight, or a crashed writer's; its writer \
                 indexes it when it reopens); ignored"
            };
            problems.push(problem(&path, ProblemKind::Stale, detail));
            segments.remove(&id);
            continue;
        }
        let Some(seg) = segments.get(&id).cloned() else {
            continue;
        };
        let decoded = match seg.decoded(hint) {
            Ok(d) => d,
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
                key_at(&segments, hint, old).as_deref() == Some(key)
            });
        }
        let content = match seg.content_hash() {
            Ok(c) => c,
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
        new_groups.push(format::encode_group(id, seg.file_len(), content, &hashes));
        if any_log {
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
        if role == Role::Single {
            durable_fs::write_atomic(&schema_path, to_schema_json(&d.schema).as_bytes())
                .map_err(Error::durable)?;
        }
    } else if schema_bad && role == Role::Single && schema.is_none() {
        // Nothing to derive it from: the first put writes a new one.
        let _ = std::fs::remove_file(&schema_path);
    }

    let (log, next_id) = match role {
        Role::Reader => (None, 0),
        Role::Single => {
            let mut log = match &base_parsed {
                Some(p) => IndexLog::open(&index_path, p.valid_len)?,
                None => IndexLog::create(&index_path, &format::encode_index_header(), &[])?,
            };
            for g in &new_groups {
                log.append(g)?;
            }
            let next = max_seen.max(global_max).map_or(0, |m| m.saturating_add(1));
            cursors.remove(&index_path);
            (Some(log), next)
        }
        Role::Multi(w) => {
            let path = dir.join(WRITERS_DIR).join(format::writer_log_name(w));
            let mut log = match &own {
                Some((p, _)) => IndexLog::open(&path, p.valid_len)?,
                None => IndexLog::create(&path, &format::encode_writer_log_header(w), &[])?,
            };
            for g in &new_groups {
                log.append(g)?;
            }
            cursors.remove(&path);
            let above = max_own_seen.max(own_floor);
            let next = format::next_writer_segment(w, above).ok_or_else(|| {
                Error::InvalidInput(format!(
                    "{}: segment ids of writer {w} exhausted; run compact()",
                    dir.display()
                ))
            })?;
            (Some(log), next)
        }
    };
    Ok(Recovered {
        schema,
        index,
        segments,
        log,
        next_id,
        problems,
        cursors,
        multi,
    })
}

/// Removes writer `w`'s leftover temp files in `dir`: its segments'
/// (`segment_<id>.arrow.tmp` with `id` of its residue class) and its log's.
fn remove_own_tmp(dir: &Path, w: u32, problems: &mut Vec<Problem>) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("list", dir)(e)),
    };
    let own_log = format!("{}{}", format::writer_log_name(w), format::TMP_SUFFIX);
    for e in entries {
        let e = e.map_err(Error::io("list", dir))?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let own_segment = name
            .strip_suffix(format::TMP_SUFFIX)
            .and_then(format::parse_segment_name)
            .is_some_and(|id| format::writer_of(id) == w);
        if own_segment || name == own_log {
            let path = e.path();
            match std::fs::remove_file(&path) {
                Ok(()) => problems.push(problem(
                    &path,
                    ProblemKind::Interrupted,
                    "leftover temp file removed",
                )),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("remove temp file", &path)(e)),
            }
        }
    }
    Ok(())
}

/// A structure hint for decoding, from a schema.
pub fn hint_of(schema: Option<&RecordSchema>) -> Option<Structure> {
    schema.map(|s| s.structure)
}

//! [`SegmentStore::compact`]: the live rows rewritten into fresh
//! segments, committed by one atomic rename of the index.

use std::collections::BTreeMap;
use std::sync::Arc;
use tensor_core::Value;

use crate::format::{self, INDEX_FILE};
use crate::index::{KeyIndex, Loc};
use crate::reader::Segment;
use crate::recover::list_writer_logs;
use crate::state::note_problem;
use crate::store::SegmentStore;
use crate::writer::{IndexLog, build_batch, split_runs, write_segment};
use crate::{Error, Result};

/// What [`SegmentStore::compact`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactReport {
    /// Segments before.
    pub segments_before: usize,
    /// Segments after.
    pub segments_after: usize,
    /// Rows kept.
    pub live_rows: usize,
    /// Dead (overwritten or unreadable) rows dropped.
    pub dropped_rows: usize,
}

impl SegmentStore {
    /// Rewrites the live rows into fresh segments of `flush_every` rows,
    /// drops dead rows and small segments, and switches to them with one
    /// atomic rename of the index. Handles opened before keep reading
    /// their old (mapped) segments.
    ///
    /// A multi-writer cache is compacted by a single-writer handle: its
    /// exclusive lock proves that no multi-writer is active (each holds
    /// the same lock shared while open). The compacted segments get ids
    /// above every old one and go to the shared log, which is the commit
    /// point; the writers' logs are removed after it (a crash in between
    /// leaves logs whose rows the newer compacted ones override), then
    /// the old segments.
    pub fn compact(&self) -> Result<CompactReport> {
        self.flush()?;
        let write = self.require_writer("compact")?;
        let inner = self.inner();
        let mut ws = write.lock();
        if ws.writer.is_some() {
            return Err(Error::InvalidInput(format!(
                "{}: a multi-writer handle cannot compact (other writers may be active); \
                 close every writer and compact with a single-writer handle",
                inner.dir.display()
            )));
        }
        let (schema, mut locs, old, total_rows) = {
            let st = inner.state.read();
            let Some(schema) = st.schema.clone() else {
                return Ok(CompactReport {
                    segments_before: st.segments.len(),
                    segments_after: st.segments.len(),
                    live_rows: 0,
                    dropped_rows: 0,
                });
            };
            let hint = Some(schema.structure);
            let locs: Vec<Loc> = st.index.locations().collect();
            let total: usize = st
                .segments
                .values()
                .filter_map(|s| s.decoded(hint).ok().map(|d| d.rows()))
                .sum();
            (schema, locs, st.segments.clone(), total)
        };
        locs.sort_unstable();
        let hint = Some(schema.structure);
        let mut records: Vec<(String, Value)> = Vec::with_capacity(locs.len());
        for loc in &locs {
            let Some(seg) = old.get(&loc.seg) else {
                continue;
            };
            let row = loc.row as usize;
            let rec = seg.decoded(hint).and_then(|d| {
                Ok((
                    d.key(row).map(str::to_owned),
                    d.record(&seg.path, row, schema.structure)?,
                ))
            });
            match rec {
                Ok((Some(k), r)) => records.push((k, r)),
                Ok((None, _)) => note_problem(
                    inner,
                    &seg.path,
                    format!("row {row}: null key; dropped by compact"),
                ),
                Err(e) => note_problem(inner, &seg.path, format!("dropped by compact: {e}")),
            }
        }
        let every = inner_flush_every(self);
        let mut groups = Vec::new();
        let mut new_segments = BTreeMap::new();
        let mut index = KeyIndex::with_entries(records.len());
        for chunk in records.chunks(every) {
            for run in split_runs(chunk, &schema) {
                let rs = &chunk[run];
                let id = ws.take_id(&inner.dir)?;
                let path = format::segment_path(&inner.dir, id);
                let rb = build_batch(&schema, rs).map_err(|e| Error::Arrow {
                    path: path.clone(),
                    source: e,
                })?;
                let (len, content) = write_segment(&inner.dir, id, &rb)?;
                let hashes: Vec<u64> = rs.iter().map(|(k, _)| format::key_hash(k)).collect();
                for (row, h) in hashes.iter().enumerate() {
                    // Keys are distinct here: every location was live.
                    index.insert(
                        *h,
                        Loc {
                            seg: id,
                            row: row as u32,
                        },
                        |_| false,
                    );
                }
                groups.push(format::encode_group(id, len, content, &hashes));
                new_segments.insert(id, Arc::new(Segment::open(&path, id, &inner.maps)?));
            }
        }
        let log = IndexLog::create(
            &inner.dir.join(INDEX_FILE),
            &format::encode_index_header(),
            &groups,
        )?;
        ws.log = log;
        // Committed: the writers' logs now only list rows the new
        // segments hold too.
        for path in list_writer_logs(&inner.dir)?.values() {
            durable_fs::remove_and_sync(path).map_err(Error::durable)?;
        }
        inner.cursors.lock().clear();
        let segments_after = new_segments.len();
        {
            let mut st = inner.state.write();
            st.index = index;
            st.segments = new_segments;
        }
        for id in old.keys() {
            let path = format::segment_path(&inner.dir, *id);
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(Error::io("remove compacted segment", &path)(e));
            }
        }
        durable_fs::sync_dir(&inner.dir.join(format::SEGMENTS_DIR)).map_err(Error::durable)?;
        Ok(CompactReport {
            segments_before: old.len(),
            segments_after,
            live_rows: records.len(),
            dropped_rows: total_rows.saturating_sub(records.len()),
        })
    }
}

fn inner_flush_every(store: &SegmentStore) -> usize {
    store.options().flush_every.max(1)
}

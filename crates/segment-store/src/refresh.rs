//! [`SegmentStore::refresh`]: what other writers committed since this
//! handle opened, read from the tails of their index logs.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crate::format::{self, INDEX_FILE, WRITERS_DIR};
use crate::recover::{LogCursor, Role, file_id, hint_of, index_group, list_writer_logs, recover};
use crate::store::SegmentStore;
use crate::{Error, Result};

impl SegmentStore {
    /// Makes what other writers committed since this handle opened (or
    /// last refreshed) visible, and returns how many segments that added.
    ///
    /// Cheap: it lists the `writers/` folder and reads each index log only
    /// from where it last stopped, so it costs O(new groups), not
    /// O(cache). A group still being appended is left for the next
    /// refresh. Only when the shared log was replaced or a log vanished
    /// (a compaction, which no writer can overlap) does it reread the
    /// whole cache. A handle sees its own writes without refreshing.
    pub fn refresh(&self) -> Result<usize> {
        let inner = self.inner();
        let dir = &inner.dir;
        let own_log: Option<PathBuf> = inner.write.as_ref().map(|w| match w.lock().writer {
            Some(id) => dir.join(WRITERS_DIR).join(format::writer_log_name(id)),
            None => dir.join(INDEX_FILE),
        });
        let mut cursors = inner.cursors.lock();
        let writer_logs = list_writer_logs(dir)?;
        let logs: Vec<(Option<u32>, PathBuf)> = std::iter::once((None, dir.join(INDEX_FILE)))
            .chain(writer_logs.into_iter().map(|(w, p)| (Some(w), p)))
            .filter(|(_, p)| Some(p) != own_log.as_ref())
            .collect();
        if logs.iter().any(|(w, _)| w.is_some()) {
            inner.multi.store(true, Ordering::Relaxed);
        }
        let mut reload = cursors.keys().any(|p| !logs.iter().any(|(_, q)| q == p));
        // (log, its file, its length, where to start, the cursor so far)
        let mut reads = Vec::new();
        for (writer, path) in &logs {
            let mut file = match File::open(path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io("open index", path)(e)),
            };
            let meta = file.metadata().map_err(Error::io("stat index", path))?;
            match cursors.get(path) {
                Some(c) if c.file_id != file_id(&meta) || meta.len() < c.offset => {
                    reload = true;
                    break;
                }
                Some(c) if meta.len() == c.offset => {}
                Some(c) => {
                    file.seek(SeekFrom::Start(c.offset))
                        .map_err(Error::io("seek index", path))?;
                    reads.push((path.clone(), file, meta.len(), Some(c.clone())));
                }
                None => {
                    let cursor = LogCursor {
                        offset: 0,
                        last_id: None,
                        writer: *writer,
                        file_id: file_id(&meta),
                    };
                    reads.push((path.clone(), file, meta.len(), Some(cursor)));
                }
            }
        }
        if reload {
            return self.reload(&mut cursors, own_log);
        }
        let mut added = 0;
        let mut problems = Vec::new();
        let mut st = inner.state.write();
        let hint = hint_of(st.schema.as_ref());
        let crate::state::State {
            index, segments, ..
        } = &mut *st;
        for (path, file, len, cursor) in reads {
            let Some(mut c) = cursor else { continue };
            index.reserve(usize::try_from((len - c.offset) / 8).unwrap_or(0));
            let visit = |g: &format::Group, body: &[u8]| {
                index_group(
                    dir,
                    &inner.maps,
                    segments,
                    index,
                    hint,
                    g,
                    body,
                    &mut problems,
                );
                added += 1;
            };
            let read = if c.offset == 0 {
                format::read_index(file, len, visit).map_err(Error::io("read index", &path))?
            } else {
                Ok(
                    format::read_groups(file, c.offset, len, c.last_id, c.writer, visit)
                        .map_err(Error::io("read index", &path))?,
                )
            };
            match read {
                // A torn tail here is most likely a group being appended:
                // the next refresh reads it once it is whole.
                Ok(p) => {
                    c.offset = p.valid_len;
                    c.last_id = p.last_id;
                    cursors.insert(path, c);
                }
                Err(detail) => problems.push(cache_check::Problem {
                    path,
                    kind: cache_check::ProblemKind::Structure,
                    detail: format!("ignored: {detail}"),
                }),
            }
        }
        drop(st);
        let mut all = inner.problems.lock();
        for p in problems {
            if !all.contains(&p) {
                all.push(p);
            }
        }
        Ok(added)
    }

    /// Rereads the whole cache (after a compaction replaced its logs).
    fn reload(
        &self,
        cursors: &mut std::collections::BTreeMap<PathBuf, LogCursor>,
        own_log: Option<PathBuf>,
    ) -> Result<usize> {
        let inner = self.inner();
        if own_log.is_some() {
            return Err(Error::InvalidInput(format!(
                "{}: the cache's index logs were replaced under a writer",
                inner.dir.display()
            )));
        }
        let rec = recover(&inner.dir, Role::Reader, &inner.maps)?;
        let added = rec.segments.len();
        {
            let mut st = inner.state.write();
            st.schema = rec.schema.or(st.schema.take());
            st.index = rec.index;
            st.segments = rec.segments;
        }
        *cursors = rec.cursors;
        inner.multi.store(rec.multi, Ordering::Relaxed);
        inner.problems.lock().extend(rec.problems);
        Ok(added)
    }
}

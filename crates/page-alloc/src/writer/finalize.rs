//! The crash-safe finalize: tables, header, fsync, footer, fsync, rename,
//! directory fsync — each a step the crash tests can stop after.

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use super::{FinalizeStep, PageWriter, WriteSummary};
use crate::format::{self, FOOTER_LEN, Header, round_up};
use crate::{Error, Result};

impl PageWriter {
    pub(super) fn run_finalize(
        mut self,
        stop: Option<FinalizeStep>,
    ) -> Result<Option<WriteSummary>> {
        self.check_poisoned()?;
        let path = self.path.clone();
        let tmp = self.tmp.clone();
        let tmp = tmp.as_path();
        let io = |op: &'static str| Error::io(op, tmp);
        let stop_at = |step: FinalizeStep| stop == Some(step);
        macro_rules! step_done {
            ($step:expr) => {
                if stop_at($step) {
                    self.keep_temp = true;
                    return Ok(None);
                }
            };
        }
        if let Some(run) = self.planner.open.take() {
            self.flush_buffered_run(run)?;
        }
        step_done!(FinalizeStep::FlushPage);
        let data_end = match self.runs.last() {
            Some(last) => self
                .run_start(last.first_page)
                .and_then(|s| s.checked_add(round_up(last.len, self.planner.align)?)),
            None => Some(self.data_offset),
        }
        .ok_or_else(|| Error::invalid(&path, "options", "file offsets overflow u64"))?;
        let mut tables = std::mem::take(&mut self.meta);
        for run in &self.runs {
            run.encode(&mut tables);
        }
        self.file
            .write_all_at(&tables, data_end)
            .map_err(io("write tables"))?;
        let tables_hash = *blake3::hash(&tables).as_bytes();
        step_done!(FinalizeStep::WriteTables);
        let meta_len = self.num_samples * self.row_len as u64;
        let footer_offset = data_end + tables.len() as u64;
        let header = Header {
            version: format::VERSION,
            page_size: self.opts.page_size,
            alignment: u64::from(self.opts.alignment),
            num_samples: self.num_samples,
            data_offset: self.data_offset,
            num_runs: self.runs.len() as u64,
            num_pages: self.planner.next_page,
            meta_offset: data_end,
            runs_offset: data_end + meta_len,
            footer_offset,
            tables_hash,
        };
        let header_bytes = header.encode(&self.schema);
        self.file
            .write_all_at(&header_bytes, 0)
            .map_err(io("write header"))?;
        step_done!(FinalizeStep::WriteHeader);
        self.file.sync_all().map_err(io("fsync"))?;
        step_done!(FinalizeStep::SyncData);
        let file_len = footer_offset + FOOTER_LEN as u64;
        let footer = format::encode_footer(
            blake3::hash(&header_bytes).as_bytes(),
            file_len,
            header.version,
        );
        self.file
            .write_all_at(&footer, footer_offset)
            .map_err(io("write footer"))?;
        // O_DIRECT rounds the last page up to 4 KiB; cut what lies beyond.
        self.file.set_len(file_len).map_err(io("set length"))?;
        step_done!(FinalizeStep::WriteFooter);
        self.file.sync_all().map_err(io("fsync"))?;
        step_done!(FinalizeStep::SyncFooter);
        // Not `durable_fs::commit_temp`: the format commits with a second
        // fsync (of the footer, above), and the rename and the directory
        // fsync are separate steps that the crash tests stop between.
        durable_fs::rename(&self.tmp, &path).map_err(Error::durable)?;
        self.keep_temp = true;
        step_done!(FinalizeStep::Rename);
        durable_fs::sync_parent_dir(&path).map_err(Error::durable)?;
        step_done!(FinalizeStep::SyncDir);
        Ok(Some(WriteSummary {
            path,
            num_samples: self.num_samples,
            num_runs: self.runs.len() as u64,
            num_pages: self.planner.next_page,
            data_bytes: self.data_bytes,
            file_len,
            direct_io: self.direct_ok.load(Ordering::Relaxed),
        }))
    }
}

impl Drop for PageWriter {
    fn drop(&mut self) {
        if !self.keep_temp {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

//! What a [`PageWriter`] is told ([`WriterOptions`]),
//! where a crash test stops it ([`FinalizeStep`]), and what it reports
//! ([`WriteSummary`]).

use std::path::PathBuf;

#[cfg(doc)]
use super::PageWriter;

use crate::format::{DEFAULT_ALIGNMENT, DEFAULT_PAGE_SIZE};

/// How a [`PageWriter`] lays out and writes its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterOptions {
    /// Page size in bytes: a power of two from 4 KiB to 4 GiB (default 64
    /// KiB, [`DEFAULT_PAGE_SIZE`]).
    pub page_size: u64,
    /// Alignment of every allocation: a power of two from 8 to 4096
    /// (default 512).
    pub alignment: u32,
    /// Write pages with `O_DIRECT` where the file system allows it; falls
    /// back to buffered writes (same bytes) where it does not.
    pub direct_io: bool,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            page_size: DEFAULT_PAGE_SIZE,
            alignment: DEFAULT_ALIGNMENT,
            direct_io: false,
        }
    }
}

impl WriterOptions {
    /// Sets the page size.
    pub fn page_size(mut self, page_size: u64) -> Self {
        self.page_size = page_size;
        self
    }

    /// Sets the allocation alignment.
    pub fn alignment(mut self, alignment: u32) -> Self {
        self.alignment = alignment;
        self
    }

    /// Turns `O_DIRECT` page writes on or off.
    pub fn direct_io(mut self, on: bool) -> Self {
        self.direct_io = on;
        self
    }
}

/// The steps of [`PageWriter::finalize`], in order (for crash tests with
/// [`PageWriter::finalize_interrupted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FinalizeStep {
    /// The open page is written.
    FlushPage,
    /// Metadata and run tables are written after the pages.
    WriteTables,
    /// The header is written at offset 0.
    WriteHeader,
    /// Pages, tables and header are fsynced.
    SyncData,
    /// The footer (the commit record) is written and the length fixed.
    WriteFooter,
    /// The footer is fsynced.
    SyncFooter,
    /// The temporary file is renamed to its final name.
    Rename,
    /// The directory is fsynced, making the rename durable.
    SyncDir,
}

impl FinalizeStep {
    /// Every step, in order.
    pub const ALL: [FinalizeStep; 8] = [
        FinalizeStep::FlushPage,
        FinalizeStep::WriteTables,
        FinalizeStep::WriteHeader,
        FinalizeStep::SyncData,
        FinalizeStep::WriteFooter,
        FinalizeStep::SyncFooter,
        FinalizeStep::Rename,
        FinalizeStep::SyncDir,
    ];
}

/// What a finished file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteSummary {
    /// The final path.
    pub path: PathBuf,
    /// Samples written.
    pub num_samples: u64,
    /// Runs (pages, or page runs of oversized samples).
    pub num_runs: u64,
    /// Pages spanned.
    pub num_pages: u64,
    /// Bytes of sample data (sum of allocation sizes).
    pub data_bytes: u64,
    /// Length of the file.
    pub file_len: u64,
    /// Whether pages went out with `O_DIRECT` (false after a fallback).
    pub direct_io: bool,
}

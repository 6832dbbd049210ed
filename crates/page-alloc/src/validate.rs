//! The checks past the header: every run and allocation, which opening
//! runs (stopping at the first problem) and [`crate::verify`] runs with
//! the page hashes (collecting many).

use std::path::Path;

use crate::Error;
use crate::format::{Layout, header_len_for, rd_u64, round_up};

/// Problems found while validating, with a cap: opening stops at the first,
/// [`crate::verify`] collects many.
pub(crate) struct Problems {
    pub list: Vec<Error>,
    limit: usize,
}

impl Problems {
    pub(crate) fn new(limit: usize) -> Problems {
        Problems {
            list: Vec::new(),
            limit,
        }
    }

    /// Records a problem; returns `false` once the cap is reached.
    pub(crate) fn push(&mut self, e: Error) -> bool {
        if self.list.len() < self.limit {
            self.list.push(e);
        }
        self.list.len() < self.limit
    }

    pub(crate) fn full(&self) -> bool {
        self.list.len() >= self.limit
    }
}

/// Walks every run and every allocation: runs contiguous and in order,
/// samples covered once, every `(ptr, size)` inside its run, aligned, in
/// order (no overlaps), arrays of their exact size. Fills `max_sizes` and
/// `data_bytes`.
pub(crate) fn check_runs(layout: &mut Layout, bytes: &[u8], path: &Path, problems: &mut Problems) {
    let h = layout.header.clone();
    let mut next_page: u64 = 0;
    let mut next_sample: u64 = 0;
    let mut data_end = h.data_offset;
    let var_fields: Vec<(usize, usize, Option<u64>)> = layout
        .schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| !f.ty.is_inline())
        .map(|(i, f)| (i, layout.row_offsets[i], f.ty.fixed_size()))
        .collect();
    let mut data_bytes: u64 = 0;
    for k in 0..h.num_runs {
        let Some(run) = layout.run(bytes, k) else {
            problems.push(Error::corrupt(
                path,
                format!("run {k} beyond the run table"),
            ));
            return;
        };
        let mut run_problem =
            |reason: String| problems.push(Error::corrupt(path, format!("run {k}: {reason}")));
        if run.first_page != next_page
            && !run_problem(format!(
                "starts at page {}, expected page {next_page}",
                run.first_page
            ))
        {
            return;
        }
        if run.first_sample != next_sample
            && !run_problem(format!(
                "starts at sample {}, expected sample {next_sample}",
                run.first_sample
            ))
        {
            return;
        }
        let capacity = run.pages.checked_mul(h.page_size);
        let start = layout.page_offset(run.first_page);
        let end = start.and_then(|s| s.checked_add(run.len));
        let sample_end = run.first_sample.checked_add(run.num_samples);
        let structural = if run.pages == 0 || run.num_samples == 0 {
            Some(format!(
                "{} pages, {} samples: both must be at least 1",
                run.pages, run.num_samples
            ))
        } else if run.pages > 1 && run.num_samples != 1 {
            Some(format!(
                "spans {} pages but holds {} samples (only a single oversized sample may)",
                run.pages, run.num_samples
            ))
        } else if capacity.is_none_or(|c| run.len > c) {
            Some(format!(
                "{} bytes used do not fit in {} pages of {}",
                run.len, run.pages, h.page_size
            ))
        } else if sample_end.is_none_or(|e| e > h.num_samples) {
            Some(format!(
                "samples {}+{} beyond the {} samples of the file",
                run.first_sample, run.num_samples, h.num_samples
            ))
        } else if end.is_none_or(|e| e > h.meta_offset) {
            Some(format!(
                "bytes from page {} (+{} B) run past the metadata table at {}",
                run.first_page, run.len, h.meta_offset
            ))
        } else {
            None
        };
        next_page = run.first_page.saturating_add(run.pages);
        next_sample = run.first_sample.saturating_add(run.num_samples);
        if let Some(reason) = structural {
            if !run_problem(reason) {
                return;
            }
            continue;
        }
        // Checked above: all of these are Some.
        let (Some(start), Some(end), Some(sample_end)) = (start, end, sample_end) else {
            return;
        };
        data_end = round_up(end, h.alignment).unwrap_or(u64::MAX);
        let mut prev_end = start;
        for s in run.first_sample..sample_end {
            let Some(row) = layout.row(bytes, s) else {
                problems.push(Error::corrupt(
                    path,
                    format!("sample {s}: row beyond the table"),
                ));
                return;
            };
            for &(f, at, fixed) in &var_fields {
                let ptr = rd_u64(row, at);
                let size = rd_u64(row, at + 8);
                let name = &layout.schema.fields()[f].name;
                let alloc_end = ptr.checked_add(size);
                let reason = if ptr < prev_end {
                    Some(format!(
                        "at {ptr} overlaps or precedes the previous allocation ending at {prev_end}"
                    ))
                } else if alloc_end.is_none_or(|e| e > end) {
                    Some(format!(
                        "{size} bytes at {ptr} run past its run (page {}, ends at {end})",
                        run.first_page
                    ))
                } else if size > 0 && !ptr.is_multiple_of(h.alignment) {
                    Some(format!("at {ptr} is not aligned to {}", h.alignment))
                } else if fixed.is_some_and(|n| n != size) {
                    Some(format!(
                        "has {size} bytes, its array type needs {}",
                        fixed.unwrap_or(0)
                    ))
                } else {
                    None
                };
                if let Some(reason) = reason {
                    if !problems.push(Error::corrupt(
                        path,
                        format!("sample {s} field {name:?}: allocation {reason}"),
                    )) {
                        return;
                    }
                    continue;
                }
                prev_end = alloc_end.unwrap_or(prev_end);
                data_bytes = data_bytes.saturating_add(size);
                if size > layout.max_sizes[f] {
                    layout.max_sizes[f] = size;
                }
            }
        }
    }
    if problems.full() {
        return;
    }
    if next_sample != h.num_samples {
        problems.push(Error::corrupt(
            path,
            format!(
                "runs hold {next_sample} samples, header says {}",
                h.num_samples
            ),
        ));
    }
    if next_page != h.num_pages {
        problems.push(Error::corrupt(
            path,
            format!("runs span {next_page} pages, header says {}", h.num_pages),
        ));
    }
    if data_end != h.meta_offset {
        problems.push(Error::corrupt(
            path,
            format!(
                "data pages end at {data_end}, metadata table recorded at {}",
                h.meta_offset
            ),
        ));
    }
    layout.data_bytes = data_bytes;
}

/// Hashes every run's bytes and compares with the run table (verify only:
/// this reads the whole file).
pub(crate) fn check_page_hashes(
    layout: &Layout,
    bytes: &[u8],
    path: &Path,
    problems: &mut Problems,
) {
    check_page_hashes_holding(layout, bytes, path, problems, &mut |_| Ok(()));
}

/// [`check_page_hashes`], calling `hold` with each byte range before it
/// reads it (the header's and tables' padding, each run with its page
/// slack) and keeping what it returns until that range is checked: a file
/// read through a local tier fetches and leases one range at a time. A
/// range `hold` fails on is a problem, and the check stops there.
pub(crate) fn check_page_hashes_holding<G>(
    layout: &Layout,
    bytes: &[u8],
    path: &Path,
    problems: &mut Problems,
    hold: &mut dyn FnMut(std::ops::Range<u64>) -> Result<G, Error>,
) {
    let mut held = |problems: &mut Problems, start: u64, end: u64| -> Option<G> {
        match hold(start..end.max(start)) {
            Ok(g) => Some(g),
            Err(e) => {
                problems.push(e);
                None
            }
        }
    };
    // Padding is not hashed, so it must be zero: then every byte of the
    // file is either checked by a hash or known.
    let zero_check = |problems: &mut Problems, start: u64, end: u64, what: &str| -> bool {
        let region = usize::try_from(start)
            .ok()
            .zip(usize::try_from(end).ok())
            .and_then(|(s, e)| bytes.get(s..e));
        match region.and_then(|r| r.iter().position(|&b| b != 0)) {
            Some(at) => problems.push(Error::corrupt(
                path,
                format!("byte {} of {what} padding is not zero", start + at as u64),
            )),
            None => true,
        }
    };
    let header_len = header_len_for(layout.schema.len()) as u64;
    let Some(guard) = held(problems, header_len, layout.header.data_offset) else {
        return;
    };
    if !zero_check(problems, header_len, layout.header.data_offset, "header") {
        return;
    }
    drop(guard);
    let pages_end = layout
        .header
        .num_pages
        .checked_mul(layout.header.page_size)
        .and_then(|n| n.checked_add(layout.header.data_offset));
    if let Some(end) = pages_end {
        let Some(guard) = held(problems, end, layout.header.meta_offset) else {
            return;
        };
        if !zero_check(problems, end, layout.header.meta_offset, "table") {
            return;
        }
        drop(guard);
    }
    for k in 0..layout.header.num_runs {
        let Some(run) = layout.run(bytes, k) else {
            return;
        };
        let slack = layout.page_offset(run.first_page).and_then(|s| {
            let used_end = s.checked_add(run.len)?;
            let run_end = s.checked_add(run.pages.checked_mul(layout.header.page_size)?)?;
            // The last page may be cut short: the tables follow its data.
            Some((used_end, run_end.min(layout.header.meta_offset)))
        });
        let start = layout.page_offset(run.first_page).unwrap_or(0);
        let end = slack.map_or(start, |(used_end, run_end)| used_end.max(run_end));
        let Some(_guard) = held(
            problems,
            start.min(bytes.len() as u64),
            end.min(bytes.len() as u64),
        ) else {
            return;
        };
        if let Some((used_end, run_end)) = slack
            && !zero_check(problems, used_end, run_end, "page")
        {
            return;
        }
        let range = layout
            .page_offset(run.first_page)
            .and_then(|s| Some((usize::try_from(s).ok()?, usize::try_from(run.len).ok()?)))
            .and_then(|(s, n)| bytes.get(s..s.checked_add(n)?));
        let Some(data) = range else {
            continue; // reported by check_runs
        };
        if blake3::hash(data).as_bytes() != &run.hash
            && !problems.push(Error::checksum(
                path,
                format!("run {k} (page {}, {} bytes): page", run.first_page, run.len),
            ))
        {
            return;
        }
    }
}

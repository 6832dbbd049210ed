//! The page allocator: samples placed in sample order, so the plan (and
//! the file's bytes) depend only on the samples' sizes.

use crate::format::round_up;

/// A run being planned: pages, bytes used, and the samples it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PlannedRun {
    pub(super) first_page: u64,
    pub(super) pages: u64,
    pub(super) len: u64,
    pub(super) first_sample: u64,
    pub(super) num_samples: u64,
}

/// The page allocator: places samples in sample order.
#[derive(Debug)]
pub(super) struct Planner {
    pub(super) page_size: u64,
    pub(super) align: u64,
    pub(super) next_page: u64,
    pub(super) open: Option<PlannedRun>,
}

impl Planner {
    /// Packs allocations of `sizes` from `start`; writes their offsets to
    /// `rel`; returns the end. Empty allocations take no space.
    fn pack(&self, start: u64, sizes: &[u64], rel: &mut [u64]) -> Option<u64> {
        let mut cursor = start;
        for (size, rel) in sizes.iter().zip(rel.iter_mut()) {
            if *size == 0 {
                *rel = cursor;
            } else {
                let at = round_up(cursor, self.align)?;
                *rel = at;
                cursor = at.checked_add(*size)?;
            }
        }
        Some(cursor)
    }

    /// Places sample `sample` (allocation sizes `sizes`); `rel` receives the
    /// offsets relative to the start of its run. Returns the run it closed
    /// to make room, if any.
    pub(super) fn place(
        &mut self,
        sample: u64,
        sizes: &[u64],
        rel: &mut [u64],
    ) -> std::result::Result<Option<PlannedRun>, String> {
        if let Some(open) = self.open.filter(|o| o.pages == 1)
            && let Some(end) = self
                .pack(open.len, sizes, rel)
                .filter(|e| *e <= self.page_size)
        {
            self.open = Some(PlannedRun {
                len: end,
                num_samples: open.num_samples + 1,
                ..open
            });
            return Ok(None);
        }
        let closed = self.open.take();
        let end = self
            .pack(0, sizes, rel)
            .ok_or("allocation sizes overflow u64")?;
        let pages = end.div_ceil(self.page_size).max(1);
        let first_page = self.next_page;
        self.next_page = first_page
            .checked_add(pages)
            .ok_or("page count overflows u64")?;
        self.open = Some(PlannedRun {
            first_page,
            pages,
            len: end,
            first_sample: sample,
            num_samples: 1,
        });
        Ok(closed)
    }
}

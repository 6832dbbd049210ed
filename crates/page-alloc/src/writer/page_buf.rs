//! The page buffer each writer thread fills: aligned for `O_DIRECT`.

use crate::format::DATA_ALIGN;

/// A page buffer whose bytes start at a 4 KiB boundary (for `O_DIRECT`).
#[derive(Debug, Default)]
pub(super) struct PageBuf {
    raw: Vec<u8>,
    start: usize,
    pub(super) len: usize,
}

impl PageBuf {
    /// Makes the buffer at least `len` bytes long (contents then undefined
    /// but initialised).
    pub(super) fn ensure(&mut self, len: usize) -> std::result::Result<(), String> {
        if self.len >= len {
            return Ok(());
        }
        let total = len
            .checked_add(DATA_ALIGN as usize)
            .ok_or("page buffer size overflows")?;
        let mut raw = Vec::new();
        raw.try_reserve_exact(total)
            .map_err(|e| format!("cannot allocate a {len}-byte page buffer: {e}"))?;
        raw.resize(total, 0);
        let start = raw.as_ptr().align_offset(DATA_ALIGN as usize);
        *self = PageBuf { raw, start, len };
        Ok(())
    }

    pub(super) fn bytes(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

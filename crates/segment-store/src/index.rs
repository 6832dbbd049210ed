//! The in-memory key index: an open-addressing table of 12-byte slots.
//!
//! A slot packs the top 40 bits of the key hash (the tag; 0 marks an empty
//! slot), a 32-bit segment id and a 24-bit row: multi-writer segment ids
//! interleave the writers (see [`crate::format::WRITER_STRIDE`]), so they
//! need the whole `u32`. The home slot is derived
//! from the tag, so the table can grow without the keys. A tag match is
//! only a candidate: readers confirm it against the `key` column of the
//! segment, so two keys with the same tag both stay findable.
//!
//! At the maximum load of 0.8 and growth by 1.5x the table holds between
//! 15 and 22.5 bytes per entry; opened with a known count it is sized to a
//! load of 0.65 (18.5 bytes per entry), which keeps probe runs short.

/// Largest row a location can hold.
pub const MAX_ROW: u32 = (1 << 24) - 1;

/// Where a key's latest record is: segment id and row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Loc {
    /// Segment id.
    pub seg: u32,
    /// Row in the segment.
    pub row: u32,
}

/// One packed slot: tag (40 bits), segment (32), row (24).
#[derive(Clone, Copy)]
struct Slot([u32; 3]);

impl Slot {
    fn pack(tag: u64, loc: Loc) -> Slot {
        let p = (u128::from(tag) << 56) | (u128::from(loc.seg) << 24) | u128::from(loc.row);
        Slot([(p >> 64) as u32, (p >> 32) as u32, p as u32])
    }
    fn packed(self) -> u128 {
        (u128::from(self.0[0]) << 64) | (u128::from(self.0[1]) << 32) | u128::from(self.0[2])
    }
    fn tag(self) -> u64 {
        (self.packed() >> 56) as u64
    }
    fn loc(self) -> Loc {
        let p = self.packed();
        Loc {
            seg: ((p >> 24) & 0xFFFF_FFFF) as u32,
            row: (p & 0xFF_FFFF) as u32,
        }
    }
    fn is_empty(self) -> bool {
        self.0[0] == 0 && self.0[1] >> 24 == 0
    }
}

fn tag_of(hash: u64) -> u64 {
    let t = hash >> 24;
    if t == 0 { 1 } else { t }
}

/// The table. See the module docs.
#[derive(Default)]
pub struct KeyIndex {
    /// Raw slots (see [`Slot`]); plain arrays so that a new table is
    /// zero-allocated (fresh pages, not written element by element).
    slots: Vec<[u32; 3]>,
    len: usize,
}

impl KeyIndex {
    /// An empty table with room for `n` entries at load 0.65.
    pub fn with_entries(n: usize) -> KeyIndex {
        let cap = n.saturating_mul(20) / 13 + 16;
        KeyIndex {
            slots: alloc_slots(cap),
            len: 0,
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table holds no key.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Resident bytes of the table.
    pub fn resident_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
    }

    fn home(&self, tag: u64) -> usize {
        (((tag >> 8) * self.slots.len() as u64) >> 32) as usize
    }

    /// Locations whose tag matches `hash`, oldest insertion first.
    pub fn candidates(&self, hash: u64) -> Candidates<'_> {
        let tag = tag_of(hash);
        Candidates {
            index: self,
            tag,
            pos: if self.slots.is_empty() {
                usize::MAX
            } else {
                self.home(tag)
            },
            seen: 0,
        }
    }

    /// Hints the CPU to fetch the home slot of `hash` (bulk inserts and
    /// batched lookups issue these ahead, so cache misses overlap).
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        if !self.slots.is_empty() {
            prefetch(&self.slots[self.home(tag_of(hash))]);
        }
    }

    /// Inserts `loc` for `hash`, replacing the location of the same key
    /// (`same_key(old)` says whether a tag-matching entry is that key) when
    /// `loc` is the later one: the greater (segment id, row) wins, whatever
    /// order the index logs are read in. Returns whether the key is new.
    pub fn insert(&mut self, hash: u64, loc: Loc, mut same_key: impl FnMut(Loc) -> bool) -> bool {
        if (self.len + 1) * 5 > self.slots.len() * 4 {
            self.grow();
        }
        let tag = tag_of(hash);
        let n = self.slots.len();
        let mut pos = self.home(tag);
        loop {
            let s = Slot(self.slots[pos]);
            if s.is_empty() {
                self.slots[pos] = Slot::pack(tag, loc).0;
                self.len += 1;
                return true;
            }
            if s.tag() == tag && same_key(s.loc()) {
                if loc > s.loc() {
                    self.slots[pos] = Slot::pack(tag, loc).0;
                }
                return false;
            }
            pos += 1;
            if pos == n {
                pos = 0;
            }
        }
    }

    /// Makes room for `more` entries beyond the current ones at load 0.65
    /// (one rehash now instead of several while they are inserted).
    pub fn reserve(&mut self, more: usize) {
        let cap = self.len.saturating_add(more).saturating_mul(20) / 13 + 16;
        if cap > self.slots.len() && (self.len + more) * 5 > self.slots.len() * 4 {
            self.grow_to(cap);
        }
    }

    fn grow(&mut self) {
        self.grow_to((self.slots.len() * 3 / 2).max(16));
    }

    fn grow_to(&mut self, cap: usize) {
        let old = std::mem::replace(&mut self.slots, alloc_slots(cap));
        for s in old.into_iter().map(Slot).filter(|s| !s.is_empty()) {
            let mut pos = self.home(s.tag());
            while !Slot(self.slots[pos]).is_empty() {
                pos += 1;
                if pos == cap {
                    pos = 0;
                }
            }
            self.slots[pos] = s.0;
        }
    }

    /// Every location, in no particular order.
    pub fn locations(&self) -> impl Iterator<Item = Loc> + '_ {
        self.slots
            .iter()
            .map(|&s| Slot(s))
            .filter(|s| !s.is_empty())
            .map(|s| s.loc())
    }
}

/// A zeroed slot array. Large tables ask Linux for transparent huge pages
/// before the first touch: one fault per 2 MiB instead of per 4 KiB (a
/// million-key table is ~18 MiB), and fewer TLB misses on lookups.
fn alloc_slots(cap: usize) -> Vec<[u32; 3]> {
    let v = vec![[0u32; 3]; cap];
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = v.as_ptr() as usize;
        let bytes = cap * std::mem::size_of::<[u32; 3]>();
        let lo = start.next_multiple_of(HUGE);
        let hi = (start + bytes) & !(HUGE - 1);
        if hi > lo {
            // SAFETY: [lo, hi) lies inside the vector's allocation, which
            // this function owns; MADV_HUGEPAGE only changes how the kernel
            // backs those pages, never their contents, and a failure (e.g.
            // THP disabled) leaves ordinary pages.
            unsafe {
                libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE);
            }
        }
    }
    v
}

/// A cache hint for the memory of `item` (no effect off x86_64).
#[inline]
pub(crate) fn prefetch<T: ?Sized>(item: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` is only a cache hint: it never faults, reads
    // nothing into the program and writes nothing; SSE, which it needs, is
    // part of the x86_64 baseline. The pointer comes from a live reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (item as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = item;
}

/// A cache hint for every 64-byte line that `bytes` spans, four lines per
/// loop turn, stepping by address rather than walking the slice in chunks,
/// so the loop's own work stays small beside the hints it issues.
#[inline]
pub(crate) fn prefetch_lines(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: as in `prefetch`: only a hint, which never faults
        // whatever the address (here always the start of a line of `bytes`).
        let hint = |line: usize| unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line as *const i8,
            );
        };
        let end = bytes.as_ptr() as usize + bytes.len();
        let mut line = bytes.as_ptr() as usize & !63;
        while line + 192 < end {
            hint(line);
            hint(line + 64);
            hint(line + 128);
            hint(line + 192);
            line += 256;
        }
        while line < end {
            hint(line);
            line += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Iterator of [`KeyIndex::candidates`].
pub struct Candidates<'a> {
    index: &'a KeyIndex,
    tag: u64,
    pos: usize,
    seen: usize,
}

impl Iterator for Candidates<'_> {
    type Item = Loc;
    fn next(&mut self) -> Option<Loc> {
        let n = self.index.slots.len();
        while self.pos != usize::MAX && self.seen < n {
            let s = Slot(self.index.slots[self.pos]);
            if s.is_empty() {
                self.pos = usize::MAX;
                return None;
            }
            self.pos += 1;
            if self.pos == n {
                self.pos = 0;
            }
            self.seen += 1;
            if s.tag() == self.tag {
                return Some(s.loc());
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_replace_grow() {
        let mut ix = KeyIndex::with_entries(0);
        for i in 0..10_000u64 {
            let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            assert!(ix.insert(
                h,
                Loc {
                    seg: 1,
                    row: i as u32
                },
                |_| true
            ));
        }
        assert_eq!(ix.len(), 10_000);
        let h = 7u64.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        assert!(!ix.insert(h, Loc { seg: 2, row: 0 }, |_| true));
        assert_eq!(
            ix.candidates(h).collect::<Vec<_>>(),
            vec![Loc { seg: 2, row: 0 }]
        );
        // A different key with the same tag is kept beside the first.
        assert!(ix.insert(h, Loc { seg: 3, row: 5 }, |_| false));
        assert_eq!(ix.candidates(h).count(), 2);
        // An earlier location of a key never replaces a later one.
        assert!(!ix.insert(h, Loc { seg: 1, row: 9 }, |l| l.seg == 2));
        assert!(ix.candidates(h).any(|l| l == Loc { seg: 2, row: 0 }));
        // Segment ids use all 32 bits.
        let big = Loc {
            seg: u32::MAX,
            row: MAX_ROW,
        };
        let hb = 0xABCD_EF01_2345_6789;
        assert!(ix.insert(hb, big, |_| false));
        assert_eq!(ix.candidates(hb).collect::<Vec<_>>(), vec![big]);
        assert!(ix.resident_bytes() / ix.len() <= 24);
    }
}

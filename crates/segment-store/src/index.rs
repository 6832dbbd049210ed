//! The in-memory key index: an open-addressing table of 12-byte slots.
//!
//! A slot packs the top 48 bits of the key hash (the tag; 0 marks an empty
//! slot), a 24-bit segment id and a 24-bit row. The home slot is derived
//! from the tag, so the table can grow without the keys. A tag match is
//! only a candidate: readers confirm it against the `key` column of the
//! segment, so two keys with the same tag both stay findable.
//!
//! At the maximum load of 0.8 and growth by 1.5x the table holds between
//! 15 and 22.5 bytes per entry; opened with a known count it is sized to a
//! load of 0.75 (16 bytes per entry).

/// Largest segment id a location can hold.
pub const MAX_SEGMENT_ID: u32 = (1 << 24) - 1;
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

#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Slot([u32; 3]);

impl Slot {
    fn pack(tag: u64, loc: Loc) -> Slot {
        let p = (u128::from(tag) << 48) | (u128::from(loc.seg) << 24) | u128::from(loc.row);
        Slot([(p >> 64) as u32, (p >> 32) as u32, p as u32])
    }
    fn packed(self) -> u128 {
        (u128::from(self.0[0]) << 64) | (u128::from(self.0[1]) << 32) | u128::from(self.0[2])
    }
    fn tag(self) -> u64 {
        (self.packed() >> 48) as u64
    }
    fn loc(self) -> Loc {
        let p = self.packed();
        Loc {
            seg: ((p >> 24) & 0xFF_FFFF) as u32,
            row: (p & 0xFF_FFFF) as u32,
        }
    }
    fn is_empty(self) -> bool {
        self.0[0] == 0 && self.0[1] >> 16 == 0
    }
}

fn tag_of(hash: u64) -> u64 {
    let t = hash >> 16;
    if t == 0 { 1 } else { t }
}

/// The table. See the module docs.
#[derive(Default)]
pub struct KeyIndex {
    slots: Vec<Slot>,
    len: usize,
}

impl KeyIndex {
    /// An empty table with room for `n` entries at load 0.75.
    pub fn with_entries(n: usize) -> KeyIndex {
        let cap = n.saturating_mul(4) / 3 + 16;
        KeyIndex {
            slots: vec![Slot::default(); cap],
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
        (((tag >> 16) * self.slots.len() as u64) >> 32) as usize
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

    /// Inserts `loc` for `hash`, replacing the location of the same key
    /// (`same_key(old)` says whether a tag-matching entry is that key).
    /// Returns whether the key is new.
    pub fn insert(&mut self, hash: u64, loc: Loc, mut same_key: impl FnMut(Loc) -> bool) -> bool {
        if (self.len + 1) * 5 > self.slots.len() * 4 {
            self.grow();
        }
        let tag = tag_of(hash);
        let n = self.slots.len();
        let mut pos = self.home(tag);
        loop {
            let s = self.slots[pos];
            if s.is_empty() {
                self.slots[pos] = Slot::pack(tag, loc);
                self.len += 1;
                return true;
            }
            if s.tag() == tag && same_key(s.loc()) {
                self.slots[pos] = Slot::pack(tag, loc);
                return false;
            }
            pos += 1;
            if pos == n {
                pos = 0;
            }
        }
    }

    fn grow(&mut self) {
        let cap = (self.slots.len() * 3 / 2).max(16);
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); cap]);
        for s in old.into_iter().filter(|s| !s.is_empty()) {
            let mut pos = self.home(s.tag());
            while !self.slots[pos].is_empty() {
                pos += 1;
                if pos == cap {
                    pos = 0;
                }
            }
            self.slots[pos] = s;
        }
    }

    /// Every location, in no particular order.
    pub fn locations(&self) -> impl Iterator<Item = Loc> + '_ {
        self.slots.iter().filter(|s| !s.is_empty()).map(|s| s.loc())
    }
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
            let s = self.index.slots[self.pos];
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
        assert!(ix.resident_bytes() / ix.len() <= 24);
    }
}

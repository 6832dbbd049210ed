//! The memory maps a store keeps: a bounded set of live mappings.
//!
//! Linux allows a process 65,530 maps by default (`vm.max_map_count`), and
//! a cache flushed one record at a time has more segments than that. So a
//! store maps a segment when a read needs it and keeps at most
//! [`Options::max_maps`](crate::Options::max_maps) mappings; beyond that it
//! unmaps the least recently used ones (CLOCK: one reference bit per
//! mapping, so a hit costs an atomic store rather than a shared lock). The
//! stores of one process also share a ceiling, half the kernel's limit,
//! leaving the other half to everything else the process maps (other
//! cachex stores, libraries, thread stacks); a store past that ceiling
//! unmaps its own least recently used mappings first.
//!
//! Unmapping only drops this set's reference: the values handed out hold
//! their own reference to the mapping (an `Arc` inside the Arrow buffers),
//! so a record read before keeps its bytes.
//!
//! This file knows nothing of segments: it holds any `T` that owns a
//! mapping.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;

/// Mappings held by every [`Maps`] of the process.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The most mappings every [`Maps`] of the process holds together: half of
/// `vm.max_map_count` (65,530 when it cannot be read).
pub fn process_ceiling() -> usize {
    static CEILING: OnceLock<usize> = OnceLock::new();
    *CEILING.get_or_init(|| {
        let limit = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(65_530);
        (limit / 2).max(1)
    })
}

/// One thing that may be mapped (a segment): its mapping while it has one.
pub struct Slot<T> {
    value: Mutex<Option<Arc<T>>>,
    /// CLOCK's reference bit: set by each use, cleared as the hand passes.
    used: AtomicBool,
}

impl<T> Slot<T> {
    /// An unmapped slot.
    pub fn new() -> Arc<Slot<T>> {
        Arc::new(Slot {
            value: Mutex::new(None),
            used: AtomicBool::new(false),
        })
    }
}

/// The bounded set of one store's live mappings.
pub struct Maps<T> {
    cap: usize,
    ring: Mutex<Ring<T>>,
}

/// The mapped slots, in the order the CLOCK hand visits them. A slot whose
/// owner was dropped stays (counted) until the hand passes it.
struct Ring<T> {
    slots: Vec<Weak<Slot<T>>>,
    hand: usize,
}

impl<T> Maps<T> {
    /// A set of at most `cap` mappings (at least one).
    pub fn new(cap: usize) -> Arc<Maps<T>> {
        Arc::new(Maps {
            cap: cap.max(1),
            ring: Mutex::new(Ring {
                slots: Vec::new(),
                hand: 0,
            }),
        })
    }

    /// Whether one more mapping fits without unmapping another.
    pub fn has_room(&self) -> bool {
        self.ring.lock().slots.len() < self.cap && LIVE.load(Ordering::Relaxed) < process_ceiling()
    }

    /// Mappings this set holds (including those of slots dropped since).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ring.lock().slots.len()
    }

    /// The slot's value, made by `map` when the slot holds none; making one
    /// unmaps the least recently used others beyond the bounds first.
    pub fn get_or_map<E>(
        &self,
        slot: &Arc<Slot<T>>,
        map: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E> {
        slot.used.store(true, Ordering::Relaxed);
        let mut value = slot.value.lock();
        if let Some(v) = &*value {
            return Ok(v.clone());
        }
        let v = Arc::new(map()?);
        let unmapped = self.admit(slot);
        *value = Some(v.clone());
        drop(value);
        // Unmapped outside every lock.
        drop(unmapped);
        Ok(v)
    }

    /// Enters `slot` (whose lock the caller holds) into the ring, taking
    /// out others while the ring is full; returns what they held.
    fn admit(&self, slot: &Arc<Slot<T>>) -> Vec<Arc<T>> {
        let mut ring = self.ring.lock();
        let mut unmapped = Vec::new();
        // Two turns of the hand clear every reference bit and visit every
        // slot twice; a slot busy both times is left mapped, and this one
        // goes over the bound rather than wait.
        let mut steps = 2 * ring.slots.len() + 1;
        while steps > 0
            && !ring.slots.is_empty()
            && (ring.slots.len() >= self.cap || LIVE.load(Ordering::Relaxed) >= process_ceiling())
        {
            steps -= 1;
            if let Some(v) = ring.step() {
                unmapped.push(v);
            }
        }
        ring.slots.push(Arc::downgrade(slot));
        LIVE.fetch_add(1, Ordering::Relaxed);
        unmapped
    }
}

impl<T> Ring<T> {
    /// Moves the hand one slot: takes out a slot that is gone or was not
    /// used since the hand last passed (returning its mapping), clears the
    /// bit of one that was.
    fn step(&mut self) -> Option<Arc<T>> {
        if self.hand >= self.slots.len() {
            self.hand = 0;
        }
        let Some(slot) = self.slots[self.hand].upgrade() else {
            self.take_out();
            return None;
        };
        if slot.used.swap(false, Ordering::Relaxed) {
            self.hand += 1;
            return None;
        }
        // Never wait on a slot under the ring's lock: whoever holds it may
        // be waiting for the ring (see `get_or_map`). A busy slot is in use.
        let Some(mut value) = slot.value.try_lock() else {
            self.hand += 1;
            return None;
        };
        let v = value.take();
        drop(value);
        self.take_out();
        v
    }

    fn take_out(&mut self) {
        self.slots.swap_remove(self.hand);
        LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<T> Drop for Maps<T> {
    fn drop(&mut self) {
        LIVE.fetch_sub(self.ring.get_mut().slots.len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(maps: &Maps<u32>, slot: &Arc<Slot<u32>>, v: u32) -> Arc<u32> {
        maps.get_or_map::<()>(slot, || Ok(v)).unwrap()
    }

    #[test]
    fn the_least_recently_used_go_first_and_values_outlive_their_slot() {
        let maps = Maps::new(3);
        let slots: Vec<_> = (0..5).map(|_| Slot::new()).collect();
        let first = get(&maps, &slots[0], 0);
        get(&maps, &slots[1], 1);
        get(&maps, &slots[2], 2);
        // A fourth: the hand clears every bit, then takes out slot 0.
        get(&maps, &slots[3], 3);
        assert_eq!(maps.len(), 3);
        assert!(slots[0].value.lock().is_none());
        // The value handed out before lives on.
        assert_eq!(*first, 0);
        // Slot 2 used again: 1 goes before it.
        get(&maps, &slots[2], 2);
        get(&maps, &slots[4], 4);
        assert!(slots[1].value.lock().is_none());
        assert!(slots[2].value.lock().is_some());
        assert_eq!(maps.len(), 3);
    }

    #[test]
    fn dropped_slots_leave_the_count_as_the_hand_passes() {
        let maps = Maps::new(2);
        let a = Slot::new();
        get(&maps, &a, 1);
        drop(a);
        let b = Slot::new();
        get(&maps, &b, 2);
        let c = Slot::new();
        get(&maps, &c, 3);
        assert_eq!(maps.len(), 2);
        assert!(b.value.lock().is_some());
        assert!(c.value.lock().is_some());
    }

    #[test]
    fn a_failed_map_leaves_nothing() {
        let maps: Arc<Maps<u32>> = Maps::new(2);
        let a = Slot::new();
        assert!(maps.get_or_map(&a, || Err("no")).is_err());
        assert_eq!(maps.len(), 0);
        assert!(maps.has_room());
    }
}

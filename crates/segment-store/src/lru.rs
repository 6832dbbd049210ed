//! A least-recently-used record cache bounded in bytes.
//!
//! Entries sit in a doubly linked list threaded through a slab (most
//! recently used at the head), so a hit, an insert and an eviction each
//! cost O(1): one hash lookup and a few index writes. Each key is
//! allocated once, shared by the map and its slot.

use std::collections::HashMap;
use std::sync::Arc;
use tensor_core::Value;

/// No slot (the end of the list).
const NIL: usize = usize::MAX;

struct Slot {
    key: Arc<str>,
    record: Value,
    size: usize,
    /// Toward the most recently used.
    prev: usize,
    /// Toward the least recently used.
    next: usize,
}

/// The LRU. A capacity of 0 disables it.
pub struct Lru {
    cap: usize,
    bytes: usize,
    map: HashMap<Arc<str>, usize>,
    /// Live entries are `Some`; freed ones are listed in `free`.
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    /// Most recently used.
    head: usize,
    /// Least recently used: the next to go.
    tail: usize,
}

impl Lru {
    /// An empty LRU holding at most `cap` bytes.
    pub fn new(cap: usize) -> Lru {
        Lru {
            cap,
            bytes: 0,
            map: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The record of `key`, marked most recently used.
    pub fn get(&mut self, key: &str) -> Option<Value> {
        let i = *self.map.get(key)?;
        self.unlink(i);
        self.push_front(i);
        self.slots[i].as_ref().map(|s| s.record.clone())
    }

    /// Drops `key`'s record, if held.
    pub fn remove(&mut self, key: &str) {
        if let Some(i) = self.map.remove(key) {
            self.release(i);
        }
    }

    /// Stores `record` under `key`, evicting the least recently used.
    pub fn put(&mut self, key: &str, record: &Value) {
        if self.cap == 0 {
            return;
        }
        let old = self.map.remove(key);
        if let Some(i) = old {
            self.release(i);
        }
        let size = record.byte_len() + key.len();
        if size > self.cap {
            return;
        }
        let key: Arc<str> = Arc::from(key);
        let slot = Slot {
            key: Arc::clone(&key),
            record: record.clone(),
            size,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        self.push_front(i);
        self.map.insert(key, i);
        self.bytes += size;
        while self.bytes > self.cap && self.tail != NIL {
            let last = self.tail;
            if let Some(s) = self.slots[last].as_ref() {
                let key = Arc::clone(&s.key);
                self.map.remove(&key);
            }
            self.release(last);
        }
    }

    /// Takes slot `i` out of the list and frees it (its record dropped).
    fn release(&mut self, i: usize) {
        self.unlink(i);
        if let Some(s) = self.slots[i].take() {
            self.bytes -= s.size;
            self.free.push(i);
        }
    }

    fn links(&self, i: usize) -> (usize, usize) {
        self.slots[i]
            .as_ref()
            .map_or((NIL, NIL), |s| (s.prev, s.next))
    }

    fn set_prev(&mut self, i: usize, prev: usize) {
        if let Some(s) = self.slots[i].as_mut() {
            s.prev = prev;
        }
    }

    fn set_next(&mut self, i: usize, next: usize) {
        if let Some(s) = self.slots[i].as_mut() {
            s.next = next;
        }
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = self.links(i);
        if prev == NIL {
            if self.head == i {
                self.head = next;
            }
        } else {
            self.set_next(prev, next);
        }
        if next == NIL {
            if self.tail == i {
                self.tail = prev;
            }
        } else {
            self.set_prev(next, prev);
        }
        self.set_prev(i, NIL);
        self.set_next(i, NIL);
    }

    fn push_front(&mut self, i: usize) {
        let old = self.head;
        self.set_next(i, old);
        self.set_prev(i, NIL);
        if old != NIL {
            self.set_prev(old, i);
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensor_core::Tensor;

    /// A record of `n` f32s (4n bytes).
    fn rec(n: usize) -> Value {
        Value::from(Tensor::from_vec([n], vec![n as f32; n]).unwrap())
    }

    fn held(lru: &mut Lru, keys: &[&str]) -> Vec<bool> {
        keys.iter().map(|k| lru.map.contains_key(*k)).collect()
    }

    #[test]
    fn evicts_the_least_recently_used_and_counts_bytes() {
        // Each entry: 40 bytes of record + 1 byte of key.
        let mut lru = Lru::new(3 * 41);
        for k in ["a", "b", "c"] {
            lru.put(k, &rec(10));
        }
        assert_eq!((lru.len(), lru.bytes()), (3, 123));
        assert!(lru.get("a").is_some()); // a is now the most recent
        lru.put("d", &rec(10));
        assert_eq!(
            held(&mut lru, &["a", "b", "c", "d"]),
            [true, false, true, true]
        );
        lru.put("e", &rec(10));
        assert_eq!(
            held(&mut lru, &["a", "c", "d", "e"]),
            [true, false, true, true]
        );
        assert_eq!((lru.len(), lru.bytes()), (3, 123));
    }

    #[test]
    fn a_second_put_replaces_and_an_oversized_record_is_not_kept() {
        let mut lru = Lru::new(100);
        lru.put("a", &rec(10));
        lru.put("a", &rec(20));
        assert_eq!((lru.len(), lru.bytes()), (1, 81));
        let got = lru.get("a").unwrap();
        assert_eq!(got.byte_len(), 80);
        // Too big to keep: the old entry goes too (it was replaced).
        lru.put("a", &rec(30));
        assert_eq!((lru.len(), lru.bytes()), (0, 0));
        assert!(lru.get("a").is_none());
        // One large entry evicts every other.
        lru.put("b", &rec(5));
        lru.put("c", &rec(5));
        lru.put("d", &rec(24));
        assert_eq!(held(&mut lru, &["b", "c", "d"]), [false, false, true]);
        assert_eq!(lru.bytes(), 97);
    }

    #[test]
    fn remove_forgets_a_key_and_frees_its_bytes() {
        let mut lru = Lru::new(1000);
        lru.put("a", &rec(10));
        lru.put("b", &rec(10));
        lru.remove("a");
        lru.remove("never");
        assert_eq!((lru.len(), lru.bytes()), (1, 41));
        assert_eq!(held(&mut lru, &["a", "b"]), [false, true]);
        // The freed slot is reused, and the list still evicts in order.
        lru.put("c", &rec(10));
        assert_eq!(lru.len(), 2);
    }

    #[test]
    fn capacity_zero_keeps_nothing_and_slots_are_reused() {
        let mut off = Lru::new(0);
        off.put("a", &rec(1));
        assert_eq!(off.len(), 0);
        let mut lru = Lru::new(2 * 41);
        for i in 0..1000 {
            lru.put(&format!("{}", i % 10), &rec(10));
            assert!(lru.len() <= 2 && lru.bytes() <= 82);
        }
        assert!(lru.slots.len() <= 3, "{} slots", lru.slots.len());
        // The list and the map agree: walking from the head finds every key.
        let mut walked = 0;
        let mut i = lru.head;
        while i != NIL {
            walked += 1;
            i = lru.links(i).1;
        }
        assert_eq!(walked, lru.len());
    }
}

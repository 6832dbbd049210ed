//! A least-recently-used record cache bounded in bytes.

use std::collections::{BTreeMap, HashMap};

use crate::Record;

/// The LRU. A capacity of 0 disables it.
#[derive(Default)]
pub struct Lru {
    cap: usize,
    bytes: usize,
    tick: u64,
    map: HashMap<String, (Record, u64, usize)>,
    order: BTreeMap<u64, String>,
}

impl Lru {
    /// An empty LRU holding at most `cap` bytes.
    pub fn new(cap: usize) -> Lru {
        Lru {
            cap,
            ..Lru::default()
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
    pub fn get(&mut self, key: &str) -> Option<Record> {
        self.tick += 1;
        let tick = self.tick;
        let (rec, t, _) = self.map.get_mut(key)?;
        let old = std::mem::replace(t, tick);
        let rec = rec.clone();
        if let Some(k) = self.order.remove(&old) {
            self.order.insert(tick, k);
        }
        Some(rec)
    }

    /// Stores `record` under `key`, evicting the least recently used.
    pub fn put(&mut self, key: &str, record: &Record) {
        if self.cap == 0 {
            return;
        }
        if let Some((_, t, size)) = self.map.remove(key) {
            self.order.remove(&t);
            self.bytes -= size;
        }
        let size = record.byte_len() + key.len();
        if size > self.cap {
            return;
        }
        self.tick += 1;
        self.map
            .insert(key.to_owned(), (record.clone(), self.tick, size));
        self.order.insert(self.tick, key.to_owned());
        self.bytes += size;
        while self.bytes > self.cap {
            let Some((_, k)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, _, s)) = self.map.remove(&k) {
                self.bytes -= s;
            }
        }
    }
}

//! The order in which the tier frees space: a pure function of what
//! could go, so that the rule is tested against a model apart from the
//! files it is applied to.
//!
//! A candidate is a whole local copy (an object no reader has open) or
//! one present block of a sparse copy. Three classes, in this order:
//!
//! 1. whole copies no live plan reads again, least recently used first
//!    (the tier without a plan is the LRU it always was);
//! 2. blocks no live plan reads again, least recently used first;
//! 3. what a plan reads again, the farthest next use first (Belady's
//!    rule: with the order of the epoch known, evicting the block needed
//!    furthest ahead fetches the fewest blocks again). First in it come
//!    the blocks of an object a live plan reads that the plan does not
//!    read within the two epochs it covers ([`NEVER`]): known idle, not
//!    merely unknown.
//!
//! A read that must make room may take any of them. A prefetch may take
//! whole idle copies and planned candidates needed strictly later than
//! the block it fetches, never an unplanned block of an open object: a
//! prefetch never evicts what is needed sooner than its own block.
//! Protected candidates (a leased block, an object taken whole by a
//! reader, a block whose range cannot be punched) are never chosen.

use std::rc::Rc;

/// Something the tier could free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The object's file-name key (shared by the candidates of its blocks).
    pub(crate) key: Rc<str>,
    /// `None`: the whole copy (all its files); `Some(b)`: block `b` of a
    /// sparse copy.
    pub(crate) block: Option<u64>,
    /// Allocated bytes freed when it goes.
    pub(crate) bytes: u64,
    /// When it was last used; larger is more recent (a copy's mtime in
    /// nanoseconds, a block's touch clock).
    pub(crate) last_use: u64,
    /// The node's next use, in batches from now (0: in use), or `None`
    /// when no live plan reads it again.
    pub(crate) next_use: Option<u64>,
    /// Never chosen: a leased block, an object a reader takes whole, a
    /// block that cannot be punched.
    pub(crate) protected: bool,
}

/// The next use of a block of an object some live plan reads, when no
/// plan reads that block within the epochs it covers: the farthest there
/// is, so a prefetch may take it (an unplanned block of an open object it
/// may not: without a plan nothing says it is idle).
pub(crate) const NEVER: u64 = u64::MAX;

/// Whether no live plan reads `c` within the epochs it covers.
fn unplanned(c: &Candidate) -> bool {
    c.next_use.is_none_or(|d| d == NEVER)
}

/// Why room is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// A read needs the bytes now: anything unprotected may go.
    Read,
    /// A prefetch of a block whose own next use is `distance` batches
    /// ahead (`u64::MAX` when no plan reads it).
    Prefetch {
        /// The prefetched block's next use.
        distance: u64,
    },
}

/// Where a candidate falls in the order, `None` when `admit` may not
/// take it: (class, key within the class; smaller goes first).
fn rank(c: &Candidate, admit: Admit) -> Option<(u8, u64)> {
    if c.protected {
        return None;
    }
    let (class, key) = match (c.next_use, c.block) {
        (None, None) => (0, c.last_use),
        (None, Some(_)) => (1, c.last_use),
        (Some(d), _) => (2, u64::MAX - d),
    };
    let allowed = match admit {
        Admit::Read => true,
        Admit::Prefetch { distance } => match class {
            0 => true,
            1 => false,
            _ => c.next_use.is_some_and(|d| d > distance),
        },
    };
    allowed.then_some((class, key))
}

/// The candidates to free, as indices into `cands` in eviction order:
/// the shortest prefix of the order whose bytes reach `need`, or every
/// candidate `admit` may take when they cannot; then, up to `need +
/// extra` bytes, the unplanned candidates that follow (no live plan reads
/// them again, so freeing them now fetches nothing more than freeing them
/// later would: slack that spares the next passes without costing the
/// plan a block). Ties fall to the key and block (then the candidates'
/// order), so the choice is the same in every process.
pub(crate) fn choose(cands: &[Candidate], need: u64, extra: u64, admit: Admit) -> Vec<usize> {
    let mut chosen = Vec::new();
    if need == 0 {
        return chosen;
    }
    // Sorted by integers alone: each object key by its rank among the
    // keys (a pass has thousands of blocks of a few objects, and keys
    // that share long prefixes), a block as 1 + its index (a whole copy
    // as 0, before its blocks).
    let mut keys: Vec<&str> = Vec::new();
    for c in cands {
        if keys.last() != Some(&&*c.key) {
            keys.push(&c.key);
        }
    }
    keys.sort_unstable();
    keys.dedup();
    let mut order: Vec<(u8, u64, usize, u64, usize)> = cands
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let (class, key) = rank(c, admit)?;
            let object = keys.binary_search(&&*c.key).unwrap_or(0);
            let block = c.block.map_or(0, |b| b.saturating_add(1));
            Some((class, key, object, block, i))
        })
        .collect();
    order.sort_unstable();
    let mut freed = 0u64;
    for (_, _, _, _, i) in order {
        if freed >= need && (!unplanned(&cands[i]) || freed >= need.saturating_add(extra)) {
            break;
        }
        freed = freed.saturating_add(cands[i].bytes);
        chosen.push(i);
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    fn candidate() -> impl Strategy<Value = Candidate> {
        (
            0u8..4,
            proptest::option::of(0u64..6),
            1u64..100,
            0u64..20,
            proptest::option::of(prop_oneof![0u64..20, Just(NEVER)]),
            proptest::bool::weighted(0.2),
        )
            .prop_map(
                |(k, block, bytes, last_use, next_use, protected)| Candidate {
                    key: format!("k{k}").into(),
                    block,
                    bytes,
                    last_use,
                    next_use,
                    protected,
                },
            )
    }

    fn admit() -> impl Strategy<Value = Admit> {
        prop_oneof![
            Just(Admit::Read),
            (0u64..25).prop_map(|distance| Admit::Prefetch { distance }),
            Just(Admit::Prefetch { distance: u64::MAX }),
        ]
    }

    /// The reference: every candidate `admit` may take, fully sorted by
    /// class, then the class's key, then object key and block.
    fn reference(cands: &[Candidate], admit: Admit) -> Vec<usize> {
        let mut all: Vec<usize> = (0..cands.len())
            .filter(|&i| {
                let c = &cands[i];
                !c.protected
                    && match admit {
                        Admit::Read => true,
                        Admit::Prefetch { distance } => match (c.next_use, c.block) {
                            (None, None) => true,
                            (None, Some(_)) => false,
                            (Some(d), _) => d > distance,
                        },
                    }
            })
            .collect();
        let class = |c: &Candidate| match (c.next_use, c.block) {
            (None, None) => (0, c.last_use),
            (None, Some(_)) => (1, c.last_use),
            (Some(d), _) => (2, u64::MAX - d),
        };
        all.sort_by(|&a, &b| {
            let (x, y) = (&cands[a], &cands[b]);
            class(x)
                .cmp(&class(y))
                .then(x.key.cmp(&y.key))
                .then(x.block.cmp(&y.block))
        });
        all
    }

    proptest! {
        /// The choice never takes a protected candidate (or one the
        /// admission forbids), frees `need` whenever the eligible ones
        /// can, takes no more than it must, and is the reference order's
        /// prefix.
        #[test]
        fn choice_is_the_reference_prefix(
            cands in proptest::collection::vec(candidate(), 0..40),
            need in 0u64..600,
            extra in prop_oneof![Just(0u64), 0u64..300],
            admit in admit(),
        ) {
            let chosen = choose(&cands, need, extra, admit);
            let full = reference(&cands, admit);
            prop_assert!(chosen.len() <= full.len());
            let freed: u64 = chosen.iter().map(|&i| cands[i].bytes).sum();
            let possible: u64 = full.iter().map(|&i| cands[i].bytes).sum();
            for &i in &chosen {
                prop_assert!(!cands[i].protected);
                if let Admit::Prefetch { distance } = admit {
                    let c = &cands[i];
                    prop_assert!(c.next_use.map_or(c.block.is_none(), |d| d > distance));
                }
            }
            if need == 0 {
                prop_assert!(chosen.is_empty());
            } else if possible >= need {
                prop_assert!(freed >= need);
                let last = &cands[*chosen.last().unwrap()];
                let before_last = freed - last.bytes;
                // Past `need`, only unplanned candidates, up to `need + extra`.
                prop_assert!(
                    before_last < need
                        || (unplanned(last) && before_last < need + extra),
                    "took more than needed"
                );
                // It stops early only at a planned candidate or the slack's end.
                if let Some(&next) = full.get(chosen.len()) {
                    prop_assert!(
                        freed < need
                            || !unplanned(&cands[next])
                            || freed >= need + extra,
                        "left unplanned slack behind"
                    );
                }
            } else {
                prop_assert_eq!(chosen.len(), full.len());
            }
            prop_assert_eq!(&chosen[..], &full[..chosen.len()]);
        }
    }

    /// One node's readers, block by block: every epoch a fresh order of
    /// `n` blocks, each read `k` times in a row, dealt to `r` readers in
    /// equal contiguous spans that advance one read per step (the ranks
    /// move in lockstep), through a cache of `b` blocks. Each reader's
    /// plan summarises its span of this epoch and of the next (first and
    /// last use, first use next epoch) as the plan records do, and the
    /// node's next use of a block is the nearest over the readers.
    struct Sim {
        n: usize,
        k: usize,
        r: usize,
        b: usize,
        orders: Vec<Vec<usize>>,
    }

    /// Reader `reader`'s span of `order`'s read sequence.
    fn span(order: &[usize], k: usize, r: usize, reader: usize) -> Vec<usize> {
        let reads: Vec<usize> = order
            .iter()
            .flat_map(|&x| std::iter::repeat_n(x, k))
            .collect();
        let len = reads.len() / r;
        reads[reader * len..(reader + 1) * len].to_vec()
    }

    /// Per block: (first, last) in `span`, and the first use in `next`.
    fn summary(span: &[usize], next: &[usize]) -> HashMap<usize, (u64, u64, Option<u64>)> {
        let len = span.len() as u64;
        let mut out: HashMap<usize, (u64, u64, Option<u64>)> = HashMap::new();
        for (p, &x) in span.iter().enumerate() {
            let e = out.entry(x).or_insert((p as u64, p as u64, None));
            e.1 = p as u64;
        }
        for (p, &x) in next.iter().enumerate() {
            let e = out.entry(x).or_insert((u64::MAX, u64::MAX, None));
            if e.2.is_none() {
                e.2 = Some(len + p as u64);
            }
        }
        out
    }

    /// The design's distance at progress `p`.
    fn distance(s: (u64, u64, Option<u64>), p: u64) -> Option<u64> {
        let (first, last, next_first) = s;
        if first != u64::MAX && p <= last {
            Some(first.saturating_sub(p))
        } else {
            next_first.map(|f| f - p)
        }
    }

    impl Sim {
        /// Misses per epoch, evicting by `choose` with plans (`plan`) or
        /// without (the LRU the tier is without them).
        fn run(&self, plan: bool) -> Vec<usize> {
            let mut resident: HashMap<usize, u64> = HashMap::new(); // block -> last use
            let mut clock = 0u64;
            let mut misses = Vec::new();
            let epochs = self.orders.len() - 1;
            for e in 0..epochs {
                let spans: Vec<Vec<usize>> = (0..self.r)
                    .map(|i| span(&self.orders[e], self.k, self.r, i))
                    .collect();
                let sums: Vec<_> = (0..self.r)
                    .map(|i| summary(&spans[i], &span(&self.orders[e + 1], self.k, self.r, i)))
                    .collect();
                let mut m = 0;
                for p in 0..spans[0].len() {
                    let reading: HashSet<usize> = spans.iter().map(|s| s[p]).collect();
                    for s in &spans {
                        let x = s[p];
                        clock += 1;
                        if let Some(last) = resident.get_mut(&x) {
                            *last = clock;
                            continue;
                        }
                        m += 1;
                        if resident.len() >= self.b {
                            let cands: Vec<Candidate> = resident
                                .iter()
                                .map(|(&y, &last_use)| Candidate {
                                    key: "o".into(),
                                    block: Some(y as u64),
                                    bytes: 1,
                                    last_use,
                                    next_use: if plan {
                                        sums.iter()
                                            .filter_map(|sm| sm.get(&y))
                                            .filter_map(|&sv| distance(sv, p as u64))
                                            .min()
                                    } else {
                                        None
                                    },
                                    protected: reading.contains(&y),
                                })
                                .collect();
                            let chosen = choose(&cands, 1, 0, Admit::Read);
                            assert!(!chosen.is_empty(), "nothing evictable");
                            for i in chosen {
                                resident.remove(&(cands[i].block.unwrap() as usize));
                            }
                        }
                        resident.insert(x, clock);
                    }
                }
                misses.push(m);
            }
            misses
        }

        /// Belady's MIN over the whole sequence (one reader), by brute
        /// force: on a miss with a full cache, evict the resident block
        /// used again farthest ahead (or never).
        fn min_misses(&self) -> usize {
            let seq: Vec<usize> = self.orders[..self.orders.len() - 1]
                .iter()
                .flat_map(|o| span(o, self.k, 1, 0))
                .collect();
            let mut resident: HashSet<usize> = HashSet::new();
            let mut misses = 0;
            for (t, &x) in seq.iter().enumerate() {
                if resident.contains(&x) {
                    continue;
                }
                misses += 1;
                if resident.len() >= self.b {
                    let next = |y: usize| {
                        seq[t + 1..]
                            .iter()
                            .position(|&z| z == y)
                            .unwrap_or(usize::MAX)
                    };
                    let victim = *resident.iter().max_by_key(|&&y| (next(y), y)).unwrap();
                    resident.remove(&victim);
                }
                resident.insert(x);
            }
            misses
        }
    }

    fn shuffled(n: usize, seed: u64) -> Vec<usize> {
        // A small LCG keeps the model free of the proptest runner's state.
        let mut order: Vec<usize> = (0..n).collect();
        let mut s = seed | 1;
        for i in (1..n).rev() {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            order.swap(i, (s >> 33) as usize % (i + 1));
        }
        order
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// One reader: the plan's rule fetches exactly what Belady's MIN
        /// (which sees the whole future) fetches, and never more than
        /// the LRU.
        #[test]
        fn one_reader_fetches_the_minimum(
            n in 8usize..48, k in 1usize..4, fill in 0.1f64..0.95, seed: u64,
        ) {
            let b = ((n as f64 * fill) as usize).max(2);
            let sim = Sim { n, k, r: 1, b, orders: (0..4).map(|e| shuffled(n, seed ^ e)).collect() };
            let plan: usize = sim.run(true).iter().sum();
            prop_assert_eq!(plan, sim.min_misses());
            prop_assert!(plan <= sim.run(false).iter().sum::<usize>());
            prop_assert!(sim.n >= sim.b);
        }

        /// Readers in lockstep: after the first epoch each epoch fetches
        /// within 5% of the floor (n − b blocks) plus a block per reader
        /// in flight, and never more than the LRU over the run.
        #[test]
        fn lockstep_readers_stay_near_the_floor(
            blocks_per_reader in 6usize..24, k in 1usize..3, r in 1usize..5,
            fill in 0.25f64..0.95, seed: u64,
        ) {
            let n = blocks_per_reader * r;
            let b = ((n as f64 * fill) as usize).max(2 * r + 1);
            let sim = Sim { n, k, r, b, orders: (0..4).map(|e| shuffled(n, seed ^ e)).collect() };
            let plan = sim.run(true);
            let lru = sim.run(false);
            let floor = n.saturating_sub(b) as f64;
            for &m in &plan[1..] {
                prop_assert!(
                    m as f64 <= 1.05 * floor + (r * k) as f64,
                    "epoch fetched {m} blocks, floor {floor}, plan {plan:?}, lru {lru:?}"
                );
            }
            prop_assert!(plan.iter().sum::<usize>() <= lru.iter().sum::<usize>());
        }
    }
}

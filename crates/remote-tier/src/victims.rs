//! The order of eviction, as a pure function of the candidates.
//!
//! (Part A's minimal version, with exactly the interface of issue 36:
//! the integrator's `victims.rs` on main replaces it.)

/// Something eviction may free: a whole copy or one block of a sparse one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The object's key.
    pub(crate) key: String,
    /// `None`: the whole object (all its files); `Some(b)`: block `b` of
    /// a sparse copy.
    pub(crate) block: Option<u64>,
    /// Allocated units freed if evicted.
    pub(crate) bytes: u64,
    /// LRU time, larger = more recent (whole: mtime in ns; block: the
    /// touch clock).
    pub(crate) last_use: u64,
    /// The node's next use in batches (`None`: no live plan reads it
    /// again).
    pub(crate) next_use: Option<u64>,
    /// Never chosen: a leased block, a whole-pinned or open object taken
    /// whole, an unaligned block.
    pub(crate) protected: bool,
}

/// Why room is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// A read that needs the bytes now.
    Read,
    /// A prefetch of a block whose own next use is `distance` batches
    /// away (`u64::MAX` if unplanned).
    Prefetch {
        /// The prefetched block's next use.
        distance: u64,
    },
}

/// The eviction class of an eligible candidate: whole unplanned copies,
/// then unplanned blocks, then planned ones.
fn class(c: &Candidate) -> u8 {
    match (c.next_use, c.block) {
        (None, None) => 0,
        (None, Some(_)) => 1,
        (Some(_), _) => 2,
    }
}

/// Indices into `cands` in eviction order, stopping once their bytes
/// reach `need` (all eligible if they cannot).
pub(crate) fn choose(cands: &[Candidate], need: u64, admit: Admit) -> Vec<usize> {
    let mut order: Vec<usize> = (0..cands.len())
        .filter(|&i| {
            let c = &cands[i];
            !c.protected
                && match admit {
                    Admit::Read => true,
                    Admit::Prefetch { distance } => match class(c) {
                        0 => true,
                        1 => false,
                        _ => c.next_use.is_some_and(|n| n > distance),
                    },
                }
        })
        .collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&cands[a], &cands[b]);
        class(x).cmp(&class(y)).then_with(|| match class(x) {
            2 => y.next_use.cmp(&x.next_use),
            _ => x.last_use.cmp(&y.last_use),
        })
    });
    let mut freed = 0u64;
    let mut out = Vec::new();
    for i in order {
        if freed >= need {
            break;
        }
        freed = freed.saturating_add(cands[i].bytes);
        out.push(i);
    }
    out
}

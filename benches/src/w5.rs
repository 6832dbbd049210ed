//! W5 of `BENCHMARKS.md`: variable-size samples in one page file
//! (page-alloc).
//!
//! N samples (default 50,000) of sizes uniform in [1 KiB, 64 KiB] from the
//! seed; word k of sample i is `start(i) + k * GOLDEN` (little-endian), so
//! every byte read back is checked against its expected value.
//!
//! Phases (each repeated, median reported):
//! - `write`: 2 writer threads fill pages in place (`write_parallel`),
//!   timed until `finalize` (fsync, rename, directory fsync) returns;
//!   each repetition from a settled disk, compared with the durable
//!   sequential write bandwidth measured right before it. `write_direct`:
//!   the same with `O_DIRECT` page writes.
//! - `read_random`: one thread reads every sample once in a random order
//!   through zero-copy `sample(i).bytes()` slices and checks every byte;
//!   compared with memcpy bandwidth.
//! - `read_random_2threads`: the same order split over 2 threads.
//! - `read_batches`: 256-sample batches copied into a `BufferPool`
//!   (allocation-free), with `prefetch` of the next batch, then checked.

use std::time::Instant;

use page_alloc::{
    BoxError, BufferPool, PageReader, PageWriter, SampleOut, SampleSource, Schema, Slot,
    WriterOptions,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::write_runs::{Synced, WritePattern, WriteRuns};
use crate::{Ctx, Limit, Line, RunError, median, progress};

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
const REPS: usize = 3;
const BATCH: usize = 256;

/// The first word of sample `i`.
fn start_word(seed: u64, i: usize) -> u64 {
    let mut z = seed ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 31)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 29)
}

/// Writes the pattern of sample `i` into `dst`.
fn fill_pattern(seed: u64, i: usize, dst: &mut [u8]) {
    let base = start_word(seed, i);
    let mut chunks = dst.chunks_exact_mut(8);
    let mut k = 0u64;
    for c in &mut chunks {
        c.copy_from_slice(&base.wrapping_add(k.wrapping_mul(GOLDEN)).to_le_bytes());
        k += 1;
    }
    let tail = chunks.into_remainder();
    let last = base.wrapping_add(k.wrapping_mul(GOLDEN)).to_le_bytes();
    let n = tail.len();
    tail.copy_from_slice(&last[..n]);
}

/// Whether `bytes` hold exactly the pattern of sample `i` (reads every byte).
fn pattern_ok(seed: u64, i: usize, bytes: &[u8]) -> bool {
    let base = start_word(seed, i);
    let chunks = bytes.chunks_exact(8);
    let tail = chunks.remainder();
    let mut diff = 0u64;
    let mut expect = base;
    for c in chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        diff |= u64::from_le_bytes(w) ^ expect;
        expect = expect.wrapping_add(GOLDEN);
    }
    diff == 0 && tail == &expect.to_le_bytes()[..tail.len()]
}

/// W5's samples: `(id: int, data: bytes)`.
struct Samples {
    seed: u64,
    sizes: Vec<usize>,
}

impl SampleSource for Samples {
    fn len(&self) -> usize {
        self.sizes.len()
    }

    fn describe(&self, i: usize, slots: &mut [Slot]) -> Result<(), BoxError> {
        slots[0] = Slot::Int(i as i64);
        slots[1] = Slot::Size(self.sizes[i] as u64);
        Ok(())
    }

    fn fill(&self, i: usize, out: &mut SampleOut<'_>) -> Result<(), BoxError> {
        let dst = out.field(1).ok_or("no region for field 1")?;
        fill_pattern(self.seed, i, dst);
        Ok(())
    }
}

fn wrong(detail: String) -> RunError {
    RunError::WrongValue {
        workload: "w5",
        detail,
    }
}

/// Reads and checks `order`; returns the bytes read.
fn read_and_check(reader: &PageReader, seed: u64, order: &[usize]) -> Result<u64, RunError> {
    let mut bytes = 0u64;
    for &i in order {
        let sample = reader.sample(i).map_err(|e| RunError::store("w5", e))?;
        let data = sample.bytes(1).map_err(|e| RunError::store("w5", e))?;
        if !pattern_ok(seed, i, data) {
            return Err(wrong(format!("sample {i}: bytes differ from the pattern")));
        }
        bytes += data.len() as u64;
    }
    Ok(bytes)
}

/// Runs W5.
pub fn run(ctx: &Ctx) -> Result<(), RunError> {
    let store = |e: page_alloc::Error| RunError::store("w5", e);
    let n = ctx.n_or(50_000);
    let dir = ctx.fresh_dir("w5").map_err(|e| RunError::store("w5", e))?;
    let path = dir.join("w5.pages");
    let mut rng = StdRng::seed_from_u64(ctx.seed);
    let sizes: Vec<usize> = (0..n).map(|_| rng.random_range(1024..=65536)).collect();
    let total: u64 = sizes.iter().map(|s| *s as u64).sum();
    let source = Samples {
        seed: ctx.seed,
        sizes,
    };
    progress!("w5: {n} samples, {:.1} MB", total as f64 / 1e6);

    // Write with 2 threads, timed until the file is durable; buffered
    // first, then with O_DIRECT page writes (the file read back below is
    // the buffered one: both have the same bytes).
    for (phase, direct) in [("write_direct", true), ("write", false)] {
        let mut summary = None;
        let runs = WriteRuns::measure(
            ctx,
            &format!("w5 {phase}"),
            || match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
            |_| {
                let _ = std::fs::remove_file(&path);
                let start = Instant::now();
                let mut writer = PageWriter::create(
                    &path,
                    Schema::new().int("id").bytes("data"),
                    WriterOptions::default().direct_io(direct),
                )
                .map_err(store)?;
                writer.write_parallel(&source, 2).map_err(store)?;
                summary = Some(writer.finalize().map_err(store)?);
                Ok(start.elapsed().as_secs_f64())
            },
            || {
                // The yardstick: the page file written to a temporary name,
                // fsynced after its pages and again after its footer, renamed.
                Ok(WritePattern::default()
                    .with(std::fs::metadata(&path)?.len(), Synced::Renamed(2)))
            },
        )?;
        let summary = summary.ok_or_else(|| wrong("no write ran".into()))?;
        ctx.emit(
            runs.line("w5", phase, n, total)
                .with("threads", 2)
                .with("direct_io", summary.direct_io)
                .with(
                    "bytes_on_disk_per_item",
                    summary.file_len as f64 / n.max(1) as f64,
                )
                .with("pages", summary.num_pages)
                .with("page_size", page_alloc::format::DEFAULT_PAGE_SIZE),
        );
    }

    // Open (validates every pointer), then random reads touching every byte.
    let open_start = Instant::now();
    let reader = PageReader::open(&path).map_err(store)?;
    let open_ms = open_start.elapsed().as_secs_f64() * 1e3;
    if reader.len() != n {
        return Err(wrong(format!(
            "{} samples read back, {n} written",
            reader.len()
        )));
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rng);
    // One untimed pass maps the pages (page cache warm, as W1's reads).
    read_and_check(&reader, ctx.seed, &order)?;

    let mut secs = Vec::new();
    for _ in 0..REPS {
        let start = Instant::now();
        let bytes = read_and_check(&reader, ctx.seed, &order)?;
        secs.push(start.elapsed().as_secs_f64());
        if bytes != total {
            return Err(wrong(format!("read {bytes} bytes, wrote {total}")));
        }
    }
    ctx.emit(
        Line::new("w5", "read_random", n, total, median(&mut secs))
            .limit(Limit::Memcpy)
            .with("threads", 1)
            .with("open_ms", open_ms),
    );

    let mut secs = Vec::new();
    for _ in 0..REPS {
        let start = Instant::now();
        let halves = order.split_at(n / 2);
        let results: Vec<Result<u64, RunError>> = std::thread::scope(|s| {
            let hs: Vec<_> = [halves.0, halves.1]
                .into_iter()
                .map(|part| s.spawn(|| read_and_check(&reader, ctx.seed, part)))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(wrong("reader thread panicked".into())))
                })
                .collect()
        });
        let mut bytes = 0;
        for r in results {
            bytes += r?;
        }
        secs.push(start.elapsed().as_secs_f64());
        if bytes != total {
            return Err(wrong(format!("read {bytes} bytes, wrote {total}")));
        }
    }
    ctx.emit(
        Line::new("w5", "read_random_2threads", n, total, median(&mut secs))
            .limit(Limit::Memcpy)
            .with("threads", 2),
    );

    // Batches through the allocation-free buffer pool, with prefetch.
    let mut pool = BufferPool::new(&reader, BATCH).map_err(store)?;
    let mut secs = Vec::new();
    for _ in 0..REPS {
        let start = Instant::now();
        let batches: Vec<&[usize]> = order.chunks(BATCH).collect();
        let mut bytes = 0u64;
        for (b, batch) in batches.iter().enumerate() {
            if let Some(next) = batches.get(b + 1) {
                reader.prefetch(next).map_err(store)?;
            }
            reader.fill_batch(batch, &mut pool).map_err(store)?;
            for (k, &i) in batch.iter().enumerate() {
                let data = pool
                    .bytes(1, k)
                    .ok_or_else(|| wrong(format!("batch slot {k} missing")))?;
                if !pattern_ok(ctx.seed, i, data) {
                    return Err(wrong(format!("sample {i}: batch bytes differ")));
                }
                bytes += data.len() as u64;
            }
        }
        secs.push(start.elapsed().as_secs_f64());
        if bytes != total {
            return Err(wrong(format!("read {bytes} bytes, wrote {total}")));
        }
    }
    ctx.emit(
        Line::new("w5", "read_batches", n, total, median(&mut secs))
            .limit(Limit::Memcpy)
            .with("batch", BATCH),
    );
    drop(reader);
    std::fs::remove_file(&path).map_err(|e| RunError::store("w5", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_round_trips_and_detects_a_flip() {
        for len in [0, 1, 7, 8, 9, 1024, 65535] {
            let mut buf = vec![0u8; len];
            fill_pattern(3, 17, &mut buf);
            assert!(pattern_ok(3, 17, &buf));
            if len > 0 {
                buf[len / 2] ^= 1;
                assert!(!pattern_ok(3, 17, &buf));
            }
        }
    }
}

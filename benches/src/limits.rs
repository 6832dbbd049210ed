//! The machine's own ceilings, measured in the same run as the workloads.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

use crate::report::Limit;

/// Measured ceilings, in bytes per second.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// One thread copying a large buffer.
    pub memcpy: f64,
    /// Reading a warm file through the page cache.
    pub page_cache_read: f64,
    /// Writing a file sequentially and fsyncing it.
    pub durable_write: f64,
    /// Size of the buffer `memcpy` was measured on, in bytes (for a
    /// [`MemcpyProbe`] that re-measures it later in the run).
    pub memcpy_bytes: usize,
    /// Size of the file `durable_write` was measured on, in bytes (write
    /// phases re-measure it next to each repetition).
    pub durable_write_bytes: usize,
}

impl Limits {
    /// The ceiling that `limit` names.
    pub fn bytes_per_s(&self, limit: Limit) -> f64 {
        match limit {
            Limit::Memcpy => self.memcpy,
            Limit::PageCacheRead => self.page_cache_read,
            Limit::DurableWrite | Limit::DurableWriteSameFiles => self.durable_write,
        }
    }

    /// Measures all three: memcpy of `memcpy_mb` MiB, and a `file_mb` MiB
    /// file in `dir` written with fsync, then read warm. Each is the median
    /// of three repetitions.
    pub fn measure(dir: &Path, memcpy_mb: usize, file_mb: usize) -> std::io::Result<Limits> {
        let memcpy_bytes = memcpy_mb << 20;
        let memcpy = MemcpyProbe::new(memcpy_bytes).median_of_3();
        let path = dir.join("limits.bin");
        let durable_write = median_of_3(|| measure_durable_write(&path, file_mb << 20))?;
        let page_cache_read = median_of_3(|| measure_page_cache_read(&path))?;
        std::fs::remove_file(&path)?;
        Ok(Limits {
            memcpy,
            page_cache_read,
            durable_write,
            memcpy_bytes,
            durable_write_bytes: file_mb << 20,
        })
    }
}

fn median_of_3(mut f: impl FnMut() -> std::io::Result<f64>) -> std::io::Result<f64> {
    let mut samples = [f()?, f()?, f()?];
    Ok(crate::median(&mut samples))
}

/// The memcpy limit, ready to be measured again: a workload whose figure
/// swings with the machine's state measures it next to each of its passes.
/// A copy of 256 MiB also leaves nothing of the previous pass in the CPU
/// caches.
pub struct MemcpyProbe {
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl MemcpyProbe {
    /// Two buffers of `len` bytes, both written once (their page faults are
    /// never timed).
    pub fn new(len: usize) -> MemcpyProbe {
        let src: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut dst = vec![0u8; len];
        dst.copy_from_slice(&src);
        MemcpyProbe { src, dst }
    }

    /// One timed copy of the whole buffer, in bytes per second.
    pub fn once(&mut self) -> f64 {
        let start = Instant::now();
        self.dst.copy_from_slice(&self.src);
        let secs = start.elapsed().as_secs_f64();
        std::hint::black_box(&self.dst);
        self.src.len() as f64 / secs.max(1e-9)
    }

    /// The median of three timed copies, in bytes per second: the limit.
    pub fn median_of_3(&mut self) -> f64 {
        let mut samples = [self.once(), self.once(), self.once()];
        crate::median(&mut samples)
    }
}

/// Writes `len` bytes to a new file at `path` and fsyncs it: bytes per second.
pub(crate) fn measure_durable_write(path: &Path, len: usize) -> std::io::Result<f64> {
    let chunk: Vec<u8> = (0..(8usize << 20)).map(|i| (i * 7) as u8).collect();
    let start = Instant::now();
    let mut file = File::create(path)?;
    let mut written = 0;
    while written < len {
        let n = chunk.len().min(len - written);
        file.write_all(&chunk[..n])?;
        written += n;
    }
    file.sync_all()?;
    Ok(len as f64 / start.elapsed().as_secs_f64().max(1e-9))
}

fn measure_page_cache_read(path: &Path) -> std::io::Result<f64> {
    let mut buf = vec![0u8; 1 << 20];
    // One untimed pass makes sure the file is in the page cache.
    let mut total = 0usize;
    for timed in [false, true] {
        let mut file = File::open(path)?;
        let start = Instant::now();
        total = 0;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            total += n;
        }
        if timed {
            return Ok(total as f64 / start.elapsed().as_secs_f64().max(1e-9));
        }
    }
    Ok(total as f64)
}

//! One JSON line per measured phase.

use serde_json::{Map, Value, json};

use crate::Limits;

/// Which measured limit a phase is compared against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// One thread copying memory.
    Memcpy,
    /// Reading a warm file through the page cache.
    PageCacheRead,
    /// Sequential writes made durable with fsync.
    DurableWrite,
    /// The very files a write phase leaves (same bytes, file count,
    /// renames and fsync points) written plainly from memory
    /// ([`crate::write_runs::WritePattern`]): what the phase would take
    /// with no encoding, copying or bookkeeping.
    DurableWriteSameFiles,
}

impl Limit {
    fn name(self) -> &'static str {
        match self {
            Limit::Memcpy => "memcpy",
            Limit::PageCacheRead => "page_cache_read",
            Limit::DurableWrite => "durable_write",
            Limit::DurableWriteSameFiles => "durable_write_same_files",
        }
    }
}

/// A report line under construction.
#[derive(Debug, Clone)]
pub struct Line {
    fields: Map<String, Value>,
    bytes_per_s: f64,
    limit: Option<Limit>,
    /// The limit's value when it was measured next to this phase rather
    /// than at the start of the run.
    ceiling: Option<f64>,
}

impl Line {
    /// A line for `phase` of `workload` over `items` items that moved
    /// `bytes` bytes in `secs` seconds.
    pub fn new(workload: &str, phase: &str, items: usize, bytes: u64, secs: f64) -> Line {
        let secs = secs.max(1e-9);
        let mut fields = Map::new();
        fields.insert("workload".into(), json!(workload));
        fields.insert("phase".into(), json!(phase));
        fields.insert("n".into(), json!(items));
        fields.insert("items_per_s".into(), json!(items as f64 / secs));
        fields.insert("mb_per_s".into(), json!(bytes as f64 / secs / 1e6));
        Line {
            fields,
            bytes_per_s: bytes as f64 / secs,
            limit: None,
            ceiling: None,
        }
    }

    /// Compares the line's MB/s with `limit`.
    pub fn limit(mut self, limit: Limit) -> Line {
        self.limit = Some(limit);
        self
    }

    /// Compares the line's MB/s with `limit` as measured next to this
    /// phase (`bytes_per_s`) rather than at the start of the run; the
    /// start-of-run figure is kept as `fraction_of_run_limit`.
    pub fn limit_measured(mut self, limit: Limit, bytes_per_s: f64) -> Line {
        self.limit = Some(limit);
        self.ceiling = Some(bytes_per_s);
        self
    }

    /// Adds a field (e.g. `s`, `flush_ms`, `p99_ms`).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Line {
        self.fields.insert(key.into(), value.into());
        self
    }

    /// The finished JSON text, with peak RSS and the fraction of the limit.
    pub fn finish(mut self, limits: &Limits) -> String {
        self.fields
            .insert("peak_rss_bytes".into(), json!(peak_rss_bytes()));
        if let Some(limit) = self.limit {
            let run_ceiling = limits.bytes_per_s(limit);
            let ceiling = match self.ceiling {
                Some(c) => {
                    self.fields.insert(
                        "fraction_of_run_limit".into(),
                        json!(self.bytes_per_s / run_ceiling.max(1.0)),
                    );
                    c
                }
                None => run_ceiling,
            };
            self.fields.insert("limit".into(), json!(limit.name()));
            self.fields
                .insert("limit_mb_per_s".into(), json!(ceiling / 1e6));
            self.fields.insert(
                "fraction_of_limit".into(),
                json!(self.bytes_per_s / ceiling.max(1.0)),
            );
        }
        Value::Object(self.fields).to_string()
    }
}

/// Peak resident set size of this process, from `/proc/self/status` (0 where
/// the OS does not say).
pub fn peak_rss_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Resets the peak RSS counter so the next phase reports its own peak
/// (Linux `clear_refs` 5; ignored where unsupported).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

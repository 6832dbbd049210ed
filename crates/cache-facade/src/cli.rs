//! The `cachex` command line: `inspect`, `verify`, `get`, `stats`,
//! `compact` and `demo`. Exit codes: 0 sound / done, 1 problems found or
//! the operation failed, 2 usage errors.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde_json::{Value, json};

use crate::detect::{CacheKind, detect};
use crate::json::record_json;

/// Inspect, verify and read cachex caches (and the Python tools' caches).
#[derive(Debug, Parser)]
#[command(name = "cachex", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Detect the kind of cache and print what it holds.
    Inspect {
        /// The cache directory or file.
        path: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Read and check everything; exit 1 when a problem is found.
    Verify {
        /// The cache directory or file.
        path: PathBuf,
    },
    /// Print one record, by key or index.
    Get {
        /// The cache directory or file.
        path: PathBuf,
        /// A key (keyed caches) or an index (row / item / sample caches;
        /// negative counts from the end).
        #[arg(allow_hyphen_values = true)]
        key: String,
        /// Print JSON (the only format for now; accepted for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Print counters and sizes.
    Stats {
        /// The cache directory or file.
        path: PathBuf,
    },
    /// Rewrite a segment-store cache without dead rows.
    Compact {
        /// The cache directory.
        path: PathBuf,
    },
    /// Two epochs of a slow feature extractor through a cache.
    Demo {
        /// Where the demo cache goes.
        #[arg(long, default_value = "cachex-demo")]
        dir: PathBuf,
        /// Use a fresh temporary directory instead of --dir.
        #[arg(long)]
        temp: bool,
        /// Samples in the synthetic dataset.
        #[arg(long, default_value_t = 2000)]
        n: usize,
        /// Simulated extractor cost per sample, in milliseconds.
        #[arg(long, default_value_t = 2.0)]
        cost_ms: f64,
    },
}

/// A command's failure: exit 1 with this message.
type CmdResult = Result<ExitCode, String>;

/// Parses the arguments and runs the command.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(cli.command) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("cachex: {msg}");
            ExitCode::from(1)
        }
    }
}

fn run(command: Command) -> CmdResult {
    match command {
        Command::Inspect { path, json } => inspect(&path, json),
        Command::Verify { path } => verify(&path),
        Command::Get { path, key, .. } => get(&path, &key),
        Command::Stats { path } => stats(&path),
        Command::Compact { path } => compact(&path),
        Command::Demo {
            dir,
            temp,
            n,
            cost_ms,
        } => demo(dir, temp, n, cost_ms),
    }
}

fn kind_of(path: &Path) -> Result<CacheKind, String> {
    if !path.exists() {
        return Err(format!("{}: no such file or directory", path.display()));
    }
    detect(path).ok_or_else(|| {
        format!(
            "{}: not a cache cachex knows (segment-store, torchcachex, memmap-array, shard-store/loadit, page-alloc, .beton)",
            path.display()
        )
    })
}

fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
}

fn open_segments(path: &Path, read_only: bool) -> Result<segment_store::SegmentStore, String> {
    let opts = segment_store::Options {
        read_only,
        lru_bytes: 0,
        ..segment_store::Options::default()
    };
    segment_store::SegmentStore::open(path, opts).map_err(|e| e.to_string())
}

fn inspect(path: &Path, as_json: bool) -> CmdResult {
    let kind = kind_of(path)?;
    match kind {
        CacheKind::SegmentStore | CacheKind::Torchcachex => {
            let store = open_segments(path, true)?;
            let report = store.inspect();
            if as_json {
                let segments: Vec<Value> = report
                    .segments
                    .iter()
                    .map(|s| json!({"id": s.id, "bytes": s.bytes, "rows": s.rows, "live_rows": s.live_rows}))
                    .collect();
                let schema: Value = report
                    .schema_json
                    .as_deref()
                    .and_then(|s| serde_json::from_str(s).ok())
                    .unwrap_or(Value::Null);
                print(
                    &json!({
                        "kind": kind.name(),
                        "path": path,
                        "structure": report.structure.map(|s| s.name()),
                        "entries": report.entries,
                        "disk_bytes": report.disk_bytes,
                        "index_bytes_per_entry": report.index_bytes_per_entry,
                        "segments": segments,
                        "schema": schema,
                    })
                    .to_string(),
                );
            } else {
                print(&format!("kind: {}\n{report}", kind.name()));
            }
        }
        CacheKind::MemmapArray => {
            let report = memmap_array::inspect(path).map_err(|e| e.to_string())?;
            if as_json {
                print(&crate::kinds::memmap_report_json(&report).to_string());
            } else {
                print(&format!("kind: memmap-array\n{report}"));
            }
        }
        CacheKind::ShardStore => {
            let summary = shard_store::inspect(path).map_err(|e| e.to_string())?;
            let mut json = serde_json::to_value(&summary).map_err(|e| e.to_string())?;
            json["kind"] = json!(kind.name());
            json["path"] = json!(path);
            if as_json {
                print(&json.to_string());
            } else {
                print(&crate::kinds::json_table(&json));
            }
        }
        CacheKind::PageAlloc => {
            let summary = page_alloc::inspect(path).map_err(|e| e.to_string())?;
            if as_json {
                print(&crate::kinds::page_summary_json(&summary).to_string());
            } else {
                print(&format!("kind: page-alloc\n{summary}"));
            }
        }
        CacheKind::Beton => {
            let file = page_alloc::beton::read(path).map_err(|e| e.to_string())?;
            let json = crate::kinds::beton_json(&file);
            if as_json {
                print(&json.to_string());
            } else {
                print(&crate::kinds::beton_table(&file));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn report_problems(kind: CacheKind, path: &Path, problems: &[String]) -> ExitCode {
    if problems.is_empty() {
        print(&format!("{} ({}): sound", path.display(), kind.name()));
        ExitCode::SUCCESS
    } else {
        for p in problems {
            print(&format!("problem: {p}"));
        }
        print(&format!(
            "{} ({}): {} problem(s)",
            path.display(),
            kind.name(),
            problems.len()
        ));
        ExitCode::from(1)
    }
}

fn verify(path: &Path) -> CmdResult {
    let (kind, problems) = verify_path(path)?;
    Ok(report_problems(kind, path, &problems))
}

/// What `cachex verify` checks: the kind of cache at `path` and every
/// problem found in it, each naming its file (empty when sound). `Err`
/// when `path` is missing or no cache `cachex` knows.
pub fn verify_path(path: &Path) -> Result<(CacheKind, Vec<String>), String> {
    let kind = kind_of(path)?;
    let problems: Vec<String> = match kind {
        CacheKind::SegmentStore | CacheKind::Torchcachex => match open_segments(path, true) {
            Err(e) => vec![e],
            Ok(store) => {
                let mut all = store.problems();
                all.extend(store.verify());
                // A torchcachex directory has no index of ours by design
                // (detection found no index log), so its absence is no problem.
                if kind == CacheKind::Torchcachex {
                    all.retain(|p| p.kind != segment_store::ProblemKind::CorruptIndex);
                }
                let mut all: Vec<String> = all.iter().map(ToString::to_string).collect();
                all.sort();
                all.dedup();
                all
            }
        },
        CacheKind::MemmapArray => strings(memmap_array::verify(path)),
        CacheKind::ShardStore => match shard_store::verify(path) {
            Ok(problems) => strings(problems),
            Err(e) => vec![e.to_string()],
        },
        CacheKind::PageAlloc => strings(page_alloc::verify(path)),
        CacheKind::Beton => strings(page_alloc::beton::verify(path)),
    };
    Ok((kind, problems))
}

fn strings<T: std::fmt::Display>(items: Vec<T>) -> Vec<String> {
    items.iter().map(ToString::to_string).collect()
}

fn get(path: &Path, key: &str) -> CmdResult {
    let kind = kind_of(path)?;
    let value = match kind {
        CacheKind::SegmentStore | CacheKind::Torchcachex => {
            let store = open_segments(path, true)?;
            let (mut values, _) = store.get_batch(&[key]).map_err(|e| e.to_string())?;
            let record = values
                .pop()
                .flatten()
                .ok_or_else(|| format!("{}: no record with key {key:?}", path.display()))?;
            record_json(&record)
        }
        CacheKind::MemmapArray => {
            let cache = memmap_array::ArrayCache::open(path).map_err(|e| e.to_string())?;
            let row = match cache.find(key) {
                Some(i) => i,
                None => parse_index(path, key, cache.len() as usize)? as u64,
            };
            crate::kinds::memmap_row_json(&cache, row).map_err(|e| e.to_string())?
        }
        CacheKind::ShardStore => {
            let index: i64 = key
                .parse()
                .map_err(|_| format!("{}: {key:?} is not an index", path.display()))?;
            shard_store::get_json(path, index).map_err(|e| e.to_string())?
        }
        CacheKind::PageAlloc => {
            let reader = page_alloc::PageReader::open(path).map_err(|e| e.to_string())?;
            let index = parse_index(path, key, reader.len())?;
            crate::kinds::page_sample_json(&reader, index).map_err(|e| e.to_string())?
        }
        CacheKind::Beton => {
            let file = page_alloc::beton::read(path).map_err(|e| e.to_string())?;
            let index = parse_index(path, key, file.len())?;
            crate::kinds::beton_sample_json(&file, index).map_err(|e| e.to_string())?
        }
    };
    print(&value.to_string());
    Ok(ExitCode::SUCCESS)
}

/// An index argument: `0 <= i < len`, or negative from the end.
fn parse_index(path: &Path, key: &str, len: usize) -> Result<usize, String> {
    let i: i64 = key
        .parse()
        .map_err(|_| format!("{}: {key:?} is not an index", path.display()))?;
    let resolved = if i < 0 { len as i64 + i } else { i };
    if resolved < 0 || resolved >= len as i64 {
        return Err(format!(
            "{}: index {i} out of range for {len} items",
            path.display()
        ));
    }
    Ok(resolved as usize)
}

fn stats(path: &Path) -> CmdResult {
    let kind = kind_of(path)?;
    match kind {
        CacheKind::SegmentStore | CacheKind::Torchcachex => {
            let store = open_segments(path, true)?;
            let s = store.stats();
            print(&format!(
                "kind: {}\nentries: {}\nsegments: {}\nindex bytes: {} ({:.1} per entry)",
                kind.name(),
                s.entries,
                s.segments,
                s.index_bytes,
                s.index_bytes_per_entry
            ));
        }
        CacheKind::MemmapArray
        | CacheKind::ShardStore
        | CacheKind::PageAlloc
        | CacheKind::Beton => {
            return inspect(path, false);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn compact(path: &Path) -> CmdResult {
    let kind = kind_of(path)?;
    if kind != CacheKind::SegmentStore {
        return Err(format!(
            "{}: compact works on segment-store caches, this is {}",
            path.display(),
            kind.name()
        ));
    }
    let store = open_segments(path, false)?;
    let report = store.compact().map_err(|e| e.to_string())?;
    print(&format!(
        "compacted {}: {} -> {} segments, {} live rows kept, {} dead rows dropped",
        path.display(),
        report.segments_before,
        report.segments_after,
        report.live_rows,
        report.dropped_rows
    ));
    Ok(ExitCode::SUCCESS)
}

fn demo(dir: PathBuf, temp: bool, n: usize, cost_ms: f64) -> CmdResult {
    let tmp;
    let dir = if temp {
        tmp = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        tmp.path().to_path_buf()
    } else {
        dir
    };
    if !(0.0..=10_000.0).contains(&cost_ms) {
        return Err(format!("--cost-ms {cost_ms} is out of range 0..=10000"));
    }
    let opts = crate::demo::DemoOptions {
        dir,
        n,
        batch: 64,
        cost_per_sample: Duration::from_secs_f64(cost_ms / 1000.0),
        dim: 256,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    eprintln!(
        "cachex demo: {n} samples, a feature extractor costing {cost_ms} ms per sample, two epochs through a segment-store cache"
    );
    let summary = crate::demo::run(&opts).map_err(|e| e.to_string())?;
    print(&summary.to_string());
    Ok(ExitCode::SUCCESS)
}

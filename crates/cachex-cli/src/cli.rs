//! The `cachex` command line: `inspect`, `verify`, `get`, `stats`,
//! `compact`, `push`, `pull`, `gc`, `du`, `tier` and `demo`. Each command finds the
//! cache's entry in the facade's registry of kinds ([`spec_for`],
//! [`cache_facade::KINDS`]) and calls it. Exit codes: [`EXIT_SOUND`] (0) done /
//! sound, [`EXIT_PROBLEMS`] (1) problems found or the cache could not be
//! read, [`EXIT_USAGE`] (2) usage errors and paths that are no cache we
//! know.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use cache_check::{Problem, Summary};
use clap::{Parser, Subcommand};
use serde_json::json;

use crate::error::{CliError, EXIT_PROBLEMS, EXIT_SOUND, EXIT_USAGE, Result};
use crate::json::value_table;
use cache_facade::{Detected, KINDS, KindSpec, StoreKind};

/// Inspect, verify and read cachex caches (and the Python tools' caches);
/// publish them to object storage, pull them back, collect their garbage.
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
        /// The cache directory or file, or the URL it was published at
        /// (`s3://bucket/prefix`, ...; materialised in `CACHEX_TIER_DIR`
        /// or a temporary directory first).
        path: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Read and check everything; exit 1 when a problem is found.
    Verify {
        /// The cache directory or file, or the URL it was published at
        /// (`s3://bucket/prefix`, ...; materialised in `CACHEX_TIER_DIR`
        /// or a temporary directory first).
        path: PathBuf,
        /// Print JSON (`{"kind", "path", "problems": [{path, kind, detail}]}`).
        #[arg(long)]
        json: bool,
    },
    /// Print one record, by key or index.
    Get {
        /// The cache directory or file, or the URL it was published at
        /// (`s3://bucket/prefix`, ...: a segment store's record is read
        /// through byte ranges of its segment on the local tier
        /// (`CACHEX_TIER_DIR`, by default `~/.cache/cachex/tier`); other
        /// caches are materialised there first).
        path: PathBuf,
        /// A key (keyed caches) or an index (row / item / sample caches;
        /// negative counts from the end).
        #[arg(allow_hyphen_values = true)]
        key: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print counters and ratios: bytes per item, dead or absent data,
    /// fill and dedup ratios.
    Stats {
        /// The cache directory or file, or the URL it was published at
        /// (`s3://bucket/prefix`, ...; materialised in `CACHEX_TIER_DIR`
        /// or a temporary directory first).
        path: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Rewrite a segment-store cache without dead rows.
    Compact {
        /// The cache directory.
        path: PathBuf,
    },
    /// Publish a cache directory to object storage as the next commit of
    /// its commit log.
    ///
    /// URLs: `s3://bucket/prefix`, `gs://…`, `az://…`, `file:///…`. The
    /// commit log is the one the stores publish to: the files new or
    /// changed since the last
    /// commit, uploaded first, and the files it no longer has as removed;
    /// the commit is written last, so readers never see a half-published
    /// cache. Credentials and endpoints come from the environment
    /// (`AWS_*`, ...).
    Push {
        /// The cache directory.
        local: PathBuf,
        /// Where to publish it.
        url: String,
    },
    /// Materialise the commit log at URL into a local directory.
    ///
    /// The directory keeps a record of what it applied in
    /// `.cachex-remote/`: pulling again applies only what was published
    /// since, removals included.
    Pull {
        /// Where the cache was published.
        url: String,
        /// The local directory to fill.
        local: PathBuf,
        /// A local tier directory to fetch through (kept, shared by
        /// processes); by default a temporary one.
        #[arg(long)]
        tier_dir: Option<PathBuf>,
        /// The local tier's budget, in MiB.
        #[arg(long, default_value_t = 1024)]
        tier_budget_mib: u64,
    },
    /// Delete what no commit inside the retention window needs, and fold
    /// old commits into a checkpoint.
    ///
    /// Objects of a cache in object storage that no commit inside the
    /// retention window needs are deleted; the commits up to the window's
    /// first are folded into a checkpoint (so an open stays a few
    /// requests).
    /// Objects younger than the grace period are never deleted (a
    /// publisher's uploads before its commit), nor those a publish still
    /// running holds a lease on (`leases/`, however long it runs); a
    /// reader on any commit that was current within the window keeps
    /// working. Safe while writers publish.
    Gc {
        /// Where the cache was published (`s3://bucket/prefix`, ...).
        url: String,
        /// The retention window: the commit current at its start and every
        /// later one stay readable (`30s`, `15m`, `1h`, `7d`, `2w`; `0s`
        /// keeps the last commit only).
        #[arg(long, default_value = "7d", value_parser = crate::garbage::parse_duration)]
        keep: std::time::Duration,
        /// Objects written within it are never deleted, referenced or not
        /// (a publisher's uploads before its commit). Publishers of this
        /// version need none; below 30m, run gc only while no earlier
        /// version publishes.
        #[arg(long, default_value = "1h", value_parser = crate::garbage::parse_duration)]
        grace: std::time::Duration,
        /// Print JSON instead of a line.
        #[arg(long)]
        json: bool,
    },
    /// Show what a cache in object storage holds: live bytes, garbage,
    /// commits, checkpoints.
    ///
    /// Garbage is what `cachex gc` with the same window would delete, once
    /// past its grace period.
    Du {
        /// Where the cache was published (`s3://bucket/prefix`, ...).
        url: String,
        /// The retention window live bytes are counted for (as `gc --keep`).
        #[arg(long, default_value = "7d", value_parser = crate::garbage::parse_duration)]
        keep: std::time::Duration,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show what a node's local tier holds and does: budget, bytes held,
    /// bytes and requests fetched, hits, evictions, the plans registered
    /// and their progress.
    ///
    /// Read from the tier directory alone (no URL, no lock, nothing
    /// changed): what to look at when a job reading a cache in object
    /// storage seems slow.
    Tier {
        /// The local tier directory (`CACHEX_TIER_DIR`, `--tier-dir`, a
        /// store's `tier_dir`).
        dir: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Two epochs of a slow feature extractor through a cache.
    Demo {
        /// Where the demo cache goes.
        #[arg(long, default_value = "cachex-demo")]
        dir: PathBuf,
        /// Use a fresh temporary directory instead of --dir (the two
        /// conflict).
        #[arg(long, conflicts_with = "dir")]
        temp: bool,
        /// Samples in the synthetic dataset.
        #[arg(long, default_value_t = 2000)]
        n: usize,
        /// Simulated extractor cost per sample, in milliseconds.
        #[arg(long, default_value_t = 2.0)]
        cost_ms: f64,
    },
}

/// Parses the arguments and runs the command.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                EXIT_USAGE
            } else {
                EXIT_SOUND
            });
        }
    };
    match run(cli.command) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("cachex: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Runs one command; `Ok` carries the exit code.
pub fn run(command: Command) -> Result<u8> {
    match command {
        Command::Inspect { path, json } => {
            let local = local_copy(&path)?;
            let path = local.as_ref().map_or(path, |m| m.path.clone());
            let summary = spec_for(&path)?.inspect(&path)?;
            print_summary(&summary, json)?;
            Ok(EXIT_SOUND)
        }
        Command::Verify { path, json } => {
            let local = local_copy(&path)?;
            verify(local.as_ref().map_or(&path, |m| &m.path), json)
        }
        Command::Get { path, key, json } => {
            // A segment store at a URL: the key's row, not the whole cache.
            let keyed = match path.to_str().filter(|p| remote_cache::is_url(p)) {
                Some(url) => crate::keyed::get(url, &key)?,
                None => None,
            };
            let value = match keyed {
                Some(value) => value,
                None => {
                    let local = local_copy(&path)?;
                    let path = local.as_ref().map_or(path, |m| m.path.clone());
                    spec_for(&path)?.get(&path, &key)?
                }
            };
            print(&if json {
                value.to_string()
            } else {
                value_table(&value)
            })?;
            Ok(EXIT_SOUND)
        }
        Command::Stats { path, json } => {
            let local = local_copy(&path)?;
            let path = local.as_ref().map_or(path, |m| m.path.clone());
            let summary = spec_for(&path)?.stats(&path)?;
            print_summary(&summary, json)?;
            Ok(EXIT_SOUND)
        }
        Command::Compact { path } => compact(&path),
        Command::Push { local, url } => {
            let (code, text) = crate::remote::push(&local, &url, progress())?;
            print(&text)?;
            Ok(code)
        }
        Command::Pull {
            url,
            local,
            tier_dir,
            tier_budget_mib,
        } => {
            let (code, text) = crate::remote::pull(&url, &local, tier_dir, tier_budget_mib)?;
            print(&text)?;
            Ok(code)
        }
        Command::Gc {
            url,
            keep,
            grace,
            json,
        } => {
            let (code, text) = crate::garbage::run_gc(&url, keep, grace, json)?;
            print(&text)?;
            Ok(code)
        }
        Command::Du { url, keep, json } => {
            let (code, text) = crate::garbage::run_du(&url, keep, json)?;
            print(&text)?;
            Ok(code)
        }
        Command::Tier { dir, json } => {
            let (code, text) = crate::tier::run_tier(&dir, json)?;
            print(&text)?;
            Ok(code)
        }
        Command::Demo {
            dir,
            temp,
            n,
            cost_ms,
        } => demo(dir, temp, n, cost_ms),
    }
}

/// A URL (`s3://…`) materialised locally; `None` for a local path.
fn local_copy(path: &Path) -> Result<Option<crate::remote::Materialised>> {
    match path.to_str().filter(|p| remote_cache::is_url(p)) {
        Some(url) => crate::remote::materialise(url).map(Some),
        None => Ok(None),
    }
}

/// Progress bars only on a terminal.
fn progress() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
}

fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").map_err(CliError::Output)
}

fn print_summary(summary: &Summary, json: bool) -> Result<()> {
    print(&if json {
        summary.to_json().to_string()
    } else {
        summary.to_string()
    })
}

/// The registry's entry for the cache at `path`, or the usage error saying
/// why there is none (no such path; no kind cachex knows).
pub fn spec_for(path: &Path) -> Result<&'static dyn KindSpec> {
    if !path.exists() {
        return Err(CliError::NoSuchPath(path.to_path_buf()));
    }
    cache_facade::spec_at(path).ok_or_else(|| CliError::NotACache {
        path: path.to_path_buf(),
        known: KINDS
            .iter()
            .map(|s| s.kind().name())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// What `cachex verify` checks: the kind of cache at `path` and every
/// problem found in it, each naming its file (empty when sound). `Err`
/// when `path` is missing or no cache `cachex` knows.
pub fn verify_path(path: &Path) -> Result<(Detected, Vec<Problem>)> {
    let spec = spec_for(path)?;
    Ok((spec.kind(), spec.verify(path)))
}

fn verify(path: &Path, json: bool) -> Result<u8> {
    let (kind, problems) = verify_path(path)?;
    if json {
        print(&json!({"kind": kind.name(), "path": path, "problems": problems}).to_string())?;
    } else {
        for p in &problems {
            print(&format!("problem ({}): {p}", p.kind))?;
        }
        if problems.is_empty() {
            print(&format!("{} ({}): sound", path.display(), kind.name()))?;
        } else {
            print(&format!(
                "{} ({}): {} problem(s)",
                path.display(),
                kind.name(),
                problems.len()
            ))?;
        }
    }
    Ok(if problems.is_empty() {
        EXIT_SOUND
    } else {
        EXIT_PROBLEMS
    })
}

fn compact(path: &Path) -> Result<u8> {
    let kind = spec_for(path)?.kind();
    if kind != Detected::own(StoreKind::SegmentStore) {
        return Err(CliError::WrongKind {
            path: path.to_path_buf(),
            command: "compact",
            works_on: "segment-store",
            found: kind.name(),
        });
    }
    let store = cache_facade::open_segments_at(path, false)?;
    let report = store.compact().map_err(CliError::store)?;
    print(&format!(
        "compacted {}: {} -> {} segments, {} live rows kept, {} dead rows dropped",
        path.display(),
        report.segments_before,
        report.segments_after,
        report.live_rows,
        report.dropped_rows
    ))?;
    Ok(EXIT_SOUND)
}

fn demo(dir: PathBuf, temp: bool, n: usize, cost_ms: f64) -> Result<u8> {
    if !(0.0..=10_000.0).contains(&cost_ms) {
        return Err(CliError::Usage(format!(
            "--cost-ms {cost_ms} is out of range 0..=10000"
        )));
    }
    let tmp;
    let dir = if temp {
        tmp = tempfile::tempdir().map_err(CliError::io(
            "create temporary directory",
            std::env::temp_dir(),
        ))?;
        tmp.path().to_path_buf()
    } else {
        dir
    };
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
    let summary = crate::demo::run(&opts)?;
    print(&summary.to_string())?;
    Ok(EXIT_SOUND)
}

//! W9 of `BENCHMARKS.md`: a tier that knows the epoch. One machine
//! simulates M nodes (one local tier each) × R ranks reading one page file
//! on an S3 test server for E epochs through `cachex.torch`'s plan, with
//! the tier's budget at 25% to 110% of a node's share.
//!
//! The runner starts each server (as W6 does, [`crate::w6::server`]),
//! writes W5's samples into one page file (`layout.rs`), publishes it with a
//! block list in the tier block W9 reads in, and writes each sample's
//! checksum, length and run beside it. It then runs one Python child per
//! server (`benches/python/w9.py`, imports paid once) with the line matrix
//! as JSON, and prints the child's lines as its own (`workload: "w9"`,
//! `server`). The child does the reading and the verdicts; see its
//! docstring and BENCHMARKS.md for the lines, the fields and the goals.
//!
//! - s3s-fs: N samples (default 6,000, about 195 MB), 256 KiB pages, 64
//!   KiB tier blocks, every line: M = 1 `lru` and `plan`, M = 4 `lru`,
//!   `plan`, `affine_f0` and `affine_f0.1`, at budgets 0.25, 0.5, 0.75,
//!   0.9 and 1.1 of a node's share (30 lines).
//! - moto (which loads the whole object for every ranged GET): N / 16
//!   samples, 64 KiB pages, 16 KiB blocks, the budget 0.5 only, M = 1
//!   `lru` and `plan`, M = 4 `plan` and `affine_f0` (4 lines).
//!
//! The same samples also go into a segment store (`sample_<i>` →
//! `{"blob": bytes}`, a twelfth of them to a segment), published beside
//! the page file and read through `cachex.torch.SegmentDataset` (whose
//! plan spans every segment): on s3s-fs M = 1 `lru` and `plan` at every
//! budget, M = 4 `lru`, `plan` and `affine_f0` at 0.5 and 1.1 (16
//! lines); on moto M = 1 `lru` and `plan` at 0.5.
//!
//! The child also writes the samples into a page file of its own with
//! `cachex.PageWriter(url)` and its defaults (page size, tier block), as a
//! user would, and reads it as the lines of store `defaults`: M = 1, `lru`
//! and `map` at 0.5, `plan` at every budget up to 0.9. Lines of policy
//! `map` read map-style: every sample once an epoch in a random order, one
//! `dataset[i]` at a time (a `DataLoader(shuffle=True)`), no plan; M = 1
//! at 0.5 on each store.

mod layout;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::w6::server::{Kind, Server, venv, workspace};
use crate::{Ctx, Line, RunError, progress};

/// Epochs every line reads.
const EPOCHS: usize = 3;
/// Rank threads per simulated node.
const RANKS: usize = 2;
/// Samples per batch.
const BATCH: usize = 16;
/// Nodes of the multi-node lines.
const NODES: usize = 4;
/// Segments of the segment store.
const SEGMENTS: usize = 12;
/// Budgets, as fractions of a node's share of the dataset.
const BUDGETS: [f64; 5] = [0.25, 0.5, 0.75, 0.9, 1.1];
/// The prefix of the page file the child writes with the defaults.
const DEFAULTS: &str = "w9def";

fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> RunError {
    RunError::store("w9", e)
}

/// One line of the matrix: which store, how many nodes, how they read
/// and evict, and the budget.
struct LineSpec {
    /// `pages`, `segments` or `defaults` (the page file the child writes
    /// with `cachex.PageWriter`'s defaults).
    store: &'static str,
    nodes: usize,
    /// `lru`, `plan`, `affine_f0`, `affine_f0.1` or `map` (random
    /// `dataset[i]` reads, no plan).
    policy: &'static str,
    budget: f64,
}

impl LineSpec {
    fn to_json(&self) -> Value {
        let (affinity, cross_node, plan_eviction) = match self.policy {
            "lru" | "map" => ("global", 0.0, false),
            "plan" => ("global", 0.0, true),
            "affine_f0" => ("node", 0.0, true),
            _ => ("node", 0.1, true),
        };
        let prefix = match self.store {
            "segments" => "seg_",
            "defaults" => "def_",
            _ => "",
        };
        json!({
            "name": format!("{prefix}m{}_{}_b{}", self.nodes, self.policy, self.budget),
            "store": self.store,
            "policy": self.policy,
            "nodes": self.nodes,
            "budget_frac": self.budget,
            "affinity": affinity,
            "cross_node": cross_node,
            "plan_eviction": plan_eviction,
        })
    }
}

/// What a server's run reads: the sizes and the lines.
struct Setup {
    samples: usize,
    page_size: u64,
    block_size: u64,
    lines: Vec<LineSpec>,
}

impl Setup {
    fn of(kind: Kind, n: usize) -> Setup {
        let line = |nodes, policy, budget| LineSpec {
            store: "pages",
            nodes,
            policy,
            budget,
        };
        let segments = |nodes, policy, budget| LineSpec {
            store: "segments",
            nodes,
            policy,
            budget,
        };
        let defaults = |nodes, policy, budget| LineSpec {
            store: "defaults",
            nodes,
            policy,
            budget,
        };
        // Map-style reads of each store, and the page file of the
        // defaults under a plan and an LRU.
        let mut more = vec![
            line(1, "map", 0.5),
            segments(1, "map", 0.5),
            defaults(1, "map", 0.5),
            defaults(1, "lru", 0.5),
        ];
        more.extend(
            BUDGETS
                .into_iter()
                .filter(|b| *b < 1.0)
                .map(|b| defaults(1, "plan", b)),
        );
        match kind {
            Kind::S3s => {
                let mut lines = Vec::new();
                for budget in BUDGETS {
                    for policy in ["lru", "plan"] {
                        lines.push(line(1, policy, budget));
                    }
                    for policy in ["lru", "plan", "affine_f0", "affine_f0.1"] {
                        lines.push(line(NODES, policy, budget));
                    }
                }
                for budget in BUDGETS {
                    for policy in ["lru", "plan"] {
                        lines.push(segments(1, policy, budget));
                    }
                }
                for policy in ["lru", "plan", "affine_f0"] {
                    lines.extend([segments(NODES, policy, 0.5), segments(NODES, policy, 1.1)]);
                }
                lines.extend(more);
                Setup {
                    samples: n,
                    page_size: 256 << 10,
                    block_size: 64 << 10,
                    lines,
                }
            }
            Kind::Moto => Setup {
                samples: (n / 16).max(1),
                page_size: 64 << 10,
                block_size: 16 << 10,
                lines: [
                    line(1, "lru", 0.5),
                    line(1, "plan", 0.5),
                    line(NODES, "plan", 0.5),
                    line(NODES, "affine_f0", 0.5),
                    segments(1, "lru", 0.5),
                    segments(1, "plan", 0.5),
                ]
                .into_iter()
                .chain(more)
                .collect(),
            },
        }
    }
}

/// Runs W9 (see the module docs) on each server of `--server`.
pub fn run(ctx: &Ctx) -> Result<(), RunError> {
    let servers = Kind::parse_list(ctx.w6_server.as_deref().unwrap_or("both"))?;
    let n = ctx.n_or(6_000);
    for kind in servers {
        let setup = Setup::of(kind, n);
        let scratch = ctx.fresh_dir(&format!("w9-{}", kind.name())).map_err(err)?;
        let server = Server::start(kind, &scratch)?;
        let bucket = server.run_bucket("w9")?;
        progress!(
            "w9: writing and publishing {} samples ({} KiB pages) to {}",
            setup.samples,
            setup.page_size >> 10,
            kind.name()
        );
        let cache = layout::write(
            &server,
            &bucket,
            &scratch,
            setup.samples,
            ctx.seed,
            setup.page_size,
            setup.block_size,
        )?;
        progress!("w9: writing and publishing the same samples as a segment store");
        let segments = layout::write_segments(
            &server,
            &bucket,
            &scratch,
            setup.samples,
            ctx.seed,
            (setup.samples / SEGMENTS).max(1),
        )?;
        // The child writes the page file of the defaults here itself.
        let (defaults_url, publish_url, publish_options) = server.urls(&bucket, DEFAULTS);
        let config = json!({
            "server": kind.name(),
            "url": cache.url,
            "storage_options": server
                .options()
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect::<serde_json::Map<_, _>>(),
            "root": scratch.join("tiers"),
            "layout": cache.layout,
            "samples": setup.samples,
            "dataset_bytes": cache.bytes,
            "block_size": cache.block_size,
            "page_size": setup.page_size,
            "max_run": cache.max_run,
            "fixed_ranges": cache.fixed.iter().map(|r| [r.start, r.end]).collect::<Vec<_>>(),
            "epochs": EPOCHS,
            "ranks": RANKS,
            "batch": BATCH,
            "seed": ctx.seed,
            "lines": setup.lines.iter().map(LineSpec::to_json).collect::<Vec<_>>(),
            "segments": {
                "url": segments.url,
                "dataset_bytes": segments.bytes,
                "layout": segments.layout,
                // One batch's rows per reading thread (each row's blocks
                // leased while read, and a 4 KiB block either side).
                "max_run": BATCH as u64 * (segments.max_sample + 2 * (4 << 10)),
            },
            "defaults": {
                "url": format!("{defaults_url}/{}", layout::PAGE_FILE),
                "publish_url": format!("{publish_url}/{}", layout::PAGE_FILE),
                "publish_options": publish_options
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect::<serde_json::Map<_, _>>(),
            },
        });
        let config_path = scratch.join("w9.json");
        std::fs::write(&config_path, config.to_string()).map_err(err)?;
        run_child(ctx, kind, &config_path)?;
        drop(server);
        let _ = std::fs::remove_dir_all(&scratch);
    }
    Ok(())
}

/// Runs `benches/python/w9.py` on `config` and prints its lines as the
/// runner's; a wrong value it read fails the run.
fn run_child(ctx: &Ctx, kind: Kind, config: &Path) -> Result<(), RunError> {
    let python = venv().join("bin").join("python");
    let script = workspace().join("benches").join("python").join("w9.py");
    let mut child = Command::new(&python)
        .arg(&script)
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| err(format!("{} {}: {e}", python.display(), script.display())))?;
    let mut wrong = None;
    if let Some(out) = child.stdout.take() {
        for text in BufReader::new(out).lines() {
            let text = text.map_err(err)?;
            let Ok(Value::Object(mut fields)) = serde_json::from_str::<Value>(&text) else {
                return Err(err(format!(
                    "w9.py printed a line that is not JSON: {text:?}"
                )));
            };
            if let Some(detail) = fields.get("wrong_value") {
                wrong = Some(detail.to_string());
                continue;
            }
            let phase = fields.remove("phase");
            let n = fields.remove("n").and_then(|v| v.as_u64()).unwrap_or(0);
            let bytes = fields.remove("bytes").and_then(|v| v.as_u64()).unwrap_or(0);
            let secs = fields.get("secs").and_then(Value::as_f64).unwrap_or(0.0);
            let phase = phase.as_ref().and_then(Value::as_str).unwrap_or("unknown");
            let mut line =
                Line::new("w9", phase, n as usize, bytes, secs).with("server", kind.name());
            for (k, v) in fields {
                line = line.with(&k, v);
            }
            ctx.emit(line);
        }
    }
    let status = child.wait().map_err(err)?;
    if let Some(detail) = wrong {
        return Err(RunError::WrongValue {
            workload: "w9",
            detail,
        });
    }
    if !status.success() {
        return Err(err(format!("w9.py on {} failed ({status})", kind.name())));
    }
    Ok(())
}

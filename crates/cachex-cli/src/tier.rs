//! `cachex tier DIR [--json]`: what a node's local tier holds and does —
//! the budget it was opened with, the bytes it holds, the bytes and
//! requests it fetched, its hits and misses, its evictions, the plans
//! registered in it and their progress — read from the tier directory
//! alone ([`remote_tier::TierReport`]: no URL, no lock, nothing changed).
//! What to look at when a job seems slow.

use std::path::Path;

use remote_tier::{PlanStatus, TierReport};
use serde_json::{Value, json};

use crate::demo::human_bytes;
use crate::error::{CliError, EXIT_SOUND, Result};

/// Runs `cachex tier`.
pub(crate) fn run_tier(dir: &Path, json: bool) -> Result<(u8, String)> {
    if !dir.exists() {
        return Err(CliError::NoSuchPath(dir.to_path_buf()));
    }
    let report = TierReport::read(dir).map_err(|e| match e {
        remote_tier::Error::NotATier { path } => CliError::NotATier(path),
        e => CliError::store(e),
    })?;
    let text = match json {
        true => report_json(&report).to_string(),
        false => report_text(&report),
    };
    Ok((EXIT_SOUND, text))
}

/// The report as `cachex tier --json` prints it (the fields the crate
/// docs list).
fn report_json(r: &TierReport) -> Value {
    let s = &r.stats;
    let plans: Vec<Value> = r
        .plans
        .iter()
        .map(|p| {
            json!({
                "file": p.file,
                "host": p.host,
                "pid": p.pid,
                "alive": p.alive,
                "progress": p.progress,
                "epoch_len": p.epoch_len,
                "objects": p.objects,
                "problem": p.problem,
            })
        })
        .collect();
    json!({
        "tier_dir": r.tier_dir.display().to_string(),
        "budget": r.budget.map(|b| b.bytes),
        "budget_pid": r.budget.map(|b| b.pid),
        "allocated": s.allocated,
        "over_budget_bytes": r.over_budget_bytes(),
        "fetched_bytes": s.fetched_bytes,
        "get_requests": s.get_requests,
        "head_requests": s.head_requests,
        "hits": s.hits,
        "misses": s.misses,
        "hit_ratio": s.hit_ratio(),
        "evicted_bytes": s.evicted_bytes,
        "punched_blocks": s.punched_blocks,
        "over_budget": s.over_budget,
        "generation": s.generation,
        "rebuilds": s.rebuilds,
        "plans": plans,
    })
}

/// `1.5 MiB (1572864 bytes)`.
fn size(n: u64) -> String {
    format!("{} ({n} bytes)", human_bytes(n))
}

fn percent(part: u64, whole: u64) -> String {
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// The report as `cachex tier` prints it: one line a subject.
fn report_text(r: &TierReport) -> String {
    let s = &r.stats;
    let budget = match r.budget {
        Some(b) => format!("{}, recorded by pid {}", size(b.bytes), b.pid),
        None => "not recorded (no process opened the tier since budgets were recorded)".into(),
    };
    let held = match (r.budget, r.over_budget_bytes()) {
        (Some(_), Some(over)) if over > 0 => {
            format!("{}: OVER the budget by {}", size(s.allocated), size(over))
        }
        (Some(b), _) if b.bytes > 0 => {
            format!(
                "{}: {} of the budget",
                size(s.allocated),
                percent(s.allocated, b.bytes)
            )
        }
        _ => size(s.allocated),
    };
    let reads = match s.hit_ratio() {
        Some(ratio) => format!(
            "{}: {} hits, {} misses, hit ratio {:.1}%",
            s.hits + s.misses,
            s.hits,
            s.misses,
            ratio * 100.0
        ),
        None => "none counted yet".into(),
    };
    let alive = r.plans.iter().filter(|p| p.alive).count();
    let mut lines = vec![
        format!("tier dir     {}", r.tier_dir.display()),
        format!("budget       {budget}"),
        format!("held         {held}"),
        format!(
            "fetched      {} in {} GET and {} HEAD requests",
            size(s.fetched_bytes),
            s.get_requests,
            s.head_requests
        ),
        format!("reads        {reads}"),
        format!(
            "evicted      {}; {} blocks punched",
            size(s.evicted_bytes),
            s.punched_blocks
        ),
        format!(
            "no room      {} reads went over the budget (all else leased or pinned)",
            s.over_budget
        ),
        format!(
            "count        generation {}, rebuilt {} time(s)",
            s.generation, s.rebuilds
        ),
        format!("plans        {} ({alive} alive)", r.plans.len()),
    ];
    lines.extend(r.plans.iter().map(plan_line));
    lines.join("\n")
}

/// `  <file>: pid 42 on host, alive, position 3 of 10 (30.0%), 2 objects`.
fn plan_line(p: &PlanStatus) -> String {
    let who = match (&p.host, p.pid) {
        (Some(host), Some(pid)) => format!("pid {pid} on {host}"),
        _ => "registrant unknown".into(),
    };
    let life = if p.alive { "alive" } else { "dead" };
    let progress = match (p.progress, p.epoch_len, &p.problem) {
        (_, _, Some(problem)) => format!("unreadable: {problem}"),
        (Some(at), Some(len), None) if at < len => {
            format!("position {at} of {len} ({})", percent(at, len))
        }
        (Some(at), Some(len), None) => {
            format!(
                "position {at}: epoch of {len} done, {} into the next",
                at - len
            )
        }
        _ => "no progress recorded".into(),
    };
    let objects = p
        .objects
        .map_or(String::new(), |n| format!(", {n} object(s)"));
    format!("  {}: {who}, {life}, {progress}{objects}", p.file)
}

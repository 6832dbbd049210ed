//! `cachex tier DIR [--json]`, run as a real process on a tier used for
//! real (a `file://` bucket read through a local tier by this test
//! process, a plan registered and advanced), and on paths that are no
//! tier.

use std::path::Path;
use std::process::{Command, Output};

use remote_tier::{RemoteTier, TierConfig, TierStats};
use serde_json::Value;

const BUDGET: u64 = 1 << 20;

fn cachex(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cachex"))
        .args(args)
        .output()
        .expect("spawn cachex")
}

fn ok(args: &[&str]) -> String {
    let out = cachex(args);
    assert!(
        out.status.success(),
        "cachex {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `cachex args`, which must fail with `code` and say `what` on
/// stderr (and nothing on stdout, and no panic).
fn fails(args: &[&str], code: i32, what: &[&str]) {
    let out = cachex(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "cachex {args:?}: {err}");
    assert!(out.stdout.is_empty(), "cachex {args:?} printed a report");
    assert!(!err.contains("panicked"), "{err}");
    for w in what {
        assert!(err.contains(w), "cachex {args:?}: {w:?} not in {err:?}");
    }
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A tier over a `file://` bucket: 64 KiB blocks, no read-ahead.
fn open(bucket: &Path, local: &Path) -> RemoteTier {
    let mut config = TierConfig::new(local, BUDGET);
    config.block_size = 64 << 10;
    config.whole_file_max = 64 << 10;
    config.prefetch_blocks = 0;
    RemoteTier::open(&format!("file://{}/", bucket.display()), config).unwrap()
}

#[test]
fn a_used_tier_shows_its_budget_counters_and_live_plan() {
    let bucket = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let tier = open(bucket.path(), local.path());
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    tier.put_bytes("data.bin", bytes.clone()).unwrap();
    let file = tier.open_object("data.bin").unwrap();
    let mut buf = [0u8; 16];
    file.read_at(100, &mut buf).unwrap();
    file.read_at(200, &mut buf).unwrap();
    assert_eq!(buf[..], bytes[200..216]);
    let plan = file
        .set_plan(
            &[(0..10, 0), (70_000..70_010, 2), (140_000..140_010, 7)],
            10,
        )
        .unwrap();
    plan.advance(3).unwrap();
    let plan_file = plan.path().file_name().unwrap().to_str().unwrap();

    let stats = TierStats::read(local.path()).unwrap();
    assert_eq!((stats.hits, stats.misses), (1, 1), "{stats:?}");

    let text = ok(&["tier", p(local.path())]);
    for want in [
        format!("tier dir     {}", local.path().display()),
        format!(
            "budget       1.0 MiB (1048576 bytes), recorded by pid {}",
            std::process::id()
        ),
        format!("held         {}", human(stats.allocated)),
        format!(
            "fetched      64.0 KiB (65536 bytes) in {} GET and {} HEAD requests",
            stats.get_requests, stats.head_requests
        ),
        "reads        2: 1 hits, 1 misses, hit ratio 50.0%".to_string(),
        "evicted      0 B (0 bytes); 0 blocks punched".to_string(),
        "plans        1 (1 alive)".to_string(),
        format!("  {plan_file}: pid {} on ", std::process::id()),
        ", alive, position 3 of 10 (30.0%), 1 object(s)".to_string(),
    ] {
        assert!(text.contains(&want), "{want:?} not in:\n{text}");
    }
    assert!(text.contains("of the budget"), "{text}");

    let json: Value = serde_json::from_str(&ok(&["tier", p(local.path()), "--json"])).unwrap();
    assert_eq!(json["tier_dir"], p(local.path()));
    assert_eq!(json["budget"], BUDGET);
    assert_eq!(json["budget_pid"], std::process::id());
    for (field, value) in [
        ("allocated", stats.allocated),
        ("fetched_bytes", stats.fetched_bytes),
        ("get_requests", stats.get_requests),
        ("head_requests", stats.head_requests),
        ("hits", stats.hits),
        ("misses", stats.misses),
        ("evicted_bytes", stats.evicted_bytes),
        ("punched_blocks", stats.punched_blocks),
        ("over_budget", stats.over_budget),
        ("generation", stats.generation),
        ("rebuilds", stats.rebuilds),
    ] {
        assert_eq!(json[field], value, "{field} in {json}");
    }
    assert_eq!(json["fetched_bytes"], 64 << 10);
    assert_eq!(json["hit_ratio"], 0.5);
    assert_eq!(json["over_budget_bytes"], 0);
    let plans = json["plans"].as_array().unwrap();
    assert_eq!(plans.len(), 1, "{json}");
    let live = &plans[0];
    assert_eq!(live["file"], plan_file);
    assert_eq!(live["pid"], std::process::id());
    assert_eq!(live["alive"], true);
    assert_eq!(live["progress"], 3);
    assert_eq!(live["epoch_len"], 10);
    assert_eq!(live["objects"], 1);
    assert_eq!(live["problem"], Value::Null);

    // Progress is read as it moves; a dropped plan is gone.
    plan.advance(12).unwrap();
    let text = ok(&["tier", p(local.path())]);
    assert!(
        text.contains("position 12: epoch of 10 done, 2 into the next"),
        "{text}"
    );
    drop(plan);
    let json: Value = serde_json::from_str(&ok(&["tier", p(local.path()), "--json"])).unwrap();
    assert_eq!(json["plans"], serde_json::json!([]));
    assert!(ok(&["tier", p(local.path())]).contains("plans        0 (0 alive)"));
}

/// `1.0 MiB (1048576 bytes)`, as the command prints sizes.
fn human(n: u64) -> String {
    format!("{} ({n} bytes)", cachex_cli::demo::human_bytes(n))
}

#[test]
fn paths_that_are_no_tier_and_damaged_states_are_typed_errors() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("nope");
    fails(
        &["tier", p(&missing)],
        2,
        &[p(&missing), "no such file or directory"],
    );
    fails(
        &["tier", p(root.path()), "--json"],
        2,
        &[p(root.path()), "not a tier directory"],
    );
    let a_file = root.path().join("file");
    std::fs::write(&a_file, b"x").unwrap();
    fails(
        &["tier", p(&a_file)],
        2,
        &[p(&a_file), "not a tier directory"],
    );

    let state = root.path().join("tier.state");
    std::fs::write(&state, vec![7u8; 4096]).unwrap();
    fails(&["tier", p(root.path())], 1, &[p(&state), "bad magic"]);
    std::fs::write(&state, b"CXTIERST").unwrap();
    fails(
        &["tier", p(root.path()), "--json"],
        1,
        &[p(&state), "8 bytes, where a tier state has 4096"],
    );
    let mut newer = b"CXTIERST".to_vec();
    newer.extend_from_slice(&2u64.to_le_bytes());
    newer.resize(4096, 0);
    std::fs::write(&state, newer).unwrap();
    fails(
        &["tier", p(root.path())],
        1,
        &[p(&state), "version 2, this build reads 1"],
    );
}

//! Runs every workload at a small size, so the runner cannot rot: each must
//! exit 0 (every value it read back was right) and print well-formed lines.

use std::process::Command;

use serde_json::Value;

fn run(which: &str, n: &str) -> Vec<Value> {
    run_with(which, n, &[])
}

fn run_with(which: &str, n: &str, extra: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_workload"))
        .args(extra)
        .args([
            which,
            "--n",
            n,
            "--limits-mb",
            "8",
            "--memcpy-mb",
            "8",
            "--dir",
        ])
        .arg(dir.path())
        .output()
        .expect("spawn workload");
    assert!(
        out.status.success(),
        "workload {which} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    for line in &lines {
        for field in [
            "workload",
            "phase",
            "n",
            "items_per_s",
            "mb_per_s",
            "peak_rss_bytes",
        ] {
            assert!(
                line.get(field).is_some(),
                "{which}: line lacks {field}: {line}"
            );
        }
        if line.get("limit").is_some() {
            let f = line["fraction_of_limit"]
                .as_f64()
                .expect("fraction_of_limit");
            assert!(f.is_finite() && f >= 0.0, "{line}");
        }
        // A write phase names its yardstick: the files it wrote, written
        // once before each repetition.
        if line["limit"] == "durable_write_same_files" {
            assert!(line["yardstick_files"].as_u64() > Some(0), "{line}");
            assert!(line["yardstick_bytes"].as_u64() > Some(0), "{line}");
            assert!(line["yardstick_fsyncs"].as_u64() > Some(0), "{line}");
            assert_eq!(
                line["yardstick_secs"].as_array().map(Vec::len),
                line["repetitions"].as_u64().map(|r| r as usize),
                "{line}"
            );
        }
    }
    let phases: Vec<&str> = lines
        .iter()
        .filter(|l| l["workload"] == which)
        .filter_map(|l| l["phase"].as_str())
        .collect();
    assert!(!phases.is_empty(), "{which} printed no line of its own");
    lines
}

#[test]
fn limits_only() {
    let lines = run("limits", "1");
    let phases: Vec<&str> = lines.iter().filter_map(|l| l["phase"].as_str()).collect();
    assert_eq!(phases, ["memcpy", "page_cache_read", "durable_write"]);
}

#[test]
fn w1_smoke() {
    run("w1", "600");
}

#[test]
fn w2_smoke() {
    let lines = run("w2", "300");
    let scaling = lines
        .iter()
        .find(|l| l["phase"] == "scaling")
        .expect("w2 ends with a scaling line");
    for field in ["flush_ratio", "open_ratio", "open_ms_at_max"] {
        assert!(scaling[field].as_f64().is_some(), "{scaling}");
    }
}

#[test]
fn w3_smoke() {
    run("w3", "2000");
}

#[test]
fn w4_smoke() {
    run("w4", "50");
}

#[test]
fn w5_smoke() {
    run("w5", "200");
}

/// Whether the S3 server scripts/test starts is there (`CACHEX_S3_ENDPOINT`).
/// Outside it (and outside CI, where its absence fails) the workload would
/// start its own from the venv, which may not exist: `which` is skipped.
fn s3_server(which: &str) -> bool {
    if std::env::var("CACHEX_S3_ENDPOINT").is_ok() {
        return true;
    }
    let msg = "CACHEX_S3_ENDPOINT not set: run scripts/test, which starts the S3 test server";
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    eprintln!("skipping {which} smoke: {msg}");
    false
}

#[test]
fn w6_smoke() {
    if !s3_server("w6") {
        return;
    }
    // moto (scripts/test's); s3s-fs too where CACHEX_W6_SERVERS says so
    // (it is built from crates.io on first use, minutes on two cores).
    let servers = std::env::var("CACHEX_W6_SERVERS").unwrap_or_else(|_| "moto".into());
    let lines = run_with("w6", "400", &["--server", &servers]);
    let names: &[&str] = match servers.as_str() {
        "both" => &["moto", "s3s-fs"],
        "s3s" => &["s3s-fs"],
        _ => &["moto"],
    };
    for server in names {
        let of = |cache: &str, phase: &str| {
            lines
                .iter()
                .find(|l| {
                    l["cache"] == cache
                        && l["phase"] == phase
                        && (phase == "read_local" || l["server"] == *server)
                })
                .unwrap_or_else(|| panic!("no {server} {cache} {phase} line"))
        };
        for cache in ["w1", "w5"] {
            for phase in ["yardstick", "yardstick_latency"] {
                let y = of(cache, phase);
                assert!(y["requests"].as_u64() > Some(0), "{y}");
                assert!(y["round_trip_s"].as_f64() > Some(0.0), "{y}");
            }
            for phase in [
                "read_local",
                "read_cold",
                "read_warm",
                "read_budget",
                "read_cold_latency",
            ] {
                let line = of(cache, phase);
                if phase != "read_local" {
                    assert!(line["fraction_of_local"].as_f64().unwrap() > 0.0);
                    assert!(line["fraction_of_server"].as_f64().unwrap() > 0.0);
                    assert!(line["requests"].as_u64().is_some());
                    assert!(line["fetch_ratio"].as_f64().is_some());
                }
            }
            // A warm open asks whether the log is still the one it holds
            // (`log.json`, a few dozen bytes, beside the commit it asks
            // for); no byte of the cache is fetched again.
            let warm = of(cache, "read_warm")["bytes_fetched"].as_u64();
            assert!(
                warm.is_some_and(|b| b < 128),
                "a warm read fetches nothing but the log's identity: {warm:?}"
            );
        }
        let first = of("w1", "first_batch");
        assert!(first["first_batch_s"].as_f64() > Some(0.0), "{first}");
        assert!(first["goal_s"].as_f64() > Some(0.0), "{first}");
    }
}

#[test]
fn w9_smoke() {
    // W9 reads through the Python package too (the venv's).
    if !s3_server("w9") {
        return;
    }
    // moto reads N / 16 samples: 64 of them, a few pages.
    let lines = run_with("w9", "1024", &["--server", "moto"]);
    let of = |phase: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| l["workload"] == "w9" && l["phase"] == phase)
            .collect()
    };
    // 14 lines (the page file's M = 1, 1, 4, 4; the segment store's M = 1
    // LRU and plan; map-style reads of the page file, the segment store
    // and the page file of PageWriter's defaults; that file's LRU and its
    // plans at four budgets) × 3 epochs, one line per node.
    let epochs = of("epoch");
    assert_eq!(
        epochs.len(),
        (1 + 1 + 4 + 4 + 1 + 1 + 3 + 1 + 4) * 3,
        "{epochs:?}"
    );
    let of_store = |store: &str| epochs.iter().filter(|e| e["store"] == store).count();
    assert_eq!(of_store("segments"), 9, "{epochs:?}");
    assert_eq!(of_store("defaults"), 18, "{epochs:?}");
    for e in &epochs {
        assert_eq!(e["server"], "moto", "{e}");
        for field in [
            "fetched_bytes",
            "get_requests",
            "floor_bytes",
            "floor_tier_bytes",
            "bookkeeping",
            "budget",
            "bound",
        ] {
            assert!(e[field].as_u64().is_some(), "epoch line lacks {field}: {e}");
        }
        // Less budget for the cached bytes (the tier's bookkeeping counts
        // too): a floor at least as high.
        assert!(
            e["floor_tier_bytes"].as_u64() >= e["floor_bytes"].as_u64(),
            "{e}"
        );
        assert!(e["max_physical"].as_u64() > Some(0), "{e}");
        assert!(e["n"].as_u64() > Some(0), "{e}");
    }
    // Epoch 0 fetches what a node reads; the floor says at least as much.
    for e in epochs.iter().filter(|e| e["epoch"] == 0) {
        assert!(e["fetched_bytes"].as_u64() >= Some(1), "{e}");
        assert!(e["floor_bytes"].as_u64() >= Some(1), "{e}");
    }
    assert_eq!(of("line").len(), 14);
    let goals = of("goal");
    let named = |g: &str, store: &str| {
        goals
            .iter()
            .any(|l| l["goal"] == g && (store.is_empty() || l["store"] == store))
    };
    for (g, store) in [
        ("allocated_within_budget", ""),
        ("plan_at_floor", "pages"),
        ("plan_vs_lru", "pages"),
        ("plan_at_floor", "segments"),
        ("plan_vs_lru", "segments"),
        ("segment_store_within_budget", ""),
        ("plan_at_floor", "defaults"),
        ("plan_vs_lru", "defaults"),
        ("map_within_d", "pages"),
        ("map_within_d", "segments"),
        ("map_within_d", "defaults"),
    ] {
        assert!(named(g, store), "no {g} goal line of {store}: {goals:?}");
    }
}

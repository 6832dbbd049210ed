//! A local tier of 10% of the cache, read through S3: every byte right,
//! the tier within its budget, open objects never evicted.

mod common;

use std::os::unix::fs::FileExt;

use common::{s3_endpoint, s3_store, s3_tier, sample, small_config};

#[test]
fn a_budget_of_a_tenth_of_the_cache_serves_every_byte() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "cache");
    let writer_dir = tempfile::tempdir().unwrap();
    let writer = s3_tier(&endpoint, &url, small_config(writer_dir.path(), 1 << 30));
    // 12 small objects fetched whole and 4 large ones fetched by blocks.
    let mut objects = Vec::new();
    for i in 0..12u64 {
        objects.push((
            format!("shards/{i}.shard"),
            sample(40_000 + i as usize * 1000, i),
        ));
    }
    for i in 0..4u64 {
        objects.push((
            format!("segments/{i}.arrow"),
            sample(600_000 + i as usize * 7, 100 + i),
        ));
    }
    for (name, bytes) in &objects {
        writer.put_bytes(name, bytes.clone()).unwrap();
    }
    let total: u64 = objects.iter().map(|(_, b)| b.len() as u64).sum();
    let budget = total / 10;

    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(dir.path(), budget);
    // A prefetch in flight pins its object (it writes into its file), so
    // the strict budget check after each close needs none running.
    config.prefetch_blocks = 0;
    let tier = s3_tier(&endpoint, &url, config);
    let largest_whole = 64 << 10;
    for pass in 0..2 {
        for (k, (name, bytes)) in objects.iter().enumerate() {
            let f = tier.open_object(name).unwrap();
            // Read it in strides so large objects cross many blocks.
            let stride = 50_000.min(bytes.len());
            let mut at = (k * 997) % stride;
            while at < bytes.len() {
                let len = 3_000.min(bytes.len() - at);
                let mut buf = vec![0u8; len];
                f.read_at(at as u64, &mut buf).unwrap();
                assert_eq!(buf, bytes[at..at + len], "pass {pass} {name} at {at}");
                at += stride;
            }
            // While open, only this object may hold the tier over budget.
            let held = tier.local_usage().unwrap();
            assert!(
                held <= budget + bytes.len() as u64 + largest_whole,
                "{held} bytes held, budget {budget}"
            );
            drop(f);
            let report = tier.evict().unwrap();
            assert!(report.bytes_after <= budget, "{report:?}");
            assert!(tier.local_usage().unwrap() <= budget);
        }
    }
    // Whole reads of everything at the end: still every byte right.
    for (name, bytes) in &objects {
        let f = tier.open_object(name).unwrap();
        let mut got = vec![0u8; bytes.len()];
        f.read_at(0, &mut got).unwrap();
        assert!(got == *bytes, "{name}");
    }
}

#[test]
fn an_open_object_is_not_evicted_under_its_reader() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "cache");
    let dir = tempfile::tempdir().unwrap();
    // A budget smaller than one object: everything is over budget.
    let tier = s3_tier(&endpoint, &url, small_config(dir.path(), 1_000));
    let a = sample(30_000, 1);
    let b = sample(30_000, 2);
    tier.put_bytes("a", a.clone()).unwrap();
    tier.put_bytes("b", b.clone()).unwrap();
    let fa = tier.open_object("a").unwrap();
    let fb = tier.open_object("b").unwrap(); // its fetch evicts what it can
    let report = tier.evict().unwrap();
    assert_eq!(report.pinned, 2, "{report:?}");
    let mut got = vec![0u8; a.len()];
    fa.file().unwrap().read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, a);
    fb.file().unwrap().read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, b);
    drop((fa, fb));
    let report = tier.evict().unwrap();
    assert_eq!((report.evicted, report.bytes_after), (2, 0), "{report:?}");
    // Evicted copies come back on the next read.
    let f = tier.open_object("a").unwrap();
    f.file().unwrap().read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, a);
}

/// Every file in the tier's `locks/` directory.
fn lock_files(tier_dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(tier_dir.join("locks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn lock_files_go_with_the_fetches_and_copies_they_guard() {
    // Real files on both sides: a `file://` store and a local tier.
    let bucket = tempfile::tempdir().unwrap();
    let url = format!("file://{}", bucket.path().display());
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(dir.path(), 200 << 10);
    config.prefetch_blocks = 0;
    let tier = remote_tier::RemoteTier::open(&url, config).unwrap();
    let mut objects = Vec::new();
    for i in 0..8u64 {
        objects.push((format!("shards/{i}.shard"), sample(30_000, i)));
        objects.push((format!("segments/{i}.arrow"), sample(300_000, 50 + i)));
    }
    for (name, bytes) in &objects {
        tier.put_bytes(name, bytes.clone()).unwrap();
    }
    for round in 0..3 {
        for (name, bytes) in &objects {
            let f = tier.open_object(name).unwrap();
            let mut buf = vec![0u8; bytes.len()];
            f.read_at(0, &mut buf).unwrap();
            assert!(buf == *bytes, "round {round}: {name}");
        }
        tier.evict().unwrap();
        let locks = lock_files(dir.path());
        assert!(
            locks.iter().all(|n| !n.ends_with(".fetch")),
            "round {round}: fetch locks left behind: {locks:?}"
        );
        // Only the copies still local keep a pin (one object each).
        let local = std::fs::read_dir(dir.path().join("objects"))
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                let name = name.to_string_lossy();
                name.ends_with(".whole") || name.ends_with(".sparse")
            })
            .count();
        assert!(
            locks.len() <= local,
            "round {round}: {} lock files for {local} local copies: {locks:?}",
            locks.len()
        );
    }
}

const PIN_CHILD: &str = "CACHEX_TEST_PIN_CHILD";

/// The child half of `an_object_open_in_another_process_is_not_evicted`
/// (does nothing unless spawned by it): opens object `a` in the shared
/// tier, says so, and holds it until its stdin closes.
#[test]
fn pinning_child() {
    let Some(fields) = test_support::s3::child_fields(PIN_CHILD) else {
        return;
    };
    let (endpoint, url, dir) = (&*fields[0], &*fields[1], &*fields[2]);
    let tier = s3_tier(
        endpoint,
        url,
        small_config(std::path::Path::new(dir), 1 << 30),
    );
    let held = tier.open_object("a").unwrap();
    println!("\nOPEN");
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut rest);
    drop(held);
}

#[test]
fn an_object_open_in_another_process_is_not_evicted() {
    use std::io::{BufRead, BufReader};
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "pinned");
    let dir = tempfile::tempdir().unwrap();
    let tier = s3_tier(&endpoint, &url, small_config(dir.path(), 1_000));
    tier.put_bytes("a", sample(30_000, 1)).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "pinning_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            PIN_CHILD,
            test_support::s3::child_env(&endpoint, &url, dir.path(), &[]),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l == "OPEN")),
        "the child opened the object"
    );
    let report = tier.evict().unwrap();
    assert_eq!((report.pinned, report.evicted), (1, 0), "{report:?}");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let report = tier.evict().unwrap();
    assert_eq!((report.pinned, report.evicted), (0, 1), "{report:?}");
}

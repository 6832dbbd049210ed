//! A store that fails, hangs or truncates requests (a wrapper around the
//! S3 test server's store): typed errors, retries where safe, and nothing
//! wrong left in the local tier.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{faulty_tier, s3_endpoint, s3_store, sample, small_config};
use remote_tier::{Error, Expected, RemoteTier, TierConfig};

/// A faulty tier over a fresh bucket holding `small` (fetched whole) and
/// `large` (fetched by blocks).
fn setup(
    endpoint: &str,
    dir: &std::path::Path,
    tune: impl FnOnce(&mut TierConfig),
) -> (RemoteTier, std::sync::Arc<common::Faults>, Vec<u8>, Vec<u8>) {
    let (store, prefix, url) = s3_store(endpoint, "f");
    let mut config = small_config(dir, 1 << 30);
    config.prefetch_blocks = 0;
    tune(&mut config);
    let (tier, faults) = faulty_tier(store, prefix, &url, config);
    let small = sample(30_000, 1);
    let large = sample(400_000, 2);
    tier.put_bytes("small", small.clone()).unwrap();
    tier.put_bytes("large", large.clone()).unwrap();
    (tier, faults, small, large)
}

/// Every byte of `name` read through `tier` equals `bytes`.
fn assert_reads(tier: &RemoteTier, name: &str, bytes: &[u8]) {
    let f = tier.open_object(name).unwrap();
    let mut got = vec![0u8; bytes.len()];
    f.read_at(0, &mut got).unwrap();
    assert!(got == bytes, "{name} read back differs");
}

#[test]
fn transient_failures_are_retried() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (tier, faults, small, large) = setup(&endpoint, dir.path(), |_| {});
    faults.fail_gets.store(3, Ordering::SeqCst); // attempts: 4
    assert_reads(&tier, "small", &small);
    faults.fail_gets.store(3, Ordering::SeqCst);
    assert_reads(&tier, "large", &large);
    assert_eq!(
        faults.fail_gets.load(Ordering::SeqCst),
        0,
        "every injected failure was met"
    );
}

#[test]
fn persistent_failures_are_typed_errors_and_leave_nothing_behind() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (tier, faults, small, large) = setup(&endpoint, dir.path(), |_| {});
    faults.fail_gets.store(1_000, Ordering::SeqCst);
    match tier.open_object("small") {
        Err(Error::Remote {
            op: "get",
            attempts: 4,
            name,
            url,
            ..
        }) => {
            assert_eq!(name, "small");
            assert!(url.starts_with("s3://"), "{url}");
        }
        other => panic!("expected a Remote error after 4 attempts, got {other:?}"),
    }
    let f = tier.open_object("large").unwrap(); // a HEAD only
    let err = f.ensure(100_000..100_010).unwrap_err();
    assert!(matches!(err, Error::Remote { attempts: 4, .. }), "{err}");
    assert!(
        err.to_string().contains("large") && err.to_string().contains("injected fault"),
        "{err}"
    );
    assert!(!f.is_complete());
    drop(f);
    // No block is marked fetched, not even in a fresh handle.
    assert_eq!(tier.open_object("large").unwrap().blocks_present(), (0, 7));
    faults.fail_gets.store(0, Ordering::SeqCst);
    assert_reads(&tier, "small", &small);
    assert_reads(&tier, "large", &large);
}

#[test]
fn hanging_requests_time_out_and_are_retried() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (tier, faults, small, large) = setup(&endpoint, dir.path(), |c| {
        c.retry.request_timeout = Duration::from_millis(300);
        c.retry.attempts = 2;
    });
    faults.hang_gets.store(1, Ordering::SeqCst);
    assert_reads(&tier, "small", &small); // the second attempt answers
    faults.hang_gets.store(2, Ordering::SeqCst);
    let f = tier.open_object("large").unwrap();
    let err = f.ensure(0..10).unwrap_err();
    assert!(matches!(err, Error::TimedOut { attempts: 2, .. }), "{err}");
    assert!(!f.is_complete());
    drop(f);
    assert_reads(&tier, "large", &large);
}

#[test]
fn short_or_wrong_bytes_are_refused_and_not_kept() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (tier, faults, small, large) = setup(&endpoint, dir.path(), |_| {});
    faults.truncate_gets.store(1, Ordering::SeqCst);
    let err = tier.open_object("small").unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("small"), "{err}");
    faults.truncate_gets.store(1, Ordering::SeqCst);
    let f = tier.open_object("large").unwrap();
    assert!(matches!(f.ensure(0..10), Err(Error::Corrupt { .. })));
    drop(f);
    assert_eq!(
        tier.open_object("large").unwrap().blocks_present(),
        (0, 7),
        "no refused block kept"
    );

    // A BLAKE3 that does not match: refused, the copy removed.
    let wrong = Expected {
        size: Some(large.len() as u64),
        blake3: Some([7; 32]),
    };
    let err = tier.fetch("large", &wrong).unwrap_err();
    assert!(err.to_string().contains("BLAKE3"), "{err}");
    assert_eq!(
        tier.open_object("large").unwrap().blocks_present(),
        (0, 7),
        "the copy was removed"
    );
    let wrong_size = Expected {
        size: Some(1),
        blake3: None,
    };
    assert!(matches!(
        tier.fetch("small", &wrong_size),
        Err(Error::Corrupt { .. })
    ));

    assert_reads(&tier, "small", &small);
    assert_reads(&tier, "large", &large);
}

#[test]
fn a_commit_whose_answer_was_lost_is_still_the_writers() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (tier, faults, _, _) = setup(&endpoint, dir.path(), |_| {});
    faults.lose_put_answers.store(1, Ordering::SeqCst);
    tier.commit("COMMIT_1", "writer a").unwrap();
    assert_eq!(&tier.read_remote("COMMIT_1").unwrap()[..], b"writer a");
    // But a record of other bytes is another writer's.
    assert!(matches!(
        tier.commit("COMMIT_1", "writer b"),
        Err(Error::CommitTaken { .. })
    ));
}

#[test]
fn a_missing_object_is_not_retried() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (tier, faults, _, _) = setup(&endpoint, dir.path(), |_| {});
    let before = faults.gets.load(Ordering::SeqCst);
    assert!(matches!(
        tier.read_remote("absent"),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(faults.gets.load(Ordering::SeqCst) - before, 1);
}

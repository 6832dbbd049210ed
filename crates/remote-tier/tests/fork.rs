//! A forked child (a data-loader worker) opens a tier of its own after its
//! parent used one: it must not send its requests to the parent's runtime,
//! whose threads it does not have, nor through the parent's connections.
//! Alone in its test binary, so that no other test thread runs at the fork.

mod common;

use common::{s3_endpoint, s3_store, s3_tier, sample, small_config};

#[test]
fn a_forked_child_opens_a_tier_of_its_own() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "fork");
    let dir = tempfile::tempdir().unwrap();
    let tier = s3_tier(
        &endpoint,
        &url,
        small_config(&dir.path().join("parent"), 1 << 30),
    );
    let data = sample(200_000, 7);
    tier.put_bytes("x", data.clone()).unwrap();
    // The parent's shared runtime and HTTP client exist from here on.
    assert_eq!(tier.read_remote("x").unwrap(), data);

    // SAFETY: no other thread of this test binary runs a test now; the
    // child only opens a tier, reads, and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            let t = s3_tier(
                &endpoint,
                &url,
                small_config(&dir.path().join("child"), 1 << 30),
            );
            let whole = t.read_remote("x").is_ok_and(|b| b == data);
            let f = t.open_object("x").unwrap();
            let mut buf = vec![0u8; 1000];
            f.read_at(150_000, &mut buf).unwrap();
            whole && buf == data[150_000..151_000]
        })
        .unwrap_or(false);
        // SAFETY: leaves the child without running the parent's destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    // A child stuck on its parent's runtime never exits.
    common::expect_child_ok(pid, "the forked child hung on its tier");
    // The parent's tier is unharmed by the child.
    assert_eq!(tier.read_remote("x").unwrap(), data);
}

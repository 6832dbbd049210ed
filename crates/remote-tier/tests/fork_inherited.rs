//! A tier opened and used before `fork()` (a data-loader's parent) is used
//! by the forked child as it is: the child must not wait on its parent's
//! runtime, whose threads it does not have, nor on its parent's
//! connections. Alone in its test binary, so that no other test thread
//! runs at the fork.

mod common;

use common::{s3_endpoint, s3_store, s3_tier, sample, small_config};

#[test]
fn a_forked_child_uses_the_tier_its_parent_opened() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "fork-inherited");
    let dir = tempfile::tempdir().unwrap();
    let tier = s3_tier(&endpoint, &url, small_config(dir.path(), 1 << 30));
    let small = sample(20_000, 3);
    let large = sample(400_000, 4);
    tier.put_bytes("small", small.clone()).unwrap();
    tier.put_bytes("large", large.clone()).unwrap();
    // The runtime, the HTTP client and its pooled connections exist now,
    // and a prefetch may be in flight at the fork.
    assert_eq!(tier.read_remote("small").unwrap(), small);
    let opened = tier.open_object("large").unwrap();
    let mut buf = vec![0u8; 1000];
    opened.read_at(10_000, &mut buf).unwrap();

    // SAFETY: no other thread of this test binary runs a test now; the
    // child only uses the tier, and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            let whole = tier.read_remote("small").is_ok_and(|b| b == small);
            let f = tier.open_object("large").unwrap();
            let mut buf = vec![0u8; 5000];
            f.read_at(300_000, &mut buf).unwrap();
            let mut again = vec![0u8; 1000];
            opened.read_at(200_000, &mut again).unwrap();
            tier.put_bytes("from-child", vec![7u8; 10]).unwrap();
            whole && buf == large[300_000..305_000] && again == large[200_000..201_000]
        })
        .unwrap_or(false);
        // SAFETY: leaves the child without running the parent's destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    // A child stuck on its parent's runtime never exits.
    common::expect_child_ok(pid, "the forked child hung on the tier its parent opened");
    // The parent's tier is unharmed by the child.
    assert_eq!(tier.read_remote("small").unwrap(), small);
    assert_eq!(&tier.read_remote("from-child").unwrap()[..], &[7u8; 10]);
}

//! Uploads trust the bytes, not the path (S3): a file whose bytes change
//! (same size, same inode) after the publisher hashed them and before it
//! uploads them is refused with an error naming it, for a publish (one
//! request) and a push (one request, and a multipart upload), and
//! nothing lands: no commit, and no object holding bytes other than its
//! name says. The change is made at the publish's `Hashed` stage
//! ([`remote_cache::hooks`]), deterministically.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::{new_bucket_url, s3_endpoint, s3_options, small_tier, tier};
use remote_cache::hooks::{Stage, on_stage};
use remote_cache::push_dir;
use remote_cache::{Error, LogState, RemoteDir, StoreFiles};
use remote_tier::RemoteTier;

/// Rewrites byte `at` of `path` in place (same size, same inode) at the
/// `Hashed` stage of the first publish to `url`.
fn change_after_hashing(url: &str, path: PathBuf, at: u64) {
    let armed = std::sync::atomic::AtomicBool::new(true);
    on_stage(url, move |stage| {
        if stage == Stage::Hashed && armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            let mut b = [0u8; 1];
            f.read_exact_at(&mut b, at).unwrap();
            f.write_all_at(&[!b[0]], at).unwrap();
            f.sync_all().unwrap();
        }
    });
}

/// The error is the tier's, naming `path`.
fn assert_refused(err: Error, path: &Path) {
    match &err {
        Error::Tier(remote_tier::Error::SourceChanged { path: p, .. }) if p == path => {}
        other => panic!("not a refusal naming {}: {other}", path.display()),
    }
    println!("refused: {err}");
}

/// No commit, and every object holds the bytes its name says.
fn assert_nothing_wrong_landed(tier: &RemoteTier, seq: u64) {
    assert_eq!(LogState::read(tier).unwrap().seq, seq);
    for o in tier.list("objects").unwrap() {
        let bytes = tier.read_remote_capped(&o.name, o.size).unwrap();
        let name = format!("objects/{}", blake3::hash(&bytes).to_hex());
        assert_eq!(
            o.name, name,
            "an object holds other bytes than its name says"
        );
    }
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|j| (j as u8).wrapping_mul(31) ^ (j >> 11) as u8 ^ salt)
        .collect()
}

#[test]
fn a_publish_of_a_file_changed_after_hashing_is_refused() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "publish");
    let w = tempfile::tempdir().unwrap();
    let writer = RemoteDir::open(
        tier(&endpoint, &url, &w.path().join("tier")),
        &w.path().join("work"),
        StoreFiles::PLAIN,
    )
    .unwrap();
    std::fs::write(writer.dir().join("a"), pattern(300 << 10, 0)).unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(1));
    let b = writer.dir().join("b");
    std::fs::write(&b, pattern(300 << 10, 1)).unwrap();
    change_after_hashing(writer.tier().url(), b.clone(), 150 << 10);
    assert_refused(writer.publish().unwrap_err(), &b);
    assert_nothing_wrong_landed(writer.tier(), 1);
    // Published as it is now, once asked again.
    assert_eq!(writer.publish().unwrap().seq, Some(2));
    assert_nothing_wrong_landed(writer.tier(), 2);
}

#[test]
fn a_push_of_a_file_changed_after_hashing_is_refused_in_one_request_and_in_parts() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    // The server's smallest part is 5 MiB: a file of 11 MiB goes in three.
    for (size, prefix) in [(200 << 10, "single"), (11 << 20, "multipart")] {
        let url = new_bucket_url(&endpoint, prefix);
        let (src, t) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut config = small_tier(t.path(), 1 << 30);
        config.part_size = 5 << 20;
        let pusher = RemoteTier::open_with_options(&url, s3_options(&endpoint), config).unwrap();
        std::fs::write(src.path().join("small"), pattern(1000, 2)).unwrap();
        let big = src.path().join("big");
        std::fs::write(&big, pattern(size, 3)).unwrap();
        // In the last part, past the first ones sent.
        change_after_hashing(pusher.url(), big.clone(), size as u64 - 10);
        let err = push_dir(&pusher, src.path(), &mut |_, _| {}).unwrap_err();
        assert_refused(err, &big);
        assert_nothing_wrong_landed(&pusher, 0);
        let pushed = push_dir(&pusher, src.path(), &mut |_, _| {}).unwrap();
        assert_eq!(pushed.seq, Some(1), "{prefix}");
        assert_nothing_wrong_landed(&pusher, 1);
    }
}

//! Objects read by blocks and checked block by block against the BLAKE3
//! their publisher recorded (`RemoteTier::open_verified`): round trips in
//! the recorded block size, a block corrupted in transit or on the server
//! (retried, then a typed error, nothing bad kept), and local copies made
//! without the list not trusted.

mod common;

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use common::{s3_endpoint, s3_store, s3_tier, sample, small_config};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, GetResult, GetResultPayload, ObjectStore};
use remote_tier::{BlockHasher, BlockHashes, Error, RemoteTier};
use test_support::intercept::{Intercept, Intercepted};

/// The block size the tests publish with: not the tiers' 64 KiB, so that
/// a reader visibly uses the recorded one.
const BLOCK: u64 = 16 << 10;

fn hashes_of(bytes: &[u8], block_size: u64) -> Arc<BlockHashes> {
    let mut hasher = BlockHasher::new(block_size);
    hasher.update(bytes);
    Arc::new(hasher.finalize().unwrap())
}

/// Flips one byte (the 100th of the block at `start`) of the body of the
/// next `left` GETs whose range covers `start`.
#[derive(Debug, Default)]
struct FlipBlock {
    start: AtomicU64,
    left: AtomicU64,
    flipped: AtomicU64,
}

#[async_trait]
impl Intercept for FlipBlock {
    fn name(&self) -> &'static str {
        "FlipBlock"
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        // A request of several blocks (a run) that covers the block counts
        // too: the byte flipped is the block's own.
        let start = self.start.load(Ordering::SeqCst);
        let at = match &options.range {
            Some(GetRange::Bounded(r)) if r.contains(&start) => Some((start - r.start) as usize),
            _ => None,
        };
        let hit = at.is_some();
        let got = inner.get_opts(location, options).await?;
        if !hit
            || self
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_err()
        {
            return Ok(got);
        }
        self.flipped.fetch_add(1, Ordering::SeqCst);
        let (meta, range, attributes) =
            (got.meta.clone(), got.range.clone(), got.attributes.clone());
        let mut body = got.bytes().await?.to_vec();
        body[at.unwrap_or(0) + 100] ^= 0x5a;
        let stream = futures::stream::once(async move { Ok(bytes::Bytes::from(body)) });
        Ok(GetResult {
            payload: GetResultPayload::Stream(Box::pin(stream)),
            meta,
            range,
            attributes,
            extensions: Default::default(),
        })
    }
}

/// A tier over a fresh bucket holding `large` (by blocks), behind
/// [`FlipBlock`]; prefetch off so each read fetches only what it covers.
fn flipping_tier(endpoint: &str, dir: &std::path::Path) -> (RemoteTier, Arc<FlipBlock>, Vec<u8>) {
    let (store, prefix, url) = s3_store(endpoint, "v");
    let mut config = small_config(dir, 1 << 30);
    config.prefetch_blocks = 0;
    let flip = Arc::new(FlipBlock::default());
    let wrapped = Arc::new(Intercepted::new(store, Arc::clone(&flip)));
    let tier = RemoteTier::with_store(wrapped, prefix, &url, config).unwrap();
    let large = sample(300_001, 7);
    tier.put_bytes("large", large.clone()).unwrap();
    (tier, flip, large)
}

#[test]
fn blocks_are_fetched_in_the_recorded_size_and_read_back() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "r");
    let dir = tempfile::tempdir().unwrap();
    let tier = s3_tier(&endpoint, &url, small_config(dir.path(), 1 << 30));
    let large = sample(1_000_003, 3);
    let small = sample(40_000, 4); // up to the tier's whole-file size
    tier.put_bytes("large", large.clone()).unwrap();
    tier.put_bytes("small", small.clone()).unwrap();

    let f = tier
        .open_verified("large", hashes_of(&large, BLOCK))
        .unwrap();
    let blocks = large.len().div_ceil(BLOCK as usize) as u64;
    assert_eq!(f.blocks_present(), (0, blocks), "the recorded block size");
    let mut buf = vec![0u8; 20];
    f.read_at(BLOCK * 5 - 10, &mut buf).unwrap();
    assert_eq!(
        buf,
        large[(BLOCK * 5 - 10) as usize..(BLOCK * 5 + 10) as usize]
    );
    assert!(f.blocks_present().0 >= 2);
    let mut all = vec![0u8; large.len()];
    f.read_at(0, &mut all).unwrap();
    assert!(all == large && f.is_complete());

    // A second handle on the same list shares the copy: nothing to fetch.
    let again = tier
        .open_verified("large", hashes_of(&large, BLOCK))
        .unwrap();
    assert!(again.is_complete());

    let whole = tier
        .open_verified("small", hashes_of(&small, BLOCK))
        .unwrap();
    let mut got = vec![0u8; small.len()];
    whole.file().unwrap().read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, small);

    // A list for other bytes of the same size: the small object's whole
    // fetch is refused and nothing of it is kept.
    tier.put_bytes("small2", small.clone()).unwrap();
    let other = hashes_of(&sample(small.len(), 5), BLOCK);
    match tier.open_verified("small2", other) {
        Err(Error::BlockMismatch(m)) if m.block == 0 => {}
        other => panic!("expected a block mismatch, got {other:?}"),
    }
    let local = std::fs::read_dir(dir.path().join("objects")).unwrap();
    assert!(
        local
            .filter_map(|e| e.ok())
            .all(|e| !e.file_name().to_string_lossy().starts_with("small2")),
        "a refused whole fetch leaves no local copy"
    );
}

#[test]
fn a_block_corrupted_once_in_transit_is_fetched_again() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (tier, flip, large) = flipping_tier(&endpoint, dir.path());
    flip.start.store(3 * BLOCK, Ordering::SeqCst);
    flip.left.store(1, Ordering::SeqCst);
    let f = tier
        .open_verified("large", hashes_of(&large, BLOCK))
        .unwrap();
    let mut got = vec![0u8; BLOCK as usize];
    f.read_at(3 * BLOCK, &mut got).unwrap();
    assert_eq!(got, large[3 * BLOCK as usize..4 * BLOCK as usize]);
    assert_eq!(flip.flipped.load(Ordering::SeqCst), 1);
}

#[test]
fn a_block_corrupted_twice_is_a_typed_error_and_never_kept() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (tier, flip, large) = flipping_tier(&endpoint, dir.path());
    let hashes = hashes_of(&large, BLOCK);
    flip.start.store(2 * BLOCK, Ordering::SeqCst);
    flip.left.store(2, Ordering::SeqCst);
    let f = tier.open_verified("large", Arc::clone(&hashes)).unwrap();
    let mut buf = vec![0u8; 3 * BLOCK as usize];
    let err = f.read_at(BLOCK, &mut buf).unwrap_err();
    let mut bad = large[2 * BLOCK as usize..3 * BLOCK as usize].to_vec();
    bad[100] ^= 0x5a;
    match &err {
        Error::BlockMismatch(m) => {
            let remote_tier::BlockMismatch {
                name,
                path,
                block,
                start,
                end,
                expected,
                got,
                ..
            } = &**m;
            assert_eq!(
                (name.as_str(), *block, *start, *end),
                ("large", 2, 2 * BLOCK, 3 * BLOCK)
            );
            assert_eq!(path, f.path());
            assert_eq!(
                expected,
                &blake3::Hash::from_bytes(*hashes.hash(2).unwrap())
                    .to_hex()
                    .to_string()
            );
            assert_eq!(got, &blake3::hash(&bad).to_hex().to_string());
        }
        other => panic!("expected a block mismatch, got {other:?}"),
    }
    let shown = err.to_string();
    assert!(
        shown.contains("large") && shown.contains("block 2") && shown.contains("32768..49152"),
        "{shown}"
    );
    assert_eq!(
        flip.flipped.load(Ordering::SeqCst),
        2,
        "fetched, then once more"
    );

    // The bad block is not in the local copy, its bytes never written.
    assert!(!f.is_complete());
    let mut local = vec![1u8; BLOCK as usize];
    f.file()
        .unwrap()
        .read_exact_at(&mut local, 2 * BLOCK)
        .unwrap();
    assert!(local.iter().all(|&b| b == 0), "no corrupt byte on disk");
    let (present, _) = f.blocks_present();
    let reopened = tier.open_verified("large", Arc::clone(&hashes)).unwrap();
    assert_eq!(
        reopened.blocks_present().0,
        present,
        "the map on disk agrees"
    );

    // The store answers right again: the same handle reads it.
    f.read_at(BLOCK, &mut buf).unwrap();
    assert!(buf == large[BLOCK as usize..4 * BLOCK as usize]);
}

#[test]
fn an_object_overwritten_on_the_server_is_refused_then_read_once_restored() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "o");
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(dir.path(), 1 << 30);
    config.prefetch_blocks = 0;
    let tier = s3_tier(&endpoint, &url, config);
    let large = sample(200_000, 9);
    let mut broken = large.clone();
    broken[5 * BLOCK as usize + 7] ^= 1;
    tier.put_bytes("large", broken).unwrap();

    let f = tier
        .open_verified("large", hashes_of(&large, BLOCK))
        .unwrap();
    let mut buf = vec![0u8; large.len()];
    match f.read_at(0, &mut buf) {
        Err(Error::BlockMismatch(m)) if m.block == 5 => {}
        other => panic!("expected a mismatch in block 5, got {other:?}"),
    }
    let mut local = vec![1u8; BLOCK as usize];
    f.file()
        .unwrap()
        .read_exact_at(&mut local, 5 * BLOCK)
        .unwrap();
    assert!(local.iter().all(|&b| b == 0), "no corrupt byte on disk");

    tier.put_bytes("large", large.clone()).unwrap();
    f.read_at(0, &mut buf).unwrap();
    assert!(buf == large && f.is_complete());
}

#[test]
fn a_copy_made_without_the_list_is_not_trusted() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "u");
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(dir.path(), 1 << 30);
    config.prefetch_blocks = 0;
    let tier = s3_tier(&endpoint, &url, config);
    let large = sample(500_000, 11);
    tier.put_bytes("large", large.clone()).unwrap();

    // Fetched by size and etag only, in the tier's own 64 KiB blocks.
    let unchecked = tier.open_object("large").unwrap();
    let mut all = vec![0u8; large.len()];
    unchecked.read_at(0, &mut all).unwrap();
    assert!(unchecked.is_complete());

    let checked = tier
        .open_verified("large", hashes_of(&large, BLOCK))
        .unwrap();
    let blocks = large.len().div_ceil(BLOCK as usize) as u64;
    assert_eq!(checked.blocks_present(), (0, blocks), "a fresh copy");
    checked.read_at(0, &mut all).unwrap();
    assert!(all == large);
    // The unchecked handle keeps its own file, still whole.
    unchecked.read_at(0, &mut all).unwrap();
    assert!(all == large);

    // A list that covers another size is refused before anything is fetched.
    let wrong = hashes_of(&large[..400_000], BLOCK);
    tier.put_bytes("large2", large.clone()).unwrap();
    match tier.open_verified("large2", wrong) {
        Err(Error::Corrupt { problem, .. }) => {
            assert!(
                problem.contains("the block list covers 400000"),
                "{problem}"
            )
        }
        other => panic!("expected a size mismatch, got {other:?}"),
    }
}

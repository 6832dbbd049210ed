//! A page file three times its local tier's budget, read for three epochs
//! by three processes that share the tier, each a rank reading its share
//! of a shuffled page order with its plan registered
//! (`PagesAt::set_plan`), the ranks in lockstep batch by batch (as
//! their collectives keep them). After every batch the tier's counted
//! bytes stay within the budget plus one run per reader, and the disk
//! holds no more than it counts; every sample read is right. From the
//! second epoch on, each epoch fetches at most 1.05 × the floor plus one
//! run per reader: the floor is what no policy can avoid fetching, the
//! epoch's blocks minus what the budget could have kept of them.
//!
//! Blocks are 4 KiB (the publisher's tier block, so the block list's):
//! a page (64 KiB, at 4 KiB-aligned offsets) is a run of whole blocks and
//! no two pages share one.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{
    Children, Lockstep, new_bucket_url, s3_endpoint, s3_options, small_tier, spawn_ready_child,
};
use page_alloc::{PageWriter, Value, WriterOptions};
use remote_cache::{Location, PagesAt, RemoteDir};
use remote_tier::{RemoteTier, TierConfig, TierStats};

const READERS: usize = 3;
const EPOCHS: u64 = 3;
const SAMPLES: usize = 2700;
const BATCH: usize = 16;
const PAGE: u64 = 64 << 10;
const BLOCK: u64 = 4 << 10;
/// Set in a child's environment: `endpoint \n url \n tier_dir \n budget \n rank`.
const CHILD: &str = "PAGE_BUDGET_CHILD";

/// Sample `i`'s bytes: 1 to 8 KiB derived from `i`.
fn blob(i: usize) -> Vec<u8> {
    let len = 1000 + (i * 7919) % 7000;
    (0..len).map(|k| (i * 31 + k * 7) as u8).collect()
}

/// A number from `seed` (splitmix64), for the shuffles.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Epoch `e`'s order: the pages (`first sample` of each, and the end)
/// shuffled, each page's samples in turn.
fn epoch_order(page_starts: &[usize], e: u64) -> Vec<usize> {
    let pages = page_starts.len() - 1;
    let mut perm: Vec<usize> = (0..pages).collect();
    for k in (1..pages).rev() {
        let r = (mix(e * 1_000_003 + k as u64) % (k as u64 + 1)) as usize;
        perm.swap(k, r);
    }
    perm.iter()
        .flat_map(|&p| page_starts[p]..page_starts[p + 1])
        .collect()
}

/// Rank `rank`'s batches of epoch `e`: its contiguous span of the order,
/// cut into batches (the remainder dropped, as `policy="drop_last"`).
fn rank_batches(page_starts: &[usize], e: u64, rank: usize) -> Vec<Vec<usize>> {
    let order = epoch_order(page_starts, e);
    let per_rank = order.len() / READERS / BATCH * BATCH;
    order[rank * per_rank..(rank + 1) * per_rank]
        .chunks(BATCH)
        .map(<[usize]>::to_vec)
        .collect()
}

/// The tier of a reader: the budget, no read-ahead (a plan's order jumps).
fn reader_tier(dir: &Path, budget: u64) -> TierConfig {
    let mut config = small_tier(dir, budget);
    config.prefetch_blocks = 0;
    config
}

/// Bytes allocated under the tier's `objects/` and `tmp/`: `(data,
/// metadata)`, data being the copies (`.sparse`, `.whole`) and fetches in
/// flight, metadata the block maps and block clocks beside them.
fn physical(tier_dir: &Path) -> (u64, u64) {
    let mut out = (0, 0);
    for d in ["objects", "tmp"] {
        let Ok(entries) = std::fs::read_dir(tier_dir.join(d)) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            let name = e.file_name().to_string_lossy().into_owned();
            let data = d == "tmp" || name.ends_with(".sparse") || name.ends_with(".whole");
            match data {
                true => out.0 += m.blocks() * 512,
                false => out.1 += m.blocks() * 512,
            }
        }
    }
    out
}

/// Writes the page file into `dir` and returns each page's first sample
/// (and the sample count last).
fn write_pages(dir: &Path) -> Vec<usize> {
    let schema = page_alloc::Schema::new().int("label").bytes("blob");
    let options = WriterOptions::default().page_size(PAGE);
    let mut writer = PageWriter::create(dir.join("data.pages"), schema, options).unwrap();
    for i in 0..SAMPLES {
        writer
            .append(&[Value::Int(i as i64), Value::Bytes(&blob(i))])
            .unwrap();
    }
    writer.finalize().unwrap();
    let reader = page_alloc::PageReader::open(dir.join("data.pages")).unwrap();
    let mut starts: Vec<usize> = reader
        .run_spans()
        .iter()
        .map(|r| r.first_sample as usize)
        .collect();
    starts.push(SAMPLES);
    starts
}

/// Writes the page file into `built` and publishes it at `url` with a
/// block list in `BLOCK` blocks; each page's first sample (as
/// [`write_pages`]) and the file's size.
fn publish_pages(endpoint: &str, url: &str, built: &Path) -> (Vec<usize>, u64) {
    let starts = write_pages(built);
    let size = std::fs::metadata(built.join("data.pages")).unwrap().len();
    let t = tempfile::tempdir().unwrap();
    let mut config = small_tier(t.path(), 1 << 30);
    config.block_size = BLOCK;
    let tier = RemoteTier::open_with_options(url, s3_options(endpoint), config).unwrap();
    let publisher = RemoteDir::open(tier, built, remote_cache::StoreFiles::PLAIN).unwrap();
    assert_eq!(publisher.publish().unwrap().seq, Some(1));
    (starts, size)
}

/// The child half of `a_page_file_three_times_the_budget_read_by_three_ranks_with_plans`
/// (does nothing unless spawned by it): rank `rank` reads its batches of
/// every epoch, one when told `go`, and answers `done <allocated>`.
#[test]
fn page_budget_child() {
    let Ok(args) = std::env::var(CHILD) else {
        return;
    };
    let args: Vec<&str> = args.split('\n').collect();
    let (endpoint, url, tier_dir) = (args[0], args[1], Path::new(args[2]));
    let budget: u64 = args[3].parse().unwrap();
    let rank: usize = args[4].parse().unwrap();
    let location =
        Location::remote(url, reader_tier(tier_dir, budget)).with_options(s3_options(endpoint));
    let pages = PagesAt::open(&location, "data.pages").unwrap();
    let starts: Vec<usize> = {
        let mut s: Vec<usize> = pages
            .reader()
            .run_spans()
            .iter()
            .map(|r| r.first_sample as usize)
            .collect();
        s.push(SAMPLES);
        s
    };
    let mut parent = Lockstep::ready();
    for e in 0..EPOCHS {
        let this = rank_batches(&starts, e, rank);
        let next = rank_batches(&starts, e + 1, rank);
        let len = this.len() as u64;
        let (mut samples, mut positions) = (Vec::new(), Vec::new());
        for (offset, batches) in [(0, &this), (len, &next)] {
            for (j, batch) in batches.iter().enumerate() {
                samples.extend_from_slice(batch);
                positions.extend(std::iter::repeat_n(offset + j as u64, batch.len()));
            }
        }
        let plan = pages.set_plan(&samples, &positions, len).unwrap().unwrap();
        for (j, batch) in this.iter().enumerate() {
            parent.go();
            let lease = pages.lease_samples(batch).unwrap();
            for &i in batch {
                let s = pages.reader().sample(i).unwrap();
                assert_eq!(s.int(0).unwrap(), i as i64);
                assert!(s.bytes(1).unwrap() == &blob(i)[..], "sample {i}");
            }
            drop(lease);
            plan.advance(j as u64 + 1).unwrap();
            parent.done(tier_dir);
        }
    }
    parent.end();
}

#[test]
fn a_page_file_three_times_the_budget_read_by_three_ranks_with_plans() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "page-budget");
    let built = tempfile::tempdir().unwrap();
    let (starts, size) = publish_pages(&endpoint, &url, built.path());
    let budget = size / 3 / BLOCK * BLOCK;
    let tier_dir = tempfile::tempdir().unwrap();
    let args = format!("{endpoint}\n{url}\n{}\n{budget}", tier_dir.path().display());
    let mut ranks = Children(
        (0..READERS)
            .map(|r| {
                spawn_ready_child(
                    "page_budget_child",
                    CHILD,
                    format!("{args}\n{r}"),
                    &format!("rank {r}"),
                )
            })
            .collect(),
    );

    // What the open left counted: the header and tables the readers keep
    // leased, the block map. The rest of the budget can keep pages.
    let opened = TierStats::read(tier_dir.path()).unwrap();
    let keepable = budget.saturating_sub(opened.allocated);
    // One run (a page: 16 blocks, plus a map's rounding) per reader.
    let runs = READERS as u64 * (PAGE + BLOCK);

    let blocks_of = |samples: &[usize]| -> BTreeSet<u64> {
        let mut pages_seen = BTreeSet::new();
        for &i in samples {
            pages_seen.insert(starts.partition_point(|&s| s <= i) - 1);
        }
        let reader = page_alloc::PageReader::open(built.path().join("data.pages")).unwrap();
        let spans = reader.run_spans();
        pages_seen
            .into_iter()
            .flat_map(|p| spans[p].bytes.start / BLOCK..spans[p].bytes.end.div_ceil(BLOCK))
            .collect()
    };
    let mut earlier: BTreeSet<u64> = BTreeSet::new();
    let mut report = Vec::new();
    let mut most_counted = 0u64;
    let mut most_physical = 0u64;
    let mut most_metadata = 0u64;
    let batches = rank_batches(&starts, 0, 0).len();
    for e in 0..EPOCHS {
        let read: Vec<usize> = (0..READERS)
            .flat_map(|r| rank_batches(&starts, e, r).into_iter().flatten())
            .collect();
        let blocks = blocks_of(&read);
        let kept_before = blocks.intersection(&earlier).count() as u64 * BLOCK;
        let floor = blocks.len() as u64 * BLOCK - kept_before.min(keepable);
        earlier.extend(&blocks);
        let before = TierStats::read(tier_dir.path()).unwrap();
        for _ in 0..batches {
            most_counted = most_counted.max(ranks.step("rank"));
            // All ranks between batches: what the tier holds now.
            let now = TierStats::read(tier_dir.path()).unwrap();
            let (disk, metadata) = physical(tier_dir.path());
            most_counted = most_counted.max(now.allocated);
            most_physical = most_physical.max(disk);
            assert!(
                disk <= now.allocated,
                "epoch {e}: the copies hold {disk} bytes, the tier counts {}",
                now.allocated
            );
            most_metadata = most_metadata.max(metadata);
        }
        let after = TierStats::read(tier_dir.path()).unwrap();
        let fetched = after.fetched_bytes - before.fetched_bytes;
        report.push((e, fetched, floor, after.over_budget));
        eprintln!(
            "epoch {e}: fetched {fetched} bytes ({:.3} of the file), floor {floor} ({:.3}), \
             most counted {most_counted}, most in copies {most_physical} (and {most_metadata} \
             of maps and clocks), budget {budget}, over budget {}",
            fetched as f64 / size as f64,
            floor as f64 / size as f64,
            after.over_budget
        );
    }
    for (child, _) in &mut ranks.0 {
        drop(child.stdin.take());
    }
    for (r, (child, _)) in ranks.0.iter_mut().enumerate() {
        assert!(child.wait().unwrap().success(), "rank {r}");
    }
    assert!(
        most_counted <= budget + runs,
        "the tier counted {most_counted} bytes at most, over {budget} + {runs}"
    );
    assert!(most_physical <= budget + runs);
    for &(e, fetched, floor, _) in &report[1..] {
        let allowed = floor + floor / 20 + runs;
        assert!(
            fetched <= allowed,
            "epoch {e}: fetched {fetched} bytes, the floor is {floor} (allowed {allowed})"
        );
    }
    // Nothing of the plans is left once their readers are gone.
    let plans = tier_dir.path().join("plans");
    let left = std::fs::read_dir(&plans).map_or(0, |d| {
        d.flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "plan"))
            .count()
    });
    assert_eq!(left, 0);
}

#[test]
fn a_page_file_smaller_than_the_whole_file_size_is_read_within_the_budget() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "page-budget-small");
    let built = tempfile::tempdir().unwrap();
    let (_, size) = publish_pages(&endpoint, &url, built.path());
    // The reader's tier would fetch a file this size whole, outside any
    // lease; a page file is linked and leased instead.
    let budget = size / 3 / BLOCK * BLOCK;
    let tier_dir = tempfile::tempdir().unwrap();
    let mut config = reader_tier(tier_dir.path(), budget);
    config.whole_file_max = size * 2;
    let location = Location::remote(&url, config).with_options(s3_options(&endpoint));
    let pages = PagesAt::open(&location, "data.pages").unwrap();
    let linked = pages.reader().path().symlink_metadata().unwrap();
    assert!(linked.file_type().is_symlink(), "the page file is linked");
    let runs = PAGE + BLOCK;
    let mut most = 0u64;
    for batch in (0..SAMPLES).collect::<Vec<_>>().chunks(BATCH) {
        let _lease = pages.lease_samples(batch).unwrap();
        for &i in batch {
            let s = pages.reader().sample(i).unwrap();
            assert!(s.bytes(1).unwrap() == &blob(i)[..], "sample {i}");
        }
        most = most.max(TierStats::read(tier_dir.path()).unwrap().allocated);
    }
    assert!(
        most <= budget + runs,
        "{most} bytes counted at most, over {budget} + {runs}"
    );
    assert!(physical(tier_dir.path()).0 <= budget + runs);
}

//! Seed inputs of the remote path's fuzz targets (`fuzz/`), built like
//! those of [`crate::fuzz_seeds`]: small *valid* inputs, the same bytes on
//! every run, written to `fuzz/corpus/<target>/seed-<what>` by the
//! `fuzz-seeds` binary and checked by `tests/remote_fuzz_seeds.rs`.
//!
//! | target | input | seeds |
//! |---|---|---|
//! | `remote_commit` | selector byte (even: read, odd: read and apply; bit 2: a checkpoint, applied) + a record | commits published by a real segment writer; commits over [`remote_cache::fuzz_entry::payloads`]: new files, appends, a replace, an empty file, a file read by blocks with its block list, a removal; a checkpoint |
//! | `remote_block_list` | object size (u64 LE) + a block list's JSON | lists of the payloads in 4 KiB blocks and of a multi-block object in 8 KiB blocks |
//! | `tier_block_map` | a block map | maps of version 1 (with and without an etag) and 2, some blocks present |

use std::path::Path;
use tensor_core::Value;

use remote_cache::CHECKPOINT_VERSION;
use remote_cache::fuzz_entry::payloads;
use remote_cache::{COMMIT_VERSION, commit_name};
use remote_cache::{Checkpoint, Commit, Location, Piece, SegmentsAt};
use remote_tier::{BlockHasher, TierConfig};
use segment_store::Options;
use tensor_core::Tensor;

use crate::fuzz_seeds::{Result, Seed};

/// The log every commit seed names: a log's identity is random, and a
/// fixed one keeps seeds the same from run to run.
const SEED_LOG: &str = "5eed5eed5eed5eed5eed5eed5eed5eed";

/// The remote path's fuzz targets, in `fuzz/Cargo.toml` order.
pub const TARGETS: [&str; 3] = ["remote_commit", "remote_block_list", "tier_block_map"];

fn seed(target: &'static str, what: &str, bytes: Vec<u8>) -> Seed {
    Seed {
        target,
        name: format!("seed-{what}"),
        bytes,
    }
}

fn framed(what: &str, selector: u8, body: &[u8]) -> Seed {
    let mut bytes = vec![selector];
    bytes.extend_from_slice(body);
    seed("remote_commit", what, bytes)
}

/// Every seed of the remote targets; `scratch` is an empty directory.
pub fn seeds(scratch: &Path) -> Result<Vec<Seed>> {
    let mut out = published_commits(scratch)?;
    out.extend(payload_commits()?);
    out.extend(block_lists()?);
    out.extend(block_maps());
    Ok(out)
}

/// Commits 1 and 2 of a segment writer publishing to a local URL, each
/// renumbered 1 (the target publishes its input as commit 1) and with a
/// fixed writer name (the real one carries the host, pid and time).
fn published_commits(scratch: &Path) -> Result<Vec<Seed>> {
    let remote = scratch.join("remote");
    std::fs::create_dir_all(&remote)?;
    let url = format!("file://{}", remote.display());
    let writer = SegmentsAt::open(
        &Location::remote(&url, TierConfig::new(scratch.join("tier"), 1 << 30)),
        Options {
            writer_id: Some(0),
            ..Options::default()
        },
    )?;
    for batch in 0..2u8 {
        let t = Tensor::from_vec([2], vec![f32::from(batch), 0.5])?;
        writer.put_batch(&[(format!("k{batch}"), Value::from(t))])?;
        writer.publish()?;
    }
    drop(writer);
    let mut out = Vec::new();
    for seq in 1..=2u64 {
        let bytes = std::fs::read(remote.join(commit_name(seq)))?;
        let mut commit: Commit = serde_json::from_slice(&bytes)?;
        commit.seq = 1;
        commit.writer = "seed".into();
        commit.log = SEED_LOG.into();
        let body = remote_cache::record::encode_record(&commit)?;
        out.push(framed(&format!("segments-commit-{seq}"), 0, &body));
    }
    Ok(out)
}

fn piece(path: &str, offset: u64, bytes: &[u8], replace: bool) -> Piece {
    Piece {
        path: path.into(),
        offset,
        size: bytes.len() as u64,
        blake3: blake3::hash(bytes).to_hex().to_string(),
        replace,
        blocks: None,
    }
}

/// Commits whose pieces point at the target's own objects, so that they
/// apply: every kind of piece a commit holds.
fn payload_commits() -> Result<Vec<Seed>> {
    let p = payloads();
    let mut by_blocks = piece("arrays/data.bin", 0, &p[3], false);
    let mut hasher = BlockHasher::new(4 << 10);
    hasher.update(&p[3]);
    by_blocks.blocks = Some(hasher.finalize()?.to_list());
    let commits = [
        ("new-file", vec![piece("a/small.dat", 0, &p[1], false)]),
        (
            "new-then-append",
            vec![
                piece("index.log", 0, &p[1], false),
                piece("index.log", 11, &p[2], false),
            ],
        ),
        (
            "new-then-replace",
            vec![
                piece("meta.json", 0, &p[2], false),
                piece("meta.json", 0, &p[1], true),
            ],
        ),
        ("empty-file", vec![piece("empty", 0, &p[0], false)]),
        ("read-by-blocks", vec![by_blocks]),
        ("no-pieces", Vec::new()),
        ("new-and-removed", vec![piece("kept.dat", 0, &p[1], false)]),
    ];
    let mut out = Vec::new();
    for (what, pieces) in commits {
        let removed = match what {
            "new-and-removed" => vec!["segments/old.arrow".to_string()],
            _ => Vec::new(),
        };
        let commit = Commit {
            version: COMMIT_VERSION,
            seq: 1,
            writer: "seed".into(),
            pieces,
            removed,
            log: SEED_LOG.into(),
        };
        let body = remote_cache::record::encode_record(&commit)?;
        out.push(framed(&format!("read-{what}"), 0, &body));
        out.push(framed(&format!("apply-{what}"), 1, &body));
    }
    // A checkpoint (selector bit 2): a file of two pieces, a file read by
    // blocks, an empty file.
    let mut by_blocks = piece("arrays/data.bin", 0, &p[3], false);
    let mut hasher = BlockHasher::new(4 << 10);
    hasher.update(&p[3]);
    by_blocks.blocks = Some(hasher.finalize()?.to_list());
    let checkpoint = Checkpoint {
        version: CHECKPOINT_VERSION,
        seq: 1,
        writer: "seed".into(),
        pieces: vec![
            piece("index.log", 0, &p[1], false),
            piece("index.log", 11, &p[2], false),
            by_blocks,
            piece("empty", 0, &p[0], false),
        ],
    };
    let body = remote_cache::record::encode_record(&checkpoint)?;
    out.push(framed("checkpoint", 4, &body));
    Ok(out)
}

/// Block lists of the payloads (4 KiB blocks) and of 20 KiB in 8 KiB
/// blocks, each after its object's size.
fn block_lists() -> Result<Vec<Seed>> {
    let mut objects: Vec<(String, Vec<u8>, u64)> = payloads()
        .into_iter()
        .enumerate()
        .map(|(i, p)| (format!("payload-{i}"), p, 4 << 10))
        .collect();
    objects.push(("three-blocks".into(), vec![7u8; 20_000], 8 << 10));
    let mut out = Vec::new();
    for (what, bytes, block_size) in objects {
        let mut hasher = BlockHasher::new(block_size);
        hasher.update(&bytes);
        let list = hasher.finalize()?.to_list();
        let mut input = (bytes.len() as u64).to_le_bytes().to_vec();
        input.extend_from_slice(&serde_json::to_vec(&list)?);
        out.push(seed("remote_block_list", &what, input));
    }
    Ok(out)
}

/// Block maps as the tier writes them.
fn block_maps() -> Vec<Seed> {
    use remote_tier::fuzz_entry::{encode_block_map, encode_unsynced_block_map};
    let maps = [
        (
            "v1-empty-etag",
            encode_block_map(4096, 10_000, "", None, &[]),
        ),
        (
            "v1-etag",
            encode_block_map(65_536, 400_000, "\"0f3c-etag\"", None, &[0, 3, 6]),
        ),
        (
            "v2-checked",
            encode_block_map(4096, 70_000, "\"e\"", Some([9u8; 32]), &[0, 1, 17]),
        ),
        (
            "v1-all",
            encode_block_map(8, 100, "x", None, &(0..13).collect::<Vec<_>>()),
        ),
        ("v1-zero-size", encode_block_map(4096, 0, "", None, &[])),
        (
            "v3-unsynced",
            encode_unsynced_block_map(65_536, 400_000, None, &[0], &[1, 5], [3u8; 16]),
        ),
        (
            "v3-unsynced-checked",
            encode_unsynced_block_map(4096, 70_000, Some([9u8; 32]), &[2], &[0, 16], [4u8; 16]),
        ),
    ];
    maps.into_iter()
        .map(|(what, bytes)| seed("tier_block_map", what, bytes))
        .collect()
}

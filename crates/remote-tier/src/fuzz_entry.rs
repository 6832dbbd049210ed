//! Entry points of the fuzz targets (`fuzz/`), public so that ordinary
//! tests run the same code over their seeds: the block map parser, which
//! is private to the crate.
//!
//! Each takes arbitrary bytes and must return (an error or a count) —
//! never panic, never allocate without bound.

use crate::format::BlockMap;

/// Decodes `bytes` as a block map (`objects/<key>.blocks` of the local
/// tier). A map that decodes must encode back to the very same bytes and
/// keep every block range inside the object. Returns the blocks present.
pub fn block_map(bytes: &[u8]) -> Result<u64, String> {
    let map = BlockMap::decode(bytes)?;
    assert_eq!(
        map.encode(),
        bytes,
        "a block map that decodes encodes to other bytes"
    );
    let blocks = map.blocks();
    for i in 0..blocks {
        let r = map.block_range(i);
        assert!(
            r.start < r.end && r.end <= map.size,
            "block {i} of {blocks}: range {r:?} outside {} bytes",
            map.size
        );
    }
    let mut copy = BlockMap::new(map.block_size, map.size, map.etag.clone(), map.checked);
    assert!(
        copy.same_copy(&map),
        "a fresh map of the same object differs"
    );
    copy.merge(&map);
    assert_eq!(
        copy.present(),
        map.present(),
        "merging lost or gained blocks"
    );
    Ok(map.present())
}

/// [`block_map`] over `bytes` with the trailing BLAKE3 recomputed, so that
/// a mutated input reaches the checks behind the checksum.
pub fn block_map_resealed(bytes: &[u8]) -> Result<u64, String> {
    block_map(&reseal(bytes))
}

/// `bytes` with its last 32 bytes replaced by the BLAKE3 of the rest
/// (inputs shorter than that are returned as they are).
pub fn reseal(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    if let Some(body) = out.len().checked_sub(32) {
        let hash = blake3::hash(&out[..body]);
        out[body..].copy_from_slice(hash.as_bytes());
    }
    out
}

/// A valid encoded block map: `blocks_present` of the blocks of an
/// object of `size` bytes in `block_size`-byte blocks, with `etag` and,
/// when given, the digest of the block list its blocks were checked
/// against (a seed for the fuzzer).
pub fn encode_block_map(
    block_size: u64,
    size: u64,
    etag: &str,
    checked: Option<[u8; 32]>,
    blocks_present: &[u64],
) -> Vec<u8> {
    let mut map = BlockMap::new(block_size, size, etag.to_string(), checked);
    for &i in blocks_present {
        map.set(i);
    }
    map.encode()
}

/// As [`encode_block_map`], with `unsynced` of the blocks marked present
/// but not durable, written in boot `boot` (a version 3 map).
pub fn encode_unsynced_block_map(
    block_size: u64,
    size: u64,
    checked: Option<[u8; 32]>,
    durable: &[u64],
    unsynced: &[u64],
    boot: [u8; 16],
) -> Vec<u8> {
    let mut map = BlockMap::new(block_size, size, "\"e\"".to_string(), checked);
    for &i in durable {
        map.set(i);
    }
    for &i in unsynced {
        map.set_unsynced(i, boot);
    }
    map.encode()
}

//! remote-tier's block lists (the per-block BLAKE3 a commit piece carries)
//! on arbitrary bytes: the first 8 bytes are the object's size (u64 LE),
//! the rest the list's JSON. A list that checks must round-trip, keep its
//! block ranges inside the object, and match its own blocks only.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remote_tier::{BlockHashes, BlockList};

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (size, json) = data.split_at(8);
    let mut b = [0u8; 8];
    b.copy_from_slice(size);
    let size = u64::from_le_bytes(b);
    let _ = BlockHashes::block_size_for(size, size.rotate_left(17));
    let Ok(list) = serde_json::from_slice::<BlockList>(json) else {
        return;
    };
    let Ok(hashes) = list.check(size) else { return };
    assert_eq!(hashes.size(), size);
    assert_eq!(hashes.blocks(), list.blake3.len() as u64);
    let back = hashes
        .to_list()
        .check(size)
        .expect("a checked list checks again");
    assert_eq!(back, hashes);
    assert_eq!(back.digest(), hashes.digest());
    for i in 0..hashes.blocks().min(64) {
        let r = hashes.range(i);
        assert!(
            r.start < r.end && r.end <= size,
            "block {i}: {r:?} of {size}"
        );
        assert!(hashes.hash(i).is_some());
        // An empty block is never a block of a list (blocks are not empty).
        assert!(!hashes.check_block(i, &[]).0 || r.is_empty());
    }
    assert!(hashes.hash(hashes.blocks()).is_none());
});

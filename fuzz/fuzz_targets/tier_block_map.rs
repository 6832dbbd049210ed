//! remote-tier's block maps (`objects/<key>.blocks` of the local tier) on
//! arbitrary bytes, as they are and with the trailing BLAKE3 recomputed
//! (so that mutations reach the header, etag, digest and bitmap checks).
//! A map that decodes must encode back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = remote_tier::fuzz_entry::block_map(data);
    let _ = remote_tier::fuzz_entry::block_map_resealed(data);
});

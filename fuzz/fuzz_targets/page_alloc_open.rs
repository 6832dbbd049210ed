//! `PageReader` open + sample reads on arbitrary bytes, as given and with
//! checksums recomputed (so mutations reach the structural checks).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = page_alloc::fuzz_entry::open_and_read(data);
    let _ = page_alloc::fuzz_entry::open_and_read_resealed(data);
});

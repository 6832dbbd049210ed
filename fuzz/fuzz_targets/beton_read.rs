//! `beton` parsing and sample reads on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = page_alloc::fuzz_entry::beton_read(data);
});

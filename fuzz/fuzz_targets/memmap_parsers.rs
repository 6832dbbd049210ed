//! memmap-array's parsers on arbitrary bytes: the first byte picks
//! `shapes.json`, a `manifest.jsonl` or a sidecar, the rest is the file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => drop(memmap_array::fuzz_entry::shapes_json(body)),
        1 => drop(memmap_array::fuzz_entry::manifest_jsonl(body)),
        _ => drop(memmap_array::fuzz_entry::sidecar_json(body)),
    }
});

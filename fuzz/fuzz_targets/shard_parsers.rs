//! shard-store's parsers on arbitrary bytes: the first byte picks
//! `metadata.json` or a shard pickle (checked, then decoded as generic
//! values); nothing in a pickle may ever be executed.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use shard_store::format::{self, ShardName};

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let path = Path::new("fuzz");
    if which % 2 == 0 {
        let _ = format::Metadata::parse(path, body);
    } else {
        let _ = format::check_pickle(path, body);
        let name = ShardName {
            start: 0,
            end: u64::from(which / 2),
        };
        let _ = format::decode_shard::<shard_store::PickleValue>(path, name, body);
    }
});

#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod canonical;
mod complete;
mod error;
mod fingerprint;
mod key;
mod source;

pub use canonical::encode as canonical_encoding;
pub use complete::{COMPLETE_FILE, clear_complete, is_complete, mark_complete};
pub use error::{FingerprintError, Result};
pub use fingerprint::{
    FINGERPRINT_FILE, FINGERPRINT_FILE_CAP, FINGERPRINT_FORMAT_VERSION, FileChange, Fingerprint,
    Stale, StaleReason, check_dir, compute_fingerprint, validate,
};
pub use key::{
    CacheKey, KEY_FORMAT_VERSION, cache_identity, cache_key_dir, compute_key, config_hash,
    named_cache_dir,
};
pub use source::{Mode, SourceStamp, stamp_sources};

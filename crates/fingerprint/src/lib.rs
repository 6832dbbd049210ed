//! `fingerprint`: cache keys, fingerprints and why-stale reports for cachex.
//!
//! A cache is only as good as the certainty that it matches what would be
//! computed now. This crate names a cache directory after its config and
//! records what the cache was built from, so that a changed option, a
//! touched source file or a bumped store format misses the old cache and
//! says *why*.
//!
//! - [`compute_key`]: 16 hex characters (BLAKE3 in `derive_key` mode) of the
//!   config's canonical encoding; [`cache_key_dir`] puts it under a root.
//!   Named caches (the facade's, memmap-array's `open_or_build`) live in
//!   [`named_cache_dir`]` = root/<name>/<key>`, keyed by
//!   [`cache_identity`]` = {"backend", "name", "options"}`.
//! - [`stamp_sources`]: each source file's relative path, size, mtime and
//!   optionally BLAKE3 of its content ([`Mode::Content`], mmap + rayon for
//!   large files). Paths are relative to a root: moving the root keeps the
//!   cache valid.
//! - [`compute_fingerprint`], [`validate`] / [`check_dir`]: every
//!   [`StaleReason`] at once (config fields, files changed/added/removed,
//!   versions); a corrupt `fingerprint.json` is [`Stale::Unreadable`].
//! - [`is_complete`] / [`mark_complete`]: the `_COMPLETE` sentinel, written
//!   by rename and a directory fsync (through `durable-fs`, like
//!   `fingerprint.json`).
//!
//! # On disk
//! ```text
//! <root>/<key>/            key = compute_key(config), 16 lowercase hex chars
//!   fingerprint.json       {"format_version": 1, "key_version": 1, "cache_version": N,
//!                           "config_hash": "<64 hex>", "config": {...},
//!                           "sources": [{"rel_path", "size", "mtime_ns", "content"?}]}
//!   _COMPLETE              empty; present only once the cache is finished
//! ```
//!
//! # The canonical encoding (a stable format)
//! Key order never matters, integer width never matters, integers and
//! floats differ (`1` is not `1.0`), every NaN is one NaN, `-0.0` is `0.0`,
//! and strings are length-prefixed. The full table is in the `canonical`
//! module source; a golden test pins the key of a fixed config, so any
//! change to it fails CI. Changing it on purpose means bumping
//! [`KEY_FORMAT_VERSION`].
//!
//! ```
//! use fingerprint::{Mode, compute_fingerprint, compute_key, stamp_sources, validate};
//! use serde_json::json;
//!
//! let dir = tempfile::tempdir()?;
//! std::fs::write(dir.path().join("labels.csv"), "a,1\n")?;
//!
//! let config = json!({"model": "resnet18", "size": 224});
//! let key = compute_key(&config)?;
//! assert_eq!(key.as_str().len(), 16);
//! // Key order does not matter.
//! assert_eq!(key, compute_key(&json!({"size": 224, "model": "resnet18"}))?);
//!
//! let sources = stamp_sources(dir.path(), ["labels.csv"], Mode::Content)?;
//! let stored = compute_fingerprint(&config, sources.clone(), 1)?;
//!
//! let changed = json!({"model": "resnet18", "size": 256});
//! let current = compute_fingerprint(&changed, sources, 1)?;
//! let stale = validate(&stored, &current).unwrap_err();
//! assert!(stale.to_string().contains("fields: size"), "{stale}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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

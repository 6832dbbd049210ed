//! Reference layouts users copy; see the `examples/` binaries.
#![deny(missing_docs)]

//! `segment-store`: see `DESIGN.md` for its job. Work in progress; its issue fills it in.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

//! `fingerprint`: being written (issue 2).
#![deny(missing_docs)]

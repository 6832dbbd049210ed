//! FFCV `.beton` files (format version 2): read and write, with the checks
//! FFCV does not make.
//!
//! The layout is written down in [`format`](mod@format).
//!
//! **Checks made here and not by FFCV:** header sizes against the file,
//! page size a power of two, every allocation row inside the data region,
//! not straddling a page, not overlapping another, for an existing sample;
//! every metadata pointer matching exactly one unused allocation of its
//! sample with the size its type implies; RGB raw images of `w * h * 3`
//! bytes; JSON text UTF-8; NDArray dtype and shape parsed and sized with
//! checked arithmetic.
//!
//! The writer lays files out as FFCV's `DatasetWriter` does with one
//! worker (samples packed into pages in order, a sample that does not fit
//! restarts on a fresh page), so a file written here from the same values
//! is byte-identical to FFCV's; it writes under a temporary name and
//! renames after fsync. A sample larger than a page is an error, as in FFCV.
pub mod format;
mod reader;
mod writer;

pub use format::{
    ALLOC_ROW_LEN, ARGS_LEN, BETON_VERSION, BetonField, BetonType, BetonValue, DEFAULT_PAGE_SIZE,
    FIELD_DESC_LEN, HEADER_LEN, MIN_PAGE_SIZE, NAME_LEN,
};
pub use reader::{BetonFile, is_beton_header, read, verify};
pub use writer::{python_json, write, write_with_page_size};

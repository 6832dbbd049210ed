//! The `cachex` command-line tool.
fn main() {}

//! W4 of `BENCHMARKS.md`: filled in by issue 3 (memmap-array).

use crate::{Ctx, RunError};

/// Runs W4.
pub fn run(_ctx: &Ctx) -> Result<(), RunError> {
    Err(RunError::store(
        "w4",
        "W4 is not built yet (issue 3 (memmap-array))",
    ))
}

//! W1 of `BENCHMARKS.md`: filled in by issue 4 (segment-store).

use crate::{Ctx, RunError};

/// Runs W1.
pub fn run(_ctx: &Ctx) -> Result<(), RunError> {
    Err(RunError::store(
        "w1",
        "W1 is not built yet (issue 4 (segment-store))",
    ))
}

//! Tests of the tier's parts that need a whole tier (a store, its local
//! directory, open files) and look at its insides: kept apart from the
//! modules they reach into, so that no module imports the tier above it.

mod eviction;
mod plans;

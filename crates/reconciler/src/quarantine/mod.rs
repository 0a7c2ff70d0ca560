//! Quarantine: when a reconciliation fails, find the changed objects that cause the
//! failure, let the rest of the change go live, and hold the culprits back.
//!
//! - [`search`]: the bounded culprit search over abstract changes (delta debugging
//!   by bisection), independent of templates and HAProxy.
//! - [`changes`]: the changed set between the last good snapshots and the current
//!   ones, per watched resource and object, and the snapshots with a subset of those
//!   changes applied.
//! - [`hints`]: a first guess at the culprits, from the values the error quotes.
//! - [`engine`]: the search run against the real renderer and a validation step
//!   passed in by the application, and the list of quarantined objects (held back
//!   until they change again, released when they validate).
//! - [`record`]: the quarantine kept beside the deployed files, so it outlives a
//!   restart.

pub mod changes;
pub mod engine;
pub mod hints;
pub mod record;
pub mod search;

pub use changes::{Change, ChangeSet};
pub use engine::{
    Culprit, Entry, Failure, GaveUp, Isolated, LastGood, Quarantine, Settled, Validate,
    ValidateFuture, isolate, render_and_validate,
};
pub use record::{BASELINE_FILE, Kept, QUARANTINE_RECORD_FILE, QuarantineRecord, Restored};
pub use search::{Outcome, Probe, Rejection, Settings, search_with_suspects, search_with_units};

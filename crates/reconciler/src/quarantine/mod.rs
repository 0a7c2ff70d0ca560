//! Quarantine: when a reconciliation fails, find the changed objects that cause the
//! failure, let the rest of the change go live, and hold the culprits back.
//!
//! - [`search`]: the bounded culprit search over abstract changes (delta debugging
//!   by bisection), independent of templates and HAProxy.
//! - [`changes`]: the changed set between the last good snapshots and the current
//!   ones, per watched resource and object, and the snapshots with a subset of those
//!   changes applied.

pub mod changes;
pub mod search;

pub use changes::{Change, ChangeSet};
pub use search::{Outcome, Probe, Rejection, Settings};

//! What hapwright knows about HAProxy's configuration: the [`config`] tokenizer, model
//! and phase-1 checks, the change [`plan`] between two configurations, and the
//! [`files`] of an instance's config directory.

mod certs;
pub mod config;
pub mod files;
pub mod plan;

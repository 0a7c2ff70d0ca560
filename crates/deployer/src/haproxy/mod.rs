//! What hapwright knows about HAProxy's configuration: the [`config`] phase-1 checks
//! (with the tokenizer and model the bus crate holds), the change [`plan`] between two configurations, and the
//! [`files`] of an instance's config directory.

pub mod backends;
pub(crate) mod certs;
pub mod config;
pub mod files;
pub mod plan;

//! The reconciliation pipeline of hapwright: the debouncer that batches resource
//! changes, the executor that runs one reconciliation at a time, and the Jinja template
//! renderer that turns resource snapshots into HAProxy configuration files.
//!
//! # Layout
//!
//! ```text
//!  ResourceIndexUpdated ─┬─▶ debouncer ── ReconciliationTriggered ──▶ executor
//!  ResourceSyncComplete ─┘   (quiet period, max wait,                 │ assigns the correlation id
//!                             first run waits for every source)       ▼
//!                                                          ReconciliationStarted
//!  ResourceIndexUpdated ────▶ renderer ◀──────────────────────────────┘
//!                               │ TemplateRendered / TemplateRenderFailed
//!                               ▼
//!                            validator (crates/deployer) ── ValidationCompleted / Failed ─▶ executor
//!                                                      executor ─▶ ReconciliationCompleted / Failed
//! ```
//!
//! - [`config`]: the template sections of the config file (`haproxyConfig`, snippets,
//!   maps, files, certificates, `templating`, `validationTests`) and the debounce
//!   timings.
//! - [`debouncer`]: turns bursts of resource changes into one trigger.
//! - [`executor`]: one reconciliation at a time, latest wins, per-stage timings.
//! - [`renderer`]: minijinja templates → [`RenderedConfig`](hapwright_eventbus::model::RenderedConfig)
//!   with a source map; static checks at load time.
//! - [`quarantine`]: which changed objects make a reconciliation fail, and the
//!   largest part of the change that still validates.
//! - [`status`]: status templates, rendered after a deployment for the status
//!   written back to Kubernetes objects.
//! - [`synthetic`]: generated clusters of any size for the benchmarks.

pub mod config;
pub mod debouncer;
pub mod executor;
pub mod quarantine;
pub mod renderer;
pub mod status;
pub mod synthetic;

pub use debouncer::Debouncer;
pub use executor::Executor;
pub use renderer::{Renderer, RendererComponent, Resources, Templates};

//! The microkernel of hapwright: the event bus, the event catalogue, the component
//! kernel with health tracking, and the model types every crate shares.
//!
//! Components never call each other: they publish and subscribe to [`Event`]s on a
//! [`Bus`]. The [`Kernel`] subscribes each to its [`Interest`], starts them, tracks
//! their [`Health`], isolates their failures and stops them within a deadline.
//!
//! # Layout
//!
//! ```text
//! event    the catalogue: one payload type per event, EventKind, KindSet, metadata
//!          (id, correlation id, caused-by), ReloadSource, Stage, ValidationPhase
//! bus      buffered pub/sub over async-broadcast: pipeline (lossless) and observer
//!          (counted losses) subscribers, the publisher's spill queue, bus metrics
//! spill    the bounded spill queue: which events a newer one supersedes
//! kernel   Component (name, consumes, mandatory, run), Context (publisher, health,
//!          next_event, cancellation), Kernel → RunningKernel, restart backoff
//! health   Health / HealthState per component and the shared HealthTable
//! model    values carried inside events: ResourceSnapshot (imbl maps + indexes),
//!          RenderedConfig (files, hash, source map), haproxy (tokenizer and
//!          parsed model of haproxy.cfg), Diagnostic, deploy strategies and
//!          reasons, InstanceRef
//! config   config value types every crate shares (durations, secrets)
//! redact   the process-wide set of secret values and their redaction
//! ```
//!
//! Data moves as `Arc<Event>`: a publisher builds a payload from `model` values, the
//! bus stamps it and fans it out to every subscription whose kinds match, and each
//! component reads it from its [`Context`].

pub mod bus;
pub mod config;
pub mod event;
pub mod health;
pub mod kernel;
pub mod model;
pub mod redact;
mod spill;

pub use bus::{Bus, BusConfig, BusError, BusMetrics, Delivery, Publisher, Subscription};
pub use event::*;
pub use health::{Health, HealthState, HealthTable};
pub use kernel::{
    Component, ComponentError, ComponentFailure, Context, HealthReporter, Interest, Kernel,
    KernelError, KernelMetrics, RestartBackoff, RunningKernel, ShutdownReport, sleep_until,
};

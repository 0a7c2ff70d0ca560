//! The microkernel of hapwright: the event bus, the event catalogue, the component
//! kernel with health tracking, and the model types every crate shares.
//!
//! Components never call each other: they publish and subscribe to [`Event`]s on a
//! [`Bus`]. The [`Kernel`] starts them in dependency order, tracks their
//! [`Health`], isolates their failures and stops them within a deadline.

pub mod bus;
pub mod config;
pub mod event;
pub mod health;
pub mod kernel;
pub mod model;

pub use bus::{Bus, BusConfig, BusError, BusMetrics, Delivery, Publisher, Subscription};
pub use event::*;
pub use health::{Health, HealthState, HealthTable};
pub use kernel::{
    Component, ComponentError, ComponentFailure, Context, HealthReporter, Interest, Kernel,
    KernelError, KernelMetrics, RestartBackoff, RunningKernel, ShutdownReport,
};

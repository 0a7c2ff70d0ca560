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
//! record   the JSON records kept beside deployed files: read back, durable
//!          removal, the newest of several copies
//! testing  (feature `testing`, for the crates' tests) a bus and kernel for a test,
//!          bounded reads, one loopback port allocator
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
pub mod record;
pub mod redact;
mod spill;
#[cfg(feature = "testing")]
pub mod testing;

pub use bus::{Bus, BusConfig, BusError, BusMetrics, Delivery, Publisher, Subscription};
pub use event::*;
pub use health::{Health, HealthState, HealthTable};
pub use kernel::{
    Component, ComponentError, ComponentFailure, Context, HealthReporter, Interest, Kernel,
    KernelError, KernelMetrics, RestartBackoff, RunningKernel, ShutdownReport, sleep_until,
};

#[cfg(test)]
mod layout_tests {
    /// The module a `# Layout` line starts with: `name`, `name/`, or
    /// ``- [`name`]: …``.
    fn named(line: &str) -> Option<&str> {
        let line = line.trim_start_matches("//!").trim_start();
        let line = line.strip_prefix("- ").unwrap_or(line);
        let line = line.strip_prefix("[`").unwrap_or(line);
        let end = line
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(line.len());
        (end > 0).then(|| &line[..end])
    }

    /// Every crate's `lib.rs` has a `# Layout` map, and it names each of its `pub
    /// mod`s at the start of a line, so the map a reader starts from does not drift
    /// from the code.
    #[test]
    fn every_layout_names_every_public_module() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut checked = 0;
        let mut missing = Vec::new();
        for entry in std::fs::read_dir(&crates).expect("the crates directory") {
            let lib = entry.expect("an entry").path().join("src/lib.rs");
            let Ok(text) = std::fs::read_to_string(&lib) else {
                continue;
            };
            let layout: Vec<&str> = text
                .lines()
                .skip_while(|line| *line != "//! # Layout")
                .take_while(|line| line.starts_with("//!"))
                .collect();
            assert!(!layout.is_empty(), "{} has no # Layout", lib.display());
            let names: Vec<&str> = layout.iter().filter_map(|line| named(line)).collect();
            for module in text
                .lines()
                .filter_map(|line| line.strip_prefix("pub mod ")?.strip_suffix(';'))
            {
                checked += 1;
                if !names.contains(&module) {
                    missing.push(format!("{}: {module}", lib.display()));
                }
            }
        }
        assert!(checked > 20, "only {checked} modules found");
        assert!(missing.is_empty(), "not in # Layout: {missing:#?}");
    }
}

//! Component health: `Unknown → Healthy / Degraded / Unhealthy / Exited`, with a
//! reason and the time of the last change.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use serde::{Serialize, Serializer};

/// The state part of a component's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthState {
    /// Not started yet.
    Unknown,
    /// Running and doing its job.
    Healthy,
    /// Running and doing its job in part, on purpose: something is held back and the
    /// reason says what (quarantined objects, a change held by the safety valve). Not
    /// a failure: liveness ignores it, but an operator should look.
    Degraded,
    /// Running, but something is wrong (a source directory is missing, a file does
    /// not parse); the reason says what.
    Unhealthy,
    /// Not running any more: stopped, failed, panicked or disabled.
    Exited,
}

impl HealthState {
    /// Every state, for metrics that export one series per state.
    pub const ALL: [HealthState; 5] = [
        HealthState::Unknown,
        HealthState::Healthy,
        HealthState::Degraded,
        HealthState::Unhealthy,
        HealthState::Exited,
    ];

    /// The lowercase name used in JSON and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Unknown => "unknown",
            HealthState::Healthy => "healthy",
            HealthState::Degraded => "degraded",
            HealthState::Unhealthy => "unhealthy",
            HealthState::Exited => "exited",
        }
    }
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A component's health: state, reason and when it last changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Health {
    /// The state.
    pub state: HealthState,
    /// Why (empty for a plain `Healthy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the state or reason last changed.
    #[serde(serialize_with = "unix_seconds")]
    pub since: SystemTime,
}

fn unix_seconds<S: Serializer>(time: &SystemTime, serializer: S) -> Result<S::Ok, S::Error> {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    serializer.serialize_f64(secs)
}

impl Health {
    /// A health with the current time.
    pub fn new(state: HealthState, reason: Option<String>) -> Self {
        Self {
            state,
            reason,
            since: SystemTime::now(),
        }
    }

    /// Same state and reason (ignores the time).
    pub fn same_as(&self, state: HealthState, reason: Option<&str>) -> bool {
        self.state == state && self.reason.as_deref() == reason
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            Some(reason) => write!(f, "{}: {reason}", self.state),
            None => write!(f, "{}", self.state),
        }
    }
}

/// The health of every component of one kernel, readable at any time (by the HTTP
/// server, tests, the status page), plus which of them are mandatory — what liveness
/// (`/healthz`) judges.
#[derive(Clone, Debug, Default)]
pub struct HealthTable {
    inner: Arc<RwLock<Table>>,
}

#[derive(Debug, Default)]
struct Table {
    health: BTreeMap<Arc<str>, Health>,
    /// Running components the controller cannot do without; emptied when the kernel
    /// shuts down, since a component stopped on purpose is not a failure.
    mandatory: BTreeSet<Arc<str>>,
}

impl HealthTable {
    /// The health of one component.
    pub fn get(&self, component: &str) -> Option<Health> {
        self.read().health.get(component).cloned()
    }

    /// Every component's health, by name.
    pub fn snapshot(&self) -> BTreeMap<Arc<str>, Health> {
        self.read().health.clone()
    }

    /// The mandatory components of a running kernel with their health. Empty before
    /// the kernel starts and after it shuts down.
    pub fn mandatory(&self) -> BTreeMap<Arc<str>, Health> {
        let table = self.read();
        table
            .mandatory
            .iter()
            .filter_map(|name| table.health.get(name).map(|h| (name.clone(), h.clone())))
            .collect()
    }

    /// Marks a started component as mandatory.
    pub(crate) fn set_mandatory(&self, component: &Arc<str>) {
        self.write().mandatory.insert(component.clone());
    }

    /// Forgets which components are mandatory: the kernel is stopping them on purpose.
    pub(crate) fn retire(&self) {
        self.write().mandatory.clear();
    }

    /// Sets a component's health; returns the new value when it differed from the old
    /// one (state or reason), `None` when nothing changed.
    pub(crate) fn set(
        &self,
        component: &Arc<str>,
        state: HealthState,
        reason: Option<String>,
    ) -> Option<Health> {
        let mut table = self.write();
        if let Some(current) = table.health.get(component.as_ref())
            && current.same_as(state, reason.as_deref())
        {
            return None;
        }
        let health = Health::new(state, reason);
        table.health.insert(component.clone(), health.clone());
        Some(health)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.inner
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Table> {
        self.inner
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

//! The event envelope and the event catalogue (see docs/architecture.md).
//!
//! Every event carries an id, the correlation id of the reconciliation it belongs to
//! (if any), the id of the event that caused it, and a monotonic timestamp. The names
//! of the payload types are the contract for logs, `/debug/events` and metric labels.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Serialize, Serializer};

use crate::health::Health;
use crate::model::haproxy::Config as HaproxyModel;
use crate::model::{
    ContentHash, DeployReason, DeployStrategy, Diagnostic, InstanceRef, RenderSummary,
    RenderedConfig, ResourceChange, ResourceSnapshot,
};

/// Position of an event: increasing in publish order, unique across every bus built
/// with the same [`crate::BusMetrics`] (the whole process, across config reloads).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct EventId(pub u64);

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Identifies one reconciliation from trigger to deployment; carried by every event
/// that reconciliation causes (render → validate → schedule → deploy) and by the
/// tracing spans of the components handling them.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CorrelationId(u64);

/// Next correlation id; starts from the process start time so ids rarely repeat
/// across controller restarts.
static NEXT_CORRELATION: LazyLock<AtomicU64> = LazyLock::new(|| {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    AtomicU64::new(micros << 8)
});

impl CorrelationId {
    /// A new id, unique within this process.
    pub fn new() -> Self {
        Self(NEXT_CORRELATION.fetch_add(1, Ordering::Relaxed))
    }

    /// Rebuilds an id from its numeric value (for lookups such as
    /// `/debug/events?correlation_id=`).
    pub fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The numeric value.
    pub fn as_u64(self) -> u64 {
        self.0
    }

    /// Parses the hex form produced by `Display`.
    pub fn parse(text: &str) -> Option<Self> {
        u64::from_str_radix(text, 16).ok().map(Self)
    }

    /// The OpenTelemetry trace id of this reconciliation: the correlation id in the
    /// upper 64 bits, a hash of it in the lower 64. Every component derives the same
    /// trace id from the id its events carry, so the spans of one reconciliation form
    /// one trace without passing trace context between tasks, and the trace id can
    /// be found from the correlation id (its first 16 hex digits) and back. The
    /// hashed half is what ratio samplers read, so sampling stays uniform although
    /// correlation ids are sequential.
    pub fn trace_id(self) -> u128 {
        (u128::from(self.0) << 64) | u128::from(mix64(self.0))
    }

    /// [`Self::trace_id`] as 32 lowercase hex digits, as trace backends show it.
    pub fn trace_id_hex(self) -> String {
        format!("{:032x}", self.trace_id())
    }

    /// The correlation id whose [`Self::trace_id`] is `trace_id`, if it is one.
    pub fn from_trace_id(trace_id: u128) -> Option<Self> {
        let id = (trace_id >> 64) as u64;
        (mix64(id) == trace_id as u64).then_some(Self(id))
    }
}

/// The splitmix64 finaliser: a bijective mix of a 64-bit value whose output bits all
/// depend on every input bit.
pub fn mix64(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Default for CorrelationId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for CorrelationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for CorrelationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CorrelationId({self})")
    }
}

impl Serialize for CorrelationId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// One published event: the envelope fields plus the payload.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    /// Unique, increasing id (process-wide).
    pub id: EventId,
    /// The reconciliation this event belongs to (`null` in JSON when none).
    pub correlation_id: Option<CorrelationId>,
    /// The event whose handling produced this one (`null` in JSON when none).
    pub caused_by: Option<EventId>,
    /// Monotonic publish time (follows `tokio::time::pause()` in tests).
    #[serde(skip)]
    pub at: tokio::time::Instant,
    /// Wall-clock publish time in microseconds since the Unix epoch, for display.
    pub unix_micros: u64,
    /// The event itself.
    #[serde(flatten)]
    pub payload: EventPayload,
}

impl Event {
    /// The kind of the payload.
    pub fn kind(&self) -> EventKind {
        self.payload.kind()
    }
}

/// Envelope fields a publisher may set; the bus fills in id and timestamps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventMeta {
    /// The reconciliation the event belongs to.
    pub correlation_id: Option<CorrelationId>,
    /// The event that caused this one.
    pub caused_by: Option<EventId>,
}

impl EventMeta {
    /// Meta for an event caused by `cause`: same correlation id, `caused_by` set.
    pub fn caused_by(cause: &Event) -> Self {
        Self {
            correlation_id: cause.correlation_id,
            caused_by: Some(cause.id),
        }
    }

    /// Meta starting a new correlation.
    pub fn correlated(correlation_id: CorrelationId) -> Self {
        Self {
            correlation_id: Some(correlation_id),
            caused_by: None,
        }
    }
}

/// Stages of a reconciliation, for per-stage timings and failures. A
/// reconciliation ends with its validation outcome; scheduling and deployment
/// report through the deployment events (`DeploymentScheduled`,
/// `InstanceDeployed`, `InstanceDeploymentFailed`, `DeploymentCompleted`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Template rendering.
    Render,
    /// Phase 1 and phase 2 validation.
    Validate,
}

/// One object held back by the quarantine: a changed object whose change makes
/// the render or validation fail.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QuarantinedObject {
    /// Watched resource name.
    pub resource: Arc<str>,
    /// The object's `kind`, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The object's namespace (empty for cluster-scoped and namespace-less objects).
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// `added`, `modified` or `removed`: the change held back.
    pub change: &'static str,
    /// Why the config with this change failed: template file and line, or
    /// HAProxy's message.
    pub errors: Vec<Diagnostic>,
    /// When it was quarantined.
    #[serde(serialize_with = "unix_seconds")]
    pub since: std::time::SystemTime,
}

fn unix_seconds<S: serde::Serializer>(
    time: &std::time::SystemTime,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let seconds = time
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    serializer.serialize_f64(seconds)
}

/// The status one status template rendered for one object: what hapwright applies
/// to the object's `status` subresource (objects of `kubernetes` resources only).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RenderedStatus {
    /// Watched resource name (the key under `statusTemplates`).
    pub resource: Arc<str>,
    /// The object's `apiVersion`, needed in the apply patch.
    pub api_version: String,
    /// The object's `kind`, needed in the apply patch.
    pub kind: String,
    /// The object's namespace (empty for cluster-scoped objects).
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The rendered content of `status`, with every condition's
    /// `lastTransitionTime` filled in.
    pub status: serde_json::Value,
    /// True when the object already shows every rendered field with the same
    /// value: nothing to write.
    pub current: bool,
}

/// Removed out of the total of one thing the safety valve counts (backends, servers,
/// map entries) between the running config and a new render.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RemovalCount {
    /// How many the new render no longer has.
    pub removed: usize,
    /// How many the running config has.
    pub total: usize,
}

impl RemovalCount {
    /// The removed share in percent (0 when the running config has none).
    pub fn percent(self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.removed as f64 * 100.0 / self.total as f64
        }
    }
}

/// What a new render would remove from the running config: the safety valve's
/// measure (see docs/validation.md, "Safety valve").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SafetyRemoval {
    /// `backend` and `listen` sections, by name.
    pub backends: RemovalCount,
    /// `server` lines: the net drop per backend, so replacing one server by another
    /// is not a removal.
    pub servers: RemovalCount,
    /// Map file entries: the net drop per map file.
    pub map_entries: RemovalCount,
    /// Names of the removed backends (the first few), for the status page.
    pub removed_backends: Vec<String>,
}

impl fmt::Display for SafetyRemoval {
    /// `would remove 2 of 3 backends (67%), 100 of 120 servers (83%)`: every count
    /// with a removal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = [
            ("backends", self.backends),
            ("servers", self.servers),
            ("map entries", self.map_entries),
        ]
        .into_iter()
        .filter(|(_, count)| count.removed > 0)
        .map(|(what, count)| {
            format!(
                "{} of {} {what} ({:.0}%)",
                count.removed,
                count.total,
                count.percent()
            )
        })
        .collect();
        if parts.is_empty() {
            f.write_str("would remove nothing")
        } else {
            write!(f, "would remove {}", parts.join(", "))
        }
    }
}

/// The validation phase that rejected a config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ValidationPhase {
    /// hapwright's own parser.
    Parse,
    /// `haproxy -c`.
    Haproxy,
}

/// Where a controller reload request came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReloadSource {
    /// SIGHUP.
    Sighup,
    /// `POST /-/reload`.
    Http,
}

/// Outcome of one deployment round across instances.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeploymentSummary {
    /// Hash that was deployed.
    pub hash: ContentHash,
    /// Instances that took the config.
    pub succeeded: Vec<String>,
    /// Instances that failed.
    pub failed: Vec<String>,
    /// Wall time of the whole round.
    #[serde(serialize_with = "seconds")]
    pub duration: Duration,
}

fn seconds<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64())
}

fn stage_seconds<S: Serializer>(
    stages: &[(Stage, Duration)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(
        stages
            .iter()
            .map(|(stage, duration)| (stage, duration.as_secs_f64())),
    )
}

fn snapshot_summary<S: Serializer>(
    snapshot: &Arc<ResourceSnapshot>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = serializer.serialize_map(Some(2))?;
    map.serialize_entry("objects", &snapshot.len())?;
    map.serialize_entry("indexBy", snapshot.index_by())?;
    map.end()
}

fn snapshots_summary<S: Serializer>(
    snapshots: &Arc<BTreeMap<Arc<str>, Arc<ResourceSnapshot>>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(
        snapshots
            .iter()
            .map(|(name, snapshot)| (name.as_ref(), snapshot.len())),
    )
}

fn config_summary<S: Serializer>(
    config: &Arc<RenderedConfig>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = serializer.serialize_map(Some(2))?;
    map.serialize_entry("hash", &config.hash())?;
    let files: Vec<String> = config
        .iter()
        .map(|(file, _)| file.relative_path())
        .collect();
    map.serialize_entry("files", &files)?;
    map.end()
}

/// Declares the payload structs, the [`EventPayload`] enum over them and the
/// field-less [`EventKind`] enum, keeping the three in step.
macro_rules! catalogue {
    ($(
        $(#[$meta:meta])*
        $name:ident { $( $(#[$fmeta:meta])* $field:ident : $ty:ty ),* $(,)? }
    )*) => {
        $(
            $(#[$meta])*
            #[derive(Clone, Debug, Serialize)]
            pub struct $name { $( $(#[$fmeta])* pub $field: $ty ),* }

            impl From<$name> for EventPayload {
                fn from(payload: $name) -> Self {
                    EventPayload::$name(payload)
                }
            }
        )*

        /// Every event payload of the catalogue.
        #[derive(Clone, Debug, Serialize)]
        #[serde(tag = "type", content = "data")]
        pub enum EventPayload {
            $(
                #[allow(missing_docs)]
                $name($name),
            )*
        }

        /// The kind of an event, for typed subscriptions and metric labels.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        pub enum EventKind {
            $(
                #[allow(missing_docs)]
                $name,
            )*
        }

        impl EventKind {
            /// Every kind, in catalogue order.
            pub const ALL: &'static [EventKind] = &[$(EventKind::$name),*];

            /// The kind's name as used in logs, `/debug/events` and metric labels.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(EventKind::$name => stringify!($name),)*
                }
            }

            /// Looks a kind up by name.
            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    $(stringify!($name) => Some(EventKind::$name),)*
                    _ => None,
                }
            }
        }

        impl EventPayload {
            /// The kind of this payload.
            pub fn kind(&self) -> EventKind {
                match self {
                    $(EventPayload::$name(_) => EventKind::$name,)*
                }
            }
        }
    };
}

catalogue! {
    /// A new, valid controller configuration was loaded.
    ConfigLoaded {
        /// Path of the config file.
        path: String,
        /// Hash of the file's content.
        hash: ContentHash,
    }
    /// A controller configuration change was rejected; the running one stays.
    ConfigInvalid {
        /// Path of the config file.
        path: String,
        /// Every located error.
        errors: Vec<Diagnostic>,
    }
    /// A watched resource changed.
    ResourceIndexUpdated {
        /// Watched resource name (`resources.<name>` in templates).
        source: Arc<str>,
        /// The complete new state.
        #[serde(serialize_with = "snapshot_summary")]
        snapshot: Arc<ResourceSnapshot>,
        /// What changed since the previous snapshot.
        change: Arc<ResourceChange>,
    }
    /// Statuses rendered by `statusTemplates` after a render's deployment round (and
    /// when a new render equals it, or an instance's deployment state changed), for
    /// the status writer and `/debug/status`.
    StatusRendered {
        /// Hash of the deployed render whose snapshots the statuses come from.
        hash: ContentHash,
        /// Every non-empty rendered status.
        statuses: Arc<[RenderedStatus]>,
        /// Template errors, one per failing object (template, line, object).
        errors: Vec<Diagnostic>,
    }
    /// A source finished its initial full listing.
    ResourceSyncComplete {
        /// Watched resource name.
        source: Arc<str>,
    }
    /// The set of discovered deploy targets changed.
    InstancesDiscovered {
        /// Discovery source name.
        source: Arc<str>,
        /// Every instance currently discovered.
        instances: Arc<[InstanceRef]>,
    }
    /// A reconciliation should run.
    ReconciliationTriggered {
        /// Human-readable cause ("resources changed: services, endpoints").
        reason: String,
        /// Sources that changed since the last trigger.
        sources: Vec<Arc<str>>,
        /// How long the debouncer held the first of these changes before
        /// triggering (zero for a leading-edge trigger): the `debounce` span of the
        /// reconciliation's trace.
        #[serde(serialize_with = "seconds")]
        waited: Duration,
        /// The rest of the change a leading-edge trigger fired for: changes that
        /// reached other sources within the debouncer's leading group (`... (with the
        /// leading change)`). One change spread over sources counts once against
        /// `minDeploymentInterval`: the scheduler lets this reconciliation's
        /// deployment follow the leading one at once.
        follow_up: bool,
    }
    /// The executor started a reconciliation.
    ReconciliationStarted {
        /// Why it started.
        reason: String,
        /// It runs a [`ReconciliationTriggered::follow_up`] trigger.
        follow_up: bool,
    }
    /// A reconciliation finished.
    ReconciliationCompleted {
        /// Total time.
        #[serde(serialize_with = "seconds")]
        duration: Duration,
        /// Time per stage.
        #[serde(serialize_with = "stage_seconds")]
        stages: Vec<(Stage, Duration)>,
    }
    /// A reconciliation failed; the last good config stays deployed.
    ReconciliationFailed {
        /// Stage that failed.
        stage: Stage,
        /// What went wrong.
        errors: Vec<Diagnostic>,
    }
    /// Templates rendered successfully.
    TemplateRendered {
        /// The rendered files, hash and source map.
        #[serde(serialize_with = "config_summary")]
        config: Arc<RenderedConfig>,
        /// Render time.
        #[serde(serialize_with = "seconds")]
        duration: Duration,
        /// Files rendered and reused, and whether the render was incremental.
        render: RenderSummary,
    }
    /// The resource snapshots a render used, published by the renderer just before
    /// its `TemplateRendered` (same correlation) when status templates are
    /// configured, so statuses are rendered from exactly the data of the deployed
    /// render, not from whatever changed since.
    TemplateInputs {
        /// Hash of the render these snapshots produced.
        hash: ContentHash,
        /// Every watched resource's snapshot, by watched resource name.
        #[serde(serialize_with = "snapshots_summary")]
        snapshots: Arc<BTreeMap<Arc<str>, Arc<ResourceSnapshot>>>,
    }
    /// Rendering failed.
    TemplateRenderFailed {
        /// Errors with template name and line.
        errors: Vec<Diagnostic>,
    }
    /// Both validation phases accepted a rendered config.
    ValidationCompleted {
        /// The validated config.
        #[serde(serialize_with = "config_summary")]
        config: Arc<RenderedConfig>,
        /// Validation time.
        #[serde(serialize_with = "seconds")]
        duration: Duration,
        /// Warnings HAProxy printed.
        warnings: Vec<Diagnostic>,
        /// The validator's parsed model of `haproxy.cfg` (phase 1 parsed it; a
        /// config that does not parse is never validated).
        #[serde(skip)]
        model: Arc<HaproxyModel>,
        /// Set when phase 2 passed by structural equivalence with a render that
        /// passed `haproxy -c`, instead of running it: the reason
        /// (`equivalent_servers`, `equivalent_maps`, ...), so `/debug/events` shows
        /// which configs HAProxy itself never saw.
        #[serde(skip_serializing_if = "Option::is_none")]
        phase2_skipped: Option<&'static str>,
    }
    /// A validation phase rejected a rendered config.
    ValidationFailed {
        /// Hash of the rejected config.
        hash: ContentHash,
        /// Phase that rejected it.
        phase: ValidationPhase,
        /// Errors, mapped back to template lines where possible.
        errors: Vec<Diagnostic>,
    }
    /// After a failed render or validation, the renderer searched which changed
    /// objects cause the failure (quarantine). Published in the failed
    /// reconciliation's correlation; when the search found the culprits, a
    /// `TemplateRendered` of the largest set of changes that validates follows in
    /// the same correlation, otherwise the reconciliation fails as it would without
    /// quarantine.
    QuarantineSearched {
        /// Every object quarantined now (held back at its last good version, or left
        /// out when new), with its error.
        objects: Vec<QuarantinedObject>,
        /// Objects released by this reconciliation.
        released: Vec<QuarantinedObject>,
        /// Changes that go live.
        accepted: usize,
        /// Extra renders and validations made.
        probes: usize,
        /// Set when the search gave up and the whole change is rejected: why
        /// (`baseline_fails`, `bound_reached`, `nothing_changed`,
        /// `tool_failure`).
        gave_up: Option<&'static str>,
    }
    /// The safety valve holds a validated render instead of deploying it: it would
    /// remove more than `controller.safety.maxRemoval` of the running backends,
    /// servers or map entries. Published for every new render held; the hold ends
    /// with `SafetyValveReleased`.
    SafetyValveHeld {
        /// Hash of the held config.
        hash: ContentHash,
        /// What it would remove.
        removal: SafetyRemoval,
        /// The configured threshold, as written (`50%`).
        max_removal: String,
        /// Since when a render over the threshold has been held (the first of them).
        #[serde(serialize_with = "unix_seconds")]
        since: std::time::SystemTime,
        /// When the hold releases itself if the drop persists
        /// (`controller.safety.confirmAfter` after `since`).
        #[serde(serialize_with = "unix_seconds")]
        release_at: std::time::SystemTime,
    }
    /// The safety valve stopped holding: the held render went out (`confirmed`: the
    /// drop persisted for `confirmAfter`; `approved`: `POST /-/approve`), a later
    /// render under the threshold replaced it (`recovered`), or a controller config
    /// reload turned the valve off (`disabled`).
    SafetyValveReleased {
        /// Hash of the config that goes out now.
        hash: ContentHash,
        /// `confirmed`, `approved`, `recovered` or `disabled`.
        reason: &'static str,
    }
    /// An operator approved the change the safety valve holds (`POST /-/approve`).
    SafetyValveApproved {
        /// Hash of the held config the operator saw, when known; the scheduler
        /// releases whatever it holds.
        hash: Option<ContentHash>,
    }
    /// The scheduler released a deployment.
    DeploymentScheduled {
        /// Config to deploy.
        #[serde(serialize_with = "config_summary")]
        config: Arc<RenderedConfig>,
        /// Target instance names.
        instances: Vec<String>,
        /// True for drift re-checks, which deploy even when the hash is unchanged.
        drift_check: bool,
        /// The validator's parsed model of `haproxy.cfg`, handed on from
        /// `ValidationCompleted`.
        #[serde(skip)]
        model: Arc<HaproxyModel>,
    }
    /// The deployer started a deployment round.
    DeploymentStarted {
        /// Hash being deployed.
        hash: ContentHash,
        /// Target instance names.
        instances: Vec<String>,
    }
    /// One instance took the config.
    InstanceDeployed {
        /// Instance name.
        instance: String,
        /// Hash deployed.
        hash: ContentHash,
        /// How it was applied.
        strategy: DeployStrategy,
        /// Why that strategy.
        reason: Option<DeployReason>,
        /// Time for this instance.
        #[serde(serialize_with = "seconds")]
        duration: Duration,
    }
    /// One instance failed to take the config.
    InstanceDeploymentFailed {
        /// Instance name.
        instance: String,
        /// Hash that failed.
        hash: ContentHash,
        /// What went wrong.
        error: Diagnostic,
    }
    /// A deployment round finished.
    DeploymentCompleted {
        /// Per-round outcome.
        summary: DeploymentSummary,
    }
    /// An instance's running config differs from the desired one.
    DriftDetected {
        /// Instance name.
        instance: String,
        /// What differed.
        detail: String,
    }
    /// A component's health changed.
    ComponentHealthChanged {
        /// Component name.
        component: Arc<str>,
        /// The new health.
        health: Health,
    }
    /// Someone asked the controller to reload its configuration.
    ReloadRequested {
        /// Where the request came from.
        source: ReloadSource,
    }
}

/// A set of [`EventKind`]s, used to filter subscriptions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KindSet(u64);

const _: () = assert!(EventKind::ALL.len() <= 64, "KindSet is a u64 bitmask");

impl KindSet {
    /// Every kind.
    pub fn all() -> Self {
        Self(u64::MAX)
    }

    /// The given kinds.
    pub fn of(kinds: &[EventKind]) -> Self {
        Self(
            kinds
                .iter()
                .fold(0, |bits, kind| bits | 1 << (*kind as u32)),
        )
    }

    /// Whether `kind` is in the set.
    pub fn contains(self, kind: EventKind) -> bool {
        self.0 & (1 << (kind as u32)) != 0
    }
}

impl From<&[EventKind]> for KindSet {
    fn from(kinds: &[EventKind]) -> Self {
        Self::of(kinds)
    }
}

impl<const N: usize> From<[EventKind; N]> for KindSet {
    fn from(kinds: [EventKind; N]) -> Self {
        Self::of(&kinds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_round_trip() {
        for kind in EventKind::ALL {
            assert_eq!(EventKind::from_name(kind.as_str()), Some(*kind));
        }
        assert_eq!(EventKind::ALL.len(), 27);
        assert_eq!(EventKind::from_name("Nope"), None);
    }

    #[test]
    fn kind_sets_filter() {
        let set = KindSet::of(&[EventKind::ConfigLoaded, EventKind::DriftDetected]);
        assert!(set.contains(EventKind::ConfigLoaded));
        assert!(set.contains(EventKind::DriftDetected));
        assert!(!set.contains(EventKind::ConfigInvalid));
        assert!(KindSet::all().contains(EventKind::ReloadRequested));
        assert!(!KindSet::default().contains(EventKind::ReloadRequested));
    }

    #[test]
    fn correlation_ids_are_unique_and_parse_back() {
        let a = CorrelationId::new();
        let b = CorrelationId::new();
        assert_ne!(a, b);
        assert_eq!(CorrelationId::parse(&a.to_string()), Some(a));
        let trace = a.trace_id_hex();
        assert_eq!(trace.len(), 32);
        assert!(trace.starts_with(&a.to_string()), "{trace}");
        assert_eq!(CorrelationId::from_trace_id(a.trace_id()), Some(a));
        assert_eq!(CorrelationId::from_trace_id(a.trace_id() ^ 1), None);
        assert_eq!(a.to_string().len(), 16);
    }

    /// A `ResourceSyncComplete` of `services` with this envelope.
    fn sync_complete(
        id: u64,
        correlation_id: Option<CorrelationId>,
        caused_by: Option<EventId>,
    ) -> Event {
        Event {
            id: EventId(id),
            correlation_id,
            caused_by,
            at: tokio::time::Instant::now(),
            unix_micros: 1,
            payload: ResourceSyncComplete {
                source: "services".into(),
            }
            .into(),
        }
    }

    #[test]
    fn events_serialize_with_type_and_envelope() {
        let event = sync_complete(7, Some(CorrelationId::from_raw(255)), Some(EventId(3)));
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["type"], "ResourceSyncComplete");
        assert_eq!(json["data"]["source"], "services");
        assert_eq!(json["id"], 7);
        assert_eq!(json["correlation_id"], "00000000000000ff");
        assert_eq!(json["caused_by"], 3);
    }

    #[test]
    fn empty_envelope_fields_serialize_as_null() {
        let event = sync_complete(1, None, None);
        let json = serde_json::to_value(&event).unwrap();
        let object = json.as_object().unwrap();
        assert_eq!(object.get("correlation_id"), Some(&serde_json::Value::Null));
        assert_eq!(object.get("caused_by"), Some(&serde_json::Value::Null));
    }
}

//! The `http` source: a document fetched at an interval (an IP allow list, a tenant
//! list from an internal service) and turned into objects that templates read like any
//! other resource.
//!
//! # Behaviour
//!
//! - Every `interval` the source sends a conditional GET ([`fetch`]): `304 Not
//!   Modified`, or a `200` with the same bytes, changes nothing. After an error (a
//!   connection failure, a timeout, a status other than 200/304, a body over
//!   `maxBytes`, a body that does not parse) it tries again with exponential backoff
//!   from 1 s, never waiting longer than `interval`; the last content stays.
//! - A new body becomes objects ([`payload`]) and is published as one snapshot
//!   marked as a unit ([`ResourceSnapshot::set_unit`]): the quarantine accepts or
//!   holds back the whole payload, never half a list.
//! - **Pending and accepted.** A new payload is *pending* until a reconciliation that
//!   started after it was published validates: then it is *accepted*. When the
//!   quarantine holds it back instead, it is *rejected*: the last accepted payload
//!   stays live (in the rendered config), the source turns `degraded` with the
//!   validation errors, and it stays rejected until the server sends other content.
//!   A reconciliation that fails as a whole (quarantine off, or the search gave up)
//!   leaves the payload pending, with the failure in the health reason.
//! - The first successful fetch publishes `ResourceSyncComplete`: until then the
//!   first deployment waits, as for any unsynced source. A source that never fetched
//!   successfully is `unhealthy`.
//! - Credentials (header values read from files, literal values of credential-like
//!   headers, a password in the URL) are registered with the process-wide redactor
//!   and never printed; the URL is shown without user information and query.

pub mod fetch;
pub mod payload;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use hapwright_eventbus::config::ConfigIssue;
use hapwright_eventbus::event::{CorrelationId, EventKind, EventPayload};
use hapwright_eventbus::model::{
    ContentHash, FieldPath, IndexedObject, ObjectKey, ResourceChange, ResourceSnapshot,
    UpsertOutcome,
};
use hapwright_eventbus::{
    Component, ComponentError, Context, Event, Interest, ResourceIndexUpdated, ResourceSyncComplete,
};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use tracing::Instrument;

use crate::config::{HttpConfig, WatchedResource};
use crate::yaml::Limits;
pub use fetch::{FetchError, Fetched, Fetcher};

/// The states of `hapwright_http_source_state{resource,state}`.
pub const STATES: [&str; 4] = ["none", "pending", "accepted", "rejected"];

/// The results of `hapwright_http_source_fetches_total{resource,result}`.
pub const RESULTS: [&str; 3] = ["success", "not_modified", "failure"];

// === impl Backoff ===

/// Delays between attempts after errors: exponential from 1 s (or `interval`, when
/// shorter), doubling, never longer than `interval`; [`reset`](Self::reset) after a
/// success.
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    current: ExponentialBackoff,
    interval: Duration,
}

impl Backoff {
    /// The schedule for a source fetched every `interval`.
    pub fn new(interval: Duration) -> Self {
        let builder = ExponentialBuilder::new()
            .with_min_delay(interval.min(Duration::from_secs(1)))
            .with_max_delay(interval)
            .with_factor(2.0)
            .without_max_times();
        Self {
            current: builder.build(),
            builder,
            interval,
        }
    }

    /// The wait before the next attempt after a failure.
    pub fn next_delay(&mut self) -> Duration {
        self.current
            .next()
            .unwrap_or(self.interval)
            .min(self.interval)
    }

    /// Starts over after a success.
    pub fn reset(&mut self) {
        self.current = self.builder.build();
    }
}

// === impl HttpSourceMetrics ===

/// `hapwright_http_source_state{resource,state}` (1 for the current state of the
/// content, 0 for the others: `none`, `pending`, `accepted`, `rejected`) and
/// `hapwright_http_source_fetches_total{resource,result}` (`success`: new content
/// or the same bytes again, `not_modified`: 304, `failure`). Register once per
/// process.
#[derive(Clone, Debug)]
pub struct HttpSourceMetrics {
    state: IntGaugeVec,
    fetches: IntCounterVec,
}

impl HttpSourceMetrics {
    /// Registers the metrics in `registry`.
    ///
    /// # Errors
    ///
    /// When they are registered already.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let state = IntGaugeVec::new(
            Opts::new(
                "hapwright_http_source_state",
                "State of an http source's content: none, pending (published, not yet validated), accepted, rejected (failed validation; the last accepted content stays live).",
            ),
            &["resource", "state"],
        )?;
        let fetches = IntCounterVec::new(
            Opts::new(
                "hapwright_http_source_fetches_total",
                "Fetches of http sources by result: success, not_modified (304), failure.",
            ),
            &["resource", "result"],
        )?;
        registry.register(Box::new(state.clone()))?;
        registry.register(Box::new(fetches.clone()))?;
        Ok(Self { state, fetches })
    }

    fn init(&self, resource: &str) {
        for result in RESULTS {
            self.fetches.with_label_values(&[resource, result]);
        }
        self.set_state(resource, "none");
    }

    fn set_state(&self, resource: &str, current: &str) {
        for state in STATES {
            self.state
                .with_label_values(&[resource, state])
                .set(i64::from(state == current));
        }
    }

    fn fetched(&self, resource: &str, result: &str) {
        self.fetches.with_label_values(&[resource, result]).inc();
    }
}

// === impl Verdict ===

/// What the pipeline made of the current content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContentState {
    /// Nothing fetched yet.
    None,
    /// Published, not validated yet. `failure` holds why the last reconciliation
    /// with it failed as a whole, if one did.
    Pending {
        /// Why a reconciliation with this content failed as a whole.
        failure: Option<String>,
    },
    /// Validated.
    Accepted,
    /// Held back by the quarantine, with the errors.
    Rejected {
        /// The validation errors.
        reason: String,
    },
}

impl ContentState {
    /// The state label (`none`, `pending`, `accepted`, `rejected`).
    pub fn label(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Pending { .. } => "pending",
            Self::Accepted => "accepted",
            Self::Rejected { .. } => "rejected",
        }
    }
}

/// Follows the pipeline's events to learn whether the published payload was
/// accepted. A reconciliation *includes* the payload when it started after the
/// source saw its own `ResourceIndexUpdated` on the bus (the renderer reads its
/// events in the same order); such a reconciliation's `QuarantineSearched` naming
/// this resource rejects the payload, its `ValidationCompleted` accepts it.
#[derive(Debug)]
pub struct Verdict {
    resource: Arc<str>,
    state: ContentState,
    /// Hash of the payload the state is about.
    payload: Option<ContentHash>,
    /// The source's own update of `payload` was seen on the bus.
    published: bool,
    /// Reconciliations that include `payload`.
    including: HashSet<CorrelationId>,
}

impl Verdict {
    /// Nothing published yet.
    pub fn new(resource: Arc<str>) -> Self {
        Self {
            resource,
            state: ContentState::None,
            payload: None,
            published: false,
            including: HashSet::new(),
        }
    }

    /// The current state.
    pub fn state(&self) -> &ContentState {
        &self.state
    }

    /// A new payload was published: it is pending.
    pub fn published(&mut self, payload: ContentHash) {
        self.state = ContentState::Pending { failure: None };
        self.payload = Some(payload);
        self.published = false;
        self.including.clear();
    }

    /// Takes one event into account; true when the state changed.
    pub fn observe(&mut self, event: &Event) -> bool {
        let Some(payload) = self.payload else {
            return false;
        };
        let included = event
            .correlation_id
            .is_some_and(|id| self.including.contains(&id));
        let before = self.state.clone();
        match &event.payload {
            EventPayload::ResourceIndexUpdated(update)
                if update.source == self.resource && update.snapshot.unit() == Some(payload) =>
            {
                self.published = true;
            }
            EventPayload::ReconciliationStarted(_) if self.published => {
                if let Some(id) = event.correlation_id {
                    self.including.insert(id);
                }
            }
            EventPayload::QuarantineSearched(searched) if included => {
                let errors: Vec<String> = searched
                    .objects
                    .iter()
                    .filter(|object| object.resource == self.resource)
                    .flat_map(|object| object.errors.iter().map(ToString::to_string))
                    .collect();
                let held = searched
                    .objects
                    .iter()
                    .any(|object| object.resource == self.resource);
                if held && matches!(self.state, ContentState::Pending { .. }) {
                    self.state = ContentState::Rejected {
                        reason: if errors.is_empty() {
                            "held back by the quarantine".to_owned()
                        } else {
                            errors.join("; ")
                        },
                    };
                }
            }
            EventPayload::ValidationCompleted(_) if included => {
                if matches!(self.state, ContentState::Pending { .. }) {
                    self.state = ContentState::Accepted;
                }
            }
            EventPayload::ReconciliationFailed(failed) if included => {
                if let ContentState::Pending { failure } = &mut self.state {
                    *failure = Some(
                        failed
                            .errors
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join("; "),
                    );
                }
            }
            _ => {}
        }
        self.state != before
    }
}

// === impl HttpSource ===

/// The `http` source component. Its name is `source/<resource name>`.
pub struct HttpSource {
    component: String,
    resource: Arc<str>,
    config: HttpConfig,
    index_by: Vec<FieldPath>,
    metrics: Option<HttpSourceMetrics>,
    fetch: Option<Box<dyn Fetch>>,
}

/// One fetch of the source's document: [`Fetcher`] over HTTP, or a stand-in that
/// lets tests drive the source's schedule (backoff, interval) under a paused clock.
#[async_trait::async_trait]
pub trait Fetch: Send {
    /// One attempt.
    async fn fetch(&mut self) -> Result<Fetched, FetchError>;

    /// The document's address as shown in logs and errors.
    fn display(&self) -> &str;
}

#[async_trait::async_trait]
impl Fetch for Fetcher {
    async fn fetch(&mut self) -> Result<Fetched, FetchError> {
        Fetcher::fetch(self).await
    }

    fn display(&self) -> &str {
        Fetcher::display(self)
    }
}

impl std::fmt::Debug for HttpSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSource")
            .field("resource", &self.resource)
            .finish_non_exhaustive()
    }
}

impl HttpSource {
    /// Builds the source for watched resource `name`. Fails when the resource has no
    /// `http` source.
    pub fn new(name: &str, resource: &WatchedResource) -> Result<Self, ConfigIssue> {
        let Some(http) = &resource.http else {
            return Err(ConfigIssue::new(name, "not an `http` source"));
        };
        Ok(Self {
            component: format!("source/{name}"),
            resource: name.into(),
            config: http.clone(),
            index_by: resource.index_by.clone(),
            metrics: None,
            fetch: None,
        })
    }

    /// Fetches with `fetch` instead of over HTTP (tests of the schedule).
    #[must_use]
    pub fn with_fetch(mut self, fetch: Box<dyn Fetch>) -> Self {
        self.fetch = Some(fetch);
        self
    }

    /// Reports to these metrics.
    #[must_use]
    pub fn with_metrics(mut self, metrics: HttpSourceMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

#[async_trait::async_trait]
impl Component for HttpSource {
    fn name(&self) -> &str {
        &self.component
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline([
            EventKind::ResourceIndexUpdated,
            EventKind::ReconciliationStarted,
            EventKind::QuarantineSearched,
            EventKind::ValidationCompleted,
            EventKind::ReconciliationFailed,
        ])
    }

    async fn run(self: Box<Self>, ctx: Context) -> Result<(), ComponentError> {
        let mut source = *self;
        let fetcher = match source.fetch.take() {
            Some(fetch) => fetch,
            None => Box::new(Fetcher::new(&source.config)?),
        };
        let span =
            tracing::info_span!("http_source", source = %source.resource, url = %fetcher.display());
        run(source, fetcher, ctx).instrument(span).await
    }
}

/// The source's state between fetches.
struct State {
    resource: Arc<str>,
    snapshot: ResourceSnapshot,
    /// Hash of the content of `snapshot`, once something was fetched.
    content: Option<ContentHash>,
    /// Why the last fetch (or parse) failed.
    fetch_error: Option<String>,
    verdict: Verdict,
    metrics: Option<HttpSourceMetrics>,
}

impl State {
    fn report(&self, ctx: &Context) {
        if let Some(metrics) = &self.metrics {
            metrics.set_state(&self.resource, self.verdict.state().label());
        }
        let mut reasons = Vec::new();
        if let Some(error) = &self.fetch_error {
            reasons.push(if self.content.is_some() {
                format!("fetch failed, keeping the content fetched before: {error}")
            } else {
                format!("fetch failed: {error}")
            });
        }
        match self.verdict.state() {
            ContentState::Rejected { reason } => reasons.push(format!(
                "the fetched content failed validation and is not used; the last accepted content stays live: {reason}"
            )),
            ContentState::Pending {
                failure: Some(failure),
            } => reasons.push(format!(
                "the fetched content is pending: the reconciliation with it failed: {failure}"
            )),
            _ => {}
        }
        let reason = hapwright_eventbus::redact::global()
            .redact(&reasons.join("; "))
            .into_owned();
        if self.content.is_none() && self.fetch_error.is_some() {
            ctx.health().unhealthy(reason);
        } else if reasons.is_empty() {
            ctx.health().healthy();
        } else {
            ctx.health().degraded(reason);
        }
    }

    /// Replaces the snapshot's objects with `objects`, keeping unchanged ones.
    fn apply(
        &mut self,
        objects: std::collections::BTreeMap<ObjectKey, serde_json::Value>,
        hash: ContentHash,
    ) -> ResourceChange {
        let mut change = ResourceChange::default();
        let gone: Vec<ObjectKey> = self
            .snapshot
            .iter()
            .filter(|(key, _)| !objects.contains_key(key))
            .map(|(key, _)| key.clone())
            .collect();
        for key in gone {
            self.snapshot.remove(&key);
            change.removed.push(key);
        }
        let index_by = self.snapshot.index_by().to_vec();
        for (key, value) in objects {
            match self
                .snapshot
                .upsert_indexed(key.clone(), IndexedObject::new(&value, &index_by))
            {
                Some(UpsertOutcome::Added) => change.added.push(key),
                Some(UpsertOutcome::Modified) => change.modified.push(key),
                None => {}
            }
        }
        self.snapshot.set_unit(Some(hash));
        self.content = Some(hash);
        change
    }
}

async fn run(
    source: HttpSource,
    mut fetcher: Box<dyn Fetch>,
    mut ctx: Context,
) -> Result<(), ComponentError> {
    let HttpSource {
        resource,
        config,
        index_by,
        metrics,
        ..
    } = source;
    if let Some(metrics) = &metrics {
        metrics.init(&resource);
    }
    let mut state = State {
        resource: resource.clone(),
        snapshot: ResourceSnapshot::new(index_by),
        content: None,
        fetch_error: None,
        verdict: Verdict::new(resource.clone()),
        metrics,
    };
    let interval = config.interval.get();
    let mut backoff = Backoff::new(interval);
    let mut next_fetch = tokio::time::Instant::now();
    let mut synced = false;
    let limits = Limits::default();
    let token = ctx.cancellation_token().clone();
    loop {
        tokio::select! {
            biased;
            () = token.cancelled() => return Ok(()),
            event = ctx.next_event() => {
                let Some(event) = event else { return Ok(()) };
                if state.verdict.observe(&event) {
                    match state.verdict.state() {
                        ContentState::Accepted => tracing::info!(objects = state.snapshot.len(), "Fetched content accepted"),
                        ContentState::Rejected { reason } => tracing::warn!(reason = %hapwright_eventbus::redact::global().redact(reason), "Fetched content rejected by validation; the last accepted content stays live"),
                        _ => {}
                    }
                    state.report(&ctx);
                }
            }
            () = tokio::time::sleep_until(next_fetch) => {
                let Some(outcome) = token.run_until_cancelled(fetcher.fetch()).await else {
                    return Ok(());
                };
                let failed = |state: &mut State, reason: String| {
                    if state.fetch_error.as_ref() != Some(&reason) {
                        tracing::warn!(%reason, "Fetch failed; keeping the last content");
                    }
                    state.fetch_error = Some(reason);
                };
                let result = match outcome {
                    Ok(Fetched::NotModified) => {
                        state.fetch_error = None;
                        "not_modified"
                    }
                    Ok(Fetched::Same) => {
                        state.fetch_error = None;
                        "success"
                    }
                    Ok(Fetched::Body { bytes, hash }) => {
                        match payload::parse(&bytes, config.format, fetcher.display(), &limits) {
                            Ok(parsed) => {
                                state.fetch_error = None;
                                if parsed.duplicates > 0 {
                                    tracing::debug!(duplicates = parsed.duplicates, "Repeated items collapsed into one object");
                                }
                                let change = state.apply(parsed.objects, hash);
                                tracing::info!(
                                    objects = state.snapshot.len(),
                                    bytes = bytes.len(),
                                    added = change.added.len(),
                                    modified = change.modified.len(),
                                    removed = change.removed.len(),
                                    payload = %hash,
                                    "Fetched new content; pending validation"
                                );
                                state.verdict.published(hash);
                                ctx.publisher().publish(ResourceIndexUpdated {
                                    source: resource.clone(),
                                    snapshot: Arc::new(state.snapshot.clone()),
                                    change: Arc::new(change),
                                });
                                "success"
                            }
                            Err(diagnostic) => {
                                failed(&mut state, format!("the body is not valid {}: {diagnostic}", config.format.as_str()));
                                "failure"
                            }
                        }
                    }
                    Err(error) => {
                        failed(&mut state, error.chain());
                        "failure"
                    }
                };
                if let Some(metrics) = &state.metrics {
                    metrics.fetched(&resource, result);
                }
                if result == "failure" {
                    next_fetch = tokio::time::Instant::now() + backoff.next_delay();
                } else {
                    backoff.reset();
                    next_fetch = tokio::time::Instant::now() + interval;
                    if !synced {
                        synced = true;
                        tracing::info!(objects = state.snapshot.len(), "Initial sync complete");
                        ctx.publisher().publish(ResourceSyncComplete { source: resource.clone() });
                    }
                }
                state.report(&ctx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_from_one_second_up_to_the_interval() {
        let mut backoff = Backoff::new(Duration::from_secs(10));
        let delays: Vec<u64> = (0..6).map(|_| backoff.next_delay().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_secs(1));
        // A short interval bounds the first delay too.
        let mut short = Backoff::new(Duration::from_millis(300));
        assert_eq!(short.next_delay(), Duration::from_millis(300));
    }

    fn event(payload: impl Into<EventPayload>, correlation: Option<CorrelationId>) -> Event {
        Event {
            id: hapwright_eventbus::EventId(0),
            correlation_id: correlation,
            caused_by: None,
            at: tokio::time::Instant::now(),
            unix_micros: 0,
            payload: payload.into(),
        }
    }

    fn update(resource: &str, unit: ContentHash) -> Event {
        let mut snapshot = ResourceSnapshot::new(Vec::new());
        snapshot.set_unit(Some(unit));
        event(
            ResourceIndexUpdated {
                source: resource.into(),
                snapshot: Arc::new(snapshot),
                change: Arc::default(),
            },
            None,
        )
    }

    fn started(correlation: CorrelationId) -> Event {
        event(
            hapwright_eventbus::ReconciliationStarted {
                reason: "test".into(),
                follow_up: false,
            },
            Some(correlation),
        )
    }

    fn searched(resource: &str, correlation: CorrelationId) -> Event {
        event(
            hapwright_eventbus::QuarantineSearched {
                objects: vec![hapwright_eventbus::QuarantinedObject {
                    resource: resource.into(),
                    kind: None,
                    namespace: String::new(),
                    name: "payload".into(),
                    change: "modified",
                    errors: vec![hapwright_eventbus::model::Diagnostic::error(
                        "invalid address",
                    )],
                    since: std::time::SystemTime::now(),
                }],
                released: Vec::new(),
                accepted: 1,
                probes: 2,
                gave_up: None,
            },
            Some(correlation),
        )
    }

    fn validated(correlation: CorrelationId) -> Event {
        let config = Arc::new(hapwright_eventbus::model::RenderedConfig::builder("").build());
        event(
            hapwright_eventbus::ValidationCompleted {
                model: Default::default(),
                config,
                duration: Duration::ZERO,
                warnings: Vec::new(),
                phase2_skipped: None,
            },
            Some(correlation),
        )
    }

    #[test]
    fn a_validation_that_started_after_the_update_accepts_the_payload() {
        let v1 = ContentHash::of(b"v1");
        let mut verdict = Verdict::new("allow".into());
        verdict.published(v1);
        // A reconciliation that started before the update reached the bus does not
        // count: it may have rendered the old content.
        let early = CorrelationId::new();
        verdict.observe(&started(early));
        verdict.observe(&validated(early));
        assert_eq!(verdict.state().label(), "pending");
        // Another resource's update is no marker either.
        verdict.observe(&update("other", v1));
        let other = CorrelationId::new();
        verdict.observe(&started(other));
        verdict.observe(&validated(other));
        assert_eq!(verdict.state().label(), "pending");

        verdict.observe(&update("allow", v1));
        let late = CorrelationId::new();
        verdict.observe(&started(late));
        assert!(verdict.observe(&validated(late)));
        assert_eq!(verdict.state(), &ContentState::Accepted);
    }

    #[test]
    fn a_quarantined_payload_is_rejected_until_new_content_arrives() {
        let v2 = ContentHash::of(b"v2");
        let mut verdict = Verdict::new("allow".into());
        verdict.published(v2);
        verdict.observe(&update("allow", v2));
        let id = CorrelationId::new();
        verdict.observe(&started(id));
        // Another resource held back does not reject this one.
        verdict.observe(&searched("services", id));
        assert_eq!(verdict.state().label(), "pending");
        assert!(verdict.observe(&searched("allow", id)));
        let ContentState::Rejected { reason } = verdict.state() else {
            panic!("rejected expected: {:?}", verdict.state());
        };
        assert!(reason.contains("invalid address"), "{reason}");
        // The render of the accepted rest validates in the same reconciliation, and
        // later ones without the payload validate too: it stays rejected.
        verdict.observe(&validated(id));
        let later = CorrelationId::new();
        verdict.observe(&started(later));
        verdict.observe(&validated(later));
        assert_eq!(verdict.state().label(), "rejected");
        // New content starts over.
        verdict.published(ContentHash::of(b"v3"));
        assert_eq!(verdict.state().label(), "pending");
    }
}

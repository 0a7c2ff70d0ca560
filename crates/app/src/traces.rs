//! OpenTelemetry traces of reconciliations (`controller.tracing`).
//!
//! The source is the `tracing` spans the pipeline components already open for their
//! logs. A `tracing-opentelemetry` layer turns the spans named in [`SPAN_NAMES`] into
//! OpenTelemetry spans, and the SDK's batch processor posts them as OTLP protobuf over
//! HTTP from its own thread, so a slow or absent receiver never holds up a
//! reconciliation.
//!
//! # One trace per reconciliation
//!
//! The components run as separate tasks connected by the bus, so no span context
//! travels from the executor's `reconciliation` span to the renderer's `render` span.
//! What travels is the correlation id on every event, and every stage span records it
//! as `correlation_id`. The trace id is derived from it
//! ([`CorrelationId::trace_id`]), and so is the span id of the root span
//! ([`root_span_id`]). [`CorrelatedTracer`] gives the `reconciliation` span exactly
//! those ids, and makes every other span that carries a correlation id, and has no
//! parent in the same trace, a child of that root. Spans nested inside those (a
//! runtime batch inside an instance's deployment) inherit the trace as usual.
//!
//! # Sampling
//!
//! [`ReconciliationSampler`] decides from the trace id alone: the hashed lower half
//! against `sampleRatio`, the same rule in every task, so a reconciliation's trace is
//! complete or absent. Spans outside any reconciliation (no derived trace id) are not
//! exported.

use std::cell::Cell;

use hapwright_eventbus::CorrelationId;
use opentelemetry::trace::{
    Link, SpanBuilder, SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId,
    TraceState,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, SamplingDecision, SamplingResult, SdkTracer, SdkTracerProvider,
    ShouldSample,
};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;

use crate::config;
use crate::telemetry::BoxedLayer;

/// The `tracing` spans exported, and so the span names a trace shows (documented in
/// docs/observability.md). Other spans (a component's whole life, a worker task)
/// are not stages of a reconciliation and stay in the logs only.
pub const SPAN_NAMES: [&str; 11] = [
    "reconciliation",
    "debounce",
    "render",
    "validation",
    "validate_phase1",
    "validate_phase2",
    "schedule",
    "deployment",
    "deploy_instance",
    "runtime_batch",
    "reload",
];

/// The root span: the executor's reconciliation.
const ROOT: &str = "reconciliation";

/// Why traces could not be set up. Not retryable: `controller.tracing` must be fixed.
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    /// The OTLP exporter rejected its settings (the endpoint, or an
    /// `OTEL_EXPORTER_OTLP_*` variable).
    #[error("cannot build the OTLP exporter for {endpoint}")]
    ExporterBuild {
        /// The URL spans would be posted to.
        endpoint: String,
        /// The exporter's complaint.
        #[source]
        error: opentelemetry_otlp::ExporterBuildError,
    },
}

/// The running trace pipeline. Dropping it without [`Traces::shutdown`] loses the
/// spans not yet exported.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Builds the exporter, the provider and the layer to add to the subscriber.
    ///
    /// # Errors
    ///
    /// [`TracesError::ExporterBuild`] when the exporter cannot be built.
    pub fn new(settings: &config::Tracing) -> Result<(Self, BoxedLayer), TracesError> {
        let endpoint = settings.traces_url();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(endpoint.clone())
            .build()
            .map_err(|error| TracesError::ExporterBuild { endpoint, error })?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(ReconciliationSampler {
                ratio: settings.sample_ratio.get(),
            })
            .with_id_generator(CorrelatedIds::default())
            .with_resource(
                Resource::builder()
                    .with_service_name(settings.service_name.clone())
                    .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                    .build(),
            )
            .build();
        let tracer = CorrelatedTracer(opentelemetry::trace::TracerProvider::tracer(
            &provider,
            "hapwright",
        ));
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // Parents come from the `tracing` span tree (and [`CorrelatedTracer`]),
            // not from a thread-local context set on every poll: nothing to do on
            // enter and exit.
            .with_context_activation(false)
            .with_tracked_inactivity(false)
            .with_filter(filter_fn(|metadata| {
                if metadata.is_span() {
                    SPAN_NAMES.contains(&metadata.name())
                        && metadata.target().starts_with("hapwright")
                } else {
                    // Warnings and errors inside a stage become span events.
                    *metadata.level() <= tracing::Level::WARN
                }
            }));
        Ok((Self { provider }, Box::new(layer)))
    }

    /// Exports the spans still queued and stops the exporter. Blocks up to the
    /// exporter's timeout; call it off the async runtime's worker threads.
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "Pending trace spans could not be exported at shutdown");
        }
    }
}

/// The span id of the root (`reconciliation`) span of `id`'s trace, derived like
/// the trace id so that spans in other tasks can name it as their parent.
pub fn root_span_id(id: CorrelationId) -> SpanId {
    let raw = hapwright_eventbus::mix64(id.as_u64() ^ 0x5bd1_e995_0000_0001);
    SpanId::from(raw.max(1))
}

/// The correlation id a span was opened for: its `correlation_id` attribute.
fn correlation_of(builder: &SpanBuilder) -> Option<CorrelationId> {
    builder
        .attributes
        .as_ref()?
        .iter()
        .find(|kv| kv.key.as_str() == "correlation_id")
        .and_then(|kv| match &kv.value {
            Value::String(text) => CorrelationId::parse(text.as_str()),
            _ => None,
        })
}

/// `wait_us` of a span that began before it was opened (the debounce wait).
fn wait_of(builder: &SpanBuilder) -> Option<std::time::Duration> {
    builder
        .attributes
        .as_ref()?
        .iter()
        .find(|kv| kv.key.as_str() == "wait_us")
        .and_then(|kv| match &kv.value {
            Value::I64(micros) => u64::try_from(*micros).ok(),
            Value::String(text) => text.as_str().parse().ok(),
            _ => None,
        })
        .map(std::time::Duration::from_micros)
}

thread_local! {
    /// Ids for the span being built on this thread by [`CorrelatedTracer`]; read by
    /// [`CorrelatedIds`] inside the same call.
    static NEXT_IDS: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
}

/// The SDK tracer, with parents and ids derived from correlation ids (see the
/// module docs).
#[derive(Clone, Debug)]
pub struct CorrelatedTracer(SdkTracer);

impl opentelemetry::trace::Tracer for CorrelatedTracer {
    type Span = opentelemetry_sdk::trace::Span;

    fn build_with_context(&self, mut builder: SpanBuilder, parent_cx: &Context) -> Self::Span {
        if let Some(wait) = wait_of(&builder)
            && let Some(start) = builder.start_time.and_then(|t| t.checked_sub(wait))
        {
            builder.start_time = Some(start);
        }
        let Some(id) = correlation_of(&builder) else {
            return self.0.build_with_context(builder, parent_cx);
        };
        let trace_id = TraceId::from(id.trace_id());
        let root = root_span_id(id);
        if builder.name == ROOT {
            NEXT_IDS.set(Some((trace_id, root)));
            let span = self.0.build_with_context(builder, &Context::new());
            NEXT_IDS.set(None);
            return span;
        }
        if parent_cx.span().span_context().trace_id() == trace_id {
            return self.0.build_with_context(builder, parent_cx);
        }
        let parent = SpanContext::new(
            trace_id,
            root,
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        self.0
            .build_with_context(builder, &parent_cx.with_remote_span_context(parent))
    }
}

/// Random ids, except for the root span [`CorrelatedTracer`] is building.
#[derive(Debug, Default)]
struct CorrelatedIds(RandomIdGenerator);

impl IdGenerator for CorrelatedIds {
    fn new_trace_id(&self) -> TraceId {
        NEXT_IDS
            .get()
            .map_or_else(|| self.0.new_trace_id(), |(trace, _)| trace)
    }

    fn new_span_id(&self) -> SpanId {
        NEXT_IDS
            .get()
            .map_or_else(|| self.0.new_span_id(), |(_, span)| span)
    }
}

/// Samples whole reconciliations: a span is exported when its trace id was derived
/// from a correlation id and that id's hashed half falls under `ratio`.
#[derive(Clone, Debug)]
pub struct ReconciliationSampler {
    /// Share of reconciliations exported, 0 to 1.
    pub ratio: f64,
}

impl ReconciliationSampler {
    /// Whether the reconciliation with this trace id is exported.
    pub fn samples(&self, trace_id: u128) -> bool {
        if CorrelationId::from_trace_id(trace_id).is_none() {
            return false;
        }
        if self.ratio >= 1.0 {
            return true;
        }
        // The lower half is a uniform hash of the correlation id.
        let bound = (self.ratio.max(0.0) * (1u64 << 63) as f64) as u64;
        (trace_id as u64 >> 1) < bound
    }
}

impl ShouldSample for ReconciliationSampler {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        _name: &str,
        _span_kind: &SpanKind,
        _attributes: &[KeyValue],
        _links: &[Link],
    ) -> SamplingResult {
        let decision = if self.samples(u128::from_be_bytes(trace_id.to_bytes())) {
            SamplingDecision::RecordAndSample
        } else {
            SamplingDecision::Drop
        };
        SamplingResult {
            decision,
            attributes: Vec::new(),
            trace_state: parent_context
                .map(|cx| cx.span().span_context().trace_state().clone())
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_is_per_reconciliation_and_follows_the_ratio() {
        let ids: Vec<CorrelationId> = (0..2000).map(|_| CorrelationId::new()).collect();
        let all = ReconciliationSampler { ratio: 1.0 };
        let none = ReconciliationSampler { ratio: 0.0 };
        let half = ReconciliationSampler { ratio: 0.5 };
        assert!(ids.iter().all(|id| all.samples(id.trace_id())));
        assert!(!ids.iter().any(|id| none.samples(id.trace_id())));
        let sampled = ids.iter().filter(|id| half.samples(id.trace_id())).count();
        // Sequential correlation ids still sample about half: the decision reads
        // the hashed half of the trace id.
        assert!((800..1200).contains(&sampled), "{sampled}");
        // A random trace id (a span outside any reconciliation) is never exported.
        assert!(!all.samples(0x1234_5678_9abc_def0_1234_5678_9abc_def0));
    }

    #[test]
    fn root_span_ids_are_valid_and_stable() {
        let id = CorrelationId::from_raw(42);
        assert_eq!(root_span_id(id), root_span_id(CorrelationId::from_raw(42)));
        assert_ne!(root_span_id(id), SpanId::INVALID);
        assert_ne!(root_span_id(id), root_span_id(CorrelationId::from_raw(43)));
    }
}

//! Logging and the process-wide metrics registry.

use prometheus::Registry;
use prometheus::process_collector::ProcessCollector;
use std::io::IsTerminal;

use serde_json::Map as JsonMap;
use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{FmtSpan, FormatEvent, FormatFields, JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormattedFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, layer::SubscriberExt as _};

use crate::traces::Traces;

pub use crate::config::LogFormat;

/// Why logging could not be set up. Not retryable: the configured `logLevel` (or
/// `RUST_LOG`) must be fixed.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The filter is not a level or a valid directive list.
    #[error("invalid log filter `{filter}`: {error}")]
    FilterInvalid {
        /// The configured filter.
        filter: String,
        /// The parser's complaint (already in the message).
        error: tracing_subscriber::filter::ParseError,
    },
    /// `controller.tracing` is set and its exporter could not be built.
    #[error("cannot set up traces")]
    TracesSetup(#[source] crate::traces::TracesError),
}

/// Installs the global tracing subscriber. `filter` is a level (`info`) or a
/// `RUST_LOG`-style directive list (`info,hapwright_deployer=debug`); the `RUST_LOG`
/// environment variable, when set, wins. Logs go to stderr, coloured only when stderr
/// is a terminal (and `NO_COLOR` is unset), so files and pipes get plain text. Calling
/// it twice keeps the first subscriber.
///
/// With `traces` set, the reconciliation spans are also exported over OTLP (see
/// [`crate::traces`]), whatever the log filter says; the returned [`Traces`] must be
/// shut down at exit to flush them. Without it no trace layer exists at all.
///
/// # Errors
///
/// [`LoggingError::FilterInvalid`] when the filter does not parse,
/// [`LoggingError::TracesSetup`] when the trace exporter cannot be built.
pub fn init_logging(
    filter: &str,
    format: LogFormat,
    traces: Option<&crate::config::Tracing>,
) -> Result<Option<Traces>, LoggingError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) if !env.trim().is_empty() => EnvFilter::try_new(env),
        _ => EnvFilter::try_new(filter),
    }
    .map_err(|error| LoggingError::FilterInvalid {
        filter: filter.to_owned(),
        error,
    })?;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let ansi = std::io::stderr().is_terminal() && !no_color;
    let (traces, trace_layer) = match traces {
        Some(settings) => {
            let (traces, layer) = Traces::new(settings).map_err(LoggingError::TracesSetup)?;
            (Some(traces), Some(layer))
        }
        None => (None, None),
    };
    let subscriber = subscriber(
        filter,
        format,
        ansi,
        || RedactingWriter(std::io::stderr()),
        trace_layer,
    );
    // A second initialisation (tests, reinit) keeps the first subscriber.
    if subscriber.try_init().is_err() {
        return Ok(None);
    }
    Ok(traces)
}

/// A layer of the subscriber [`init_logging`] builds.
pub type BoxedLayer = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;

/// The subscriber [`init_logging`] installs, writing to `writer` (a separate function
/// so tests can capture what it writes).
///
/// Without traces the log filter is global, as cheap as it gets: a disabled span or
/// event is never even built. With traces it filters the log lines only, so
/// `logLevel: warn` does not switch the trace spans off.
fn subscriber<W>(
    filter: EnvFilter,
    format: LogFormat,
    ansi: bool,
    writer: W,
    traces: Option<BoxedLayer>,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let registry = tracing_subscriber::Registry::default();
    match traces {
        None => Box::new(registry.with(filter).with(log_layer(format, ansi, writer))),
        Some(traces) => {
            let logs = log_layer(format, ansi, writer).with_filter(filter).boxed();
            Box::new(registry.with(vec![logs, traces]))
        }
    }
}

/// The layer that writes log lines in `format`.
fn log_layer<S, W>(format: LogFormat, ansi: bool, writer: W) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_span_events(FmtSpan::NONE);
    match format {
        LogFormat::Text => builder.with_ansi(ansi).boxed(),
        LogFormat::Json => builder
            .with_ansi(false)
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .boxed(),
    }
}

/// `logFormat: json`: one JSON object per line with flat, stable keys (documented in
/// docs/cli.md, "Logs"): `timestamp` (RFC 3339, UTC), `level`, `target`, `message`,
/// `span` (the enclosing spans' names, outermost first, joined by `:`), then the
/// fields of the enclosing spans and of the event itself. Flat keys let a log shipper
/// index `correlation_id` or `instance` without knowing which span carried them.
#[derive(Debug, Clone, Copy)]
struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let metadata = event.metadata();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let mut fields = JsonMap::new();
        event.record(&mut JsonVisitor(&mut fields));

        let mut line = JsonMap::new();
        line.insert("timestamp".into(), timestamp.into());
        line.insert("level".into(), metadata.level().as_str().into());
        line.insert("target".into(), metadata.target().into());
        let message = fields.remove("message").unwrap_or_default();
        line.insert("message".into(), message);
        if let Some(scope) = ctx.event_scope() {
            let mut names = Vec::new();
            let mut span_fields = JsonMap::new();
            for span in scope.from_root() {
                names.push(span.name());
                let extensions = span.extensions();
                // The span's fields, formatted by `JsonFields` when it was created.
                if let Some(formatted) = extensions.get::<FormattedFields<N>>()
                    && let Ok(serde_json::Value::Object(recorded)) =
                        serde_json::from_str::<serde_json::Value>(formatted.as_str())
                {
                    span_fields.extend(recorded);
                }
            }
            line.insert("span".into(), names.join(":").into());
            line.extend(span_fields);
        }
        line.extend(fields);
        let text = serde_json::to_string(&line).map_err(|_| std::fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// Records an event's fields as JSON values: numbers and booleans as such, everything
/// else as its `Display` (`%`) or `Debug` (`?`) text.
struct JsonVisitor<'a>(&'a mut JsonMap<String, serde_json::Value>);

impl Visit for JsonVisitor<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

/// A log writer that replaces every known secret value (see
/// [`hapwright_eventbus::redact`]) before the line leaves the process. The formatter
/// writes each event with one `write_all`, so a secret is never split across calls.
#[derive(Debug)]
pub struct RedactingWriter<W>(pub W);

impl<W: std::io::Write> std::io::Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let redacted = hapwright_eventbus::redact::global().redact_bytes(buf);
        self.0.write_all(&redacted)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The one registry of the process, with the process collector (`process_*`)
/// registered. Every component's metrics are registered here once and survive reinit
/// iterations.
pub fn registry() -> Registry {
    let registry = Registry::new();
    if let Err(error) = registry.register(Box::new(ProcessCollector::for_self())) {
        tracing::warn!(%error, "Process metrics are unavailable");
    }
    registry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_exports_process_metrics() {
        let names: Vec<String> = registry()
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        assert!(
            names.iter().any(|n| n == "process_resident_memory_bytes"),
            "{names:?}"
        );
        assert!(
            names.iter().any(|n| n == "process_start_time_seconds"),
            "{names:?}"
        );
    }

    #[test]
    fn log_lines_leave_without_secret_values() {
        hapwright_eventbus::config::Secret::new("log-canary-0b5e2d91");
        let mut out = Vec::new();
        let mut writer = RedactingWriter(&mut out);
        std::io::Write::write_all(
            &mut writer,
            b"ERROR error=\"line 12: user a password log-canary-0b5e2d91\"\n",
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("log-canary"), "{text}");
        assert!(text.contains("password [redacted]"), "{text}");
    }

    /// A writer whose output a test reads back.
    #[derive(Clone, Default)]
    struct Capture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the subscriber for `format` writes while `emit` runs.
    fn captured(format: LogFormat, ansi: bool, emit: impl FnOnce()) -> String {
        let capture = Capture::default();
        let writer = capture.clone();
        let subscriber = subscriber(
            EnvFilter::new("info"),
            format,
            ansi,
            move || writer.clone(),
            None,
        );
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = capture.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    /// A deployment span with a correlation id, and an event inside it, recorded the
    /// way the pipeline components record them.
    fn emit_deployment() {
        let id = Some(hapwright_eventbus::CorrelationId::from_raw(
            0x0661_06ab_cdef_0001,
        ));
        let span = tracing::info_span!(
            "deployment",
            correlation_id = id.map(tracing::field::display),
            hash = "3fa2",
        );
        span.in_scope(|| {
            let inner = tracing::info_span!("deploy_instance", instance = "local");
            inner.in_scope(|| {
                tracing::info!(instances = 2u64, ready = true, duration = ?std::time::Duration::from_millis(5), "Deployment started");
            });
        });
    }

    #[test]
    fn json_lines_are_flat_objects_with_documented_keys() {
        let text = captured(LogFormat::Json, false, emit_deployment);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        let keys: Vec<&str> = line
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        // The fixed keys first, in this order; then span fields, then event fields.
        assert_eq!(
            keys[..7],
            [
                "timestamp",
                "level",
                "target",
                "message",
                "span",
                "correlation_id",
                "hash"
            ],
            "{text}"
        );
        let mut rest = keys[7..].to_vec();
        rest.sort_unstable();
        assert_eq!(
            rest,
            ["duration", "instance", "instances", "ready"],
            "{text}"
        );
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["message"], "Deployment started");
        assert_eq!(line["span"], "deployment:deploy_instance");
        assert_eq!(line["correlation_id"], "066106abcdef0001");
        assert_eq!(line["instance"], "local");
        assert_eq!(line["instances"], 2);
        assert_eq!(line["ready"], true);
        assert_eq!(line["duration"], "5ms");
        let timestamp = line["timestamp"].as_str().unwrap();
        assert!(
            timestamp.ends_with('Z') && timestamp.contains('T'),
            "{timestamp}"
        );
    }

    #[test]
    fn text_lines_carry_plain_values_and_no_colour_when_off() {
        let text = captured(LogFormat::Text, false, emit_deployment);
        assert!(!text.contains('\x1b'), "{text:?}");
        assert!(text.contains("correlation_id=066106abcdef0001"), "{text}");
        assert!(!text.contains("Some("), "{text}");
        // On a terminal the same line is coloured.
        let coloured = captured(LogFormat::Text, true, emit_deployment);
        assert!(coloured.contains("\x1b["), "{coloured:?}");
    }

    /// Counts the spans it sees: stands in for the trace layer.
    struct CountSpans(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl<S: tracing::Subscriber> Layer<S> for CountSpans {
        fn on_new_span(
            &self,
            _: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn trace_spans_do_not_depend_on_the_log_filter() {
        let spans = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let capture = Capture::default();
        let writer = capture.clone();
        let subscriber = subscriber(
            EnvFilter::new("warn"),
            LogFormat::Text,
            false,
            move || writer.clone(),
            Some(Box::new(CountSpans(spans.clone()))),
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing::info_span!("render").in_scope(|| tracing::info!("Rendered"));
            tracing::warn!("Shown");
        });
        assert_eq!(spans.load(std::sync::atomic::Ordering::Relaxed), 1);
        let text = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
        assert!(!text.contains("Rendered"), "{text}");
        assert!(text.contains("Shown"), "{text}");
    }

    #[test]
    fn invalid_filters_are_reported() {
        if std::env::var_os("RUST_LOG").is_none() {
            assert!(init_logging("info,=[bad", LogFormat::Text, None).is_err());
        }
        assert!(init_logging("info", LogFormat::Json, None).is_ok());
    }
}

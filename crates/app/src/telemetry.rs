//! Logging and the process-wide metrics registry.

use prometheus::Registry;
use prometheus::process_collector::ProcessCollector;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

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
}

/// Installs the global tracing subscriber. `filter` is a level (`info`) or a
/// `RUST_LOG`-style directive list (`info,hapwright_deployer=debug`); the `RUST_LOG`
/// environment variable, when set, wins. Logs go to stderr. Calling it twice keeps
/// the first subscriber.
///
/// # Errors
///
/// [`LoggingError::FilterInvalid`] when the filter does not parse.
pub fn init_logging(filter: &str, format: LogFormat) -> Result<(), LoggingError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) if !env.trim().is_empty() => EnvFilter::try_new(env),
        _ => EnvFilter::try_new(filter),
    }
    .map_err(|error| LoggingError::FilterInvalid {
        filter: filter.to_owned(),
        error,
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| RedactingWriter(std::io::stderr()))
        .with_span_events(FmtSpan::NONE);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    // A second initialisation (tests, reinit) keeps the first subscriber.
    let _ = result;
    Ok(())
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

    #[test]
    fn invalid_filters_are_reported() {
        if std::env::var_os("RUST_LOG").is_none() {
            assert!(init_logging("info,=[bad", LogFormat::Text).is_err());
        }
        assert!(init_logging("info", LogFormat::Json).is_ok());
    }
}

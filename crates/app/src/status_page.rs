//! The self-contained HTML status page at `/`: components and their health, instances
//! with their last deployment, recent reconciliations with per-stage timings, recent
//! events, and the last render/validation error with its template line. No external
//! assets; it refreshes itself every five seconds.

use std::sync::LazyLock;
use std::time::SystemTime;

use minijinja::value::Serde;
use minijinja::{Environment, Value, context};

use crate::status::StatusStore;

const TEMPLATE: &str = include_str!("assets/status.html.j2");

static ENV: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::Html);
    env.add_function("ms", |seconds: Option<f64>| -> String {
        seconds.map_or_else(String::new, |s| format!("{:.1} ms", s * 1000.0))
    });
    env.add_template("status.html", TEMPLATE)
        .expect("the built-in status page template compiles");
    env
});

fn ago(time: SystemTime) -> String {
    let secs = SystemTime::now()
        .duration_since(time)
        .map_or(0, |d| d.as_secs());
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        _ => format!("{}h ago", secs / 3600),
    }
}

/// How long until `time`, as `in 4m 10s` (`now` once past).
fn until(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::now())
        .map_or(0, |d| d.as_secs());
    match secs {
        0 => "now".to_owned(),
        1..60 => format!("in {secs}s"),
        60..3600 => format!("in {}m {}s", secs / 60, secs % 60),
        _ => format!("in {}h {}m", secs / 3600, secs % 3600 / 60),
    }
}

/// A time given in seconds since the Unix epoch.
fn unix_time(seconds: f64) -> SystemTime {
    SystemTime::UNIX_EPOCH + std::time::Duration::from_secs_f64(seconds.max(0.0))
}

/// `controller.tracing` of the effective config, when traces are on.
fn tracing_settings(effective: &serde_json::Value) -> Option<crate::config::Tracing> {
    let section = effective.get("controller")?.get("tracing")?;
    serde_json::from_value(section.clone()).ok()
}

/// Renders the page from the current status.
pub fn render(store: &StatusStore) -> Result<String, minijinja::Error> {
    let components: Vec<Value> = store
        .health()
        .snapshot()
        .into_iter()
        .map(|(name, health)| {
            context! {
                name => name.as_ref(),
                health => health.state.as_str(),
                reason => health.reason,
                since_text => ago(health.since),
            }
        })
        .collect();
    let config = store.config();
    let config_errors: Vec<String> = config.errors.iter().map(ToString::to_string).collect();
    let last_error = store.last_error();
    let last_error_text: Vec<String> = last_error
        .iter()
        .flat_map(|e| e.errors.iter())
        .map(|d| match &d.source_line {
            Some(line) => format!("{d}\n    | {line}"),
            None => d.to_string(),
        })
        .collect();
    let quarantine: Vec<Value> = store
        .quarantine()
        .into_iter()
        .map(|object| {
            let error: Vec<String> = object.errors.iter().map(ToString::to_string).collect();
            context! {
                resource => object.resource.as_ref(),
                kind => object.kind,
                namespace => object.namespace,
                name => object.name,
                change => object.change,
                error => error.join("\n"),
            }
        })
        .collect();
    let safety = store.safety_hold().map(|hold| {
        let more_backends = hold
            .removal
            .backends
            .removed
            .saturating_sub(hold.removal.removed_backends.len());
        context! {
            hash => hold.hash.short(),
            summary => hold.summary,
            max_removal => hold.max_removal,
            removed_backends => hold.removal.removed_backends,
            more_backends,
            since_text => ago(unix_time(hold.since)),
            release_in => until(unix_time(hold.release_at)),
        }
    });
    let traces = tracing_settings(&config.effective);
    let reconciliations: Vec<Value> = store
        .reconciliations()
        .into_iter()
        .map(|record| {
            let trace = traces.as_ref().map(|settings| {
                let sampled = crate::traces::ReconciliationSampler {
                    ratio: settings.sample_ratio.get(),
                }
                .samples(record.correlation_id.trace_id());
                context! {
                    id => sampled.then(|| record.trace_id.clone()),
                    link => sampled.then(|| settings.link(&record.trace_id)).flatten(),
                }
            });
            context! { trace, ..Value::from(Serde(&record)) }
        })
        .collect();
    let mut events = store.events(30, None);
    events.reverse();
    ENV.get_template("status.html")?.render(context! {
        version => env!("CARGO_PKG_VERSION"),
        config => Value::from(Serde(&config)),
        config_errors,
        readiness => readiness_view(&store.readiness()),
        last_error => Value::from(Serde(&last_error)),
        last_error_text,
        components,
        quarantine,
        safety,
        instances => Value::from(Serde(store.instances())),
        tracing => traces.is_some(),
        reconciliations,
        events => Value::from(Serde(&events)),
    })
}

/// Readiness as the status page shows it: `ready`, the reason when not, and the
/// instances that serve their last good config because the last attempt failed.
fn readiness_view(readiness: &crate::status::Readiness) -> Value {
    let (ready, reason) = match readiness {
        crate::status::Readiness::Ready { .. } => (true, None),
        crate::status::Readiness::NotReady { reason, .. } => (false, Some(reason.clone())),
    };
    let failing: Vec<String> = readiness
        .failing()
        .iter()
        .map(|f| f.instance.clone())
        .collect();
    context! { ready, reason, failing }
}

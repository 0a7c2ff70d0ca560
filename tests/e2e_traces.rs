//! OpenTelemetry traces of reconciliations (`controller.tracing`), received by an
//! OTLP/HTTP receiver inside the test: one trace per change with the stage spans under
//! the reconciliation's root span across the controller's tasks, sampling per
//! reconciliation, nothing sent when tracing is off, and deployments unaffected when
//! the receiver is down.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use hapwright_e2e::{
    Controller, Value, WAIT, free_port, quick_pacing, replace_once, service_manifest,
};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use prost::Message as _;

const WEB: &str = "web.example.test";

/// What the receiver got: the request paths and the decoded export requests.
#[derive(Default)]
struct Received {
    paths: Vec<String>,
    requests: Vec<ExportTraceServiceRequest>,
}

/// A minimal OTLP/HTTP receiver: HTTP/1.1 with keep-alive, protobuf bodies,
/// answering each export with an empty `ExportTraceServiceResponse`.
struct Receiver {
    port: u16,
    received: Arc<Mutex<Received>>,
}

impl Receiver {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the receiver");
        let port = listener.local_addr().expect("address").port();
        let received = Arc::new(Mutex::new(Received::default()));
        let shared = received.clone();
        // The accept loop ends with the test process; connections end when the
        // controller closes them.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = shared.clone();
                std::thread::spawn(move || serve(stream, &shared));
            }
        });
        Self { port, received }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spans(&self) -> Vec<Span> {
        let received = self.received.lock().expect("receiver lock");
        let mut spans = Vec::new();
        for request in &received.requests {
            for resource in &request.resource_spans {
                let service = resource
                    .resource
                    .as_ref()
                    .map(|r| attributes(&r.attributes))
                    .and_then(|a| a.get("service.name").cloned())
                    .unwrap_or_default();
                for scope in &resource.scope_spans {
                    for span in &scope.spans {
                        spans.push(Span {
                            service: service.clone(),
                            trace_id: hex(&span.trace_id),
                            span_id: hex(&span.span_id),
                            parent: hex(&span.parent_span_id),
                            name: span.name.clone(),
                            attributes: attributes(&span.attributes),
                            start: span.start_time_unix_nano,
                            end: span.end_time_unix_nano,
                        });
                    }
                }
            }
        }
        spans
    }

    fn paths(&self) -> Vec<String> {
        self.received.lock().expect("receiver lock").paths.clone()
    }
}

fn serve(stream: TcpStream, received: &Mutex<Received>) {
    let mut writer = stream.try_clone().expect("clone the connection");
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().expect("a Content-Length");
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let request = ExportTraceServiceRequest::decode(body.as_slice())
            .expect("an ExportTraceServiceRequest in protobuf");
        {
            let mut received = received.lock().expect("receiver lock");
            received.paths.push(path);
            received.requests.push(request);
        }
        let reply =
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// One received span, with ids in hex.
#[derive(Clone, Debug)]
struct Span {
    service: String,
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    attributes: BTreeMap<String, String>,
    /// Start and end, nanoseconds since the Unix epoch.
    start: u64,
    end: u64,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    list.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                Some(any_value::Value::IntValue(i)) => i.to_string(),
                Some(any_value::Value::BoolValue(b)) => b.to_string(),
                Some(any_value::Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

/// The quickstart with quick pacing and `controller.tracing` set to `tracing`.
fn with_tracing(config: &str, tracing: &str) -> String {
    let config = quick_pacing(config, "100ms");
    replace_once(
        &config,
        "controller:\n",
        &format!("controller:\n  tracing: {tracing}\n"),
    )
}

/// Moves the `web` service to the other demo app port (a runtime change); returns
/// the new port once HAProxy serves it.
fn move_web(controller: &Controller) -> u16 {
    let to = controller.move_web();
    controller.wait_for_body(WEB, &controller.demo_body(to));
    to
}

/// The correlation id and trace id of the last reconciliation whose deployment had
/// `strategy`, from `/debug/events`.
fn reconciliation_of(controller: &Controller, strategy: &str) -> (String, String, Value) {
    let events = controller.json("/debug/events?limit=500");
    let deployed = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .rev()
        .find(|e| e["type"] == "InstanceDeployed" && e["data"]["strategy"] == strategy)
        .unwrap_or_else(|| controller.fail(&format!("no {strategy} deployment in {events}")))
        .clone();
    let correlation = deployed["correlation_id"].as_str().expect("correlated");
    let trace = deployed["trace_id"].as_str().expect("a trace id");
    (
        correlation.to_owned(),
        trace.to_owned(),
        deployed["data"].clone(),
    )
}

fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one `{name}` span expected: {spans:#?}");
    found[0]
}

#[test]
fn a_change_arrives_as_one_trace_with_its_stages_under_the_root() {
    let receiver = Receiver::start();
    let tracing = format!(
        "{{ endpoint: {}, sampleRatio: 1.0, traceUrl: 'http://traces.example/trace/{{traceId}}' }}",
        receiver.endpoint()
    );
    let mut controller = Controller::start_with(|config| with_tracing(config, &tracing));
    controller.wait_deployed();
    let to = move_web(&controller);
    let after = controller.wait_deployed();
    assert_eq!(after.last_strategy.as_deref(), Some("runtime"), "{after:?}");
    let (correlation, trace, _) = reconciliation_of(&controller, "runtime");
    assert_eq!(trace.len(), 32, "{trace}");
    assert!(
        trace.starts_with(&correlation),
        "{trace} from {correlation}"
    );

    // The status page links the reconciliation to its trace (HTML-escaped `/`).
    let page = controller.status_page().replace("&#x2f;", "/");
    assert!(
        page.contains(&format!("href=\"http://traces.example/trace/{trace}\"")),
        "no link to trace {trace} on the status page:\n{page}"
    );

    // A new route: a reload for the new backend (its endpoints may follow as a
    // runtime change of their own).
    let reloads = controller.instance().reloads;
    let api = controller.ports().api;
    controller.write_resource(
        "extra.yaml",
        &service_manifest("extra", "extra.example.test", api),
    );
    controller.wait_for_body("extra.example.test", &controller.demo_body(api));
    controller.wait_until("the new route's reload", WAIT, || {
        (controller.instance().reloads > reloads).then_some(())
    });
    controller.wait_deployed();
    let (_, reload_trace, reloaded) = reconciliation_of(&controller, "reload");

    // Shutdown flushes what the batch processor still holds (its export interval
    // is five seconds, longer than this test waits).
    let status = controller.terminate(WAIT);
    assert!(status.success(), "{status:?}");

    assert!(
        receiver.paths().iter().all(|p| p == "/v1/traces"),
        "{:?}",
        receiver.paths()
    );
    let all = receiver.spans();
    let spans: Vec<Span> = all
        .iter()
        .filter(|s| s.trace_id == trace)
        .cloned()
        .collect();
    assert!(!spans.is_empty(), "no span of trace {trace} among {all:#?}");
    assert!(spans.iter().all(|s| s.service == "hapwright"), "{spans:#?}");

    let root = one(&spans, "reconciliation");
    assert_eq!(root.parent, "", "the root has no parent: {root:?}");
    assert_eq!(root.attributes["correlation_id"], correlation);
    assert!(
        root.attributes["reason"].contains("resources changed"),
        "{root:?}"
    );
    for stage in [
        "debounce",
        "render",
        "validation",
        "schedule",
        "deployment",
        "deploy_instance",
    ] {
        let span = one(&spans, stage);
        assert_eq!(
            span.parent, root.span_id,
            "`{stage}` is a child of the root: {spans:#?}"
        );
    }
    // The root and the debounce span start when the debouncer took the first
    // change, before the trigger opened them; every stage starts inside the root.
    let debounce = one(&spans, "debounce");
    let wait_ns = root.attributes["wait_us"].parse::<u64>().expect("wait_us") * 1000;
    assert_eq!(debounce.attributes["wait_us"], root.attributes["wait_us"]);
    assert!(
        debounce.end - debounce.start >= wait_ns,
        "the debounce span lasts the wait: {debounce:?}"
    );
    assert!(
        spans
            .iter()
            .all(|s| s.start >= root.start && s.end >= s.start),
        "{spans:#?}"
    );
    let validation = one(&spans, "validation");
    for phase in ["validate_phase1", "validate_phase2"] {
        assert_eq!(one(&spans, phase).parent, validation.span_id, "{spans:#?}");
    }
    let method = &one(&spans, "validate_phase2").attributes["method"];
    assert!(method == "haproxy" || method == "equivalence", "{method}");
    let deploy = one(&spans, "deploy_instance");
    assert_eq!(deploy.attributes["instance"], "local");
    assert_eq!(deploy.attributes["strategy"], "runtime");
    assert_eq!(deploy.attributes["correlation_id"], correlation);
    assert!(
        deploy.attributes["reason"].contains(&format!("127.0.0.1:{to}")),
        "the reason names the new address: {deploy:?}"
    );
    let batch = one(&spans, "runtime_batch");
    assert_eq!(batch.parent, deploy.span_id, "{spans:#?}");
    assert_eq!(batch.attributes["operations"], "1", "{batch:?}");
    assert!(
        !spans.iter().any(|s| s.name == "reload"),
        "a runtime change has no reload: {spans:#?}"
    );
    // The reload of the new route: a `reload` span inside the instance's deployment.
    let reload_spans: Vec<Span> = all
        .iter()
        .filter(|s| s.trace_id == reload_trace)
        .cloned()
        .collect();
    let deploy = one(&reload_spans, "deploy_instance");
    assert_eq!(deploy.attributes["strategy"], "reload", "{deploy:?}");
    let reload = one(&reload_spans, "reload");
    assert_eq!(reload.parent, deploy.span_id, "{reload_spans:#?}");
    assert_eq!(
        reload.attributes.get("reason").map(String::as_str),
        reloaded["reason"]["reload"].as_str(),
        "{reload:?} for {reloaded}"
    );
    assert_eq!(
        reload.attributes.get("detail").map(String::as_str),
        reloaded["reason"]["detail"].as_str(),
        "{reload:?} for {reloaded}"
    );
    assert!(
        !reload_spans.iter().any(|s| s.name == "runtime_batch"),
        "{reload_spans:#?}"
    );
    // The first deployment (the managed HAProxy's start) is a trace of its own.
    assert!(
        all.iter()
            .any(|s| s.name == "reconciliation" && s.trace_id != trace),
        "{all:#?}"
    );
    // Only reconciliation stages are exported (not a component's whole life).
    let names = [
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
    assert!(
        all.iter().all(|s| names.contains(&s.name.as_str())),
        "{all:#?}"
    );
}

#[test]
fn sample_ratio_zero_sends_nothing() {
    let receiver = Receiver::start();
    let tracing = format!("{{ endpoint: {}, sampleRatio: 0 }}", receiver.endpoint());
    let mut controller = Controller::start_with(|config| with_tracing(config, &tracing));
    controller.wait_deployed();
    move_web(&controller);
    let page = controller.status_page();
    assert!(page.contains("not sampled"), "{page}");
    let status = controller.terminate(WAIT);
    assert!(status.success(), "{status:?}");
    // The process flushed at exit: anything it would export has arrived.
    assert!(receiver.spans().is_empty(), "{:#?}", receiver.spans());
}

#[test]
fn tracing_is_off_by_default() {
    let receiver = Receiver::start();
    let endpoint = receiver.endpoint();
    // The standard OTLP variables alone do not turn traces on.
    let mut controller = Controller::start_with_env(
        |config| quick_pacing(config, "2s"),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_TRACES_EXPORTER", "otlp"),
        ],
    );
    controller.wait_deployed();
    move_web(&controller);
    let page = controller.status_page();
    assert!(!page.contains("not sampled"), "{page}");
    let status = controller.terminate(WAIT);
    assert!(status.success(), "{status:?}");
    assert!(receiver.paths().is_empty(), "{:?}", receiver.paths());
}

#[test]
fn a_receiver_that_is_down_does_not_hold_up_deployments() {
    let tracing = format!(
        "{{ endpoint: 'http://127.0.0.1:{}', sampleRatio: 1.0 }}",
        free_port()
    );
    let mut controller = Controller::start_with(|config| with_tracing(config, &tracing));
    let before = controller.wait_deployed();
    move_web(&controller);
    let after = controller.wait_deployed();
    assert_eq!(after.last_strategy.as_deref(), Some("runtime"), "{after:?}");
    assert_eq!(after.deployments, before.deployments + 1);
    let status = controller.terminate(WAIT);
    assert!(status.success(), "{status:?}");
}

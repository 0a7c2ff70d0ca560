//! The ingress-nginx library in `examples/ingress-nginx/`: its `validationTests` all
//! pass under the real HAProxy (`hapwright test`), and end to end, on an HAProxy
//! started as the sidecar manifest starts it with files standing in for the API
//! server, Ingresses written for ingress-nginx behave as ingress-nginx documents
//! their `nginx.ingress.kubernetes.io/*` annotations (real requests, checked by
//! status, headers, body and which upstream answered). A bad annotation value
//! quarantines its own Ingress only; snippets and annotations the library does not
//! implement are reported and the Ingress is otherwise served.

#[path = "support/certs.rs"]
mod certs;
mod library;

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use hapwright_deployer::client::master::Version;
use hapwright_e2e::{Signal, WAIT, free_port, poll, send_signal};
use library::{Sidecar, hapwright, library_path, library_value, loopback_slice, text, upstream};
use serde_json::{Value, json};

const LIBRARY: &str = "examples/ingress-nginx/hapwright.yaml";

/// The library's watched resources `(name, apiVersion, kind)`.
const SOURCES: &[(&str, &str, &str)] = &[
    ("ingresses", "networking.k8s.io/v1", "Ingress"),
    ("ingressclasses", "networking.k8s.io/v1", "IngressClass"),
    ("services", "v1", "Service"),
    ("endpointslices", "discovery.k8s.io/v1", "EndpointSlice"),
    ("secrets", "v1", "Secret"),
    ("authsecrets", "v1", "Secret"),
];

/// One test per supported annotation family and per refused value.
const FEATURE_TESTS: &[&str] = &[
    "class-nginx-and-ingressclasses",
    "default-ingressclass",
    "routes-name-ingress-and-path",
    "unsupported-annotations-reported",
    "use-regex",
    "rewrite-target",
    "app-root",
    "headers-x-forwarded-prefix-and-upstream-vhost",
    "server-alias",
    "ssl-redirect-and-force",
    "permanent-and-temporal-redirect",
    "from-to-www-redirect",
    "proxy-body-size",
    "proxy-timeouts",
    "source-ranges",
    "cors",
    "backend-protocol",
    "refuses-bad-boolean",
    "refuses-bad-rewrite-target",
    "refuses-rewrite-target-variable",
    "refuses-bad-size",
    "refuses-bad-timeout",
    "refuses-bad-cidr",
    "refuses-bad-host",
    "refuses-bad-url",
    "refuses-bad-redirect-code",
    "refuses-bad-cors-origin",
    "refuses-bad-cors-headers",
    "refuses-bad-backend-protocol",
    "refuses-bad-upstream-vhost",
    "limits",
    "refuses-bad-limit",
    "affinity-cookie",
    "refuses-bad-affinity",
    "load-balance-and-upstream-hash-by",
    "default-backend-annotation",
    "canary",
    "service-upstream",
    "auth-basic",
    "refuses-auth-secret-of-another-namespace",
    "refuses-unsupported-access-annotation",
    "canary-stays-in-its-namespace",
    "host-level-annotations-stay-with-the-host",
    "proxy-ssl",
    "refuses-proxy-ssl-secret-of-another-namespace",
    "status-of-served-ingresses",
    "auth-tls",
    "refuses-auth-tls-without-ca",
    "ssl-passthrough",
    "proxy-connect-timeout",
    "custom-http-errors",
    "custom-http-errors-global-default",
    "no-custom-http-errors-no-lua",
    "refuses-bad-custom-http-errors",
];

fn library_config() -> PathBuf {
    library_path(LIBRARY)
}

/// `hapwright check` accepts the library and every test passes; each supported family renders a config HAProxy accepts
/// (`haproxy_valid` first) and each refused value fails the render with the
/// Ingress, the annotation and the value named.
#[test]
fn the_library_checks_and_every_validation_test_passes_under_haproxy() {
    let checked = hapwright(&["check"], &library_config());
    assert!(checked.status.success(), "{}", text(&checked));
    let output = hapwright(&["test", "--output", "json"], &library_config());
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("the JSON report does not parse ({e}): {}", text(&output)));
    assert_eq!(report["failed"], json!(0), "{}", text(&output));
    assert!(output.status.success(), "{}", text(&output));
    let tests = report["tests"].as_array().expect("tests");
    for feature in FEATURE_TESTS {
        let test = tests
            .iter()
            .find(|t| t["name"] == *feature)
            .unwrap_or_else(|| panic!("no library test named {feature}"));
        let first = &test["assertions"][0];
        if feature.starts_with("refuses-") {
            assert_eq!(first["target"], "rendering_error", "{feature}: {test}");
        } else {
            assert_eq!(first["type"], "haproxy_valid", "{feature}: {test}");
            assert!(
                test["assertions"].as_array().map_or(0, Vec::len) >= 2,
                "{feature} checks something of its own"
            );
        }
    }
    library::assert_each_feature_test_checks_something_of_its_own(&library_config(), FEATURE_TESTS);
}

/// The library with files sources, its frontends on `http` and `https`.
fn config(http: u16, https: u16) -> Value {
    let mut config = library_value(&library_config());
    library::use_files_sources(&mut config, SOURCES);
    config["extraContext"]["httpPort"] = json!(http);
    config["extraContext"]["httpsPort"] = json!(https);
    config["extraContext"]["statsPort"] = json!(free_port());
    config["extraContext"]["maxconn"] = json!(1000);
    config
}

fn service(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": name, "namespace": "shop" },
        "spec": { "ports": [ { "name": "http", "port": 80, "protocol": "TCP" } ] }
    })
}

/// Annotations `(name without the nginx.ingress.kubernetes.io/ prefix, value)`.
type Annotations<'a> = &'a [(&'a str, &'a str)];

/// An Ingress of class `nginx` as a user writes it: one rule for `host` with
/// `paths` (`(path, pathType)`) to Service `service`, and `annotations` (names
/// without the `nginx.ingress.kubernetes.io/` prefix).
fn ingress(
    name: &str,
    host: &str,
    service: &str,
    paths: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), json!(v)))
        .collect();
    let paths: Vec<Value> = paths
        .iter()
        .map(|(path, kind)| {
            json!({ "path": path, "pathType": kind,
                    "backend": { "service": { "name": service, "port": { "name": "http" } } } })
        })
        .collect();
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": { "name": name, "namespace": "shop", "annotations": annotations,
                      "creationTimestamp": "2026-01-01T00:00:00Z" },
        "spec": { "ingressClassName": "nginx",
                  "rules": [ { "host": host, "http": { "paths": paths } } ] }
    })
}

/// An upstream that accepts connections and never answers (the connections stay
/// open as long as the test process), and how many it accepted.
fn silent_upstream() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind");
    let port = listener.local_addr().expect("address").port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
            count.fetch_add(1, Ordering::SeqCst);
        }
    });
    (port, accepted)
}

/// The response head HAProxy sends for `head` (a raw request head) on `port`.
fn raw_response(sidecar: &Sidecar, port: u16, head: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| sidecar.fail(&format!("connect: {e}")));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
        .write_all(head.as_bytes())
        .unwrap_or_else(|e| sidecar.fail(&format!("write: {e}")));
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// The answer to `GET /` for `host` over TLS on `port` (SNI `host`), sent with
/// `openssl s_client`, showing the client certificate `<cert>.crt`/`.key` of `dir`
/// when given.
fn tls_get(dir: &Path, port: u16, host: &str, cert: Option<&str>) -> String {
    let mut command = Command::new("openssl");
    command
        .args([
            "s_client",
            "-quiet",
            "-connect",
            &format!("127.0.0.1:{port}"),
        ])
        .args(["-servername", host])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(cert) = cert {
        command.args([
            "-cert",
            &format!("{cert}.crt"),
            "-key",
            &format!("{cert}.key"),
        ]);
    }
    let mut child = command.spawn().expect("run openssl s_client");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(
            format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .expect("write the request");
    let output = child.wait_with_output().expect("openssl s_client ends");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `request` sent with `Host: host`: status, headers and body.
fn call(
    sidecar: &Sidecar,
    request: reqwest::blocking::RequestBuilder,
    host: &str,
) -> (u16, reqwest::header::HeaderMap, String) {
    let response = request
        .header(reqwest::header::HOST, host)
        .send()
        .unwrap_or_else(|e| sidecar.fail(&format!("{host}: {e:?}")));
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().unwrap_or_default())
}

fn header<'a>(headers: &'a reqwest::header::HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// The TLS Secret of `shop.example.test` from the library's fixtures.
fn shop_tls_secret() -> Value {
    library_value(&library_config())["validationTests"]["_global"]["fixtures"]["secrets"][0].clone()
}

/// A TLS or HTTP/2 upstream process, stopped when dropped.
struct TlsUpstream {
    child: Child,
    port: u16,
}

impl TlsUpstream {
    /// An HTTP/2 upstream: another HAProxy answering every request with
    /// `h2-upstream <HTTP version>`, on `h2` cleartext (`tls` false) or TLS with ALPN
    /// `h2` (the `upstream` certificate of `dir`).
    fn h2(dir: &Path, tls: bool) -> TlsUpstream {
        let port = free_port();
        let name = if tls { "h2s" } else { "h2c" };
        let pem = [
            fs::read(dir.join("upstream.crt")),
            fs::read(dir.join("upstream.key")),
        ]
        .into_iter()
        .map(|part| part.expect("read the upstream certificate"))
        .collect::<Vec<_>>()
        .concat();
        fs::write(dir.join("upstream.pem"), pem).expect("write the upstream PEM");
        let bind = if tls {
            "ssl crt upstream.pem alpn h2"
        } else {
            "proto h2"
        };
        fs::write(
            dir.join(format!("{name}.cfg")),
            format!(
                "defaults\n    mode http\n    timeout client 10s\n    timeout connect 1s\n    timeout server 10s\n\
                 frontend {name}\n    bind 127.0.0.1:{port} {bind}\n    \
                 http-request return status 200 content-type text/plain lf-string \"h2-upstream %[req.ver]\"\n"
            ),
        )
        .expect("write the upstream config");
        let mut command = Command::new("haproxy");
        command.args(["-db", "-f", &format!("{name}.cfg")]);
        TlsUpstream::spawn(command, dir, port)
    }

    /// An HTTPS upstream: `openssl s_server -www` with a certificate for `localhost`
    /// of the test CA `upstream-ca` (files in `dir`), and `args` added, which answers
    /// `GET /` with a page that names `s_server`.
    fn start(dir: &Path, args: &[&str]) -> TlsUpstream {
        certs::leaf(dir, "upstream-ca", "upstream");
        let port = free_port();
        let mut command = Command::new("openssl");
        command
            .args(["s_server", "-accept", &format!("127.0.0.1:{port}")])
            .args(["-cert", "upstream.crt", "-key", "upstream.key", "-www"])
            .args(args);
        TlsUpstream::spawn(command, dir, port)
    }

    /// Starts `command` in `dir` (its stdin a pipe that stays open: `s_server` ends
    /// at end of input) and waits until it listens on `port`.
    fn spawn(mut command: Command, dir: &Path, port: u16) -> TlsUpstream {
        let child = command
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
        let upstream = TlsUpstream { child, port };
        poll(WAIT, || TcpStream::connect(("127.0.0.1", port)).ok())
            .unwrap_or_else(|_| panic!("{command:?} never listened on {port}"));
        upstream
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        send_signal(self.child.id(), Signal::TERM);
        if poll(Duration::from_secs(10), || {
            self.child.try_wait().ok().flatten()
        })
        .is_err()
        {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The Opaque Secret `basic-auth` of the library's `auth-basic` test: user `alice`
/// with password `secret` (a SHA-512 crypt hash).
fn basic_auth_secret() -> Value {
    library_value(&library_config())["validationTests"]["auth-basic"]["fixtures"]["authsecrets"][0]
        .clone()
}

#[test]
fn annotations_behave_as_ingress_nginx_documents_them() {
    let (http, https) = (free_port(), free_port());
    let (web, api) = (upstream("web"), upstream("api"));
    let (one, two) = (upstream("one"), upstream("two"));
    // A Service whose cluster IP and port are an upstream's (it has no endpoints).
    let mut direct = service("direct");
    direct["spec"] = json!({ "clusterIP": "127.0.0.1",
                             "ports": [ { "name": "http", "port": upstream("direct"), "protocol": "TCP" } ] });
    let (silent, silent_accepted) = silent_upstream();
    let certificates = tempfile::tempdir().expect("temp dir");
    let tls_upstream = TlsUpstream::start(certificates.path(), &[]);
    // One that wants a client certificate of its CA (proxy-ssl-secret), and the
    // Secrets: that client certificate with the right ca.crt, and with another CA's.
    let mtls_upstream = TlsUpstream::start(
        certificates.path(),
        &["-Verify", "1", "-CAfile", "upstream-ca.crt"],
    );
    let (h2c, h2s) = (
        TlsUpstream::h2(certificates.path(), false),
        TlsUpstream::h2(certificates.path(), true),
    );
    certs::leaf(certificates.path(), "upstream-ca", "client");
    certs::leaf(certificates.path(), "other-ca", "stranger");
    let pem = |file: &str| {
        let bytes = fs::read(certificates.path().join(file)).expect("read a test PEM");
        base64::engine::general_purpose::STANDARD.encode(bytes)
    };
    let client_secret = |name: &str, ca: &str| {
        json!({ "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": { "name": name, "namespace": "shop" },
                "data": { "tls.crt": pem("client.crt"), "tls.key": pem("client.key"), "ca.crt": pem(ca) } })
    };
    let prefix_only = [("/", "Prefix")];
    let mut secure = ingress("secure", "shop.example.test", "web", &prefix_only, &[]);
    secure["spec"]["tls"] = json!([ { "hosts": ["shop.example.test"], "secretName": "shop-tls" } ]);
    // Ingresses with one rule and one Prefix path "/": (name, host, Service, annotations).
    #[rustfmt::skip]
    let plain: &[(&str, &str, &str, Annotations)] = &[
        ("approot", "app.test", "web", &[("app-root", "/app1")]),
        ("headers", "hdr.test", "web", &[("x-forwarded-prefix", "/shop"), ("upstream-vhost", "internal.shop.svc")]),
        ("alias", "main.test", "api", &[("server-alias", "alias.test")]),
        ("moved", "moved.test", "web", &[("permanent-redirect", "https://new.example.test/"), ("permanent-redirect-code", "308")]),
        ("gone", "gone.test", "web", &[("permanent-redirect", "https://new.example.test/gone")]),
        ("away", "away.test", "web", &[("temporal-redirect", "https://status.example.test/")]),
        ("www", "www.site.test", "web", &[("from-to-www-redirect", "true")]),
        ("forced", "forced.test", "web", &[("force-ssl-redirect", "true")]),
        ("upload", "upload.test", "web", &[("proxy-body-size", "1k")]),
        ("slow", "slow.test", "silent", &[("proxy-read-timeout", "1")]),
        ("office", "office.test", "web", &[("whitelist-source-range", "10.0.0.0/8")]),
        ("home", "home.test", "web", &[("allowlist-source-range", "10.0.0.0/8, 127.0.0.1")]),
        ("blocked", "blocked.test", "web", &[("denylist-source-range", "127.0.0.0/8")]),
        ("cors", "cors.test", "web", &[
            ("enable-cors", "true"),
            ("cors-allow-origin", "https://app.example.test, https://*.example.org"),
            ("cors-allow-methods", "GET, POST"),
            ("cors-max-age", "600"),
            ("cors-expose-headers", "X-Total"),
        ]),
        ("snippets", "snip.test", "api", &[("configuration-snippet", "more_set_headers \"X-Evil: 1\";"), ("limit-rate", "5")]),
        ("tls-backend", "tlsbe.test", "tls", &[("backend-protocol", "HTTPS")]),
        ("passthrough", "pass.test", "tls", &[("ssl-passthrough", "true")]),
        ("grpc", "grpc.test", "h2c", &[("backend-protocol", "GRPC")]),
        ("grpcs", "grpcs.test", "h2s", &[("backend-protocol", "GRPCS")]),
        ("mtls", "mtls.test", "mtls", &[("backend-protocol", "HTTPS"), ("proxy-ssl-secret", "shop/upstream-client"), ("proxy-ssl-verify", "on"), ("proxy-ssl-name", "localhost")]),
        ("mtls-other-ca", "otherca.test", "mtls", &[("backend-protocol", "HTTPS"), ("proxy-ssl-secret", "shop/other-ca-client"), ("proxy-ssl-verify", "on"), ("proxy-ssl-name", "localhost")]),
        ("mtls-no-client", "noclient.test", "mtls", &[("backend-protocol", "HTTPS")]),
        ("per-minute", "rpm.test", "web", &[("limit-rpm", "1")]),
        ("one-at-a-time", "conn.test", "silent", &[("limit-connections", "1")]),
        ("sticky", "sticky.test", "pair", &[("affinity", "cookie"), ("session-cookie-name", "STICKY"), ("session-cookie-max-age", "3600"), ("session-cookie-path", "/shop")]),
        ("round-robin", "rr.test", "pair", &[]),
        ("hashed", "hash.test", "pair", &[("upstream-hash-by", "$http_x_user")]),
        ("fallback", "fb.test", "empty", &[("default-backend", "web")]),
        ("no-fallback", "nofb.test", "empty", &[]),
        ("errors", "errors.test", "web", &[("custom-http-errors", "404,503"), ("default-backend", "api")]),
        ("errors-default", "errdef.test", "web", &[("custom-http-errors", "404")]),
        ("via-service", "direct.test", "direct", &[("service-upstream", "true")]),
        ("admin", "admin.test", "web", &[("auth-type", "basic"), ("auth-secret", "basic-auth"), ("auth-realm", "Admins only")]),
        ("stable", "canary.test", "web", &[]),
        ("preview", "canary.test", "api", &[("canary", "true"), ("canary-by-header", "X-Canary"), ("canary-by-cookie", "canary")]),
        ("stable-v", "version.test", "web", &[]),
        ("preview-v", "version.test", "api", &[("canary", "true"), ("canary-by-header", "X-Version"), ("canary-by-header-value", "v2")]),
        ("stable-all", "weighted.test", "web", &[]),
        ("preview-all", "weighted.test", "api", &[("canary", "true"), ("canary-weight", "100")]),
    ];
    let mut ingresses: Vec<Value> = plain
        .iter()
        .map(|(name, host, service, annotations)| {
            ingress(name, host, service, &prefix_only, annotations)
        })
        .collect();
    let rewrite = [("/something(/|$)(.*)", "ImplementationSpecific")];
    ingresses.push(ingress(
        "rewrite",
        "rw.test",
        "web",
        &rewrite,
        &[("rewrite-target", "/$2")],
    ));
    let regex = [("/v[0-9]+/users", "Prefix")];
    ingresses.push(ingress(
        "regex",
        "re.test",
        "api",
        &regex,
        &[("use-regex", "true")],
    ));
    ingresses.push(secure);
    let mut partners = ingress(
        "partners",
        "partners.test",
        "web",
        &prefix_only,
        &[
            ("auth-tls-secret", "shop/client-ca"),
            ("auth-tls-verify-client", "on"),
        ],
    );
    partners["spec"]["tls"] =
        json!([ { "hosts": ["partners.test"], "secretName": "apps-wildcard-tls" } ]);
    ingresses.push(partners);
    // Another tenant's canary for canary.test/ with weight 100: refused.
    let mut grab = ingress(
        "grab",
        "canary.test",
        "web",
        &prefix_only,
        &[("canary", "true"), ("canary-weight", "100")],
    );
    grab["metadata"]["namespace"] = json!("aaa-evil");
    ingresses.push(grab);
    let resources = [
        ("ingresses", Value::Array(ingresses)),
        ("ingressclasses", json!([])),
        (
            "services",
            json!([
                service("web"),
                service("api"),
                service("silent"),
                service("tls"),
                service("pair"),
                service("empty"),
                service("mtls"),
                service("h2c"),
                service("h2s"),
                direct
            ]),
        ),
        (
            "endpointslices",
            json!([
                loopback_slice("shop", "web", "http", &[web]),
                loopback_slice("shop", "api", "http", &[api]),
                loopback_slice("shop", "silent", "http", &[silent]),
                loopback_slice("shop", "tls", "http", &[tls_upstream.port]),
                loopback_slice("shop", "mtls", "http", &[mtls_upstream.port]),
                loopback_slice("shop", "h2c", "http", &[h2c.port]),
                loopback_slice("shop", "h2s", "http", &[h2s.port]),
                loopback_slice("shop", "pair", "http", &[one, two]),
            ]),
        ),
        (
            "secrets",
            json!(
                    [
                        shop_tls_secret(),
                        library_value(&library_config())["validationTests"]["_global"]["fixtures"]
                            ["secrets"][1]
                            .clone(),
                        client_secret("upstream-client", "upstream-ca.crt"),
                        client_secret("other-ca-client", "other-ca.crt")
                    ]
                ),
        ),
        (
            "authsecrets",
            json!([basic_auth_secret(), {
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": { "name": "client-ca", "namespace": "shop" },
                "data": { "ca.crt": pem("upstream-ca.crt") }
            }]),
        ),
    ];
    let sidecar = Sidecar::start(
        "hapwright-ingress-nginx-",
        config(http, https),
        &resources,
        http,
        reqwest::blocking::Client::builder()
            .resolve("shop.example.test", ([127, 0, 0, 1], https).into()),
    );
    let url = |path: &str| format!("http://127.0.0.1:{http}{path}");
    let get = |host: &str, path: &str| call(&sidecar, sidecar.client.get(url(path)), host);
    // The status and Location of GET host path.
    let redirect = |host: &str, path: &str| {
        let (status, headers, _) = get(host, path);
        (status, header(&headers, "location").to_owned())
    };

    // rewrite-target: the path's regex (case-insensitive) matched, the path replaced
    // by the target with capture group $2; the query string stays.
    for (path, upstream_path) in [
        ("/something/new?x=1", "GET /new?x=1 "),
        ("/SOMETHING/a/b", "GET /a/b "),
        ("/something", "GET / "),
    ] {
        let (status, _, body) = get("rw.test", path);
        assert!(
            status == 200 && body.starts_with("web\n") && body.contains(upstream_path),
            "rw.test{path}: {status} {body}"
        );
    }
    // use-regex: a Prefix path is a regex anchored at the start.
    sidecar.expect(http, "re.test", "/v2/users/7", 200, "api");
    sidecar.expect(http, "re.test", "/V10/USERS", 200, "api");
    sidecar.expect(http, "re.test", "/vx/users", 404, "default backend");

    // app-root: "/" is redirected (302) to the application root, other paths served.
    assert_eq!(
        redirect("app.test", "/"),
        (302, "http://app.test/app1".into())
    );
    sidecar.expect(http, "app.test", "/app1/page", 200, "web");

    // x-forwarded-prefix and upstream-vhost reach the upstream.
    let (_, _, body) = get("hdr.test", "/x");
    let lower = body.to_lowercase();
    assert!(lower.contains("x-forwarded-prefix: /shop\r\n"), "{body}");
    assert!(lower.contains("host: internal.shop.svc\r\n"), "{body}");
    assert!(!lower.contains("host: hdr.test"), "{body}");

    // server-alias: the alias serves the Ingress's rules.
    sidecar.expect(http, "alias.test", "/", 200, "api");
    sidecar.expect(http, "ALIAS.test.", "/x", 200, "api");

    // permanent-redirect (301, or permanent-redirect-code) and temporal-redirect
    // (302), whatever the path.
    for (host, code, location) in [
        ("moved.test", 308, "https://new.example.test/"),
        ("gone.test", 301, "https://new.example.test/gone"),
        ("away.test", 302, "https://status.example.test/"),
    ] {
        assert_eq!(
            redirect(host, "/some/path"),
            (code, location.into()),
            "{host}"
        );
    }
    // from-to-www-redirect: the name without www. goes to the rule host (308).
    assert_eq!(
        redirect("site.test", "/p?q=1"),
        (308, "http://www.site.test/p?q=1".into())
    );
    sidecar.expect(http, "www.site.test", "/p", 200, "web");

    // ssl-redirect: a host with a certificate redirects plain HTTP with 308 and is
    // served over HTTPS; force-ssl-redirect redirects without a certificate.
    assert_eq!(
        redirect("shop.example.test", "/cart"),
        (308, "https://shop.example.test/cart".into())
    );
    let (status, _, body) = call(
        &sidecar,
        sidecar
            .client
            .get(format!("https://shop.example.test:{https}/cart")),
        "shop.example.test",
    );
    assert!(status == 200 && body.starts_with("web"), "{status} {body}");
    assert_eq!(
        redirect("forced.test", "/a"),
        (308, "https://forced.test/a".into())
    );

    // proxy-body-size: a larger body is refused with 413, as nginx's
    // client_max_body_size; the ConfigMap default 1m applies to the other Ingresses.
    let post = |host: &str, length: usize| {
        raw_response(
            &sidecar,
            http,
            &format!(
                "POST / HTTP/1.1\r\nHost: {host}\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    assert!(
        post("upload.test", 2000).starts_with("HTTP/1.1 413"),
        "{}",
        post("upload.test", 2000)
    );
    let (status, _, _) = call(
        &sidecar,
        sidecar.client.post(url("/")).body(vec![b'x'; 1000]),
        "upload.test",
    );
    assert_eq!(status, 200);
    assert!(post("hdr.test", 2 << 20).starts_with("HTTP/1.1 413"));

    // proxy-read-timeout: an upstream that does not answer within 1 s gives 504
    // (HAProxy's server timeout is 50 s otherwise; the client waits 10 s).
    let (status, _, _) = get("slow.test", "/");
    assert_eq!(status, 504);

    // limit-rpm 1 with ingress-nginx's burst multiplier 5: six requests a minute
    // from one address pass, the seventh gets 503.
    for n in 1..=6 {
        let (status, _, body) = get("rpm.test", "/");
        assert!(
            status == 200 && body.starts_with("web"),
            "request {n}: {status} {body}"
        );
    }
    let (status, _, _) = get("rpm.test", "/");
    assert_eq!(status, 503, "the seventh request within the minute");
    // limit-connections 1: while one request is in flight (the upstream holds it),
    // a second one from the same address gets 503.
    let before = silent_accepted.load(Ordering::SeqCst);
    let mut in_flight = TcpStream::connect(("127.0.0.1", http)).expect("connect");
    in_flight
        .write_all(b"GET / HTTP/1.1\r\nHost: conn.test\r\n\r\n")
        .expect("write");
    poll(WAIT, || {
        (silent_accepted.load(Ordering::SeqCst) > before).then_some(())
    })
    .unwrap_or_else(|_| sidecar.fail("the first request never reached the upstream"));
    let (status, _, _) = get("conn.test", "/");
    assert_eq!(status, 503, "a second concurrent request");
    drop(in_flight);

    // affinity cookie: without it the two servers take turns; with it the first
    // answer sets the cookie (session-cookie-name, session-cookie-max-age) and every
    // request carrying it reaches the same server.
    let answered = |host: &str, cookie: Option<&str>| {
        let mut request = sidecar.client.get(url("/"));
        if let Some(cookie) = cookie {
            request = request.header(reqwest::header::COOKIE, cookie);
        }
        let (status, headers, body) = call(&sidecar, request, host);
        assert_eq!(status, 200, "{host}: {body}");
        let cookie = header(&headers, "set-cookie").to_owned();
        (body.lines().next().unwrap_or_default().to_owned(), cookie)
    };
    let turns: Vec<String> = (0..4).map(|_| answered("rr.test", None).0).collect();
    assert!(
        turns.contains(&"one".into()) && turns.contains(&"two".into()),
        "{turns:?}"
    );
    let (first, set_cookie) = answered("sticky.test", None);
    assert!(
        set_cookie.starts_with("STICKY=")
            && set_cookie.contains("Max-Age=3600")
            && set_cookie.ends_with("Path=/shop"),
        "{set_cookie}"
    );
    let cookie = set_cookie.split(';').next().unwrap_or_default().to_owned();
    for _ in 0..4 {
        assert_eq!(answered("sticky.test", Some(&cookie)).0, first, "{cookie}");
    }

    // upstream-hash-by $http_x_user: each user always reaches the same server, and
    // the users are spread over both.
    let mut servers = std::collections::BTreeSet::new();
    for user in [
        "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi",
    ] {
        let answers: Vec<String> = (0..3)
            .map(|_| {
                let request = sidecar.client.get(url("/")).header("X-User", user);
                let (_, _, body) = call(&sidecar, request, "hash.test");
                body.lines().next().unwrap_or_default().to_owned()
            })
            .collect();
        assert!(
            answers.iter().all(|a| *a == answers[0]),
            "{user}: {answers:?}"
        );
        servers.insert(answers[0].clone());
    }
    assert_eq!(servers.into_iter().collect::<Vec<_>>(), ["one", "two"]);

    // default-backend: while the Ingress's Service has no endpoint, the named
    // Service answers (without it: 503).
    sidecar.expect(http, "fb.test", "/x", 200, "web");
    sidecar.expect(http, "nofb.test", "/x", 503, "");

    // custom-http-errors: an upstream answer with a listed status is replaced by
    // what the error backend (default-backend, else the default backend: here the
    // built-in 404 page) answers when asked with ingress-nginx's headers; other
    // statuses pass as they are.
    let (status, headers, body) = call(
        &sidecar,
        sidecar
            .client
            .get(url("/page?status=404"))
            .header("accept", "text/html")
            .header("x-request-id", "req-42"),
        "errors.test",
    );
    assert!(body.starts_with("api\n"), "{status} {body}");
    // The error backend's own status goes out (here the upstream echo answers
    // `status=404` of the original URI with 404 too).
    assert_eq!(status, 404, "{body}");
    assert_eq!(header(&headers, "x-upstream"), "api", "{headers:?}");
    let asked = body.to_ascii_lowercase();
    for expected in [
        "get /page?status=404 http/1.1",
        "x-code: 404",
        "x-format: text/html",
        "x-original-uri: /page?status=404",
        "x-namespace: shop",
        "x-ingress-name: errors",
        "x-service-name: web",
        "x-service-port: http",
        "x-request-id: req-42",
        "host: errors.test",
    ] {
        assert!(asked.contains(expected), "{expected:?} in {body}");
    }
    assert!(
        !asked.contains("x-hapwright-error-backend"),
        "the routing header stays inside HAProxy: {body}"
    );
    let (status, _, body) = call(
        &sidecar,
        sidecar.client.get(url("/other?status=503")),
        "errors.test",
    );
    assert!(
        status == 503 && body.starts_with("api\n"),
        "{status} {body}"
    );
    let (status, _, body) = call(
        &sidecar,
        sidecar.client.get(url("/page?status=500")),
        "errors.test",
    );
    assert!(
        status == 500 && body.starts_with("web\n"),
        "{status} {body}"
    );
    sidecar.expect(http, "errors.test", "/page", 200, "web");
    sidecar.expect(
        http,
        "errdef.test",
        "/x?status=404",
        404,
        "default backend - 404",
    );
    sidecar.expect(http, "errdef.test", "/x?status=410", 410, "web");

    // auth-type basic: 401 with the realm unless the credentials match a user of the
    // Secret (auth-file).
    let basic = |credentials: Option<(&str, &str)>| {
        let mut request = sidecar.client.get(url("/"));
        if let Some((user, password)) = credentials {
            request = request.basic_auth(user, Some(password));
        }
        let (status, headers, body) = call(&sidecar, request, "admin.test");
        (
            status,
            header(&headers, "www-authenticate").to_owned(),
            body,
        )
    };
    let (status, challenge, _) = basic(None);
    assert_eq!(
        (status, challenge.as_str()),
        (401, "Basic realm=\"Admins only\"")
    );
    assert_eq!(basic(Some(("alice", "wrong"))).0, 401);
    assert_eq!(basic(Some(("mallory", "secret"))).0, 401);
    let (status, _, body) = basic(Some(("alice", "secret")));
    assert!(status == 200 && body.starts_with("web"), "{status} {body}");

    // service-upstream: the Service's cluster IP and port, not its endpoints.
    sidecar.expect(http, "direct.test", "/", 200, "direct");

    // Canaries: the header decides first (always / never, or the configured value),
    // then the cookie, then the weight; otherwise the main Ingress answers.
    let canary = |host: &str, header: Option<(&str, &str)>, cookie: Option<&str>| {
        let mut request = sidecar.client.get(url("/"));
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        if let Some(cookie) = cookie {
            request = request.header(reqwest::header::COOKIE, cookie);
        }
        let (status, _, body) = call(&sidecar, request, host);
        assert_eq!(status, 200, "{host}: {body}");
        body.lines().next().unwrap_or_default().to_owned()
    };
    // (also: the weight-100 canary of namespace aaa-evil takes nothing)
    assert_eq!(canary("canary.test", None, None), "web");
    assert_eq!(
        canary("canary.test", Some(("X-Canary", "always")), None),
        "api"
    );
    assert_eq!(
        canary(
            "canary.test",
            Some(("X-Canary", "never")),
            Some("canary=always")
        ),
        "web"
    );
    assert_eq!(
        canary(
            "canary.test",
            Some(("X-Canary", "maybe")),
            Some("canary=always")
        ),
        "api"
    );
    assert_eq!(canary("canary.test", None, Some("canary=never")), "web");
    assert_eq!(
        canary("version.test", Some(("X-Version", "v2")), None),
        "api"
    );
    assert_eq!(
        canary("version.test", Some(("X-Version", "v1")), None),
        "web"
    );
    assert_eq!(canary("weighted.test", None, None), "api");

    // Source ranges: 403 for clients outside the allowlist or inside the denylist.
    sidecar.expect(http, "office.test", "/", 403, "");
    sidecar.expect(http, "home.test", "/", 200, "web");
    sidecar.expect(http, "blocked.test", "/", 403, "");

    // CORS: preflight answered with 204 and the configured headers for an allowed
    // origin; simple requests get the headers; other origins get none.
    let cors = |method: reqwest::Method, origin: &str| {
        let request = sidecar.client.request(method, url("/api"));
        call(&sidecar, request.header("Origin", origin), "cors.test")
    };
    let (status, headers, _) = cors(reqwest::Method::OPTIONS, "https://app.example.test");
    assert_eq!(status, 204);
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        "https://app.example.test"
    );
    assert_eq!(
        header(&headers, "access-control-allow-methods"),
        "GET, POST"
    );
    assert_eq!(header(&headers, "access-control-max-age"), "600");
    assert_eq!(header(&headers, "access-control-allow-credentials"), "true");
    let (status, headers, body) = cors(reqwest::Method::GET, "https://shop.example.org");
    assert!(status == 200 && body.starts_with("web"), "{status} {body}");
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        "https://shop.example.org"
    );
    assert_eq!(header(&headers, "access-control-expose-headers"), "X-Total");
    let (_, headers, _) = cors(reqwest::Method::GET, "https://evil.test");
    assert_eq!(header(&headers, "access-control-allow-origin"), "");

    // backend-protocol HTTPS: HAProxy speaks TLS to the upstream (without verifying
    // its certificate, as nginx's proxy-ssl-verify defaults to off), and with
    // proxy-ssl-secret, -verify, -name it shows the client certificate and checks
    // the upstream's against ca.crt for the name.
    for host in ["tlsbe.test", "mtls.test"] {
        let (status, _, body) = get(host, "/");
        assert!(
            status == 200 && body.contains("s_server -accept"),
            "{host}: {status} {body}"
        );
    }

    // backend-protocol GRPC and GRPCS: HAProxy speaks HTTP/2 to the upstream, in
    // clear and over TLS (an HTTP/1.1 request in front).
    for host in ["grpc.test", "grpcs.test"] {
        let (status, _, body) = get(host, "/");
        assert_eq!((status, body.as_str()), (200, "h2-upstream 2.0"), "{host}");
    }

    // With another CA, or without a client certificate, the TLS session fails and
    // the request gets HAProxy's error: 503 when the handshake fails, 502 when the
    // upstream closes the TLS 1.3 connection after it (which one depends on timing).
    for host in ["otherca.test", "noclient.test"] {
        let (status, _, body) = get(host, "/");
        assert!(matches!(status, 502 | 503), "{host}: {status} {body}");
    }

    // auth-tls-secret with verify on: a client certificate of the CA passes and the
    // upstream learns the result; none, or one of another CA, gets 400 as from
    // ingress-nginx. Clients cannot bring the ssl-client-* headers themselves.
    let answer = tls_get(certificates.path(), https, "partners.test", Some("client"));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let lower = answer.to_lowercase();
    assert!(lower.contains("ssl-client-verify: success\r\n"), "{answer}");
    assert!(
        lower.contains("ssl-client-subject-dn: /cn=localhost\r\n"),
        "{answer}"
    );
    for cert in [None, Some("stranger")] {
        let answer = tls_get(certificates.path(), https, "partners.test", cert);
        assert!(answer.starts_with("HTTP/1.1 400"), "{cert:?}: {answer}");
    }
    let request = sidecar
        .client
        .get(url("/"))
        .header("ssl-client-verify", "SUCCESS");
    let (_, _, body) = call(&sidecar, request, "hdr.test");
    assert!(!body.to_lowercase().contains("ssl-client-verify"), "{body}");

    // ssl-passthrough: the TLS connection for pass.test reaches the upstream as it is
    // (openssl s_server answers); the other HTTPS hosts above were terminated by
    // HAProxy behind the same port.
    let answer = tls_get(certificates.path(), https, "pass.test", None);
    assert!(
        answer.starts_with("HTTP/1.0 200 ok") && answer.contains("s_server -accept"),
        "{answer}"
    );

    // Snippets are refused and limit-rate is not supported yet: both reported as
    // notices (Warning Events in Kubernetes, on /debug/rendered), the Ingress served
    // without them.
    let (status, headers, body) = get("snip.test", "/");
    assert!(status == 200 && body.starts_with("api"), "{status} {body}");
    assert_eq!(header(&headers, "x-evil"), "");
    let rendered = sidecar
        .client
        .get(format!(
            "http://127.0.0.1:{}/debug/rendered",
            sidecar.status
        ))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_else(|e| sidecar.fail(&format!("/debug/rendered: {e}")));
    for notice in [
        "# hapwright:RefusedAnnotation Ingress shop/snippets: nginx.ingress.kubernetes.io/configuration-snippet is refused",
        "# hapwright:UnsupportedAnnotation Ingress shop/snippets: nginx.ingress.kubernetes.io/limit-rate is not supported yet",
    ] {
        assert!(rendered.contains(notice), "{notice} not in /debug/rendered");
    }
    assert!(!sidecar.deployed_config().contains("more_set_headers"));
}

/// A sidecar serving `ingresses` with Services `web` and `api` (echo upstreams
/// answering with their name), and the ports of both upstreams.
fn web_and_api_sidecar(
    prefix: &str,
    config: Value,
    http: u16,
    ingresses: Value,
) -> (Sidecar, [u16; 2]) {
    let (web, api) = (upstream("web"), upstream("api"));
    let resources = [
        ("ingresses", ingresses),
        ("ingressclasses", json!([])),
        ("services", json!([service("web"), service("api")])),
        (
            "endpointslices",
            json!([
                loopback_slice("shop", "web", "http", &[web]),
                loopback_slice("shop", "api", "http", &[api]),
            ]),
        ),
        ("secrets", json!([])),
        ("authsecrets", json!([])),
    ];
    let sidecar = Sidecar::start(
        prefix,
        config,
        &resources,
        http,
        reqwest::blocking::Client::builder(),
    );
    (sidecar, [web, api])
}

/// One bad value per annotation family arrives with a good Ingress each time: the
/// bad Ingress is quarantined with an error naming its annotation, the good one
/// goes live, and what was served before stays served.
#[test]
fn a_bad_annotation_value_quarantines_only_its_ingress() {
    let http = free_port();
    let prefix_only = [("/", "Prefix")];
    let base = ingress(
        "base",
        "base.test",
        "web",
        &prefix_only,
        &[("rewrite-target", "/")],
    );
    let (sidecar, _) = web_and_api_sidecar(
        "hapwright-ingress-nginx-bad-",
        config(http, free_port()),
        http,
        json!([base.clone()]),
    );
    sidecar.expect(http, "base.test", "/deep/path", 200, "web\nGET / ");

    let bad_values = [
        ("rewrite-target", "/x\n    server evil 127.0.0.1:1"),
        ("proxy-body-size", "8q"),
        ("proxy-read-timeout", "60s; } listen evil"),
        ("whitelist-source-range", "10.0.0.0/8 %[env(SECRET)]"),
        ("server-alias", "base.test victim.test"),
        ("permanent-redirect", "https://x.test/\"\nlisten evil"),
        ("cors-allow-origin", "${SECRET}"),
        ("backend-protocol", "FCGI"),
        ("ssl-redirect", "yes"),
        ("limit-connections", "ten"),
        ("canary-weight", "half"),
        ("auth-secret", "victim/basic-auth"),
    ];
    let mut objects = vec![base];
    for (n, (annotation, value)) in bad_values.iter().enumerate() {
        objects.push(ingress(
            &format!("bad-{n}"),
            &format!("bad{n}.test"),
            "web",
            &prefix_only,
            &[(annotation, value)],
        ));
        let good_host = format!("good{n}.test");
        objects.push(ingress(
            &format!("good-{n}"),
            &good_host,
            "api",
            &prefix_only,
            &[("x-forwarded-prefix", "/good")],
        ));
        sidecar.change("ingresses", &json!(objects));
        poll(WAIT, || {
            let (status, body) = sidecar.get(http, &good_host, "/").ok()?;
            (status == 200 && body.starts_with("api")).then_some(())
        })
        .unwrap_or_else(|_| {
            sidecar.fail(&format!(
                "{good_host} never went live beside a bad {annotation}"
            ))
        });
        let quarantine = sidecar.quarantine(n as u64 + 1);
        let held = quarantine["objects"]
            .as_array()
            .and_then(|list| list.iter().find(|o| o["name"] == format!("bad-{n}")))
            .unwrap_or_else(|| sidecar.fail(&format!("bad-{n} is not quarantined: {quarantine}")));
        let errors = held.to_string();
        assert!(
            errors.contains(&format!(
                "Ingress shop/bad-{n}: annotation nginx.ingress.kubernetes.io/{annotation}: "
            )),
            "the error names the Ingress and the annotation: {errors}"
        );
        sidecar.expect(http, &format!("bad{n}.test"), "/", 404, "default backend");
        sidecar.expect(http, "base.test", "/deep/path", 200, "web\nGET / ");
    }
    let deployed = sidecar.deployed_config();
    assert!(
        !deployed.contains("evil") && !deployed.contains("SECRET"),
        "{deployed}"
    );
}

/// Whether the `haproxy` on `PATH` has `add backend`.
fn dynamic_line() -> bool {
    let output = Command::new("haproxy")
        .arg("-v")
        .output()
        .expect("haproxy -v runs");
    Version::parse(&String::from_utf8_lossy(&output.stdout))
        .is_some_and(|v| v >= Version { major: 3, minor: 4 })
}

/// What the coverage table says about deployment: a new Ingress without
/// rule-adding annotations is runtime on 3.4 with `haproxy.dynamicBackends` (a
/// reload on older lines), a `proxy-body-size` change is a map change (runtime on
/// every line), and an annotation that adds frontend rules reloads.
#[test]
fn a_new_ingress_and_a_body_size_change_deploy_at_runtime() {
    let dynamic = dynamic_line();
    let http = free_port();
    let prefix_only = [("/", "Prefix")];
    let mut config = config(http, free_port());
    config["haproxy"] = json!({ "dynamicBackends": true });
    let shop = |size: &str| {
        ingress(
            "shop",
            "shop.test",
            "web",
            &prefix_only,
            &[("proxy-body-size", size), ("affinity", "cookie")],
        )
    };
    let (sidecar, [web, api]) = web_and_api_sidecar(
        "hapwright-ingress-nginx-deploy-",
        config,
        http,
        json!([shop("1k")]),
    );
    let post = || {
        raw_response(
            &sidecar,
            http,
            "POST / HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 2000\r\nConnection: close\r\n\r\n",
        )
    };
    assert!(post().starts_with("HTTP/1.1 413"), "{}", post());

    // A new Ingress with a new backend.
    let reloads = sidecar.master_reloads();
    let plain = ingress("blog", "blog.test", "api", &prefix_only, &[]);
    let deployed = sidecar.change("ingresses", &json!([shop("1k"), plain]));
    if dynamic {
        assert_eq!(deployed["last_strategy"], "runtime", "{deployed}");
        assert_eq!(sidecar.master_reloads(), reloads, "HAProxy did not reload");
    } else {
        assert_eq!(deployed["last_strategy"], "reload", "{deployed}");
    }
    sidecar.expect(http, "blog.test", "/", 200, "api");

    // proxy-body-size raised: one map line, on every line without a reload.
    let reloads = sidecar.master_reloads();
    let plain = ingress("blog", "blog.test", "api", &prefix_only, &[]);
    let deployed = sidecar.change("ingresses", &json!([shop("4k"), plain]));
    assert_eq!(deployed["last_strategy"], "runtime", "{deployed}");
    assert_eq!(sidecar.master_reloads(), reloads, "HAProxy did not reload");
    let answer = post();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("\r\n\r\nweb\n"),
        "{answer}"
    );

    // x-forwarded-prefix adds a frontend rule: a reload.
    let prefixed = ingress(
        "blog",
        "blog.test",
        "api",
        &prefix_only,
        &[("x-forwarded-prefix", "/blog")],
    );
    let deployed = sidecar.change("ingresses", &json!([shop("4k"), prefixed]));
    assert_eq!(deployed["last_strategy"], "reload", "{deployed}");
    let (status, body) = sidecar
        .get(http, "blog.test", "/")
        .unwrap_or_else(|e| sidecar.fail(&e));
    assert!(
        status == 200
            && body
                .to_lowercase()
                .contains("x-forwarded-prefix: /blog\r\n"),
        "{status} {body}"
    );

    // A new endpoint of a Service behind a cookie-affinity profile: `add server` at
    // runtime (its cookie value comes from its address), no reload.
    let reloads = sidecar.master_reloads();
    let web2 = upstream("web2");
    let deployed = sidecar.change(
        "endpointslices",
        &json!([
            loopback_slice("shop", "web", "http", &[web, web2]),
            loopback_slice("shop", "api", "http", &[api]),
        ]),
    );
    assert_eq!(deployed["last_strategy"], "runtime", "{deployed}");
    assert_eq!(sidecar.master_reloads(), reloads, "HAProxy did not reload");
    let served: Vec<String> = (0..4)
        .map(|_| {
            let (_, body) = sidecar
                .get(http, "shop.test", "/")
                .unwrap_or_else(|e| sidecar.fail(&e));
            body.lines().next().unwrap_or_default().to_owned()
        })
        .collect();
    assert!(served.contains(&"web2".into()), "{served:?}");
}

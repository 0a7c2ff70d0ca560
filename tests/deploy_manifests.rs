//! The Kubernetes manifests in `deploy/` are well-formed and consistent: every YAML
//! document is a named object that round-trips through its Kubernetes API type
//! (k8s-openapi), volume mounts name defined volumes, RBAC covers what
//! the embedded hapwright config watches (plus pods for discovery and leases for
//! leader election), ports agree between containers, Services, probes, the
//! ServiceMonitor and the hapwright config, HAProxy is started the way hapwright
//! expects, and every embedded hapwright config passes `hapwright check` and uses the
//! templates of `examples/kubernetes-ingress/`. Run for real: the drain, the Data
//! Plane API runner, and the HAProxy pods' readiness (not ready on the bootstrap
//! config, ready on a deployed one and after a failed deployment).
//!
//! Each check is a function returning the problems it found, so the negative tests
//! below can show that a broken manifest is reported.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use hapwright_e2e::hapwright_binary;
use serde_json::Value;

#[path = "support/certs.rs"]
#[allow(dead_code)]
mod certs;

/// YAML files in deploy/ that are not Kubernetes manifests: kustomize's
/// `kustomization.yaml`, the site settings `site.yaml` and the hapwright config
/// `hapwright.yaml` composed from them (a ConfigMap's content).
const NOT_MANIFESTS: &[&str] = &["kustomization", "site", "hapwright"];

/// Secrets the manifests use but do not ship (the user creates them, see
/// deploy/README.md).
const EXTERNAL_SECRETS: &[&str] = &["hapwright-dataplane"];

/// ConfigMaps Kubernetes creates in every namespace.
const CLUSTER_CONFIG_MAPS: &[&str] = &["kube-root-ca.crt"];

/// Kinds of add-ons (CRDs) that k8s-openapi does not have; `kubernetes-validate`
/// reports them as unknown, the checks below look at what matters in them.
const CUSTOM_KINDS: &[&str] = &[
    "ServiceMonitor",
    "PrometheusRule",
    "Certificate",
    "Issuer",
    "GatewayClass",
];

/// Kinds that live in a namespace (everything else here is cluster-scoped).
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "IngressClass",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingWebhookConfiguration",
    "GatewayClass",
];

/// Keys of a hapwright config that must be the Ingress library's.
const LIBRARY_KEYS: &[&str] = &[
    "watchedResources",
    "haproxyConfig",
    "templateSnippets",
    "maps",
    "files",
    "sslCertificates",
    "extraContext",
    "templating",
    "statusTemplates",
];

/// One YAML document and the file it came from.
#[derive(Clone, Debug)]
struct Doc {
    file: String,
    value: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or("")
    }

    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or("")
    }

    fn namespace(&self) -> &str {
        self.value["metadata"]["namespace"].as_str().unwrap_or("")
    }

    fn label(&self) -> String {
        format!("{}: {} {}", self.file, self.kind(), self.name())
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The deployment modes: each directory is applied on its own.
fn modes() -> Vec<PathBuf> {
    vec![
        repo().join("deploy/sidecar"),
        repo().join("deploy/controller"),
    ]
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            files.extend(yaml_files(&path));
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) && !path
            .file_stem()
            .and_then(|s| s.to_str())
            .is_some_and(|stem| NOT_MANIFESTS.contains(&stem) || stem.starts_with('.'))
        {
            files.push(path);
        }
    }
    files.sort();
    files
}

fn parse_docs(file: &str, text: &str) -> Vec<Doc> {
    let values: Vec<Value> = serde_saphyr::from_multiple(text)
        .unwrap_or_else(|e| panic!("{file} is not valid YAML: {e}"));
    values
        .into_iter()
        .filter(|v| !v.is_null())
        .map(|value| Doc {
            file: file.to_owned(),
            value,
        })
        .collect()
}

/// The objects `kubectl apply -k dir` applies when `dir` has a kustomization, else
/// the documents of every manifest under `dir`.
fn load(dir: &Path) -> Vec<Doc> {
    if dir.join("kustomization.yaml").is_file() {
        kustomize(dir)
    } else {
        load_files(dir)
    }
}

fn relative(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// What `kustomize build` makes of the kustomizations in deploy/: `resources`
/// (files, and directories with their own kustomization) and `configMapGenerator`
/// (`files` as `key=path` or `path`, `options.labels`, `behavior` create or
/// replace). Anything else in a kustomization is refused, so this stays what
/// kustomize does (the kubectl_kustomize test compares both where kubectl exists).
fn kustomize(dir: &Path) -> Vec<Doc> {
    let file = dir.join("kustomization.yaml");
    let at = relative(&file);
    let kustomization: Value =
        serde_saphyr::from_str(&fs::read_to_string(&file).expect("read kustomization"))
            .unwrap_or_else(|e| panic!("{at}: {e}"));
    for key in kustomization.as_object().expect("a mapping").keys() {
        assert!(
            matches!(
                key.as_str(),
                "apiVersion" | "kind" | "resources" | "configMapGenerator"
            ),
            "{at}: `{key}` is not understood by tests/deploy_manifests.rs"
        );
    }
    let mut docs = Vec::new();
    for resource in array(&kustomization, "resources") {
        let path = dir.join(resource.as_str().expect("a resource path"));
        if path.is_dir() {
            docs.extend(load(&path));
        } else {
            let text = fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{at}: resource {}: {e}", path.display()));
            docs.extend(parse_docs(&relative(&path), &text));
        }
    }
    for generator in array(&kustomization, "configMapGenerator") {
        let name = generator["name"].as_str().expect("generator name");
        let namespace = generator["namespace"].as_str().unwrap_or("");
        assert_eq!(
            generator["options"]["disableNameSuffixHash"],
            Value::Bool(true),
            "{at}: ConfigMap {name} gets a hash suffix, which the pods do not name"
        );
        let mut data = serde_json::Map::new();
        for entry in array(generator, "files") {
            let entry = entry.as_str().expect("a file entry");
            let (key, path) = entry.split_once('=').unwrap_or((
                Path::new(entry)
                    .file_name()
                    .and_then(|n| n.to_str())
                    .expect("a file name"),
                entry,
            ));
            let content = fs::read_to_string(dir.join(path))
                .unwrap_or_else(|e| panic!("{at}: ConfigMap {name} file {path}: {e}"));
            data.insert(key.to_owned(), Value::String(content));
        }
        let config_map = Doc {
            file: format!("{at} (configMapGenerator)"),
            value: serde_json::json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": generator["options"]["labels"].clone(),
                },
                "data": data,
            }),
        };
        let existing = docs.iter().position(|d| {
            d.kind() == "ConfigMap" && d.name() == name && d.namespace() == namespace
        });
        match (generator["behavior"].as_str().unwrap_or("create"), existing) {
            ("create", None) => docs.push(config_map),
            ("replace", Some(i)) => docs[i] = config_map,
            (behavior, existing) => {
                panic!("{at}: ConfigMap {name} with behavior {behavior}, existing: {existing:?}")
            }
        }
    }
    docs
}

fn load_files(dir: &Path) -> Vec<Doc> {
    yaml_files(dir)
        .iter()
        .flat_map(|path| {
            let text = fs::read_to_string(path).expect("read manifest");
            let name = path
                .strip_prefix(repo())
                .unwrap_or(path)
                .display()
                .to_string();
            parse_docs(&name, &text)
        })
        .collect()
}

fn assert_no_problems(what: &str, problems: Vec<String>) {
    assert!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
}

// === pod templates ===

/// The pod spec of a workload (or of a Pod).
fn pod_spec(doc: &Doc) -> Option<&Value> {
    match doc.kind() {
        "Deployment" | "StatefulSet" | "DaemonSet" | "Job" => {
            doc.value.pointer("/spec/template/spec")
        }
        "Pod" => doc.value.get("spec"),
        _ => None,
    }
}

fn pod_labels(doc: &Doc) -> BTreeMap<String, String> {
    let labels = match doc.kind() {
        "Pod" => doc.value.pointer("/metadata/labels"),
        _ => doc.value.pointer("/spec/template/metadata/labels"),
    };
    labels
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

fn workloads(docs: &[Doc]) -> impl Iterator<Item = (&Doc, &Value)> {
    docs.iter()
        .filter_map(|doc| pod_spec(doc).map(|spec| (doc, spec)))
}

/// Containers and init containers.
fn containers(spec: &Value) -> Vec<&Value> {
    ["containers", "initContainers"]
        .iter()
        .filter_map(|key| spec[*key].as_array())
        .flatten()
        .collect()
}

fn array<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value[key].as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn matches_selector(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn string_map(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// `a=b,c=d` (equality terms only, which is what the manifests use).
fn parse_label_selector(selector: &str) -> BTreeMap<String, String> {
    selector
        .split(',')
        .filter_map(|term| term.split_once('='))
        .map(|(k, v)| {
            (
                k.trim().to_owned(),
                v.trim().trim_start_matches('=').to_owned(),
            )
        })
        .collect()
}

// === checks ===

/// Every document has apiVersion, kind and metadata.name; namespaced objects name a
/// namespace; no object is defined twice.
fn check_metadata(docs: &[Doc]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for doc in docs {
        for (field, value) in [
            ("apiVersion", doc.value["apiVersion"].as_str()),
            ("kind", doc.value["kind"].as_str()),
            ("metadata.name", doc.value["metadata"]["name"].as_str()),
        ] {
            if value.is_none_or(str::is_empty) {
                problems.push(format!("{}: a document has no {field}", doc.file));
            }
        }
        let namespaced = !CLUSTER_SCOPED.contains(&doc.kind());
        if namespaced && doc.namespace().is_empty() {
            problems.push(format!("{} has no metadata.namespace", doc.label()));
        }
        if !namespaced && !doc.namespace().is_empty() {
            problems.push(format!(
                "{} is cluster-scoped but names a namespace",
                doc.label()
            ));
        }
        if !seen.insert((
            doc.kind().to_owned(),
            doc.namespace().to_owned(),
            doc.name().to_owned(),
        )) {
            problems.push(format!("{} is defined twice", doc.label()));
        }
    }
    problems
}

/// Volume mounts name volumes of their pod; ConfigMap and Secret volumes name
/// objects (and keys) that exist.
fn check_volumes(docs: &[Doc]) -> Vec<String> {
    let mut problems = Vec::new();
    let config_maps: BTreeMap<&str, &Value> = docs
        .iter()
        .filter(|d| d.kind() == "ConfigMap")
        .map(|d| (d.name(), &d.value["data"]))
        .collect();
    // Secrets shipped, and those cert-manager writes for a shipped Certificate.
    let secrets: BTreeSet<&str> = docs
        .iter()
        .filter_map(|d| match d.kind() {
            "Secret" => Some(d.name()),
            "Certificate" => d.value["spec"]["secretName"].as_str(),
            _ => None,
        })
        .collect();
    let check_items =
        |problems: &mut Vec<String>, at: &str, name: &str, items: &[Value]| match config_maps
            .get(name)
        {
            None if CLUSTER_CONFIG_MAPS.contains(&name) => {}
            None => problems.push(format!("{at}: ConfigMap {name} is not defined")),
            Some(data) => {
                for item in items {
                    let key = item["key"].as_str().unwrap_or("");
                    if data.get(key).is_none() {
                        problems.push(format!("{at}: ConfigMap {name} has no key {key}"));
                    }
                }
            }
        };
    for (doc, spec) in workloads(docs) {
        let volumes: BTreeSet<&str> = array(spec, "volumes")
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        for container in containers(spec) {
            for mount in array(container, "volumeMounts") {
                let name = mount["name"].as_str().unwrap_or("");
                if !volumes.contains(name) {
                    problems.push(format!(
                        "{}: container {} mounts volume `{name}`, which the pod does not define",
                        doc.label(),
                        container["name"].as_str().unwrap_or("?")
                    ));
                }
            }
        }
        for volume in array(spec, "volumes") {
            let at = format!(
                "{}: volume {}",
                doc.label(),
                volume["name"].as_str().unwrap_or("?")
            );
            let mut sources = vec![volume];
            sources.extend(array(&volume["projected"], "sources"));
            for source in sources {
                if let Some(name) = source["configMap"]["name"].as_str() {
                    check_items(
                        &mut problems,
                        &at,
                        name,
                        array(&source["configMap"], "items"),
                    );
                }
                if let Some(name) = source["secret"]["name"]
                    .as_str()
                    .or(source["secret"]["secretName"].as_str())
                    && !secrets.contains(name)
                    && !EXTERNAL_SECRETS.contains(&name)
                {
                    problems.push(format!(
                        "{at}: Secret {name} is neither defined nor documented"
                    ));
                }
            }
        }
        for container in containers(spec) {
            for env in array(container, "env") {
                if let Some(name) = env
                    .pointer("/valueFrom/secretKeyRef/name")
                    .and_then(Value::as_str)
                    && !secrets.contains(name)
                    && !EXTERNAL_SECRETS.contains(&name)
                {
                    problems.push(format!(
                        "{}: env uses Secret {name}, which is not defined",
                        doc.label()
                    ));
                }
            }
        }
    }
    problems
}

/// An embedded hapwright config and the workload that runs it.
struct Embedded<'a> {
    config_map: &'a Doc,
    config: Value,
    workload: &'a Doc,
    container: &'a Value,
    /// Where the config volume is mounted in the hapwright container.
    mount_path: String,
    /// The config file path given to `hapwright run -c`.
    config_path: String,
}

fn embedded_configs(docs: &[Doc]) -> Vec<Embedded<'_>> {
    let mut found = Vec::new();
    for config_map in docs.iter().filter(|d| d.kind() == "ConfigMap") {
        let Some(text) = config_map.value["data"]["hapwright.yaml"].as_str() else {
            continue;
        };
        let config: Value = serde_saphyr::from_str(text)
            .unwrap_or_else(|e| panic!("{}: hapwright.yaml is not YAML: {e}", config_map.label()));
        for (workload, spec) in workloads(docs) {
            let volume = array(spec, "volumes").iter().find(|v| {
                v["configMap"]["name"].as_str() == Some(config_map.name())
                    || array(&v["projected"], "sources")
                        .iter()
                        .any(|s| s["configMap"]["name"].as_str() == Some(config_map.name()))
            });
            let Some(volume) = volume else { continue };
            let volume_name = volume["name"].as_str().unwrap_or("");
            for container in array(spec, "containers") {
                let Some(mount) = array(container, "volumeMounts")
                    .iter()
                    .find(|m| m["name"].as_str() == Some(volume_name))
                else {
                    continue;
                };
                let args: Vec<&str> = array(container, "args")
                    .iter()
                    .chain(array(container, "command"))
                    .filter_map(Value::as_str)
                    .collect();
                let config_path = args
                    .iter()
                    .position(|a| *a == "-c" || *a == "--config")
                    .and_then(|i| args.get(i + 1))
                    .map(|s| (*s).to_owned())
                    .unwrap_or_default();
                found.push(Embedded {
                    config_map,
                    config: config.clone(),
                    workload,
                    container,
                    mount_path: mount["mountPath"].as_str().unwrap_or("").to_owned(),
                    config_path,
                });
            }
        }
    }
    found
}

/// The Kubernetes resource (group, plural) of an apiVersion and kind.
fn resource_of(api_version: &str, kind: &str) -> (String, String) {
    let group = api_version
        .rsplit_once('/')
        .map(|(g, _)| g.to_owned())
        .unwrap_or_default();
    let lower = kind.to_ascii_lowercase();
    let plural = if lower.ends_with('s') || lower.ends_with("ch") || lower.ends_with("sh") {
        format!("{lower}es")
    } else if let Some(stem) = lower
        .strip_suffix('y')
        .filter(|stem| !stem.ends_with(['a', 'e', 'i', 'o', 'u']))
    {
        format!("{stem}ies")
    } else {
        format!("{lower}s")
    };
    (group, plural)
}

/// The RBAC rules a ServiceAccount has: cluster-wide ones and per namespace.
struct Grants {
    cluster: Vec<Value>,
    namespaced: BTreeMap<String, Vec<Value>>,
}

fn grants(docs: &[Doc], namespace: &str, account: &str) -> Grants {
    let bound = |binding: &Doc| {
        array(&binding.value, "subjects").iter().any(|s| {
            s["kind"].as_str() == Some("ServiceAccount")
                && s["name"].as_str() == Some(account)
                && s["namespace"].as_str().unwrap_or(binding.namespace()) == namespace
        })
    };
    let rules_of = |kind: &str, name: &str, ns: &str| -> Vec<Value> {
        docs.iter()
            .filter(|d| {
                d.kind() == kind
                    && d.name() == name
                    && (kind == "ClusterRole" || d.namespace() == ns)
            })
            .flat_map(|d| array(&d.value, "rules").to_vec())
            .collect()
    };
    let mut grants = Grants {
        cluster: Vec::new(),
        namespaced: BTreeMap::new(),
    };
    for binding in docs.iter().filter(|d| bound(d)) {
        let role_kind = binding.value["roleRef"]["kind"].as_str().unwrap_or("");
        let role_name = binding.value["roleRef"]["name"].as_str().unwrap_or("");
        match binding.kind() {
            "ClusterRoleBinding" => grants.cluster.extend(rules_of(role_kind, role_name, "")),
            "RoleBinding" => grants
                .namespaced
                .entry(binding.namespace().to_owned())
                .or_default()
                .extend(rules_of(role_kind, role_name, binding.namespace())),
            _ => {}
        }
    }
    grants
}

fn rules_allow(rules: &[Value], group: &str, resource: &str, verbs: &[&str]) -> bool {
    let has = |rule: &Value, key: &str, wanted: &str| {
        array(rule, key)
            .iter()
            .any(|v| v.as_str() == Some(wanted) || v.as_str() == Some("*"))
    };
    verbs.iter().all(|verb| {
        rules.iter().any(|rule| {
            has(rule, "apiGroups", group)
                && has(rule, "resources", resource)
                && has(rule, "verbs", verb)
        })
    })
}

impl Grants {
    /// Whether the verbs are allowed on the resource in `namespace` (`None`: in
    /// every namespace).
    fn allow(&self, namespace: Option<&str>, group: &str, resource: &str, verbs: &[&str]) -> bool {
        rules_allow(&self.cluster, group, resource, verbs)
            || namespace.is_some_and(|ns| {
                self.namespaced
                    .get(ns)
                    .is_some_and(|rules| rules_allow(rules, group, resource, verbs))
            })
    }
}

/// RBAC lets the hapwright ServiceAccount do what its config needs.
fn check_rbac(docs: &[Doc]) -> Vec<String> {
    let mut problems = Vec::new();
    for embedded in embedded_configs(docs) {
        let namespace = embedded.workload.namespace();
        let account = pod_spec(embedded.workload)
            .and_then(|s| s["serviceAccountName"].as_str())
            .unwrap_or("default");
        let grants = grants(docs, namespace, account);
        let at = format!("{} (ServiceAccount {account})", embedded.workload.label());
        let watched = embedded.config["watchedResources"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for (name, resource) in watched {
            let Some(source) = resource.get("kubernetes") else {
                continue;
            };
            let (group, plural) = resource_of(
                source["apiVersion"].as_str().unwrap_or(""),
                source["kind"].as_str().unwrap_or(""),
            );
            let namespaces: Vec<Option<&str>> = match source["namespaces"].as_array() {
                Some(list) => list.iter().map(Value::as_str).collect(),
                None => vec![None],
            };
            for ns in namespaces {
                if !grants.allow(ns, &group, &plural, &["list", "watch"]) {
                    problems.push(format!(
                        "{at}: may not list/watch {plural}.{group} {} (watchedResources.{name})",
                        ns.map_or("in all namespaces".to_owned(), |ns| format!("in {ns}"))
                    ));
                }
            }
        }
        let quarantine_off = embedded
            .config
            .pointer("/controller/quarantine/maxValidations")
            .and_then(Value::as_u64)
            == Some(0);
        let kubernetes_sources = embedded.config["watchedResources"]
            .as_object()
            .is_some_and(|all| all.values().any(|r| r.get("kubernetes").is_some()));
        if kubernetes_sources
            && !quarantine_off
            && !grants.allow(None, "events.k8s.io", "events", &["create", "patch"])
        {
            problems.push(format!(
                "{at}: may not create/patch events.events.k8s.io in all namespaces \
                 (Events on quarantined objects)"
            ));
        }
        let status_templates = embedded.config["statusTemplates"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for name in status_templates.keys() {
            let Some(source) = embedded.config["watchedResources"][name].get("kubernetes") else {
                continue;
            };
            let (group, plural) = resource_of(
                source["apiVersion"].as_str().unwrap_or(""),
                source["kind"].as_str().unwrap_or(""),
            );
            let status = format!("{plural}/status");
            if !grants.allow(None, &group, &status, &["patch"]) {
                problems.push(format!(
                    "{at}: may not patch {status}.{group} in all namespaces \
                     (statusTemplates.{name})"
                ));
            }
        }
        if let Some(discovery) = embedded.config.pointer("/haproxy/discovery/kubernetes") {
            let ns = discovery["namespace"].as_str();
            if !grants.allow(ns, "", "pods", &["list", "watch"]) {
                problems.push(format!(
                    "{at}: may not list/watch pods in {ns:?} (haproxy.discovery)"
                ));
            }
        }
        let election = embedded.config.pointer("/controller/leaderElection");
        if election.is_some_and(|e| e["enabled"].as_bool() == Some(true)) {
            let ns = election
                .and_then(|e| e["namespace"].as_str())
                .unwrap_or(namespace);
            if !grants.allow(
                Some(ns),
                "coordination.k8s.io",
                "leases",
                &["get", "create", "update"],
            ) {
                problems.push(format!(
                    "{at}: may not get/create/update leases in {ns} (leaderElection)"
                ));
            }
        }
    }
    problems
}

fn container_port(container: &Value, port: &Value) -> bool {
    array(container, "ports").iter().any(|p| match port {
        Value::String(name) => p["name"].as_str() == Some(name),
        Value::Number(n) => p["containerPort"].as_u64() == n.as_u64(),
        _ => false,
    })
}

fn named_port(spec: &Value, container: &str, name: &str) -> Option<u64> {
    array(spec, "containers")
        .iter()
        .filter(|c| c["name"].as_str() == Some(container))
        .flat_map(|c| array(c, "ports"))
        .find(|p| p["name"].as_str() == Some(name))
        .and_then(|p| p["containerPort"].as_u64())
}

fn listen_port(address: &str) -> Option<u64> {
    address.rsplit_once(':').and_then(|(_, p)| p.parse().ok())
}

/// Services select pods and name their ports; probes name container ports; the
/// hapwright config's ports are the containers' ports.
fn check_ports(docs: &[Doc]) -> Vec<String> {
    let mut problems = Vec::new();
    for (doc, spec) in workloads(docs) {
        for container in containers(spec) {
            for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                let probe_port = container[probe]
                    .pointer("/httpGet/port")
                    .or(container[probe].pointer("/tcpSocket/port"));
                if let Some(port) = probe_port
                    && !container_port(container, port)
                {
                    problems.push(format!(
                        "{}: container {} {probe} uses port {port}, which it does not expose",
                        doc.label(),
                        container["name"].as_str().unwrap_or("?")
                    ));
                }
            }
        }
        if doc.kind() != "Pod" {
            let selector = string_map(&doc.value["spec"]["selector"]["matchLabels"]);
            if !matches_selector(&selector, &pod_labels(doc)) {
                problems.push(format!(
                    "{}: spec.selector does not match the pod template's labels",
                    doc.label()
                ));
            }
        }
    }
    for service in docs.iter().filter(|d| d.kind() == "Service") {
        let selector = string_map(&service.value["spec"]["selector"]);
        let pods: Vec<&Value> = workloads(docs)
            .filter(|(doc, _)| matches_selector(&selector, &pod_labels(doc)))
            .map(|(_, spec)| spec)
            .collect();
        if pods.is_empty() {
            problems.push(format!(
                "{}: the selector matches no pod template",
                service.label()
            ));
            continue;
        }
        for port in array(&service.value["spec"], "ports") {
            let target = port.get("targetPort").unwrap_or(&port["port"]);
            for spec in &pods {
                if !array(spec, "containers")
                    .iter()
                    .any(|c| container_port(c, target))
                {
                    problems.push(format!(
                        "{}: targetPort {target} is not a port of the selected pods",
                        service.label()
                    ));
                }
            }
        }
    }
    for embedded in embedded_configs(docs) {
        let Some(spec) = pod_spec(embedded.workload) else {
            continue;
        };
        let hapwright = embedded.container["name"].as_str().unwrap_or("");
        let at = embedded.config_map.label();
        if let Some(listen) = embedded
            .config
            .pointer("/controller/metricsListen")
            .and_then(Value::as_str)
            && named_port(spec, hapwright, "metrics") != listen_port(listen)
        {
            problems.push(format!(
                "{at}: controller.metricsListen {listen} is not the `metrics` port of container {hapwright}"
            ));
        }
        // The pods that run the rendered config: this pod (sidecar) or the
        // discovered ones (controller).
        let discovery = embedded.config.pointer("/haproxy/discovery/kubernetes");
        let haproxy_pods: Vec<&Value> = match discovery {
            Some(discovery) => {
                let selector =
                    parse_label_selector(discovery["labelSelector"].as_str().unwrap_or(""));
                let namespace = discovery["namespace"].as_str().unwrap_or("");
                workloads(docs)
                    .filter(|(doc, _)| {
                        doc.namespace() == namespace
                            && matches_selector(&selector, &pod_labels(doc))
                    })
                    .map(|(_, spec)| spec)
                    .collect()
            }
            None => vec![spec],
        };
        if haproxy_pods.is_empty() {
            problems.push(format!(
                "{at}: no HAProxy pod runs this config (discovery matches nothing)"
            ));
        }
        for pod in &haproxy_pods {
            for (key, name) in [
                ("httpPort", "http"),
                ("httpsPort", "https"),
                ("statsPort", "haproxy-metrics"),
            ] {
                let wanted = embedded.config["extraContext"][key].as_u64();
                if named_port(pod, "haproxy", name) != wanted {
                    problems.push(format!(
                        "{at}: extraContext.{key} {wanted:?} is not the `{name}` port of the haproxy container"
                    ));
                }
            }
            if let Some(port) = discovery.and_then(|d| d["port"].as_u64())
                && !array(pod, "containers")
                    .iter()
                    .any(|c| container_port(c, &Value::from(port)))
            {
                problems.push(format!("{at}: haproxy.discovery.kubernetes.port {port} is not a port of the HAProxy pods"));
            }
            // Discovery deploys to a pod once this container is ready; without it, it
            // waits for the whole pod, which turns ready only after hapwright's first
            // deployment.
            if let Some(discovery) = discovery {
                let name = discovery["dataplaneContainer"]
                    .as_str()
                    .unwrap_or("dataplaneapi");
                match container(pod, name) {
                    None => problems.push(format!(
                        "{at}: the HAProxy pods have no container `{name}` \
                         (haproxy.discovery.kubernetes.dataplaneContainer)"
                    )),
                    Some(api) => {
                        if let Some(port) = discovery["port"].as_u64()
                            && !container_port(api, &Value::from(port))
                        {
                            problems.push(format!(
                                "{at}: container `{name}` does not expose \
                                 haproxy.discovery.kubernetes.port {port}"
                            ));
                        }
                        if api["readinessProbe"].is_null() {
                            problems.push(format!(
                                "{at}: container `{name}` has no readinessProbe: pods are \
                                 deployed to before their Data Plane API answers"
                            ));
                        }
                    }
                }
            }
        }
    }
    problems
}

/// The ServiceMonitor scrapes ports that the Services it selects have.
fn check_service_monitors(monitors: &[Doc], all: &[Doc]) -> Vec<String> {
    let mut problems = Vec::new();
    for monitor in monitors.iter().filter(|d| d.kind() == "ServiceMonitor") {
        let selector = string_map(&monitor.value["spec"]["selector"]["matchLabels"]);
        let namespaces: Vec<&str> =
            array(&monitor.value["spec"]["namespaceSelector"], "matchNames")
                .iter()
                .filter_map(Value::as_str)
                .collect();
        let services: Vec<&Doc> = all
            .iter()
            .filter(|d| d.kind() == "Service")
            .filter(|d| namespaces.is_empty() || namespaces.contains(&d.namespace()))
            .filter(|d| matches_selector(&selector, &string_map(&d.value["metadata"]["labels"])))
            .collect();
        if services.is_empty() {
            problems.push(format!("{}: selects no Service", monitor.label()));
        }
        for endpoint in array(&monitor.value["spec"], "endpoints") {
            let port = endpoint["port"].as_str().unwrap_or("");
            let found = services.iter().any(|s| {
                array(&s.value["spec"], "ports")
                    .iter()
                    .any(|p| p["name"].as_str() == Some(port))
            });
            if !found {
                problems.push(format!(
                    "{}: no selected Service has a port named {port}",
                    monitor.label()
                ));
            }
        }
    }
    problems
}

/// A socket instance's HAProxy runs in the same pod, in master-worker mode with the
/// configured master socket, the config directory as working directory, and both
/// directories on volumes shared with hapwright.
fn check_haproxy_start(docs: &[Doc]) -> Vec<String> {
    let mut problems = Vec::new();
    for embedded in embedded_configs(docs) {
        let Some(spec) = pod_spec(embedded.workload) else {
            continue;
        };
        for instance in array(&embedded.config["haproxy"], "instances") {
            let Some(socket) = instance.get("socket") else {
                continue;
            };
            let at = format!(
                "{}: instance {}",
                embedded.workload.label(),
                instance["name"]
            );
            let master = socket["master"].as_str().unwrap_or("");
            let config_dir = socket["configDir"].as_str().unwrap_or("");
            let Some(haproxy) = array(spec, "containers")
                .iter()
                .find(|c| c["name"].as_str() == Some("haproxy"))
            else {
                problems.push(format!("{at}: the pod has no haproxy container"));
                continue;
            };
            let command: Vec<&str> = array(haproxy, "command")
                .iter()
                .chain(array(haproxy, "args"))
                .filter_map(Value::as_str)
                .collect();
            let after = |flag: &str| {
                command
                    .iter()
                    .position(|a| *a == flag)
                    .and_then(|i| command.get(i + 1))
                    .copied()
                    .unwrap_or("")
            };
            if !command.contains(&"-W") {
                problems.push(format!(
                    "{at}: HAProxy is not started in master-worker mode (-W)"
                ));
            }
            if after("-S").split(',').next() != Some(master) {
                problems.push(format!(
                    "{at}: HAProxy's -S is `{}`, not the master socket {master}",
                    after("-S")
                ));
            }
            if after("-f") != format!("{}/haproxy.cfg", config_dir.trim_end_matches('/')) {
                problems.push(format!(
                    "{at}: HAProxy's -f is `{}`, not {config_dir}/haproxy.cfg",
                    after("-f")
                ));
            }
            if haproxy["workingDir"].as_str() != Some(config_dir) {
                problems.push(format!(
                    "{at}: HAProxy's workingDir is not the config directory {config_dir}"
                ));
            }
            let socket_dir = Path::new(master)
                .parent()
                .and_then(Path::to_str)
                .unwrap_or("");
            for dir in [config_dir, socket_dir] {
                let volume_at = |container: &Value| {
                    array(container, "volumeMounts")
                        .iter()
                        .find(|m| m["mountPath"].as_str() == Some(dir))
                        .and_then(|m| m["name"].as_str())
                        .map(str::to_owned)
                };
                match (volume_at(haproxy), volume_at(embedded.container)) {
                    (Some(a), Some(b)) if a == b => {
                        let shared = array(spec, "volumes")
                            .iter()
                            .any(|v| v["name"].as_str() == Some(&a) && v.get("emptyDir").is_some());
                        if !shared {
                            problems.push(format!("{at}: {dir} is not an emptyDir"));
                        }
                    }
                    _ => problems.push(format!(
                        "{at}: {dir} is not one volume mounted in both containers"
                    )),
                }
            }
        }
    }
    problems
}

/// `hapwright check` accepts the embedded config, written out with the files its
/// pod mounts next to it.
fn assert_hapwright_check_passes(docs: &[Doc], embedded: &Embedded<'_>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = materialize(docs, embedded, dir.path());
    let output = Command::new(hapwright_binary())
        .args(["check", "-c"])
        .arg(&config)
        .output()
        .expect("run hapwright check");
    assert!(
        output.status.success(),
        "{}: hapwright check failed:\n{}{}",
        embedded.config_map.label(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Writes the hapwright config volume as the pod would see it (ConfigMap items and
/// projected Secrets; a placeholder for Secrets the user creates) and returns the
/// config file's path in it.
fn materialize(docs: &[Doc], embedded: &Embedded<'_>, dir: &Path) -> PathBuf {
    let spec = pod_spec(embedded.workload).expect("pod spec");
    let mount = array(embedded.container, "volumeMounts")
        .iter()
        .find(|m| m["mountPath"].as_str() == Some(embedded.mount_path.as_str()))
        .expect("config mount");
    let volume = array(spec, "volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("config volume");
    let mut sources = vec![volume];
    sources.extend(array(&volume["projected"], "sources"));
    for source in sources {
        if let Some(name) = source["configMap"]["name"].as_str() {
            let data = &docs
                .iter()
                .find(|d| d.kind() == "ConfigMap" && d.name() == name)
                .expect("ConfigMap")
                .value["data"];
            let items: Vec<(String, String)> = match source["configMap"]["items"].as_array() {
                Some(items) => items
                    .iter()
                    .map(|i| {
                        (
                            i["key"].as_str().unwrap().to_owned(),
                            i["path"].as_str().unwrap().to_owned(),
                        )
                    })
                    .collect(),
                None => data
                    .as_object()
                    .unwrap()
                    .keys()
                    .map(|k| (k.clone(), k.clone()))
                    .collect(),
            };
            for (key, path) in items {
                fs::write(dir.join(path), data[&key].as_str().unwrap()).expect("write item");
            }
        }
        if source["secret"].is_object() {
            for item in array(&source["secret"], "items") {
                let path = item["path"].as_str().unwrap();
                let content = if path.ends_with(".crt") {
                    // A CA certificate, as cert-manager's ca.crt holds.
                    let scratch = tempfile::tempdir().expect("temp dir");
                    certs::ca(scratch.path(), "deploy-ca")
                } else {
                    b"placeholder-password\n".to_vec()
                };
                fs::write(dir.join(path), content).expect("write secret item");
            }
        }
    }
    let relative = embedded
        .config_path
        .strip_prefix(&embedded.mount_path)
        .expect("hapwright is run with a config file inside the config volume")
        .trim_start_matches('/');
    dir.join(relative)
}

// === tests ===

#[test]
fn every_document_is_a_named_object() {
    let all = load(&repo().join("deploy"));
    assert!(all.len() >= 20, "deploy/ holds {} documents", all.len());
    for mode in modes() {
        assert_no_problems(&mode.display().to_string(), check_metadata(&load(&mode)));
    }
    assert_no_problems(
        "deploy/monitoring",
        check_metadata(&load(&repo().join("deploy/monitoring"))),
    );
    assert_no_problems(
        "deploy/gateway-api",
        check_metadata(&load(&repo().join("deploy/gateway-api"))),
    );
}

#[test]
fn volume_mounts_name_defined_volumes() {
    for mode in modes() {
        let docs = load(&mode);
        assert!(
            workloads(&docs).count() >= 1,
            "{}: no workload",
            mode.display()
        );
        assert_no_problems(&mode.display().to_string(), check_volumes(&docs));
    }
}

#[test]
fn rbac_covers_what_the_embedded_configs_watch() {
    for mode in modes() {
        let docs = load(&mode);
        assert_eq!(
            embedded_configs(&docs).len(),
            1,
            "{}: one hapwright container",
            mode.display()
        );
        assert_no_problems(&mode.display().to_string(), check_rbac(&docs));
    }
    // Controller mode needs pods (discovery) and leases (leader election) too.
    let docs = load(&repo().join("deploy/controller"));
    let embedded = &embedded_configs(&docs)[0];
    assert!(
        embedded
            .config
            .pointer("/haproxy/discovery/kubernetes")
            .is_some()
    );
    assert_eq!(
        embedded
            .config
            .pointer("/controller/leaderElection/enabled"),
        Some(&Value::Bool(true))
    );
}

/// With the Gateway API library in a mode's ConfigMap, the mode's RBAC plus
/// `deploy/gateway-api/` covers what the library watches and the statuses it writes;
/// the mode's RBAC alone does not.
#[test]
fn the_gateway_api_add_on_grants_what_the_gateway_library_needs() {
    let library = fs::read_to_string(repo().join("examples/gateway-api/hapwright.yaml"))
        .expect("the Gateway API library");
    // The add-on's own objects (its kustomization also brings the sidecar mode).
    let add_on: Vec<Doc> = load(&repo().join("deploy/gateway-api"))
        .into_iter()
        .filter(|d| d.file.starts_with("deploy/gateway-api/"))
        .collect();
    assert!(!add_on.is_empty(), "deploy/gateway-api/ has manifests");
    for mode in modes() {
        let mut docs = load(&mode);
        for doc in docs.iter_mut().filter(|d| d.kind() == "ConfigMap") {
            if doc.value["data"]["hapwright.yaml"].is_string() {
                doc.value["data"]["hapwright.yaml"] = Value::String(library.clone());
            }
        }
        let without = check_rbac(&docs);
        assert!(
            without.iter().any(|p| p.contains("httproutes"))
                && without.iter().any(|p| p.contains("gateways/status")),
            "{}: the mode's own RBAC should not cover the Gateway library: {without:#?}",
            mode.display()
        );
        docs.extend(add_on.iter().cloned());
        assert_no_problems(
            &format!("{} + deploy/gateway-api", mode.display()),
            check_rbac(&docs),
        );
    }
}

#[test]
fn ports_agree_between_containers_services_probes_and_config() {
    for mode in modes() {
        assert_no_problems(&mode.display().to_string(), check_ports(&load(&mode)));
    }
}

#[test]
fn the_service_monitor_scrapes_ports_of_both_modes() {
    let monitors: Vec<Doc> = load(&repo().join("deploy/monitoring"))
        .into_iter()
        .filter(|d| d.kind() == "ServiceMonitor")
        .collect();
    assert_eq!(monitors.len(), 1);
    for mode in modes() {
        assert_no_problems(
            &mode.display().to_string(),
            check_service_monitors(&monitors, &load(&mode)),
        );
    }
}

#[test]
fn sidecar_haproxy_is_started_the_way_hapwright_expects() {
    let docs = load(&repo().join("deploy/sidecar"));
    let embedded = embedded_configs(&docs);
    assert_eq!(array(&embedded[0].config["haproxy"], "instances").len(), 1);
    assert_no_problems("deploy/sidecar", check_haproxy_start(&docs));
}

#[test]
fn embedded_hapwright_configs_pass_check() {
    for mode in modes() {
        let docs = load(&mode);
        for embedded in embedded_configs(&docs) {
            assert_hapwright_check_passes(&docs, &embedded);
        }
    }
}

#[test]
fn embedded_configs_use_the_ingress_library_templates() {
    let text = fs::read_to_string(repo().join("examples/kubernetes-ingress/hapwright.yaml"))
        .expect("read the library");
    let library: Value = serde_saphyr::from_str(&text).expect("library YAML");
    for mode in modes() {
        let docs = load(&mode);
        for embedded in embedded_configs(&docs) {
            assert_no_problems(
                &embedded.config_map.label(),
                check_library(&embedded.config, &library),
            );
            assert!(
                embedded.config.get("validationTests").is_none(),
                "{}: deployed configs leave the validationTests out",
                embedded.config_map.label()
            );
        }
    }
}

#[test]
fn bootstrap_haproxy_configs_are_valid() {
    for mode in modes() {
        for doc in load(&mode).iter().filter(|d| d.kind() == "ConfigMap") {
            let Some(config) = doc.value["data"]["haproxy.cfg"].as_str() else {
                continue;
            };
            let dir = tempfile::tempdir().expect("temp dir");
            fs::write(dir.path().join("haproxy.cfg"), config).expect("write haproxy.cfg");
            let output = Command::new("haproxy")
                .args(["-c", "-f", "haproxy.cfg"])
                .current_dir(dir.path())
                .output()
                .expect("run haproxy -c");
            assert!(
                output.status.success(),
                "{}: haproxy -c rejects the bootstrap config:\n{}",
                doc.label(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

#[test]
fn the_readme_documents_the_secret_the_user_creates() {
    let readme = fs::read_to_string(repo().join("deploy/README.md")).expect("deploy/README.md");
    for secret in EXTERNAL_SECRETS {
        assert!(
            readme.contains(secret),
            "deploy/README.md does not mention {secret}"
        );
    }
}

#[test]
fn hapwright_containers_run_the_image_scripts_image_sh_builds() {
    let script = fs::read_to_string(repo().join("scripts/image.sh")).expect("scripts/image.sh");
    let default = "tag=\"ghcr.io/hapwright/hapwright:${version}\"";
    assert!(
        script.contains(default),
        "scripts/image.sh no longer tags `{default}`: update this test and deploy/"
    );
    let image = format!("ghcr.io/hapwright/hapwright:{}", env!("CARGO_PKG_VERSION"));
    let mut seen = 0;
    for mode in modes() {
        for (doc, spec) in workloads(&load(&mode)) {
            for container in containers(spec) {
                if container["name"] == "hapwright" {
                    seen += 1;
                    assert_eq!(container["image"], image.as_str(), "{}", doc.label());
                }
            }
        }
    }
    assert_eq!(seen, 2, "one hapwright container per mode");
}

// === the checks report problems ===

const BROKEN: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: { name: hapwright-config, namespace: ns }
data:
  hapwright.yaml: |
    watchedResources:
      ingresses:
        kubernetes: { apiVersion: networking.k8s.io/v1, kind: Ingress }
      services:
        kubernetes: { apiVersion: v1, kind: Service, namespaces: [shop] }
    haproxyConfig: { template: "" }
    haproxy:
      discovery:
        kubernetes: { namespace: ns, labelSelector: app=haproxy, port: 5555 }
    controller:
      leaderElection: { enabled: true, leaseName: l }
      metricsListen: 0.0.0.0:9401
    extraContext: { httpPort: 8080, httpsPort: 8443, statsPort: 8404 }
---
apiVersion: apps/v1
kind: Deployment
metadata: { name: hapwright, namespace: ns }
spec:
  selector: { matchLabels: { app: hapwright } }
  template:
    metadata: { labels: { app: other } }
    spec:
      serviceAccountName: sa
      containers:
        - name: hapwright
          args: [run, -c, /etc/hapwright/hapwright.yaml]
          ports: [ { name: metrics, containerPort: 9400 } ]
          readinessProbe: { httpGet: { path: /readyz, port: health } }
          volumeMounts:
            - { name: config, mountPath: /etc/hapwright }
            - { name: scratch, mountPath: /tmp }
      volumes:
        - name: config
          configMap: { name: hapwright-config, items: [ { key: missing.yaml, path: x } ] }
        - name: secret
          secret: { secretName: unknown }
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: { name: sa }
rules:
  - { apiGroups: [networking.k8s.io], resources: [ingresses], verbs: [get, list] }
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: { name: sa, namespace: ns }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: sa }
subjects: [ { kind: ServiceAccount, name: sa, namespace: ns } ]
---
apiVersion: v1
kind: Service
metadata: { name: nothing }
spec:
  selector: { app: nothing }
  ports: [ { port: 80 } ]
"#;

fn broken() -> Vec<Doc> {
    parse_docs("broken.yaml", BROKEN)
}

fn assert_reported(problems: &[String], needle: &str) {
    assert!(
        problems.iter().any(|p| p.contains(needle)),
        "expected a problem containing `{needle}`, got:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn metadata_problems_are_reported() {
    let mut docs = broken();
    docs.push(Doc {
        file: "broken.yaml".to_owned(),
        value: serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {}}),
    });
    let problems = check_metadata(&docs);
    assert_reported(&problems, "a document has no metadata.name");
    assert_reported(&problems, "Service nothing has no metadata.namespace");
    assert_reported(
        &problems,
        "ClusterRoleBinding sa is cluster-scoped but names a namespace",
    );
}

#[test]
fn volume_problems_are_reported() {
    let problems = check_volumes(&broken());
    assert_reported(
        &problems,
        "mounts volume `scratch`, which the pod does not define",
    );
    assert_reported(
        &problems,
        "ConfigMap hapwright-config has no key missing.yaml",
    );
    assert_reported(
        &problems,
        "Secret unknown is neither defined nor documented",
    );
}

#[test]
fn rbac_problems_are_reported() {
    let problems = check_rbac(&broken());
    assert_reported(
        &problems,
        "may not list/watch ingresses.networking.k8s.io in all namespaces",
    );
    assert_reported(&problems, "may not list/watch services. in shop");
    assert_reported(&problems, "may not list/watch pods");
    assert_reported(&problems, "may not get/create/update leases in ns");
}

#[test]
fn port_problems_are_reported() {
    let problems = check_ports(&broken());
    assert_reported(&problems, "readinessProbe uses port \"health\"");
    assert_reported(
        &problems,
        "spec.selector does not match the pod template's labels",
    );
    assert_reported(
        &problems,
        "Service nothing: the selector matches no pod template",
    );
    assert_reported(
        &problems,
        "controller.metricsListen 0.0.0.0:9401 is not the `metrics` port",
    );
    assert_reported(&problems, "no HAProxy pod runs this config");
}

#[test]
fn a_data_plane_api_container_discovery_does_not_know_is_reported() {
    let mut docs = load(&repo().join("deploy/controller"));
    assert_no_problems("deploy/controller", check_ports(&docs));
    let haproxy = docs
        .iter_mut()
        .find(|d| d.kind() == "Deployment" && d.name() == "haproxy")
        .expect("Deployment haproxy");
    let containers = haproxy
        .value
        .pointer_mut("/spec/template/spec/containers")
        .and_then(Value::as_array_mut)
        .expect("containers");
    let api = containers
        .iter_mut()
        .find(|c| c["name"] == "dataplaneapi")
        .expect("dataplaneapi container");
    api["name"] = Value::from("api");
    let problems = check_ports(&docs);
    assert_reported(
        &problems,
        "the HAProxy pods have no container `dataplaneapi` (haproxy.discovery.kubernetes.dataplaneContainer)",
    );
}

#[test]
fn haproxy_start_problems_are_reported() {
    let mut docs = load(&repo().join("deploy/sidecar"));
    let deployment = docs
        .iter_mut()
        .find(|d| d.kind() == "Deployment")
        .expect("sidecar Deployment");
    let haproxy = deployment
        .value
        .pointer_mut("/spec/template/spec/containers/0")
        .expect("first container");
    assert_eq!(haproxy["name"], "haproxy");
    haproxy["workingDir"] = Value::from("/");
    haproxy["command"] = serde_json::json!(["haproxy", "-f", "/tmp/haproxy.cfg"]);
    let problems = check_haproxy_start(&docs);
    assert_reported(&problems, "not started in master-worker mode");
    assert_reported(&problems, "not the master socket /run/haproxy/master.sock");
    assert_reported(&problems, "not /etc/haproxy/haproxy.cfg");
    assert_reported(&problems, "workingDir is not the config directory");
}

#[test]
fn service_monitor_problems_are_reported() {
    let monitor = parse_docs(
        "monitor.yaml",
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: { name: m, namespace: hapwright }\n\
         spec: { selector: { matchLabels: { hapwright.io/metrics: \"true\" } }, endpoints: [ { port: nope } ] }\n",
    );
    let problems = check_service_monitors(&monitor, &load(&repo().join("deploy/sidecar")));
    assert_reported(&problems, "no selected Service has a port named nope");
    let problems = check_service_monitors(&monitor, &broken());
    assert_reported(&problems, "selects no Service");
}

#[test]
fn resource_names_are_the_api_plurals() {
    assert_eq!(
        resource_of("networking.k8s.io/v1", "Ingress"),
        ("networking.k8s.io".into(), "ingresses".into())
    );
    assert_eq!(
        resource_of("discovery.k8s.io/v1", "EndpointSlice"),
        ("discovery.k8s.io".into(), "endpointslices".into())
    );
    assert_eq!(
        resource_of("v1", "Secret"),
        (String::new(), "secrets".into())
    );
    assert_eq!(
        resource_of("networking.k8s.io/v1", "NetworkPolicy"),
        ("networking.k8s.io".into(), "networkpolicies".into())
    );
    assert_eq!(
        resource_of("gateway.networking.k8s.io/v1", "Gateway"),
        ("gateway.networking.k8s.io".into(), "gateways".into())
    );
    assert_eq!(
        resource_of("gateway.networking.k8s.io/v1", "GatewayClass"),
        ("gateway.networking.k8s.io".into(), "gatewayclasses".into())
    );
}

/// Deserializes `value` as `T` (the Kubernetes API type) and serializes it back:
/// what does not survive is a field the API does not know (a typo, a wrong level)
/// or a value of the wrong type.
fn round_trip<T: k8s_openapi::serde::de::DeserializeOwned + k8s_openapi::serde::Serialize>(
    value: &Value,
) -> Result<Value, String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

/// Checks a document against the API schema of its kind (k8s-openapi); kinds the
/// crate does not have (ServiceMonitor) are left out.
fn check_schema(docs: &[Doc]) -> Vec<String> {
    use k8s_openapi::api::{
        admissionregistration::v1 as admission, apps::v1 as apps, core::v1 as core,
        networking::v1 as networking, policy::v1 as policy, rbac::v1 as rbac,
    };
    let mut problems = Vec::new();
    for doc in docs {
        let result = match doc.kind() {
            "Namespace" => round_trip::<core::Namespace>(&doc.value),
            "ServiceAccount" => round_trip::<core::ServiceAccount>(&doc.value),
            "ConfigMap" => round_trip::<core::ConfigMap>(&doc.value),
            "Secret" => round_trip::<core::Secret>(&doc.value),
            "Service" => round_trip::<core::Service>(&doc.value),
            "Deployment" => round_trip::<apps::Deployment>(&doc.value),
            "IngressClass" => round_trip::<networking::IngressClass>(&doc.value),
            "NetworkPolicy" => round_trip::<networking::NetworkPolicy>(&doc.value),
            "PodDisruptionBudget" => round_trip::<policy::PodDisruptionBudget>(&doc.value),
            "ClusterRole" => round_trip::<rbac::ClusterRole>(&doc.value),
            "ClusterRoleBinding" => round_trip::<rbac::ClusterRoleBinding>(&doc.value),
            "Role" => round_trip::<rbac::Role>(&doc.value),
            "RoleBinding" => round_trip::<rbac::RoleBinding>(&doc.value),
            "ValidatingWebhookConfiguration" => {
                round_trip::<admission::ValidatingWebhookConfiguration>(&doc.value)
            }
            _ => continue,
        };
        match result {
            Err(error) => problems.push(format!("{}: {error}", doc.label())),
            Ok(back) if back != doc.value => problems.push(format!(
                "{}: fields the API does not know or values of the wrong shape:\n    {}",
                doc.label(),
                first_difference(&doc.value, &back, "")
            )),
            Ok(_) => {}
        }
    }
    problems
}

/// The path of the first place where `a` and `b` differ.
fn first_difference(a: &Value, b: &Value, at: &str) -> String {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (key, value) in x {
                match y.get(key) {
                    None => return format!("{at}.{key} is not a field of the API type"),
                    Some(other) if other != value => {
                        return first_difference(value, other, &format!("{at}.{key}"));
                    }
                    Some(_) => {}
                }
            }
            format!("{at}: {a} became {b}")
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (index, (p, q)) in x.iter().zip(y).enumerate() {
                if p != q {
                    return first_difference(p, q, &format!("{at}[{index}]"));
                }
            }
            format!("{at}: {a} became {b}")
        }
        _ => format!("{at}: {a} became {b}"),
    }
}

#[test]
fn documents_match_the_kubernetes_api_schema() {
    let docs = load(&repo().join("deploy"));
    let typed = docs
        .iter()
        .filter(|d| !CUSTOM_KINDS.contains(&d.kind()))
        .count();
    assert!(typed >= 20, "{typed} typed documents");
    assert_no_problems("deploy/", check_schema(&docs));
}

#[test]
fn schema_problems_are_reported() {
    let docs = parse_docs(
        "typo.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: { name: d, namespace: ns }\n\
         spec:\n  selector: { matchLabels: { a: b } }\n  template:\n    metadata: { labels: { a: b } }\n\
         \x20   spec:\n      containers:\n        - name: c\n          image: x\n          readinessprobe: { tcpSocket: { port: 1 } }\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: { name: s, namespace: ns }\nspec: { ports: [ { port: http } ] }\n",
    );
    let problems = check_schema(&docs);
    assert_reported(
        &problems,
        ".spec.template.spec.containers[0].readinessprobe is not a field of the API type",
    );
    assert_reported(&problems, "Service s: invalid type");
}

// === the admission webhook add-on ===

/// What `deploy/webhook/` must agree on with itself and with the controller mode it
/// is applied on top of: the webhook configuration calls the add-on's Service on
/// `/validate`, the Service reaches the controller pods on the webhook's default
/// port, dry runs are allowed (no side effects), the API server waits longer than
/// hapwright's default budget, and every rule names a resource the controller
/// watches (so `controller.webhook.resources` can name it).
fn check_webhook(webhook: &[Doc], controller: &[Doc]) -> Vec<String> {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    let mut problems = Vec::new();
    let configs: Vec<ValidatingWebhookConfiguration> = webhook
        .iter()
        .filter(|d| d.kind() == "ValidatingWebhookConfiguration")
        .map(|d| serde_json::from_value(d.value.clone()).expect("checked by the schema test"))
        .collect();
    if configs.is_empty() {
        problems.push("deploy/webhook has no ValidatingWebhookConfiguration".to_owned());
    }
    let watched: Vec<(String, String)> = embedded_configs(controller)
        .iter()
        .flat_map(|e| {
            e.config["watchedResources"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(_, r)| {
                    let k = &r["kubernetes"];
                    Some(resource_of(k["apiVersion"].as_str()?, k["kind"].as_str()?))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    for config in &configs {
        for hook in config.webhooks.iter().flatten() {
            let at = format!("webhook {}", hook.name);
            if !hook.admission_review_versions.iter().any(|v| v == "v1") {
                problems.push(format!("{at}: admissionReviewVersions lacks v1"));
            }
            if !matches!(hook.side_effects.as_str(), "None" | "NoneOnDryRun") {
                problems.push(format!(
                    "{at}: sideEffects must be None (dry runs are answered)"
                ));
            }
            if hook.timeout_seconds.unwrap_or(10) <= 8 {
                problems.push(format!(
                    "{at}: timeoutSeconds must exceed controller.webhook.timeout's default (8s)"
                ));
            }
            let Some(service) = &hook.client_config.service else {
                problems.push(format!("{at}: clientConfig names no Service"));
                continue;
            };
            if service.path.as_deref() != Some("/validate") {
                problems.push(format!("{at}: clientConfig.service.path is not /validate"));
            }
            let target = webhook.iter().find(|d| {
                d.kind() == "Service"
                    && d.name() == service.name
                    && d.namespace() == service.namespace
            });
            let Some(target) = target else {
                problems.push(format!(
                    "{at}: Service {}/{} is not in deploy/webhook",
                    service.namespace, service.name
                ));
                continue;
            };
            let port = service.port.unwrap_or(443);
            let service_port = array(&target.value["spec"], "ports")
                .iter()
                .find(|p| p["port"].as_i64() == Some(i64::from(port)));
            if service_port.and_then(|p| p["targetPort"].as_u64()) != Some(9443) {
                problems.push(format!(
                    "{at}: Service port {port} does not lead to 9443 (controller.webhook.listen)"
                ));
            }
            let selector = string_map(&target.value["spec"]["selector"]);
            if !workloads(controller).any(|(doc, _)| {
                let labels = pod_labels(doc);
                !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
            }) {
                problems.push(format!("{at}: the Service selects no controller pod"));
            }
            for rule in hook.rules.iter().flatten() {
                for operation in rule.operations.iter().flatten() {
                    if !matches!(operation.as_str(), "CREATE" | "UPDATE") {
                        problems.push(format!(
                            "{at}: checks {operation}; only CREATE and UPDATE can break the \
                             config (a checked DELETE blocks namespace deletion while no \
                             replica answers)"
                        ));
                    }
                }
                for group in rule.api_groups.iter().flatten() {
                    for resource in rule.resources.iter().flatten() {
                        if !watched.contains(&(group.clone(), resource.clone())) {
                            problems.push(format!(
                                "{at}: rule for {group}/{resource}, which the controller \
                                 does not watch"
                            ));
                        }
                    }
                }
            }
        }
    }
    problems
}

#[test]
fn the_webhook_add_on_agrees_with_the_controller_mode() {
    let webhook = load(&repo().join("deploy/webhook"));
    assert_no_problems("deploy/webhook", check_metadata(&webhook));
    assert_no_problems(
        "deploy/webhook",
        check_webhook(&webhook, &load(&repo().join("deploy/controller"))),
    );
}

#[test]
fn webhook_problems_are_reported() {
    let webhook = parse_docs(
        "broken-webhook.yaml",
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\n\
         metadata: { name: w }\nwebhooks:\n  - name: v.example.io\n    admissionReviewVersions: [v1beta1]\n\
         \x20   sideEffects: Some\n    timeoutSeconds: 5\n\
         \x20   clientConfig: { service: { namespace: hapwright, name: hapwright-webhook, path: /check } }\n\
         \x20   rules: [ { apiGroups: [apps], apiVersions: [v1], resources: [deployments], operations: [CREATE, DELETE] } ]\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: { name: hapwright-webhook, namespace: hapwright }\n\
         spec: { selector: { app: nothing }, ports: [ { port: 443, targetPort: 8443 } ] }\n",
    );
    let problems = check_webhook(&webhook, &load(&repo().join("deploy/controller")));
    for needle in [
        "lacks v1",
        "sideEffects",
        "timeoutSeconds",
        "not /validate",
        "does not lead to 9443",
        "selects no controller pod",
        "apps/deployments",
        "checks DELETE",
    ] {
        assert_reported(&problems, needle);
    }
}

#[test]
fn a_status_template_without_the_status_permission_is_reported() {
    let mut docs = load(&repo().join("deploy/sidecar"));
    assert_no_problems("deploy/sidecar", check_rbac(&docs));
    for doc in docs.iter_mut().filter(|d| d.kind() == "ClusterRole") {
        if let Some(rules) = doc.value["rules"].as_array_mut() {
            rules.retain(|rule| {
                !array(rule, "resources")
                    .iter()
                    .any(|r| r.as_str() == Some("ingresses/status"))
            });
        }
    }
    assert_reported(
        &check_rbac(&docs),
        "may not patch ingresses/status.networking.k8s.io in all namespaces (statusTemplates.ingresses)",
    );
}

// === the library and the site's settings ===

/// Snippet name prefixes a site may add to the library's `templateSnippets`: the
/// extension points its templates render with `render_glob` in the `global` and
/// `defaults` sections (docs/kubernetes-ingress.md, "Extending the library").
const SITE_SNIPPETS: &[&str] = &["global-", "defaults-"];

/// A deployed config carries the library's templates unchanged: every library key
/// equal, except `templateSnippets` (the library's own unchanged, plus `global-*` and
/// `defaults-*` additions of the site) and `extraContext` (the site's values for the
/// library's settings: the same keys, other values allowed).
fn check_library(config: &Value, library: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let copy_again = "copy it from examples/kubernetes-ingress/hapwright.yaml again";
    for key in LIBRARY_KEYS {
        match *key {
            "templateSnippets" => {
                let ours = config[key].as_object().cloned().unwrap_or_default();
                let theirs = library[key].as_object().cloned().unwrap_or_default();
                for (name, snippet) in &theirs {
                    if ours.get(name) != Some(snippet) {
                        problems.push(format!(
                            "templateSnippets.{name} differs from the library's; {copy_again}"
                        ));
                    }
                }
                for name in ours.keys().filter(|n| !theirs.contains_key(*n)) {
                    if !SITE_SNIPPETS.iter().any(|p| name.starts_with(p)) {
                        problems.push(format!(
                            "templateSnippets.{name} is not the library's, and a site may only \
                             add {SITE_SNIPPETS:?} snippets"
                        ));
                    }
                }
            }
            "extraContext" => {
                let keys = |v: &Value| -> BTreeSet<String> {
                    v.as_object()
                        .map(|m| m.keys().cloned().collect())
                        .unwrap_or_default()
                };
                if keys(&config[key]) != keys(&library[key]) {
                    problems.push(format!(
                        "extraContext has the keys {:?}, the library's are {:?}",
                        keys(&config[key]),
                        keys(&library[key])
                    ));
                }
            }
            _ if config[key] != library[key] => {
                problems.push(format!("`{key}` differs from the library's; {copy_again}"));
            }
            _ => {}
        }
    }
    problems
}

#[test]
fn library_problems_are_reported() {
    let text = fs::read_to_string(repo().join("examples/kubernetes-ingress/hapwright.yaml"))
        .expect("read the library");
    let library: Value = serde_saphyr::from_str(&text).expect("library YAML");
    let mut config = library.clone();
    assert_no_problems("the library itself", check_library(&config, &library));
    config["templateSnippets"]["lib"] = Value::from("{# edited #}");
    config["templateSnippets"]["frontend-99-mine"] = Value::from("x");
    config["templateSnippets"]["global-99-mine"] = Value::from("x");
    config["extraContext"]["unknownSetting"] = Value::from(1);
    config["maps"] = Value::Null;
    let problems = check_library(&config, &library);
    assert_reported(&problems, "templateSnippets.lib differs from the library's");
    assert_reported(
        &problems,
        "templateSnippets.frontend-99-mine is not the library's",
    );
    assert_reported(&problems, "extraContext has the keys");
    assert_reported(&problems, "`maps` differs from the library's");
    assert!(
        !problems.iter().any(|p| p.contains("global-99-mine")),
        "a global-* snippet is the site's to add: {problems:#?}"
    );
}

// === drains, tokens, availability, network access ===

fn container<'a>(spec: &'a Value, name: &str) -> Option<&'a Value> {
    array(spec, "containers")
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
}

/// `hard-stop-after <n>s` in an HAProxy config text, in seconds.
fn hard_stop_after(config: &str) -> Option<u64> {
    config.lines().find_map(|line| {
        let value = line.trim().strip_prefix("hard-stop-after")?.trim();
        if let Some(m) = value.strip_suffix('m') {
            m.parse::<u64>().ok().map(|m| m * 60)
        } else {
            value.trim_end_matches('s').parse().ok()
        }
    })
}

/// The preStop drain delay: `HAPWRIGHT_DRAIN_DELAY:-<n>` in the drain script.
fn drain_delay(script: &str) -> Option<u64> {
    let rest = script.split("HAPWRIGHT_DRAIN_DELAY:-").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Every pod with an HAProxy container drains on stop: a preStop hook running the
/// shipped `drain` script (a delay, then HAProxy's soft stop, then waiting for it),
/// `hard-stop-after` in the bootstrap config and in the rendered config (a
/// `global-*` snippet of the embedded hapwright config), and a grace period longer
/// than the delay plus `hard-stop-after`.
fn check_drains(docs: &[Doc]) -> Vec<String> {
    let mut problems = Vec::new();
    let config_maps: Vec<&Doc> = docs.iter().filter(|d| d.kind() == "ConfigMap").collect();
    let data = |key: &str| {
        config_maps
            .iter()
            .find_map(|d| d.value["data"][key].as_str())
    };
    let rendered_bound = embedded_configs(docs).first().and_then(|e| {
        e.config["templateSnippets"]
            .as_object()?
            .iter()
            .filter(|(name, _)| name.starts_with("global-"))
            .find_map(|(_, s)| hard_stop_after(s["template"].as_str().or(s.as_str())?))
    });
    for (doc, spec) in workloads(docs) {
        let Some(haproxy) = container(spec, "haproxy") else {
            continue;
        };
        let at = doc.label();
        let pre_stop: Vec<&str> = array(&haproxy["lifecycle"]["preStop"]["exec"], "command")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        if !pre_stop.last().is_some_and(|s| s.ends_with("/drain")) {
            problems.push(format!(
                "{at}: the haproxy container has no preStop running the drain script"
            ));
        }
        let Some(drain) = data("drain") else {
            problems.push(format!("{at}: no ConfigMap ships the drain script"));
            continue;
        };
        let delay = drain_delay(drain).unwrap_or(0);
        if delay == 0 {
            problems.push(format!(
                "{at}: the drain script does not wait before stopping HAProxy"
            ));
        }
        if !drain.contains("kill -USR1") {
            problems.push(format!(
                "{at}: the drain script does not soft-stop HAProxy (SIGUSR1)"
            ));
        }
        let bootstrap = data("haproxy.cfg").and_then(hard_stop_after);
        let Some(bootstrap) = bootstrap else {
            problems.push(format!(
                "{at}: the bootstrap haproxy.cfg has no hard-stop-after"
            ));
            continue;
        };
        match rendered_bound {
            None if !embedded_configs(docs).is_empty() => problems.push(format!(
                "{at}: the hapwright config has no global-* snippet with hard-stop-after"
            )),
            Some(rendered) if rendered != bootstrap => problems.push(format!(
                "{at}: hard-stop-after is {bootstrap}s in the bootstrap config but {rendered}s \
                 in the rendered one"
            )),
            _ => {}
        }
        let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
        if grace <= delay + bootstrap {
            problems.push(format!(
                "{at}: terminationGracePeriodSeconds {grace} is not longer than the drain \
                 ({delay}s delay + hard-stop-after {bootstrap}s)"
            ));
        }
    }
    problems
}

const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// No service-account token where the API is not needed: pods with an HAProxy
/// container turn the automatic token off, and only a hapwright container mounts one.
fn check_tokens(docs: &[Doc]) -> Vec<String> {
    let mut problems = Vec::new();
    for (doc, spec) in workloads(docs) {
        if container(spec, "haproxy").is_none() {
            continue;
        }
        if spec["automountServiceAccountToken"].as_bool() != Some(false) {
            problems.push(format!(
                "{}: a pod with HAProxy must set automountServiceAccountToken: false",
                doc.label()
            ));
        }
        for c in containers(spec) {
            let mounts_token = array(c, "volumeMounts")
                .iter()
                .any(|m| m["mountPath"].as_str() == Some(TOKEN_PATH));
            let name = c["name"].as_str().unwrap_or("?");
            if mounts_token && name != "hapwright" {
                problems.push(format!(
                    "{}: container {name} mounts a service-account token",
                    doc.label()
                ));
            }
        }
    }
    problems
}

fn selector_labels(value: &Value) -> BTreeMap<String, String> {
    string_map(&value["matchLabels"])
}

/// Every workload with more than one replica has a PodDisruptionBudget selecting its
/// pods, every budget selects a workload's pods and lets one pod go, and replicas
/// are spread over nodes (anti-affinity) and zones.
fn check_availability(docs: &[Doc]) -> Vec<String> {
    let mut problems = Vec::new();
    let budgets: Vec<&Doc> = docs
        .iter()
        .filter(|d| d.kind() == "PodDisruptionBudget")
        .collect();
    for budget in &budgets {
        let selector = selector_labels(&budget.value["spec"]["selector"]);
        if !workloads(docs).any(|(doc, _)| matches_selector(&selector, &pod_labels(doc))) {
            problems.push(format!(
                "{}: the selector matches no pod template",
                budget.label()
            ));
        }
        if budget.value["spec"]["minAvailable"].is_null()
            && budget.value["spec"]["maxUnavailable"].is_null()
        {
            problems.push(format!(
                "{}: neither minAvailable nor maxUnavailable",
                budget.label()
            ));
        }
    }
    for (doc, spec) in workloads(docs) {
        if doc.kind() != "Deployment" || doc.value["spec"]["replicas"].as_u64().unwrap_or(1) < 2 {
            continue;
        }
        let labels = pod_labels(doc);
        if !budgets
            .iter()
            .any(|b| matches_selector(&selector_labels(&b.value["spec"]["selector"]), &labels))
        {
            problems.push(format!(
                "{}: no PodDisruptionBudget selects its pods",
                doc.label()
            ));
        }
        let spreads = |key: &str| {
            array(spec, "topologySpreadConstraints")
                .iter()
                .any(|c| c["topologyKey"].as_str() == Some(key))
                || array(
                    &spec["affinity"]["podAntiAffinity"],
                    "preferredDuringSchedulingIgnoredDuringExecution",
                )
                .iter()
                .any(|t| t["podAffinityTerm"]["topologyKey"].as_str() == Some(key))
        };
        for key in ["kubernetes.io/hostname", "topology.kubernetes.io/zone"] {
            if !spreads(key) {
                problems.push(format!(
                    "{}: replicas are not spread over {key}",
                    doc.label()
                ));
            }
        }
    }
    problems
}

/// NetworkPolicies select pods, name ports those pods have, and, together, leave
/// every port of the selected pods reachable by someone (nothing closed by
/// accident). `extra` are add-on policies applied with the mode.
fn check_network_policies(docs: &[Doc]) -> Vec<String> {
    let mut problems = Vec::new();
    let policies: Vec<&Doc> = docs
        .iter()
        .filter(|d| d.kind() == "NetworkPolicy")
        .collect();
    for (doc, spec) in workloads(docs) {
        let labels = pod_labels(doc);
        let selecting: Vec<&&Doc> = policies
            .iter()
            .filter(|p| {
                matches_selector(&selector_labels(&p.value["spec"]["podSelector"]), &labels)
            })
            .collect();
        if selecting.is_empty() {
            problems.push(format!(
                "{}: no NetworkPolicy selects its pods",
                doc.label()
            ));
            continue;
        }
        let opened: Vec<&Value> = selecting
            .iter()
            .flat_map(|p| array(&p.value["spec"], "ingress"))
            .flat_map(|rule| array(rule, "ports"))
            .map(|p| &p["port"])
            .collect();
        for port in &opened {
            if !array(spec, "containers")
                .iter()
                .any(|c| container_port(c, port))
            {
                problems.push(format!(
                    "{}: a NetworkPolicy opens port {port}, which its pods do not have",
                    doc.label()
                ));
            }
        }
        for c in array(spec, "containers") {
            for p in array(c, "ports") {
                let covered = opened.iter().any(|o| match o {
                    Value::String(name) => p["name"].as_str() == Some(name),
                    Value::Number(n) => p["containerPort"].as_u64() == n.as_u64(),
                    _ => false,
                });
                if !covered {
                    problems.push(format!(
                        "{}: port {} of container {} is closed by the NetworkPolicies",
                        doc.label(),
                        p["containerPort"],
                        c["name"].as_str().unwrap_or("?")
                    ));
                }
            }
        }
    }
    problems
}

/// Ports below 1024 are the Services' only: containers run as non-root without
/// capabilities, so every port they listen on is 1024 or above.
fn check_unprivileged_ports(docs: &[Doc]) -> Vec<String> {
    let mut problems = Vec::new();
    for (doc, spec) in workloads(docs) {
        for c in containers(spec) {
            for p in array(c, "ports") {
                if p["containerPort"].as_u64().is_some_and(|n| n < 1024) {
                    problems.push(format!(
                        "{}: container {} listens on {}, below 1024, as non-root",
                        doc.label(),
                        c["name"].as_str().unwrap_or("?"),
                        p["containerPort"]
                    ));
                }
            }
        }
    }
    problems
}

/// Long-running containers have a readiness probe; hapwright containers a liveness
/// probe on `/healthz`.
fn check_probes(docs: &[Doc]) -> Vec<String> {
    let mut problems = Vec::new();
    for (doc, spec) in workloads(docs) {
        for c in array(spec, "containers") {
            let name = c["name"].as_str().unwrap_or("?");
            if c["readinessProbe"].is_null() {
                problems.push(format!(
                    "{}: container {name} has no readinessProbe",
                    doc.label()
                ));
            }
            if name == "hapwright"
                && c.pointer("/livenessProbe/httpGet/path") != Some(&Value::from("/healthz"))
            {
                problems.push(format!(
                    "{}: container {name} has no livenessProbe on /healthz",
                    doc.label()
                ));
            }
        }
    }
    problems
}

#[test]
fn pods_drain_before_they_stop() {
    for mode in modes() {
        let docs = load(&mode);
        assert_no_problems(&mode.display().to_string(), check_drains(&docs));
    }
}

#[test]
fn haproxy_containers_get_no_service_account_token() {
    for mode in modes() {
        assert_no_problems(&mode.display().to_string(), check_tokens(&load(&mode)));
    }
    // The sidecar's hapwright container still has one (it watches the API).
    let docs = load(&repo().join("deploy/sidecar"));
    let (_, spec) = workloads(&docs).next().expect("sidecar Deployment");
    let hapwright = container(spec, "hapwright").expect("hapwright container");
    assert!(
        array(hapwright, "volumeMounts")
            .iter()
            .any(|m| m["mountPath"].as_str() == Some(TOKEN_PATH)),
        "the sidecar's hapwright container needs the API token"
    );
}

#[test]
fn replicas_have_budgets_and_spread() {
    for mode in modes() {
        assert_no_problems(
            &mode.display().to_string(),
            check_availability(&load(&mode)),
        );
    }
}

#[test]
fn network_policies_match_the_pods_ports() {
    assert_no_problems(
        "deploy/sidecar",
        check_network_policies(&load(&repo().join("deploy/sidecar"))),
    );
    assert_no_problems(
        "deploy/controller",
        check_network_policies(&load(&repo().join("deploy/controller"))),
    );
    // With the webhook add-on, its port is opened too.
    let mut docs = load(&repo().join("deploy/controller"));
    let webhook = load(&repo().join("deploy/webhook"));
    docs.extend(
        webhook
            .iter()
            .filter(|d| d.kind() == "NetworkPolicy")
            .cloned(),
    );
    let deployment = docs
        .iter_mut()
        .find(|d| d.kind() == "Deployment" && d.name() == "hapwright-controller")
        .expect("controller Deployment");
    let c = deployment
        .value
        .pointer_mut("/spec/template/spec/containers/0/ports")
        .and_then(Value::as_array_mut)
        .expect("ports");
    c.push(serde_json::json!({"name": "webhook", "containerPort": 9443, "protocol": "TCP"}));
    assert_no_problems(
        "deploy/controller + deploy/webhook",
        check_network_policies(&docs),
    );
}

#[test]
fn containers_listen_on_unprivileged_ports_and_have_probes() {
    for mode in modes() {
        let docs = load(&mode);
        assert_no_problems(&mode.display().to_string(), check_unprivileged_ports(&docs));
        assert_no_problems(&mode.display().to_string(), check_probes(&docs));
    }
}

#[test]
fn drain_token_availability_and_policy_problems_are_reported() {
    let mut docs = load(&repo().join("deploy/sidecar"));
    let deployment = docs
        .iter_mut()
        .find(|d| d.kind() == "Deployment")
        .expect("sidecar Deployment");
    let spec = deployment
        .value
        .pointer_mut("/spec/template/spec")
        .expect("pod spec");
    spec["terminationGracePeriodSeconds"] = Value::from(30);
    spec["automountServiceAccountToken"] = Value::Null;
    spec["topologySpreadConstraints"] = Value::Null;
    spec["containers"][0]["lifecycle"] = Value::Null;
    spec["containers"][0]["readinessProbe"] = Value::Null;
    spec["containers"][0]["ports"][0]["containerPort"] = Value::from(80);
    spec["containers"][0]["volumeMounts"]
        .as_array_mut()
        .expect("mounts")
        .push(serde_json::json!({"name": "kube-api-access", "mountPath": TOKEN_PATH}));
    docs.retain(|d| d.kind() != "PodDisruptionBudget");
    for doc in docs.iter_mut().filter(|d| d.kind() == "NetworkPolicy") {
        doc.value["spec"]["ingress"][1]["ports"][0]["port"] = Value::from("nope");
    }
    assert_reported(&check_drains(&docs), "no preStop running the drain script");
    assert_reported(
        &check_drains(&docs),
        "terminationGracePeriodSeconds 30 is not longer",
    );
    let tokens = check_tokens(&docs);
    assert_reported(&tokens, "must set automountServiceAccountToken: false");
    assert_reported(&tokens, "container haproxy mounts a service-account token");
    let availability = check_availability(&docs);
    assert_reported(&availability, "no PodDisruptionBudget selects its pods");
    assert_reported(&availability, "not spread over topology.kubernetes.io/zone");
    let policies = check_network_policies(&docs);
    assert_reported(&policies, "opens port \"nope\"");
    assert_reported(&policies, "port 9401 of container hapwright is closed");
    assert_reported(
        &check_unprivileged_ports(&docs),
        "listens on 80, below 1024",
    );
    assert_reported(
        &check_probes(&docs),
        "container haproxy has no readinessProbe",
    );
}

// === external validators: kubernetes-validate, promtool ===

/// A validator command the test script installs (`scripts/test.sh`): `None` when it
/// is missing outside CI (the test says so and checks nothing more); missing in CI
/// (`CI` set, as scripts/test.sh sets it) is a failure.
fn tool(name: &str, install: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is not installed ({install}; scripts/test.sh installs it)"
        );
        eprintln!("skipped: {name} is not installed ({install})");
    }
    found
}

/// The Kubernetes version the manifests are validated against: the oldest one the
/// manifests support.
const KUBERNETES_VERSION: &str = "1.31.0";

#[test]
fn every_manifest_passes_kubernetes_validate() {
    let Some(validate) = tool("kubernetes-validate", "pip install kubernetes-validate") else {
        return;
    };
    let files = yaml_files(&repo().join("deploy"));
    assert!(files.len() >= 15, "{} manifest files", files.len());
    let output = Command::new(validate)
        .args(["--strict", "--no-warn", "-k", KUBERNETES_VERSION])
        .args(&files)
        .output()
        .expect("run kubernetes-validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "kubernetes-validate:\n{text}");
    // Every document of a kind the schemas know was checked.
    let known = load(&repo().join("deploy"))
        .iter()
        .filter(|d| !CUSTOM_KINDS.contains(&d.kind()))
        .count();
    let passed = text.matches(" passed for resource ").count();
    assert_eq!(
        passed, known,
        "kubernetes-validate checked {passed} of {known}:\n{text}"
    );
}

#[test]
fn kubernetes_validate_reports_a_broken_manifest() {
    let Some(validate) = tool("kubernetes-validate", "pip install kubernetes-validate") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("broken.yaml");
    fs::write(
        &file,
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: { name: b, namespace: n }\n\
         spec: { maxUnavailable: 1, selectr: { matchLabels: { a: b } } }\n",
    )
    .expect("write");
    let output = Command::new(validate)
        .args(["--strict", "-k", KUBERNETES_VERSION])
        .arg(&file)
        .output()
        .expect("run kubernetes-validate");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "accepted: {text}");
    assert!(text.contains("selectr"), "{text}");
}

/// The PrometheusRule's `spec` (a Prometheus rules file) in `dir`.
fn rules_file(dir: &Path) -> PathBuf {
    let rule = load(&repo().join("deploy/monitoring"))
        .into_iter()
        .find(|d| d.kind() == "PrometheusRule")
        .expect("deploy/monitoring has a PrometheusRule");
    let path = dir.join("hapwright-rules.yaml");
    fs::write(
        &path,
        serde_json::to_string_pretty(&rule.value["spec"]).expect("JSON"),
    )
    .expect("write rules");
    path
}

/// `promtool test rules` cases: series as the ServiceMonitor scrapes them (the
/// HAProxy instance in `exported_instance`), and the alerts that must fire and must
/// not.
const RULE_TESTS: &str = r#"
rule_files: [hapwright-rules.yaml]
evaluation_interval: 1m
tests:
  # The leader's instance out of sync for 10 minutes fires; a follower's 0 does not.
  - interval: 1m
    input_series:
      - series: 'hapwright_instance_in_sync{namespace="hapwright", pod="leader", exported_instance="haproxy-a"}'
        values: '1 0x15'
      - series: 'hapwright_leader{namespace="hapwright", pod="leader", job="hapwright-controller-metrics"}'
        values: '1x15'
      - series: 'hapwright_instance_in_sync{namespace="hapwright", pod="follower", exported_instance="haproxy-a"}'
        values: '0x15'
      - series: 'hapwright_leader{namespace="hapwright", pod="follower", job="hapwright-controller-metrics"}'
        values: '0x15'
    alert_rule_test:
      - eval_time: 5m
        alertname: HapwrightInstanceOutOfSync
        exp_alerts: []
      - eval_time: 12m
        alertname: HapwrightInstanceOutOfSync
        exp_alerts:
          - exp_labels: { severity: critical, namespace: hapwright, pod: leader, exported_instance: haproxy-a }
            exp_annotations:
              summary: "HAProxy instance haproxy-a does not run the desired configuration"
              description: "For 10 minutes. It still serves its last good configuration; see /debug/instances of leader for the error."
      - eval_time: 12m
        alertname: HapwrightNoLeader
        exp_alerts: []
  # No replica leads for 5 minutes.
  - interval: 1m
    input_series:
      - series: 'hapwright_leader{namespace="hapwright", pod="a", job="hapwright-controller-metrics"}'
        values: '1 0x10'
      - series: 'hapwright_leader{namespace="hapwright", pod="b", job="hapwright-controller-metrics"}'
        values: '0x10'
    alert_rule_test:
      - eval_time: 7m
        alertname: HapwrightNoLeader
        exp_alerts:
          - exp_labels: { severity: critical, namespace: hapwright, job: hapwright-controller-metrics }
            exp_annotations:
              summary: "No hapwright replica in hapwright holds the leader Lease"
              description: "Nothing is deployed to HAProxy until one does: check the Lease and the replicas' API access."
  # A failed reload, a quarantined object, a held removal, failing status writes.
  - interval: 1m
    input_series:
      - series: 'hapwright_reloads_total{namespace="hapwright", pod="p", exported_instance="local", result="failure", reason="structure"}'
        values: '0 0 1 1 1'
      - series: 'hapwright_quarantined_objects{namespace="hapwright", pod="p", resource="ingresses"}'
        values: '2x20'
      - series: 'hapwright_safety_valve_held{namespace="hapwright", pod="p"}'
        values: '0 1x10'
      - series: 'hapwright_status_writes_total{namespace="hapwright", pod="p", resource="ingresses", result="failure"}'
        values: '0+1x20'
    alert_rule_test:
      - eval_time: 3m
        alertname: HapwrightReloadsFailing
        exp_alerts:
          - exp_labels: { severity: warning, namespace: hapwright, pod: p, exported_instance: local, result: failure, reason: structure }
            exp_annotations:
              summary: "HAProxy reloads of local fail (structure)"
              description: "1 failed reloads in 15 minutes; the instance keeps its last good configuration."
      - eval_time: 10m
        alertname: HapwrightObjectsQuarantined
        exp_alerts: []
      - eval_time: 16m
        alertname: HapwrightObjectsQuarantined
        exp_alerts:
          - exp_labels: { severity: warning, namespace: hapwright, resource: ingresses }
            exp_annotations:
              summary: "2 ingresses held back by the quarantine"
              description: "Their changes would break the HAProxy configuration; the objects carry Warning Events with the reason (/debug/quarantine)."
      - eval_time: 7m
        alertname: HapwrightRemovalHeld
        exp_alerts:
          - exp_labels: { severity: warning, namespace: hapwright, pod: p }
            exp_annotations:
              summary: "The safety valve of p holds a large removal"
              description: "A change that removes many backends waits for the sources to recover, for confirmAfter, or for POST /-/approve (/debug/safety)."
      - eval_time: 12m
        alertname: HapwrightStatusWritesFailing
        exp_alerts:
          - exp_labels: { severity: warning, namespace: hapwright, pod: p, resource: ingresses, result: failure }
            exp_annotations:
              summary: "Status writes to ingresses fail"
              description: "The leader cannot patch object statuses (RBAC or API errors); see its log."
  # The API server cannot call the webhook; a certificate cert-manager did not renew.
  - interval: 1m
    input_series:
      - series: 'apiserver_admission_webhook_rejection_count{name="validate.hapwright.io", error_type="calling_webhook_error", operation="CREATE", rejection_code="0", type="validating"}'
        values: '0 3'
      - series: 'certmanager_certificate_expiration_timestamp_seconds{namespace="hapwright", name="haproxy-dataplane"}'
        values: '864000'
      - series: 'certmanager_certificate_expiration_timestamp_seconds{namespace="hapwright", name="hapwright-ca"}'
        values: '157680000'
    alert_rule_test:
      - eval_time: 1m
        alertname: HapwrightWebhookFailing
        exp_alerts:
          - exp_labels: { severity: critical, name: validate.hapwright.io }
            exp_annotations:
              summary: "The API server cannot call the hapwright admission webhook"
              description: "3 calls failed in 10 minutes; with failurePolicy Fail the objects were refused."
      - eval_time: 1m
        alertname: HapwrightCertificateExpiresSoon
        exp_alerts:
          - exp_labels: { severity: warning, namespace: hapwright, name: haproxy-dataplane }
            exp_annotations:
              summary: "Certificate hapwright/haproxy-dataplane expires in less than 14 days"
              description: "cert-manager has not renewed it; check the Certificate's conditions."
"#;

#[test]
fn the_alert_rules_pass_promtool() {
    let Some(promtool) = tool(
        "promtool",
        "apt-get install --no-install-recommends prometheus",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = rules_file(dir.path());
    let check = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("run promtool check rules");
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "promtool check rules:\n{out}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(out.contains("SUCCESS: 13 rules found"), "{out}");
    fs::write(dir.path().join("tests.yaml"), RULE_TESTS).expect("write rule tests");
    let test = Command::new(&promtool)
        .args(["test", "rules", "tests.yaml"])
        .current_dir(dir.path())
        .output()
        .expect("run promtool test rules");
    assert!(
        test.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
}

#[test]
fn promtool_reports_a_rule_that_does_not_fire() {
    let Some(promtool) = tool(
        "promtool",
        "apt-get install --no-install-recommends prometheus",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    rules_file(dir.path());
    // A follower's out-of-sync instance must not alert: expecting it to fails.
    let wrong = r#"
rule_files: [hapwright-rules.yaml]
tests:
  - interval: 1m
    input_series:
      - series: 'hapwright_instance_in_sync{namespace="hapwright", pod="follower", exported_instance="haproxy-a"}'
        values: '0x15'
      - series: 'hapwright_leader{namespace="hapwright", pod="follower"}'
        values: '0x15'
    alert_rule_test:
      - eval_time: 12m
        alertname: HapwrightInstanceOutOfSync
        exp_alerts:
          - exp_labels: { severity: critical, namespace: hapwright, pod: follower, exported_instance: haproxy-a }
"#;
    fs::write(dir.path().join("tests.yaml"), wrong).expect("write rule tests");
    let test = Command::new(&promtool)
        .args(["test", "rules", "tests.yaml"])
        .current_dir(dir.path())
        .output()
        .expect("run promtool test rules");
    assert!(
        !test.status.success(),
        "promtool accepted a wrong expectation"
    );
}

/// The `hapwright_*` metric names documented in docs/cli.md ("Metrics").
fn documented_metrics() -> BTreeSet<String> {
    let cli = fs::read_to_string(repo().join("docs/cli.md")).expect("docs/cli.md");
    cli.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .map(|name| format!("hapwright_{name}"))
        .collect()
}

/// The `hapwright_*` names an expression uses, without histogram suffixes.
fn metrics_in(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("hapwright_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.push(base.to_owned());
        rest = &tail[end..];
    }
    names
}

#[test]
fn alerts_and_dashboard_use_documented_metrics() {
    let documented = documented_metrics();
    assert!(
        documented.contains("hapwright_instance_in_sync"),
        "{documented:?}"
    );
    let rule = load(&repo().join("deploy/monitoring"))
        .into_iter()
        .find(|d| d.kind() == "PrometheusRule")
        .expect("PrometheusRule");
    let mut exprs: Vec<String> = array(&rule.value["spec"], "groups")
        .iter()
        .flat_map(|g| array(g, "rules"))
        .filter_map(|r| r["expr"].as_str().map(str::to_owned))
        .collect();
    let dashboard: Value = serde_json::from_str(
        &fs::read_to_string(repo().join("deploy/monitoring/grafana-dashboard.json"))
            .expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let panels = array(&dashboard, "panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    for panel in panels {
        let targets = array(panel, "targets");
        assert!(!targets.is_empty(), "panel {} has no query", panel["title"]);
        exprs.extend(
            targets
                .iter()
                .filter_map(|t| t["expr"].as_str().map(str::to_owned)),
        );
    }
    let mut unknown = Vec::new();
    for expr in &exprs {
        for name in metrics_in(expr) {
            if !documented.contains(&name) {
                unknown.push(format!("{name} (in `{expr}`)"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics hapwright does not have: {unknown:#?}"
    );
    assert_eq!(
        metrics_in("rate(hapwright_x_bucket[5m]) + hapwright_y"),
        ["hapwright_x", "hapwright_y"]
    );
}

#[test]
fn monitoring_objects_are_picked_up_by_kube_prometheus_stack() {
    for doc in load(&repo().join("deploy/monitoring")) {
        if matches!(doc.kind(), "ServiceMonitor" | "PrometheusRule") {
            assert_eq!(
                doc.value["metadata"]["labels"]["release"],
                "kube-prometheus-stack",
                "{}: the release label kube-prometheus-stack's selectors look for",
                doc.label()
            );
        }
    }
    let kustomization = fs::read_to_string(repo().join("deploy/monitoring/kustomization.yaml"))
        .expect("kustomization");
    assert!(kustomization.contains("grafana_dashboard: \"1\""));
}

// === install and upgrade: kustomizations, the library and the site settings ===

/// Each deployable directory: the library its config is composed from.
const COMPOSED: &[(&str, &str)] = &[
    (
        "deploy/sidecar",
        "examples/kubernetes-ingress/hapwright.yaml",
    ),
    (
        "deploy/controller",
        "examples/kubernetes-ingress/hapwright.yaml",
    ),
    ("deploy/gateway-api", "examples/gateway-api/hapwright.yaml"),
    (
        "deploy/ingress-nginx",
        "examples/ingress-nginx/hapwright.yaml",
    ),
];

fn compose(library: &str, site: &str) -> std::process::Output {
    Command::new("sh")
        .arg("deploy/compose.sh")
        .args([library, site])
        .current_dir(repo())
        .output()
        .expect("run deploy/compose.sh")
}

#[test]
fn composed_configs_are_the_library_plus_the_site_settings() {
    for (dir, library) in COMPOSED {
        let site = format!("{dir}/site.yaml");
        let output = compose(library, &site);
        assert!(
            output.status.success(),
            "deploy/compose.sh {library} {site}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let composed = String::from_utf8(output.stdout).expect("UTF-8");
        let committed =
            fs::read_to_string(repo().join(dir).join("hapwright.yaml")).expect("hapwright.yaml");
        let mode = dir.trim_start_matches("deploy/");
        assert!(
            composed == committed,
            "{dir}/hapwright.yaml is not {library} plus {site} (the library or the site \
             settings changed): run `deploy/install.sh --compose-only {mode}` and commit it"
        );
        // What it means: the library's keys, the site's where it has them.
        let config: Value = serde_saphyr::from_str(&composed).expect("composed YAML");
        let library_value: Value =
            serde_saphyr::from_str(&fs::read_to_string(repo().join(library)).expect("library"))
                .expect("library YAML");
        let site_value: Value =
            serde_saphyr::from_str(&fs::read_to_string(repo().join(&site)).expect("site"))
                .expect("site YAML");
        assert_no_problems(dir, check_library(&config, &library_value));
        for (key, value) in site_value.as_object().expect("site mapping") {
            if key == "templateSnippets" {
                for (name, snippet) in value.as_object().expect("snippets") {
                    assert_eq!(
                        &config[key][name], snippet,
                        "{dir}: templateSnippets.{name}"
                    );
                }
            } else {
                assert_eq!(&config[key], value, "{dir}: {key} is the site's");
            }
        }
        assert!(
            config.get("validationTests").is_none(),
            "{dir}: no validationTests"
        );
    }
}

#[test]
fn compose_refuses_what_it_cannot_compose() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        fs::write(&path, text).expect("write");
        path.display().to_string()
    };
    let library = write("library.yaml", "haproxyConfig:\n  template: x\n");
    let twice = write("twice.yaml", "controller: {}\ncontroller: {}\n");
    let flow = write("flow.yaml", "{controller: {}}\n");
    let output = compose(&library, &twice);
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("top-level key controller appears twice"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = compose(&library, &flow);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("not in block style"));
    let output = compose(&library, "/nonexistent/site.yaml");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read /nonexistent/site.yaml"));
}

/// Every manifest under a kustomization's directory is one of its resources (a file
/// that `kubectl apply -k` would silently leave out is a mistake).
#[test]
fn kustomizations_apply_every_manifest_of_their_directory() {
    for dir in [
        "sidecar",
        "controller",
        "webhook",
        "monitoring",
        "gateway-api",
        "ingress-nginx",
    ] {
        let root = repo().join("deploy").join(dir);
        let text = fs::read_to_string(root.join("kustomization.yaml")).expect("kustomization");
        let kustomization: Value = serde_saphyr::from_str(&text).expect("YAML");
        let listed: BTreeSet<PathBuf> = array(&kustomization, "resources")
            .iter()
            .map(|r| root.join(r.as_str().expect("path")))
            .filter(|p| p.is_file())
            .collect();
        let present: BTreeSet<PathBuf> = yaml_files(&root).into_iter().collect();
        assert_eq!(listed, present, "deploy/{dir}/kustomization.yaml resources");
    }
}

/// Where kubectl is installed, its kustomize builds the same objects as `kustomize`
/// above.
#[test]
fn kubectl_kustomize_builds_the_same_objects() {
    let kubectl = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("kubectl"))
            .find(|path| path.is_file())
    });
    let Some(kubectl) = kubectl else {
        eprintln!("skipped: kubectl is not installed");
        return;
    };
    for dir in [
        "sidecar",
        "controller",
        "webhook",
        "monitoring",
        "gateway-api",
        "ingress-nginx",
    ] {
        let root = repo().join("deploy").join(dir);
        let output = Command::new(&kubectl)
            .arg("kustomize")
            .arg(&root)
            .output()
            .expect("run kubectl kustomize");
        assert!(
            output.status.success(),
            "kubectl kustomize deploy/{dir}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let key = |v: &Value| {
            (
                v["kind"].as_str().unwrap_or("").to_owned(),
                v["metadata"]["namespace"].as_str().unwrap_or("").to_owned(),
                v["metadata"]["name"].as_str().unwrap_or("").to_owned(),
            )
        };
        let theirs: BTreeMap<_, Value> = parse_docs(dir, &String::from_utf8_lossy(&output.stdout))
            .into_iter()
            .map(|d| (key(&d.value), d.value))
            .collect();
        let ours: BTreeMap<_, Value> = kustomize(&root)
            .into_iter()
            .map(|d| (key(&d.value), d.value))
            .collect();
        assert_eq!(
            theirs.keys().collect::<Vec<_>>(),
            ours.keys().collect::<Vec<_>>(),
            "deploy/{dir}"
        );
        for (k, value) in &ours {
            if k.0 == "ConfigMap" {
                assert_eq!(value["data"], theirs[k]["data"], "deploy/{dir}: {k:?}");
            }
        }
    }
}

#[test]
fn the_gateway_api_mode_serves_its_gateway_class_with_the_gateway_library() {
    let docs = load(&repo().join("deploy/gateway-api"));
    assert_no_problems("deploy/gateway-api", check_metadata(&docs));
    assert_no_problems("deploy/gateway-api", check_volumes(&docs));
    assert_no_problems("deploy/gateway-api", check_rbac(&docs));
    assert_no_problems("deploy/gateway-api", check_drains(&docs));
    let embedded = embedded_configs(&docs);
    assert_eq!(embedded.len(), 1, "one hapwright container");
    let class = docs
        .iter()
        .find(|d| d.kind() == "GatewayClass")
        .expect("a GatewayClass");
    assert_eq!(
        class.value["spec"]["controllerName"],
        embedded[0].config["extraContext"]["gatewayControllerName"],
        "the GatewayClass names the controller the library serves"
    );
    assert!(
        embedded[0].config["watchedResources"]["httproutes"].is_object(),
        "the Gateway API library"
    );
    assert_hapwright_check_passes(&docs, &embedded[0]);
}

/// The ingress-nginx mode is the sidecar mode with the ingress-nginx library: it
/// serves class `nginx` and IngressClasses of `k8s.io/ingress-nginx`, and the
/// sidecar's RBAC covers what that library reads (IngressClasses, Opaque Secrets for
/// `auth-secret`) without an add-on of its own.
#[test]
fn the_ingress_nginx_mode_serves_the_nginx_class_with_the_ingress_nginx_library() {
    let docs = load(&repo().join("deploy/ingress-nginx"));
    assert_no_problems("deploy/ingress-nginx", check_metadata(&docs));
    assert_no_problems("deploy/ingress-nginx", check_volumes(&docs));
    assert_no_problems("deploy/ingress-nginx", check_rbac(&docs));
    assert_no_problems("deploy/ingress-nginx", check_ports(&docs));
    assert_no_problems("deploy/ingress-nginx", check_drains(&docs));
    assert_no_problems("deploy/ingress-nginx", check_haproxy_start(&docs));
    let embedded = embedded_configs(&docs);
    assert_eq!(embedded.len(), 1, "one hapwright container");
    let config = &embedded[0].config;
    assert_eq!(config["extraContext"]["ingressClass"], "nginx");
    assert_eq!(
        config["extraContext"]["controllerName"],
        "k8s.io/ingress-nginx"
    );
    for watched in ["ingressclasses", "authsecrets"] {
        assert!(
            config["watchedResources"][watched].is_object(),
            "the ingress-nginx library watches {watched}"
        );
    }
    assert_hapwright_check_passes(&docs, &embedded[0]);
}

// === the drain and the Data Plane API runner, run for real ===

/// A script of a shipped ConfigMap (`drain`, `dataplaneapi-run`), written to `dir`.
fn shipped_script(mode: &str, key: &str, dir: &Path) -> PathBuf {
    let text = load(&repo().join(mode))
        .iter()
        .find_map(|d| d.value["data"][key].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("{mode}: no ConfigMap has `{key}`"));
    let path = dir.join(key);
    fs::write(&path, text).expect("write script");
    path
}

/// Kills a child process when dropped (tests clean up what they start).
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Kills a process by pid when dropped.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        hapwright_e2e::send_signal(self.0, hapwright_e2e::Signal::KILL);
    }
}

/// An upstream on 127.0.0.1 answering `/fast` at once and holding every `/slow`
/// request until `release` is set; `held` counts the slow requests it has read.
struct Upstream {
    port: u16,
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    release: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Upstream {
    fn start() -> Upstream {
        use std::io::{BufRead, BufReader, Write};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind upstream");
        let port = listener.local_addr().expect("address").port();
        let held = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(AtomicBool::new(false));
        let (h, r) = (held.clone(), release.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (held, release) = (h.clone(), r.clone());
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                    let mut writer = stream;
                    loop {
                        let mut request_line = String::new();
                        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
                            return;
                        }
                        let mut line = String::new();
                        while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                            line.clear();
                        }
                        if request_line.contains("/slow") {
                            held.fetch_add(1, Ordering::SeqCst);
                            while !release.load(Ordering::SeqCst) {
                                std::thread::park_timeout(std::time::Duration::from_millis(20));
                            }
                        }
                        let body = if request_line.contains("/slow") {
                            "slow"
                        } else {
                            "fast"
                        };
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if writer.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Upstream {
            port,
            held,
            release,
        }
    }
}

/// Sends one HTTP/1.1 request on `stream` and reads the response (status, body);
/// keep-alive unless the server closes.
fn request(stream: &mut std::net::TcpStream, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{BufRead, BufReader, Read, Write};
    stream.write_all(format!("GET {path} HTTP/1.1\r\nhost: shop.test\r\n\r\n").as_bytes())?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut status = String::new();
    reader.read_line(&mut status)?;
    let code = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line: {status:?}")))?;
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

/// The sidecar's preStop `drain`, on HAProxy started with the sidecar manifest's
/// command and bootstrap `global` section: requests in flight when the pod stops
/// (on fresh and on keep-alive connections) all complete, HAProxy closes its
/// listeners and exits, and the script returns only after HAProxy is gone.
#[test]
fn the_drain_finishes_requests_in_flight_then_stops_haproxy() {
    use std::process::Stdio;
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("temp dir");
    let upstream = Upstream::start();
    let port = hapwright_e2e::free_port();
    let docs = load(&repo().join("deploy/sidecar"));
    let bootstrap = docs
        .iter()
        .find_map(|d| d.value["data"]["haproxy.cfg"].as_str())
        .expect("bootstrap haproxy.cfg");
    let global: String = bootstrap
        .split("\ndefaults")
        .next()
        .expect("global section")
        .to_owned();
    assert!(global.contains("hard-stop-after"), "{global}");
    let config = format!(
        "{global}\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    \
         timeout server 30s\n\nfrontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n\n\
         backend be\n    server up 127.0.0.1:{}\n",
        upstream.port
    );
    for sub in ["haproxy", "run"] {
        fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
    }
    fs::write(dir.path().join("haproxy/haproxy.cfg"), config).expect("write config");
    let (_, spec) = workloads(&docs).next().expect("sidecar Deployment");
    let haproxy = container(spec, "haproxy").expect("haproxy container");
    let local = |s: &str| {
        s.replace(
            "/etc/haproxy",
            &dir.path().join("haproxy").display().to_string(),
        )
        .replace(
            "/run/haproxy",
            &dir.path().join("run").display().to_string(),
        )
    };
    let command: Vec<String> = array(haproxy, "command")
        .iter()
        .map(|a| local(a.as_str().expect("string")))
        .collect();
    let child = Command::new(&command[0])
        .args(&command[1..])
        .current_dir(dir.path().join("haproxy"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(dir.path().join("haproxy.err")).expect("log"))
        .spawn()
        .expect("start haproxy");
    // Reaped as the container runtime would: the drain's `kill -0` must not see a
    // zombie. Killed when the test ends, whatever happened.
    let master = KillOnDrop(child.id());
    let (exited_tx, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut child = child;
        let _ = exited_tx.send(child.wait());
    });
    let master_exited = || exited.try_recv().is_ok();
    hapwright_e2e::poll(Duration::from_secs(20), || {
        hapwright_e2e::accepts_connections(port).then_some(())
    })
    .expect("HAProxy listens");
    let connect = || std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");

    // In flight when the pod stops: 4 slow requests on fresh connections and one on
    // a keep-alive connection that has already served a request.
    let mut keep_alive = connect();
    assert_eq!(
        request(&mut keep_alive, "/fast").expect("fast"),
        (200, "fast".into())
    );
    let mut in_flight: Vec<std::thread::JoinHandle<std::io::Result<(u16, String)>>> = (0..4)
        .map(|_| {
            let mut stream = connect();
            std::thread::spawn(move || request(&mut stream, "/slow"))
        })
        .collect();
    in_flight.push(std::thread::spawn(move || {
        request(&mut keep_alive, "/slow")
    }));
    hapwright_e2e::poll(Duration::from_secs(20), || {
        (upstream.held.load(Ordering::SeqCst) == 5).then_some(())
    })
    .expect("the upstream holds the 5 slow requests");

    // The preStop hook, as the kubelet runs it (a shorter delay).
    let drain = shipped_script("deploy/sidecar", "drain", dir.path());
    let mut hook = Reaped(
        Command::new("sh")
            .arg(&drain)
            .env("HAPWRIGHT_DRAIN_DELAY", "1")
            .env(
                "HAPWRIGHT_DRAIN_PIDFILE",
                dir.path().join("run/haproxy.pid"),
            )
            .spawn()
            .expect("run the drain"),
    );
    // Soft stop: the listener closes while the requests are still held.
    hapwright_e2e::poll(Duration::from_secs(20), || {
        (!hapwright_e2e::accepts_connections(port)).then_some(())
    })
    .expect("HAProxy closes its listener");
    assert!(
        hook.0.try_wait().expect("try_wait").is_none(),
        "the drain returned while requests were in flight"
    );
    assert!(!master_exited(), "HAProxy exited with requests in flight");
    upstream.release.store(true, Ordering::SeqCst);
    for handle in in_flight {
        let answer = handle.join().expect("client thread");
        assert_eq!(
            answer.as_ref().map_err(ToString::to_string),
            Ok(&(200, "slow".to_owned())),
            "a request in flight failed: {answer:?}"
        );
    }
    let status = hapwright_e2e::poll(Duration::from_secs(30), || {
        hook.0.try_wait().expect("try_wait")
    })
    .unwrap_or_else(|_| {
        panic!(
            "the drain did not return; HAProxy's log:\n{}",
            fs::read_to_string(dir.path().join("haproxy.err")).unwrap_or_default()
        )
    });
    assert!(status.success(), "drain: {status}");
    assert!(
        master_exited() || !Path::new(&format!("/proc/{}", master.0)).exists(),
        "the drain returned before HAProxy exited"
    );
}

/// `dataplaneapi-run` of controller mode, with a stand-in `dataplaneapi` that logs
/// its start and the signals it gets: it writes the config with the password,
/// restarts the API in place when the certificate changes, stops it with SIGTERM on
/// the container's stop signal (SIGUSR1, which dataplaneapi would take as a reload)
/// and exits 0; and passes on the status of an API that exits by itself.
#[test]
fn the_data_plane_api_runner_stops_and_restarts_the_api() {
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    let script = shipped_script("deploy/controller", "dataplaneapi-run", root);
    for sub in ["bin", "tls", "work"] {
        fs::create_dir_all(root.join(sub)).expect("mkdir");
    }
    let log = root.join("api.log");
    fs::write(
        root.join("bin/dataplaneapi"),
        format!(
            "#!/bin/sh\necho \"start $$ $*\" >> {log}\n\
             [ -n \"${{FAKE_EXIT:-}}\" ] && exit \"$FAKE_EXIT\"\n\
             trap 'echo \"term $$\" >> {log}; exit 0' TERM\n\
             trap 'echo \"usr1 $$\" >> {log}' USR1\n\
             while :; do sleep 1; done\n",
            log = log.display()
        ),
    )
    .expect("stand-in");
    let mut permissions = fs::metadata(root.join("bin/dataplaneapi"))
        .expect("meta")
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    fs::set_permissions(root.join("bin/dataplaneapi"), permissions).expect("chmod");
    fs::write(root.join("config.yaml"), "password: \"@PASSWORD@\"\n").expect("config");
    fs::write(root.join("tls/tls.crt"), "certificate 1\n").expect("crt");
    fs::write(root.join("tls/tls.key"), "key 1\n").expect("key");
    let path = format!(
        "{}:{}",
        root.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |fake_exit: Option<&str>| {
        let mut command = Command::new("sh");
        command
            .arg(&script)
            .env("PATH", &path)
            .env("DATAPLANE_PASSWORD", "s3cret")
            .env("DATAPLANE_CONFIG", root.join("config.yaml"))
            .env("DATAPLANE_WORK_DIR", root.join("work"))
            .env("DATAPLANE_TLS_DIR", root.join("tls"))
            .env("DATAPLANE_CERT_CHECK_SECONDS", "1");
        if let Some(code) = fake_exit {
            command.env("FAKE_EXIT", code);
        }
        Reaped(command.spawn().expect("run dataplaneapi-run"))
    };
    let lines = |word: &str| {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(word))
            .count()
    };
    let wait = Duration::from_secs(20);

    let mut runner = run(None);
    hapwright_e2e::poll(wait, || (lines("start") == 1).then_some(())).expect("API started");
    let written = fs::read_to_string(root.join("work/dataplaneapi.yaml")).expect("config");
    assert_eq!(written, "password: \"s3cret\"\n");
    assert!(fs::read_to_string(&log).expect("log").contains(&format!(
        "-f {}",
        root.join("work/dataplaneapi.yaml").display()
    )));

    // cert-manager renews the certificate: the API restarts, the runner stays.
    fs::write(root.join("tls/tls.crt"), "certificate 2\n").expect("renew");
    hapwright_e2e::poll(wait, || {
        (lines("start") == 2 && lines("term") == 1).then_some(())
    })
    .expect("API restarted with the renewed certificate");
    assert!(runner.0.try_wait().expect("try_wait").is_none());

    // The kubelet stops the container with the image's STOPSIGNAL, SIGUSR1.
    hapwright_e2e::send_signal(runner.0.id(), hapwright_e2e::Signal::USR1);
    let status = hapwright_e2e::poll(wait, || runner.0.try_wait().expect("try_wait"))
        .expect("the runner exits on SIGUSR1");
    assert!(status.success(), "{status}");
    assert_eq!(lines("term"), 2, "the API got SIGTERM");
    assert_eq!(lines("usr1"), 0, "the API never saw the reload signal");

    // An API that exits by itself: the runner exits with its status.
    let mut failing = run(Some("3"));
    let status = hapwright_e2e::poll(wait, || failing.0.try_wait().expect("try_wait"))
        .expect("the runner exits");
    assert_eq!(status.code(), Some(3));
}

// === readiness of the HAProxy pods, run for real ===

/// Rewrites every `bind :PORT` (and `*:PORT`, `0.0.0.0:PORT`) of an HAProxy config to
/// a loopback port, the same one for the same number in every config (`ports`), and
/// lowers a global `maxconn` to what a test process may open.
fn local_binds(config: &str, ports: &mut BTreeMap<u64, u16>) -> String {
    let mut out = String::with_capacity(config.len());
    for line in config.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let mut words = trimmed.split(' ');
        let rewritten = match (words.next(), words.next()) {
            (Some("bind"), Some(address)) => address
                .strip_prefix(':')
                .or_else(|| address.strip_prefix("*:"))
                .or_else(|| address.strip_prefix("0.0.0.0:"))
                .and_then(|port| port.parse::<u64>().ok())
                .map(|port| {
                    let local = *ports.entry(port).or_insert_with(hapwright_e2e::free_port);
                    let rest: Vec<&str> = words.collect();
                    format!("{indent}bind 127.0.0.1:{local} {}", rest.join(" "))
                }),
            (Some("maxconn"), Some(_)) => Some(format!("{indent}maxconn 1000")),
            _ => None,
        };
        out.push_str(rewritten.as_deref().unwrap_or(line).trim_end());
        out.push('\n');
    }
    out
}

/// The status code of `GET path` on `127.0.0.1:port`, as a kubelet probe sends it;
/// `None` when nothing answers.
fn probe_get(port: u16, path: &str) -> Option<u16> {
    use std::io::{BufRead, BufReader, Write};
    let timeout = std::time::Duration::from_secs(2);
    let mut stream =
        std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream
        .write_all(
            format!(
                "GET {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nuser-agent: kube-probe/1.31\r\n\
                 connection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .ok()?;
    let mut status = String::new();
    BufReader::new(stream).read_line(&mut status).ok()?;
    status.split_whitespace().nth(1)?.parse().ok()
}

/// Whether the kubelet would count `probe` of `container` as passing against HAProxy
/// on loopback (container ports mapped by `ports`): `httpGet` answers 200 to 399,
/// `tcpSocket` accepts the connection. Other probe kinds are not run here.
fn probe_passes(probe: &Value, container: &Value, ports: &mut BTreeMap<u64, u16>) -> bool {
    let port_of = |port: &Value| -> u64 {
        match port {
            Value::Number(n) => n.as_u64().expect("a port number"),
            Value::String(name) => array(container, "ports")
                .iter()
                .find(|p| p["name"].as_str() == Some(name))
                .and_then(|p| p["containerPort"].as_u64())
                .unwrap_or_else(|| panic!("no container port named {name}")),
            other => panic!("probe port {other}"),
        }
    };
    if let Some(get) = probe.get("httpGet") {
        let port = *ports
            .entry(port_of(&get["port"]))
            .or_insert_with(hapwright_e2e::free_port);
        let path = get["path"].as_str().unwrap_or("/");
        probe_get(port, path).is_some_and(|code| (200..400).contains(&code))
    } else if let Some(tcp) = probe.get("tcpSocket") {
        let port = *ports
            .entry(port_of(&tcp["port"]))
            .or_insert_with(hapwright_e2e::free_port);
        hapwright_e2e::accepts_connections(port)
    } else {
        panic!("a probe this test does not run: {probe}")
    }
}

/// An HAProxy master started by a test: stopped (SIGTERM, then SIGKILL) when dropped,
/// and every HAProxy process whose command line names `dir` with it.
struct Haproxy {
    child: std::process::Child,
    dir: String,
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        use hapwright_e2e::Signal;
        use std::time::Duration;
        hapwright_e2e::send_signal(self.child.id(), Signal::TERM);
        let child = &mut self.child;
        if hapwright_e2e::poll(Duration::from_secs(10), || child.try_wait().ok().flatten()).is_err()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in hapwright_e2e::processes_matching("haproxy", &self.dir) {
            hapwright_e2e::send_signal(pid, Signal::KILL);
        }
        let _ = hapwright_e2e::poll(Duration::from_secs(10), || {
            hapwright_e2e::processes_matching("haproxy", &self.dir)
                .is_empty()
                .then_some(())
        });
    }
}

/// The HAProxy pod of each mode, with HAProxy started as its haproxy container starts
/// it (the init container's bootstrap config and directories, the container's
/// command, loopback ports): the readiness probe fails while the bootstrap config
/// runs (the liveness probe passes), and passes once the config hapwright renders for
/// that mode is deployed (written, then the master reloaded with SIGUSR2 as the
/// Data Plane API's `reload` does). A later deployment that fails at the reload
/// (passes `haproxy -c`, then a `bind` on a port in use) leaves that config's worker
/// serving, and the probe passes again well within the kubelet's failure threshold.
#[test]
fn haproxy_pods_turn_ready_only_once_they_serve_a_deployed_config() {
    use std::time::Duration;
    for (dir, _) in COMPOSED {
        let docs = kustomize(&repo().join(dir));
        let scratch = tempfile::tempdir().expect("temp dir");
        let root = scratch.path();

        // The config hapwright deploys in this mode, with no objects.
        let embedded = embedded_configs(&docs);
        let config_dir = root.join("hapwright");
        fs::create_dir_all(&config_dir).expect("config dir");
        let config = materialize(&docs, &embedded[0], &config_dir);
        let fixtures = root.join("fixtures");
        fs::create_dir_all(&fixtures).expect("fixtures dir");
        let rendered = root.join("rendered");
        let output = Command::new(hapwright_binary())
            .args(["render", "-c"])
            .arg(&config)
            .arg("--fixtures")
            .arg(&fixtures)
            .arg("--out")
            .arg(&rendered)
            .output()
            .expect("run hapwright render");
        assert!(
            output.status.success(),
            "{dir}: hapwright render:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );

        // The pod: the haproxy container, its bootstrap config, its probes.
        let (_, spec) = workloads(&docs)
            .find(|(_, spec)| container(spec, "haproxy").is_some())
            .unwrap_or_else(|| panic!("{dir}: no pod with a haproxy container"));
        let haproxy = container(spec, "haproxy").expect("haproxy container");
        let readiness = &haproxy["readinessProbe"];
        let liveness = &haproxy["livenessProbe"];
        let bootstrap = docs
            .iter()
            .find_map(|d| d.value["data"]["haproxy.cfg"].as_str())
            .unwrap_or_else(|| panic!("{dir}: no bootstrap haproxy.cfg"));
        let mut ports = BTreeMap::new();
        let bootstrap = local_binds(bootstrap, &mut ports);
        let deployed = local_binds(
            &fs::read_to_string(rendered.join("haproxy.cfg")).expect("rendered haproxy.cfg"),
            &mut ports,
        );
        let http = named_port(spec, "haproxy", "http").expect("port http");
        let http = *ports
            .get(&http)
            .unwrap_or_else(|| panic!("{dir}: the bootstrap config does not bind {http}"));

        // As the init container leaves it: the bootstrap config and the directories.
        let etc = root.join("haproxy");
        for sub in ["maps", "files", "certs"] {
            fs::create_dir_all(etc.join(sub)).expect("mkdir");
        }
        fs::create_dir_all(root.join("run")).expect("mkdir");
        fs::write(etc.join("haproxy.cfg"), &bootstrap).expect("write bootstrap");
        let local = |s: &str| {
            s.replace("/etc/haproxy", &etc.display().to_string())
                .replace("/run/haproxy", &root.join("run").display().to_string())
        };
        let command: Vec<String> = array(haproxy, "command")
            .iter()
            .map(|a| local(a.as_str().expect("string")))
            .collect();
        let log = root.join("haproxy.log");
        let child = Command::new(&command[0])
            .args(&command[1..])
            .current_dir(&etc)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start haproxy");
        let master = child.id();
        let _haproxy = Haproxy {
            child,
            dir: root.display().to_string(),
        };
        let log = || fs::read_to_string(&log).unwrap_or_default();
        let socket = root.join("run/master.sock");
        let procs = || {
            hapwright_e2e::master_command(&socket, "show proc")
                .ok()
                .and_then(|text| hapwright_e2e::parse_show_proc(&text))
        };

        // The bootstrap config runs: HAProxy answers (503) and is alive, not ready.
        // Started means the master CLI answers too: a reload signal that arrives
        // before the master's loop runs is lost.
        hapwright_e2e::poll(Duration::from_secs(20), || {
            (hapwright_e2e::accepts_connections(http)
                && procs().is_some_and(|p| p.workers.len() == 1))
            .then_some(())
        })
        .unwrap_or_else(|_| panic!("{dir}: HAProxy does not start:\n{}", log()));
        assert_eq!(
            probe_get(http, "/"),
            Some(503),
            "{dir}: the bootstrap answers"
        );
        assert!(
            probe_passes(liveness, haproxy, &mut ports),
            "{dir}: the liveness probe fails on the bootstrap config: the kubelet would \
             restart HAProxy before hapwright deploys"
        );
        assert!(
            !probe_passes(readiness, haproxy, &mut ports),
            "{dir}: the haproxy container is ready while it serves the bootstrap config \
             ({readiness})"
        );

        // hapwright deploys: the rendered files, then a reload.
        let copy = Command::new("cp")
            .arg("-r")
            .arg(format!("{}/.", rendered.display()))
            .arg(&etc)
            .status()
            .expect("cp");
        assert!(copy.success());
        fs::write(etc.join("haproxy.cfg"), &deployed).expect("write deployed config");
        hapwright_e2e::send_signal(master, hapwright_e2e::Signal::USR2);
        hapwright_e2e::poll(Duration::from_secs(20), || {
            probe_passes(readiness, haproxy, &mut ports).then_some(())
        })
        .unwrap_or_else(|_| {
            panic!(
                "{dir}: not ready on the deployed config ({readiness}):\n{}",
                log()
            )
        });
        let serving = hapwright_e2e::poll(Duration::from_secs(20), || {
            procs().filter(|p| p.reloads == 1 && p.workers.len() == 1)
        })
        .unwrap_or_else(|_| panic!("{dir}: show proc after the reload: {:?}", procs()));

        // A deployment that fails at the reload: the config passes `haproxy -c`, the
        // new process cannot bind.
        let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let taken = holder.local_addr().expect("address").port();
        let failing = format!("{deployed}\nfrontend taken\n    bind 127.0.0.1:{taken}\n");
        fs::write(etc.join("haproxy.cfg"), &failing).expect("write failing config");
        let check = Command::new(&command[0])
            .args(["-c", "-f", "haproxy.cfg"])
            .current_dir(&etc)
            .output()
            .expect("haproxy -c");
        assert!(
            check.status.success(),
            "{dir}: haproxy -c refuses the failing config:\n{}",
            String::from_utf8_lossy(&check.stderr)
        );
        hapwright_e2e::send_signal(master, hapwright_e2e::Signal::USR2);
        // Over once one worker is left (from 3.1 on, the new worker is listed while
        // it loads the config, then exits).
        let after = hapwright_e2e::poll(Duration::from_secs(30), || {
            procs().filter(|p| p.reloads == 2 && p.workers.len() == 1)
        })
        .unwrap_or_else(|_| panic!("{dir}: the failed reload never ends:\n{}", log()));
        assert_eq!(
            after.workers,
            serving.workers,
            "{dir}: the worker of the deployed config no longer serves:\n{}",
            log()
        );
        // The kubelet marks the container unready after 3 failures 5 s apart.
        hapwright_e2e::poll(Duration::from_secs(10), || {
            probe_passes(readiness, haproxy, &mut ports).then_some(())
        })
        .unwrap_or_else(|_| {
            panic!(
                "{dir}: not ready after a failed deployment ({readiness}):\n{}",
                log()
            )
        });
        drop(holder);
    }
}

/// What the shipped configs render with no objects (`hapwright render`, both
/// validation phases, `haproxy -c` included): the site's drain bound in the `global`
/// section, with the `maxconn` the memory limit is sized for.
#[test]
fn rendered_configs_carry_the_drain_bound_and_the_sized_maxconn() {
    for (dir, _) in COMPOSED {
        let docs = load(&repo().join(dir));
        let embedded = embedded_configs(&docs);
        let scratch = tempfile::tempdir().expect("temp dir");
        let config = materialize(&docs, &embedded[0], scratch.path());
        let fixtures = scratch.path().join("fixtures");
        fs::create_dir_all(&fixtures).expect("fixtures dir");
        let output = Command::new(hapwright_binary())
            .args(["render", "-c"])
            .arg(&config)
            .arg("--fixtures")
            .arg(&fixtures)
            .output()
            .expect("run hapwright render");
        let rendered = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{dir}: hapwright render:\n{rendered}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = format!("\n{rendered}");
        let global: Vec<&str> = text
            .split("\nglobal\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{dir}: no global section:\n{rendered}"))
            .lines()
            .take_while(|l| l.starts_with(' ') || l.is_empty())
            .map(str::trim)
            .collect();
        assert!(global.contains(&"hard-stop-after 45s"), "{dir}: {global:?}");
        assert!(global.contains(&"maxconn 10000"), "{dir}: {global:?}");
    }
}

/// `deploy/install.sh`, in a copy of the repository's `deploy/` and `examples/`, with
/// a stand-in `kubectl` that records its arguments: it composes the mode's config
/// (the same bytes as the committed one) and runs `kubectl apply -k deploy/<mode>`
/// with the extra arguments; `--compose-only` applies nothing; an unknown mode is a
/// usage error.
#[test]
fn install_composes_the_config_then_applies_the_kustomization() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    let copy = Command::new("cp")
        .args(["-r", "deploy", "examples"])
        .arg(root)
        .current_dir(repo())
        .status()
        .expect("cp");
    assert!(copy.success());
    fs::create_dir_all(root.join("bin")).expect("bin");
    let calls = root.join("kubectl.calls");
    fs::write(
        root.join("bin/kubectl"),
        format!("#!/bin/sh\necho \"$*\" >> {}\n", calls.display()),
    )
    .expect("stand-in kubectl");
    let mut permissions = fs::metadata(root.join("bin/kubectl"))
        .expect("meta")
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    fs::set_permissions(root.join("bin/kubectl"), permissions).expect("chmod");
    let path = format!(
        "{}:{}",
        root.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let install = |args: &[&str]| {
        Command::new("sh")
            .arg(root.join("deploy/install.sh"))
            .args(args)
            .env("PATH", &path)
            .current_dir("/")
            .output()
            .expect("run deploy/install.sh")
    };
    for (dir, _) in COMPOSED {
        fs::remove_file(root.join(dir).join("hapwright.yaml")).expect("remove");
        let mode = dir.trim_start_matches("deploy/");
        let output = install(&[mode, "--dry-run=server"]);
        assert!(
            output.status.success(),
            "install.sh {mode}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(
            fs::read_to_string(root.join(dir).join("hapwright.yaml")).expect("composed"),
            fs::read_to_string(repo().join(dir).join("hapwright.yaml")).expect("committed"),
            "{dir}"
        );
    }
    assert_eq!(
        fs::read_to_string(&calls).expect("kubectl was called"),
        "apply -k deploy/sidecar --dry-run=server\n\
         apply -k deploy/controller --dry-run=server\n\
         apply -k deploy/gateway-api --dry-run=server\n\
         apply -k deploy/ingress-nginx --dry-run=server\n"
    );
    fs::write(root.join("deploy/sidecar/hapwright.yaml"), "stale\n").expect("stale");
    let output = install(&["--compose-only", "sidecar"]);
    assert!(output.status.success());
    assert_ne!(
        fs::read_to_string(root.join("deploy/sidecar/hapwright.yaml")).expect("composed"),
        "stale\n"
    );
    assert_eq!(
        fs::read_to_string(&calls).expect("calls").lines().count(),
        COMPOSED.len(),
        "--compose-only applied something"
    );
    let output = install(&["ingress"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("usage:"));
    // A site file that cannot be composed leaves the previous config in place.
    fs::write(root.join("deploy/sidecar/site.yaml"), "{ flow: style }\n").expect("site");
    let before = fs::read_to_string(root.join("deploy/sidecar/hapwright.yaml")).expect("read");
    let output = install(&["sidecar"]);
    assert!(!output.status.success());
    assert_eq!(
        fs::read_to_string(root.join("deploy/sidecar/hapwright.yaml")).expect("read"),
        before
    );
    assert_eq!(
        fs::read_to_string(&calls).expect("calls").lines().count(),
        COMPOSED.len()
    );
}

/// A certificate chain that survives renewals: a `Certificate`'s issuer is a CA
/// issuer whose Secret is a CA `Certificate` (never a self-signed leaf, whose
/// renewal would change the trusted bundle ahead of the mounted Secret), and what
/// trusts it (the webhook's injected bundle, hapwright's `caFile`) takes the CA.
fn check_certificate_chain(docs: &[Doc]) -> Vec<String> {
    let mut problems = Vec::new();
    let find = |kind: &str, name: &str| docs.iter().find(|d| d.kind() == kind && d.name() == name);
    for cert in docs.iter().filter(|d| d.kind() == "Certificate") {
        if cert.value["spec"]["isCA"].as_bool() == Some(true) {
            continue;
        }
        let issuer_name = cert.value["spec"]["issuerRef"]["name"]
            .as_str()
            .unwrap_or("");
        match find("Issuer", issuer_name) {
            None => problems.push(format!(
                "{}: Issuer {issuer_name} is not shipped",
                cert.label()
            )),
            Some(issuer) => match issuer.value["spec"]["ca"]["secretName"].as_str() {
                None => problems.push(format!(
                    "{}: issued by {issuer_name}, which is not a CA issuer (a self-signed \
                     leaf changes the trusted bundle on every renewal)",
                    cert.label()
                )),
                Some(secret) => {
                    let ca = docs.iter().find(|d| {
                        d.kind() == "Certificate"
                            && d.value["spec"]["secretName"].as_str() == Some(secret)
                    });
                    if ca.is_none_or(|ca| ca.value["spec"]["isCA"].as_bool() != Some(true)) {
                        problems.push(format!(
                            "{}: the CA issuer's Secret {secret} is not a CA Certificate",
                            cert.label()
                        ));
                    }
                }
            },
        }
    }
    for hook in docs
        .iter()
        .filter(|d| d.kind() == "ValidatingWebhookConfiguration")
    {
        let inject = hook.value["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            .as_str()
            .unwrap_or("");
        let name = inject.split('/').nth(1).unwrap_or("");
        match find("Certificate", name) {
            None => problems.push(format!(
                "{}: inject-ca-from `{inject}` names no shipped Certificate",
                hook.label()
            )),
            Some(cert) => {
                for webhook in array(&hook.value, "webhooks") {
                    let service = &webhook["clientConfig"]["service"];
                    let dns = format!(
                        "{}.{}.svc",
                        service["name"].as_str().unwrap_or(""),
                        service["namespace"].as_str().unwrap_or("")
                    );
                    if !array(&cert.value["spec"], "dnsNames").contains(&Value::from(dns.clone())) {
                        problems.push(format!("{}: does not name {dns}", cert.label()));
                    }
                }
            }
        }
    }
    problems
}

#[test]
fn certificates_come_from_the_hapwright_ca() {
    let mut docs = load(&repo().join("deploy/controller"));
    docs.extend(load(&repo().join("deploy/webhook")));
    assert_eq!(
        docs.iter().filter(|d| d.kind() == "Certificate").count(),
        3,
        "the CA, the Data Plane API's and the webhook's"
    );
    assert_no_problems(
        "deploy/controller + deploy/webhook",
        check_certificate_chain(&docs),
    );
    // hapwright trusts the CA: caFile is the ca.crt of the Data Plane API's Secret.
    let embedded = embedded_configs(&docs);
    let discovery = embedded[0]
        .config
        .pointer("/haproxy/discovery/kubernetes")
        .expect("discovery");
    assert_eq!(discovery["scheme"], "https");
    assert!(discovery.get("allowInsecureHttp").is_none());
    let dataplane = docs
        .iter()
        .find(|d| d.kind() == "Certificate" && d.name() == "haproxy-dataplane")
        .expect("the Data Plane API's Certificate");
    assert!(
        array(&dataplane.value["spec"], "dnsNames").contains(&discovery["serverName"]),
        "the Data Plane certificate names haproxy.discovery.kubernetes.serverName"
    );
    let (_, spec) = workloads(&docs)
        .find(|(d, _)| d.name() == "hapwright-controller")
        .expect("controller");
    let projected = array(&spec["volumes"][0]["projected"], "sources");
    assert!(projected.iter().any(|s| {
        s["secret"]["name"] == dataplane.value["spec"]["secretName"]
            && array(&s["secret"], "items").iter().any(|i| {
                i["key"] == "ca.crt" && Some(i["path"].clone()) == discovery.get("caFile").cloned()
            })
    }));

    // A self-signed leaf and a wrong injection are reported.
    for doc in docs.iter_mut() {
        if doc.kind() == "Certificate" && doc.name() == "hapwright-webhook" {
            doc.value["spec"]["issuerRef"]["name"] = Value::from("hapwright-selfsigned");
        }
        if doc.kind() == "ValidatingWebhookConfiguration" {
            doc.value["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] =
                Value::from("hapwright/nothing");
        }
    }
    let problems = check_certificate_chain(&docs);
    assert_reported(&problems, "which is not a CA issuer");
    assert_reported(&problems, "names no shipped Certificate");
}

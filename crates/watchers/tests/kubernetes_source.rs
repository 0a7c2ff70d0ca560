//! The `kubernetes` source at the protocol level: a real `kube::Client` and
//! `kube::runtime::watcher` talking to a scripted API server (`tower-test`), a real
//! kernel and bus. Time is paused, so the watcher's backoff runs on virtual time;
//! every wait is a receive bounded by a (virtual) timeout.

mod common;

use common::Harness;
mod kubernetes_mock;

use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::model::{ObjectKey, ResourceChange, ResourceSnapshot};
use hapwright_eventbus::{EventPayload, HealthState};
use hapwright_watchers::config::WatchedResource;
use hapwright_watchers::kubernetes::{ClientFactory, KubernetesSource};
use kubernetes_mock::{ApiServer, bookmark, error_event, event, list, pair, resource_list};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(600);
const COMPONENT: &str = "source/backends";
const DISCOVERY: &str = "/apis/example.com/v1";
const ALL: &str = "/apis/example.com/v1/backendpools";

fn in_namespace(namespace: &str) -> String {
    format!("/apis/example.com/v1/namespaces/{namespace}/backendpools")
}

impl Harness {
    fn start(resource: Value, client: kube::Client) -> Self {
        let resource: WatchedResource = serde_json::from_value(resource).unwrap();
        let source =
            KubernetesSource::new("backends", &resource, ClientFactory::with_client(client))
                .unwrap();
        Self::source(source, WAIT)
    }

    /// The next `ResourceIndexUpdated`; fails on a `ResourceSyncComplete` before it.
    async fn update(&mut self) -> (Arc<ResourceSnapshot>, Arc<ResourceChange>) {
        loop {
            match self.next().await {
                EventPayload::ResourceIndexUpdated(update) => {
                    assert_eq!(&*update.source, "backends");
                    return (update.snapshot, update.change);
                }
                EventPayload::ResourceSyncComplete(_) => panic!("sync complete before an update"),
                _ => {}
            }
        }
    }

    async fn sync_complete(&mut self) {
        loop {
            match self.next().await {
                EventPayload::ResourceSyncComplete(done) => {
                    assert_eq!(&*done.source, "backends");
                    return;
                }
                EventPayload::ResourceIndexUpdated(_) => panic!("an update before sync complete"),
                _ => {}
            }
        }
    }

    /// Waits for the source's health to become `state`; returns the reason. Fails on a
    /// resource event on the way (nothing is published while the source cannot list).
    async fn health(&mut self, state: HealthState) -> Option<String> {
        loop {
            match self.next().await {
                EventPayload::ComponentHealthChanged(changed)
                    if &*changed.component == COMPONENT && changed.health.state == state =>
                {
                    return changed.health.reason;
                }
                EventPayload::ComponentHealthChanged(_) => {}
                other => panic!("unexpected event while waiting for {state:?}: {other:?}"),
            }
        }
    }

    /// The source's health as the kernel's table has it now.
    fn current(&self) -> (HealthState, Option<String>) {
        let health = self
            .kernel
            .as_ref()
            .unwrap()
            .health()
            .get(COMPONENT)
            .expect("the source is registered");
        (health.state, health.reason)
    }
}

fn backend(namespace: Option<&str>, name: &str, resource_version: &str, port: u32) -> Value {
    let mut metadata = json!({
        "name": name,
        "resourceVersion": resource_version,
        "uid": format!("uid-{name}"),
        "labels": {"app": "web"},
        "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": "{\"huge\":true}",
            "team": "edge",
        },
        "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "example.com/v1"}],
    });
    if let Some(namespace) = namespace {
        metadata["namespace"] = json!(namespace);
    }
    json!({
        "apiVersion": "example.com/v1",
        "kind": "Backend",
        "metadata": metadata,
        "spec": {"port": port, "secret": "s3cr3t"},
    })
}

fn keys(pairs: &[(&str, &str)]) -> Vec<ObjectKey> {
    pairs
        .iter()
        .map(|(ns, name)| ObjectKey::new(*ns, *name))
        .collect()
}

fn object(snapshot: &ResourceSnapshot, namespace: &str, name: &str) -> Value {
    snapshot
        .get_by_key(&ObjectKey::new(namespace, name))
        .unwrap_or_else(|| panic!("{namespace}/{name} is in the snapshot"))
        .parse()
}

async fn discover(api: &mut ApiServer, namespaced: bool) {
    api.expect_get(DISCOVERY).await.respond(
        200,
        &resource_list("example.com/v1", "backendpools", "Backend", namespaced),
    );
}

#[tokio::test(start_paused = true)]
async fn list_then_watch_publishes_one_snapshot_then_sync_complete_and_coalesces_watch_events() {
    let (client, mut api) = pair();
    let mut harness = Harness::start(
        json!({
            "kubernetes": {
                "apiVersion": "example.com/v1", "kind": "Backend",
                "labelSelector": "app=web", "fieldSelector": "metadata.name!=skip",
            },
            "ignoreFields": ["spec.secret"],
        }),
        client,
    );
    discover(&mut api, true).await;

    // The plural comes from discovery (a guess from the kind would be `backends`).
    let listing = api.expect_list(ALL).await;
    assert_eq!(listing.param("labelSelector"), Some("app=web"));
    assert_eq!(listing.param("fieldSelector"), Some("metadata.name!=skip"));
    listing.respond(
        200,
        &list(
            "Backend",
            "10",
            &[
                backend(Some("web"), "a", "5", 80),
                backend(Some("api"), "b", "6", 81),
            ],
        ),
    );
    let (snapshot, change) = harness.update().await;
    assert_eq!(change.added, keys(&[("api", "b"), ("web", "a")]));
    assert_eq!(snapshot.len(), 2);
    let a = object(&snapshot, "web", "a");
    assert_eq!(
        a["apiVersion"], "example.com/v1",
        "filled in for list items"
    );
    assert_eq!(a["kind"], "Backend");
    assert!(a["metadata"].get("managedFields").is_none(), "{a}");
    assert_eq!(
        a["metadata"]["annotations"],
        json!({"team": "edge"}),
        "last-applied stripped, others kept"
    );
    assert!(
        a["spec"].get("secret").is_none(),
        "ignoreFields applied: {a}"
    );
    assert_eq!(a["spec"]["port"], 80);
    assert_eq!(
        snapshot.fetch(&["web", "a"]).unwrap().len(),
        1,
        "indexed by the default indexBy"
    );
    harness.sync_complete().await;
    assert_eq!(harness.current(), (HealthState::Healthy, None));

    // The watch resumes from the list's resourceVersion, with bookmarks and selectors.
    let watch = api.expect_watch(ALL).await;
    assert_eq!(watch.param("resourceVersion"), Some("10"));
    assert_eq!(watch.param("allowWatchBookmarks"), Some("true"));
    assert_eq!(watch.param("labelSelector"), Some("app=web"));
    assert_eq!(watch.param("fieldSelector"), Some("metadata.name!=skip"));
    watch.respond_events(&[
        event("MODIFIED", &backend(Some("web"), "a", "11", 8080)),
        event("ADDED", &backend(Some("web"), "c", "12", 82)),
        event("DELETED", &backend(Some("api"), "b", "13", 81)),
        bookmark("example.com/v1", "Backend", "20"),
    ]);
    // Three watch events arriving together: one update.
    let (snapshot, change) = harness.update().await;
    assert_eq!(
        *change,
        ResourceChange {
            added: keys(&[("web", "c")]),
            modified: keys(&[("web", "a")]),
            removed: keys(&[("api", "b")]),
        }
    );
    assert_eq!(object(&snapshot, "web", "a")["spec"]["port"], 8080);

    // The stream ended after the bookmark: the watch resumes from the bookmark.
    let watch = api.expect_watch(ALL).await;
    assert_eq!(watch.param("resourceVersion"), Some("20"));
    api.hold(watch);
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn gone_410_relists_and_applies_the_difference_as_one_change() {
    let (client, mut api) = pair();
    let mut harness = Harness::start(
        json!({"kubernetes": {"apiVersion": "example.com/v1", "kind": "Backend"}}),
        client,
    );
    discover(&mut api, true).await;
    api.expect_list(ALL).await.respond(
        200,
        &list(
            "Backend",
            "10",
            &[
                backend(Some("web"), "a", "5", 80),
                backend(Some("web"), "b", "6", 81),
                backend(Some("web"), "c", "7", 82),
            ],
        ),
    );
    harness.update().await;
    harness.sync_complete().await;

    api.expect_watch(ALL).await.respond_events(&[error_event(
        410,
        "Expired",
        "too old resource version: 10 (4000)",
    )]);
    let note = harness.health(HealthState::Healthy).await;
    let note = note.expect("a note while relisting");
    assert!(note.contains("410 Expired"), "{note}");

    // The watcher relists; objects gone from the new list are removed.
    let relist = api.expect_list(ALL).await;
    relist.respond(
        200,
        &list(
            "Backend",
            "4100",
            &[
                backend(Some("web"), "a", "5", 80),
                backend(Some("web"), "b", "4050", 9000),
                backend(Some("web"), "d", "4060", 83),
            ],
        ),
    );
    let (snapshot, change) = harness.update().await;
    assert_eq!(
        *change,
        ResourceChange {
            added: keys(&[("web", "d")]),
            modified: keys(&[("web", "b")]),
            removed: keys(&[("web", "c")]),
        }
    );
    assert_eq!(snapshot.len(), 3);
    assert_eq!(harness.current(), (HealthState::Healthy, None));
    let watch = api.expect_watch(ALL).await;
    assert_eq!(watch.param("resourceVersion"), Some("4100"));
    api.hold(watch);
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn namespaces_get_one_watcher_each_and_a_relist_only_touches_its_namespace() {
    let (client, mut api) = pair();
    let mut harness = Harness::start(
        json!({"kubernetes": {
            "apiVersion": "example.com/v1", "kind": "Backend",
            "namespaces": ["web", "api"], "labelSelector": "app=web",
        }}),
        client,
    );
    discover(&mut api, true).await;
    let mut lists = vec![api.next().await, api.next().await];
    lists.sort_by(|a, b| a.path.cmp(&b.path));
    let [api_list, web_list] = <[_; 2]>::try_from(lists).unwrap();
    assert_eq!(api_list.path, in_namespace("api"));
    assert_eq!(web_list.path, in_namespace("web"));
    assert!(!api_list.is_watch() && !web_list.is_watch());
    assert_eq!(api_list.param("labelSelector"), Some("app=web"));
    // The first snapshot waits for every namespace's list.
    web_list.respond(
        200,
        &list("Backend", "10", &[backend(Some("web"), "w1", "5", 80)]),
    );
    api_list.respond(
        200,
        &list("Backend", "11", &[backend(Some("api"), "a1", "6", 81)]),
    );
    let (snapshot, change) = harness.update().await;
    assert_eq!(change.added, keys(&[("api", "a1"), ("web", "w1")]));
    assert_eq!(snapshot.len(), 2);
    harness.sync_complete().await;

    // `web` expires and relists; `api`'s objects are untouched.
    let web_watch = api.next_on(&in_namespace("web")).await;
    assert!(web_watch.is_watch());
    assert_eq!(web_watch.param("resourceVersion"), Some("10"));
    web_watch.respond_events(&[error_event(410, "Expired", "too old")]);
    let relist = api.next_on(&in_namespace("web")).await;
    assert!(!relist.is_watch(), "{relist:?}");
    relist.respond(
        200,
        &list("Backend", "30", &[backend(Some("web"), "w2", "25", 80)]),
    );
    let (snapshot, change) = harness.update().await;
    assert_eq!(
        *change,
        ResourceChange {
            added: keys(&[("web", "w2")]),
            modified: vec![],
            removed: keys(&[("web", "w1")]),
        }
    );
    assert!(snapshot.get_by_key(&ObjectKey::new("api", "a1")).is_some());
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn rbac_denied_list_is_unhealthy_with_the_api_reason_and_recovers() {
    let (client, mut api) = pair();
    let mut harness = Harness::start(
        json!({"kubernetes": {"apiVersion": "example.com/v1", "kind": "Backend", "namespaces": ["web"]}}),
        client,
    );
    discover(&mut api, true).await;
    let message = "backendpools.example.com is forbidden: User \"system:serviceaccount:ingress:hapwright\" \
                   cannot list resource \"backendpools\" in API group \"example.com\" in the namespace \"web\"";
    api.expect_list(&in_namespace("web"))
        .await
        .respond_status(403, "Forbidden", message);
    let reason = harness.health(HealthState::Unhealthy).await.unwrap();
    assert!(reason.contains("namespace web"), "{reason}");
    assert!(reason.contains("403 Forbidden"), "{reason}");
    assert!(reason.contains("cannot list resource"), "{reason}");

    // Still denied: retried with backoff, still unhealthy, nothing published.
    let denied_at = tokio::time::Instant::now();
    api.expect_list(&in_namespace("web"))
        .await
        .respond_status(403, "Forbidden", message);
    assert!(
        tokio::time::Instant::now() > denied_at,
        "the retry came after a backoff delay"
    );
    // The RBAC is fixed: the next list succeeds.
    api.expect_list(&in_namespace("web")).await.respond(
        200,
        &list("Backend", "10", &[backend(Some("web"), "a", "5", 80)]),
    );
    assert_eq!(harness.health(HealthState::Healthy).await, None);
    let (snapshot, _) = harness.update().await;
    assert_eq!(snapshot.len(), 1);
    harness.sync_complete().await;
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_unknown_kind_or_denied_discovery_is_unhealthy_not_a_crash() {
    let (client, mut api) = pair();
    let mut harness = Harness::start(
        json!({"kubernetes": {"apiVersion": "example.com/v1", "kind": "Backend"}}),
        client,
    );
    // The group exists but does not serve the kind.
    api.expect_get(DISCOVERY).await.respond(
        200,
        &resource_list("example.com/v1", "frontends", "Frontend", true),
    );
    let reason = harness.health(HealthState::Unhealthy).await.unwrap();
    assert!(
        reason.contains("does not serve kind `Backend` in `example.com/v1`"),
        "{reason}"
    );
    // The group does not exist (CRD not installed).
    api.expect_get(DISCOVERY).await.respond_status(
        404,
        "NotFound",
        "the server could not find the requested resource",
    );
    let reason = harness.health(HealthState::Unhealthy).await.unwrap();
    assert!(reason.contains("404 NotFound"), "{reason}");
    // Discovery denied.
    api.expect_get(DISCOVERY)
        .await
        .respond_status(403, "Forbidden", "discovery is forbidden");
    let reason = harness.health(HealthState::Unhealthy).await.unwrap();
    assert!(
        reason.contains("403 Forbidden: discovery is forbidden"),
        "{reason}"
    );
    // The CRD is installed: the source starts.
    discover(&mut api, true).await;
    api.expect_list(ALL)
        .await
        .respond(200, &list("Backend", "1", &[]));
    let (snapshot, _) = harness.update().await;
    assert!(snapshot.is_empty());
    harness.sync_complete().await;
    assert_eq!(harness.current(), (HealthState::Healthy, None));
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_cannot_start_backs_off_and_resumes_from_the_same_version() {
    let (client, mut api) = pair();
    let mut harness = Harness::start(
        json!({"kubernetes": {"apiVersion": "example.com/v1", "kind": "Backend"}}),
        client,
    );
    discover(&mut api, true).await;
    api.expect_list(ALL).await.respond(
        200,
        &list("Backend", "10", &[backend(Some("web"), "a", "5", 80)]),
    );
    harness.update().await;
    harness.sync_complete().await;
    assert_eq!(harness.current(), (HealthState::Healthy, None));

    api.expect_watch(ALL)
        .await
        .respond_status(500, "InternalError", "etcd leader changed");
    let failed_at = tokio::time::Instant::now();
    let reason = harness.health(HealthState::Unhealthy).await.unwrap();
    assert!(
        reason.contains("watch could not start: 500 InternalError: etcd leader changed"),
        "{reason}"
    );
    let watch = api.expect_watch(ALL).await;
    assert!(
        tokio::time::Instant::now() > failed_at,
        "the retry came after a backoff delay"
    );
    assert_eq!(watch.param("resourceVersion"), Some("10"), "no relist");
    watch.respond_events(&[event("ADDED", &backend(Some("web"), "b", "11", 81))]);
    assert_eq!(harness.health(HealthState::Healthy).await, None);
    let (_, change) = harness.update().await;
    assert_eq!(change.added, keys(&[("web", "b")]));
    let watch = api.expect_watch(ALL).await;
    assert_eq!(watch.param("resourceVersion"), Some("11"));
    api.hold(watch);
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_cluster_scoped_kind_is_watched_cluster_wide_with_an_empty_namespace_key() {
    let (client, mut api) = pair();
    let mut harness = Harness::start(
        json!({
            "kubernetes": {"apiVersion": "example.com/v1", "kind": "Backend", "namespaces": ["web"]},
            "indexBy": ["metadata.name"],
        }),
        client,
    );
    discover(&mut api, false).await;
    api.expect_list(ALL).await.respond(
        200,
        &list("Backend", "3", &[backend(None, "global", "2", 80)]),
    );
    let (snapshot, change) = harness.update().await;
    assert_eq!(change.added, keys(&[("", "global")]));
    assert!(snapshot.get(&["global"]).unwrap().is_some());
    harness.sync_complete().await;
    harness.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_recovers_without_events_is_healthy_after_the_quiet_period() {
    let (client, mut api) = pair();
    let mut harness = Harness::start(
        json!({"kubernetes": {"apiVersion": "example.com/v1", "kind": "Backend"}}),
        client,
    );
    discover(&mut api, true).await;
    api.expect_list(ALL)
        .await
        .respond(200, &list("Backend", "10", &[]));
    harness.update().await;
    harness.sync_complete().await;
    api.expect_watch(ALL)
        .await
        .respond_status(503, "ServiceUnavailable", "apiserver restarting");
    let failed_at = tokio::time::Instant::now();
    let reason = harness.health(HealthState::Unhealthy).await.unwrap();
    assert!(reason.contains("503 ServiceUnavailable"), "{reason}");
    // The retried watch starts and stays quiet: no event tells of the recovery.
    let watch = api.expect_watch(ALL).await;
    assert_eq!(watch.param("resourceVersion"), Some("10"));
    api.hold(watch);
    assert_eq!(harness.health(HealthState::Healthy).await, None);
    assert!(
        tokio::time::Instant::now()
            >= failed_at + hapwright_watchers::kubernetes::source::RECOVERY_QUIET_PERIOD
    );
    harness.stop().await;
}

#[test]
fn a_batch_reports_each_object_once_by_its_state_before_and_after() {
    use hapwright_watchers::kubernetes::source::Store;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    use kube::runtime::watcher::Event;

    let object = |name: &str, rv: &str, port: u32| -> DynamicObject {
        serde_json::from_value(backend(Some("web"), name, rv, port)).unwrap()
    };
    let mut store = Store::new(
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("example.com", "v1", "Backend"),
            "backendpools",
        ),
        &[None],
        KubernetesSource::default_ignore_fields(),
        hapwright_watchers::config::default_index_by(),
    );
    store.apply(0, Event::Init);
    store.apply(0, Event::InitApply(object("a", "1", 80)));
    store.apply(0, Event::InitApply(object("b", "2", 81)));
    assert!(!store.synced());
    assert!(store.snapshot().is_empty(), "a list applies at its end");
    store.apply(0, Event::InitDone);
    assert!(store.synced());
    assert_eq!(
        store.take_change().added,
        keys(&[("web", "a"), ("web", "b")])
    );

    // Added then deleted: nothing. Deleted then re-added: modified. Changed twice:
    // modified once.
    store.apply(0, Event::Apply(object("c", "3", 82)));
    store.apply(0, Event::Delete(object("c", "4", 82)));
    store.apply(0, Event::Delete(object("a", "5", 80)));
    store.apply(0, Event::Apply(object("a", "6", 80)));
    store.apply(0, Event::Apply(object("b", "7", 90)));
    store.apply(0, Event::Apply(object("b", "8", 91)));
    assert_eq!(
        store.take_change(),
        ResourceChange {
            added: vec![],
            modified: keys(&[("web", "a"), ("web", "b")]),
            removed: vec![],
        }
    );
    // An identical object changes nothing.
    store.apply(0, Event::Apply(object("b", "8", 91)));
    assert!(store.take_change().is_empty());
    assert!(store.health().same_as(HealthState::Healthy, None));
}

// === optional and mandatory resources whose kind is missing ===

impl Harness {
    /// Events up to and including `ResourceSyncComplete`: the one update before it and
    /// the health reported on the way (the last one).
    async fn absent_sync(
        &mut self,
    ) -> (Arc<ResourceSnapshot>, Option<(HealthState, Option<String>)>) {
        let mut update = None;
        let mut health = None;
        loop {
            match self.next().await {
                EventPayload::ResourceIndexUpdated(u) => {
                    assert!(update.is_none(), "one update before sync complete");
                    update = Some(u.snapshot);
                }
                EventPayload::ResourceSyncComplete(done) => {
                    assert_eq!(&*done.source, "backends");
                    return (update.expect("an update before sync complete"), health);
                }
                EventPayload::ComponentHealthChanged(changed)
                    if &*changed.component == COMPONENT =>
                {
                    health = Some((changed.health.state, changed.health.reason));
                }
                _ => {}
            }
        }
    }
}

const OPTIONAL: &str = "optional watchedResources.backends (hapwright.yaml:12:3) is empty";

fn optional_source(client: kube::Client) -> Harness {
    let resource: WatchedResource = serde_json::from_value(json!({
        "kubernetes": {"apiVersion": "example.com/v1", "kind": "Backend"},
        "optional": true,
    }))
    .unwrap();
    let source = KubernetesSource::new("backends", &resource, ClientFactory::with_client(client))
        .unwrap()
        .with_location("hapwright.yaml:12:3");
    Harness::source(source, WAIT)
}

/// An optional resource whose group the API server does not serve (404 on
/// discovery) is empty and synced at once, degraded with the reason; when the CRD is
/// installed later its objects come as an ordinary change, without a second sync.
#[tokio::test(start_paused = true)]
async fn an_optional_kind_that_is_not_served_is_empty_then_picked_up_when_it_appears() {
    let (client, mut api) = pair();
    let mut harness = optional_source(client);
    api.expect_get(DISCOVERY).await.respond_status(
        404,
        "NotFound",
        "the server could not find the requested resource",
    );
    let (snapshot, health) = harness.absent_sync().await;
    assert!(snapshot.is_empty());
    let (state, reason) = health.expect("health reported before the sync");
    assert_eq!(state, HealthState::Degraded);
    let reason = reason.unwrap();
    assert!(reason.starts_with(OPTIONAL), "{reason}");
    assert!(reason.contains("404 NotFound"), "{reason}");
    assert!(
        reason.contains("picked up when the kind appears"),
        "{reason}"
    );

    // The group is served, but not this kind yet: still degraded, nothing published.
    let absent_at = tokio::time::Instant::now();
    api.expect_get(DISCOVERY).await.respond(
        200,
        &resource_list("example.com/v1", "frontends", "Frontend", true),
    );
    assert!(
        tokio::time::Instant::now() > absent_at,
        "checked again after a delay"
    );
    let reason = harness.health(HealthState::Degraded).await.unwrap();
    assert!(reason.contains("does not serve kind `Backend`"), "{reason}");

    // The CRD is installed: watched, its objects published as a change.
    discover(&mut api, true).await;
    api.expect_list(ALL).await.respond(
        200,
        &list("Backend", "7", &[backend(Some("web"), "a", "5", 80)]),
    );
    let (snapshot, change) = harness.update().await;
    assert_eq!(change.added, keys(&[("web", "a")]));
    assert_eq!(snapshot.len(), 1);
    assert_eq!(harness.current(), (HealthState::Healthy, None));
    let watch = api.expect_watch(ALL).await;
    assert_eq!(watch.param("resourceVersion"), Some("7"));
    api.hold(watch);
    harness.stop().await;
}

/// Discovery lists the kind but the list answers 404 (the CRD was just removed, or
/// discovery is stale): an optional resource renders without it, and the list that
/// works later brings the objects.
#[tokio::test(start_paused = true)]
async fn an_optional_kind_whose_list_answers_404_is_empty_until_the_list_works() {
    let (client, mut api) = pair();
    let mut harness = optional_source(client);
    discover(&mut api, true).await;
    api.expect_list(ALL).await.respond_status(
        404,
        "NotFound",
        "the server could not find the requested resource (get backendpools.example.com)",
    );
    let (snapshot, health) = harness.absent_sync().await;
    assert!(snapshot.is_empty());
    let (state, reason) = health.expect("health reported before the sync");
    assert_eq!(state, HealthState::Degraded);
    let reason = reason.unwrap();
    assert!(reason.starts_with(OPTIONAL), "{reason}");
    assert!(reason.contains("list failed: 404 NotFound"), "{reason}");

    api.expect_list(ALL).await.respond(
        200,
        &list("Backend", "9", &[backend(Some("web"), "b", "8", 81)]),
    );
    let (snapshot, change) = harness.update().await;
    assert_eq!(change.added, keys(&[("web", "b")]));
    assert_eq!(snapshot.len(), 1);
    assert_eq!(harness.current(), (HealthState::Healthy, None));
    let watch = api.expect_watch(ALL).await;
    api.hold(watch);
    harness.stop().await;
}

/// A mandatory resource whose kind is not served publishes nothing (the first render
/// waits for it) and says which config entry asks for it and how to run without it;
/// a denied discovery is not taken for a missing kind, even for an optional one.
#[tokio::test(start_paused = true)]
async fn a_missing_mandatory_kind_is_a_located_error_and_a_denied_discovery_is_not_absence() {
    let (client, mut api) = pair();
    let resource: WatchedResource = serde_json::from_value(json!({
        "kubernetes": {"apiVersion": "example.com/v1", "kind": "Backend"},
    }))
    .unwrap();
    let source = KubernetesSource::new("backends", &resource, ClientFactory::with_client(client))
        .unwrap()
        .with_location("hapwright.yaml:12:3");
    let mut harness = Harness::source(source, WAIT);
    api.expect_get(DISCOVERY).await.respond(
        200,
        &resource_list("example.com/v1", "frontends", "Frontend", true),
    );
    // `health` fails on any resource event before the state: nothing is published.
    let reason = harness.health(HealthState::Unhealthy).await.unwrap();
    assert_eq!(
        reason,
        "watchedResources.backends (hapwright.yaml:12:3): the API server does not serve kind \
         `Backend` in `example.com/v1` (is the CRD installed?); mark it `optional: true` to \
         render without it"
    );
    harness.stop().await;

    let (client, mut api) = pair();
    let mut harness = optional_source(client);
    api.expect_get(DISCOVERY)
        .await
        .respond_status(403, "Forbidden", "discovery is forbidden");
    let reason = harness.health(HealthState::Unhealthy).await.unwrap();
    assert!(reason.contains("403 Forbidden"), "{reason}");
    assert!(!reason.contains("optional: true"), "{reason}");
    harness.stop().await;
}

//! Which instances serve which object: the rule behind the `deployment` variable of
//! status templates.
//!
//! An instance **serves** an object when the config it runs was rendered from the
//! same version of that object as the render the statuses describe. It runs that
//! render, or an older one whose snapshot holds the object unchanged (an object's
//! version is everything but its `status`, `metadata.resourceVersion` and
//! `metadata.managedFields`, which change when a status is written and never reach
//! the config). An instance whose last attempt failed for the very config it is
//! believed to run (a restarted HAProxy whose config is unknown, an unreachable one
//! on a drift check) serves nothing. An object is **programmed** when every instance
//! of the fleet serves it, and there is at least one.
//!
//! The rule compares the object itself, not what else the config holds: a route is
//! served by an instance that runs its current rules even while a Service's servers
//! are still on their way there.

use std::collections::BTreeMap;
use std::sync::Arc;

use hapwright_eventbus::model::{ContentHash, ObjectKey, ResourceSnapshot, StoredObject};
use serde::Serialize;
use serde_json::Value as Json;

/// Every watched resource's snapshot of one render, by watched resource name.
pub type Snapshots = Arc<BTreeMap<Arc<str>, Arc<ResourceSnapshot>>>;

/// Longest error text a status message quotes for one instance.
const ERROR_CHARS: usize = 240;

/// The config an instance runs, as far as hapwright knows.
#[derive(Clone, Debug)]
pub struct Running {
    /// Hash of the render it runs.
    pub hash: ContentHash,
    /// The snapshots that render was made from, when still known (`None`: only the
    /// render with this very hash counts as served).
    pub snapshots: Option<Snapshots>,
}

/// The last deployment attempt to an instance failed.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// Hash of the config that failed.
    pub hash: ContentHash,
    /// What went wrong.
    pub error: String,
}

/// What the deployer's events say about one instance.
#[derive(Clone, Debug)]
pub struct InstanceState {
    /// Instance name.
    pub name: String,
    /// What it runs after its last successful deployment.
    pub runs: Option<Running>,
    /// Set when its last attempt failed; cleared by a success.
    pub failure: Option<Failure>,
}

impl InstanceState {
    /// An instance nothing is known about yet.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            runs: None,
            failure: None,
        }
    }

    /// Whether this instance serves `object` (the version in the render `render`, of
    /// watched resource `resource`, at `key`). See the [module docs](self).
    pub fn serving(
        &self,
        render: ContentHash,
        resource: &str,
        key: &ObjectKey,
        object: &StoredObject,
    ) -> Serving {
        let failing = || match &self.failure {
            Some(failure) => Serving::Failing(failure.error.clone()),
            None => Serving::Lagging,
        };
        let Some(runs) = &self.runs else {
            return match &self.failure {
                Some(failure) => Serving::Failing(failure.error.clone()),
                None => Serving::Pending,
            };
        };
        if self
            .failure
            .as_ref()
            .is_some_and(|failure| failure.hash == runs.hash)
        {
            return failing();
        }
        if runs.hash == render {
            return Serving::Serves;
        }
        let theirs = runs
            .snapshots
            .as_ref()
            .and_then(|snapshots| snapshots.get(resource))
            .and_then(|snapshot| snapshot.get_by_key(key));
        match theirs {
            Some(theirs) if same_version(theirs, object) => Serving::Serves,
            _ => failing(),
        }
    }
}

/// Whether an instance serves one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Serving {
    /// It runs a config made from this version of the object.
    Serves,
    /// It runs an older config, and its last attempt did not fail: the newer one is
    /// on its way (a deployment in progress, a reload window).
    Lagging,
    /// Its last attempt failed, with this error.
    Failing(String),
    /// Nothing was deployed to it yet.
    Pending,
}

impl Serving {
    /// `serving`, `lagging`, `failing` or `pending`, as templates see it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Serving::Serves => "serving",
            Serving::Lagging => "lagging",
            Serving::Failing(_) => "failing",
            Serving::Pending => "pending",
        }
    }
}

/// The fleet the statuses of one render are judged against.
#[derive(Clone, Debug)]
pub struct Fleet {
    /// Hash of the render the statuses describe.
    pub render: ContentHash,
    /// Every instance that should serve the objects, in name order.
    pub instances: Vec<InstanceState>,
}

impl Fleet {
    /// A fleet whose instances `names` all run `render` (what `hapwright test`
    /// assumes unless a test says otherwise).
    pub fn serving<S: Into<String>>(
        render: ContentHash,
        names: impl IntoIterator<Item = S>,
    ) -> Self {
        Self {
            render,
            instances: names
                .into_iter()
                .map(|name| InstanceState {
                    name: name.into(),
                    runs: Some(Running {
                        hash: render,
                        snapshots: None,
                    }),
                    failure: None,
                })
                .collect(),
        }
    }

    /// The `deployment` variable of one object's status template.
    pub fn deployment(&self, resource: &str, key: &ObjectKey, object: &StoredObject) -> Deployment {
        let instances: Vec<InstanceView> = self
            .instances
            .iter()
            .map(|instance| {
                let serving = instance.serving(self.render, resource, key, object);
                InstanceView {
                    name: instance.name.clone(),
                    state: serving.as_str(),
                    serves: serving == Serving::Serves,
                    hash: instance.runs.as_ref().map(|r| r.hash.short()),
                    error: match serving {
                        Serving::Failing(error) => Some(one_line(&error)),
                        _ => None,
                    },
                }
            })
            .collect();
        let waiting: Vec<String> = instances
            .iter()
            .filter(|i| !i.serves)
            .map(|i| i.name.clone())
            .collect();
        let programmed = !instances.is_empty() && waiting.is_empty();
        Deployment {
            message: message(&instances),
            programmed,
            hash: self.render.short(),
            waiting,
            instances,
        }
    }
}

/// What a status template sees as `deployment`: whether every instance serves the
/// object, and which do not and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Deployment {
    /// Every instance of the fleet serves this version of the object (and there is
    /// at least one).
    pub programmed: bool,
    /// One sentence for a condition's message: `served by all 2 instances`, or `not
    /// yet served by instance haproxy-1 (last deployment failed: ...)`.
    pub message: String,
    /// Short hash of the render the statuses describe.
    pub hash: String,
    /// Names of the instances that do not serve it, in name order.
    pub waiting: Vec<String>,
    /// Every instance, in name order.
    pub instances: Vec<InstanceView>,
}

/// One instance in [`Deployment`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstanceView {
    /// Instance name.
    pub name: String,
    /// `serving`, `lagging`, `failing` or `pending` ([`Serving`]).
    pub state: &'static str,
    /// Whether it serves the object.
    pub serves: bool,
    /// Short hash of the config it runs, when known.
    pub hash: Option<String>,
    /// Its last error, when failing (one line, shortened).
    pub error: Option<String>,
}

fn message(instances: &[InstanceView]) -> String {
    if instances.is_empty() {
        return "no HAProxy instance to serve it".to_owned();
    }
    let waiting: Vec<String> = instances
        .iter()
        .filter(|i| !i.serves)
        .map(|i| {
            let why = match (i.state, &i.error) {
                ("failing", Some(error)) => format!("last deployment failed: {error}"),
                ("pending", _) => "nothing deployed yet".to_owned(),
                _ => "runs an older config".to_owned(),
            };
            format!("{} ({why})", i.name)
        })
        .collect();
    match (waiting.len(), instances.len()) {
        (0, 1) => format!("served by instance {}", instances[0].name),
        (0, all) => format!("served by all {all} instances"),
        (1, 1) => format!("not yet served by instance {}", waiting[0]),
        (1, all) => format!(
            "not yet served by instance {}; {} of {all} instances serve it",
            waiting[0],
            all - 1
        ),
        (n, all) => format!(
            "not yet served by instances {}; {} of {all} instances serve it",
            waiting.join(", "),
            all - n
        ),
    }
}

/// `error` on one line, whitespace runs collapsed, at most [`ERROR_CHARS`] characters.
fn one_line(error: &str) -> String {
    let line = error.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= ERROR_CHARS {
        return line;
    }
    let mut short: String = line.chars().take(ERROR_CHARS - 1).collect();
    short.push('…');
    short
}

/// Whether two stored versions of an object are the same version for the config:
/// equal but for `status`, `metadata.resourceVersion` and `metadata.managedFields`.
pub fn same_version(a: &StoredObject, b: &StoredObject) -> bool {
    if a == b {
        return true;
    }
    strip(a.parse()) == strip(b.parse())
}

fn strip(mut object: Json) -> Json {
    if let Json::Object(map) = &mut object {
        map.remove("status");
        if let Some(Json::Object(metadata)) = map.get_mut("metadata") {
            metadata.remove("resourceVersion");
            metadata.remove("managedFields");
        }
    }
    object
}

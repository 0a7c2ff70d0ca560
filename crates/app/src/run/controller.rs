//! The reinit loop: the controller across config reloads, waking on config
//! changes, reload requests (SIGHUP, `POST /-/reload`), signals and component
//! failures, and deciding for each whether the running iteration keeps running,
//! is replaced by a checked new one or stops.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hapwright_eventbus::model::Diagnostic;
use hapwright_eventbus::{ComponentFailure, ReloadRequested, ReloadSource, RestartBackoff};
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::candidate::{Candidate, prepare};
use super::iteration::Iteration;
use super::listeners::{Listeners, webhook_listen};
use super::process::Process;
use crate::config::{self, Loaded};
use crate::http::{self, HttpState, Limits, ReloadHandle, ReloadOutcome, ReloadRequest};
use crate::status::ConfigStatus;

/// Grace period for stopping an iteration's components.
const ITERATION_GRACE: Duration = Duration::from_secs(10);

/// What woke the loop up.
enum Wake {
    /// Load the config file again (SIGHUP, HTTP).
    Reload(ReloadRequest),
    /// The config watcher parsed a valid new config.
    Loaded(Box<Loaded>),
    /// The config watcher found the new config invalid.
    Invalid(Vec<Diagnostic>),
    /// SIGTERM or SIGINT.
    Shutdown(&'static str),
    /// A mandatory component exited outside shutdown.
    ComponentFailed(ComponentFailure),
    /// The restart delay after a component failure is over: rebuild the iteration.
    Restart,
    /// The iteration has run long enough since the last restart to count as healthy.
    Recovered,
}

fn config_status(loaded: &Loaded) -> ConfigStatus {
    ConfigStatus {
        path: loaded.path.display().to_string(),
        last_reload_successful: true,
        errors: Vec::new(),
        effective: serde_json::to_value(&loaded.config).unwrap_or(serde_json::Value::Null),
    }
}

/// The signals the controller answers: SIGHUP reloads, SIGTERM and SIGINT stop.
struct Signals {
    hangup: Signal,
    terminate: Signal,
    interrupt: Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            hangup: signal(SignalKind::hangup())?,
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }
}

/// Why the running iteration ends (after a wake-up that does not leave it running).
enum End {
    /// It is replaced by one built from the candidate, for the reason given.
    Replace(Box<Candidate>, &'static str),
    /// It stops, and so does the controller.
    Shutdown,
}

/// The running iteration and what the controller tracks about it.
struct Running {
    iteration: Iteration,
    /// Its config, kept to rebuild it from the same config after a component failure.
    config: Loaded,
    generation: u64,
    /// How long its components get to stop.
    grace: Duration,
    started: tokio::time::Instant,
    /// When it is rebuilt after a component failure.
    restart_at: Option<tokio::time::Instant>,
    /// Whether it follows a restart and has not yet run long enough to reset the
    /// backoff.
    recovering: bool,
    recovered_at: tokio::time::Instant,
}

/// The controller across config reloads: what outlives iterations (the process's
/// state, the HTTP listeners) and the inputs that end one (config changes, reload
/// requests, signals, component failures).
pub(super) struct Controller {
    process: Process,
    config_path: PathBuf,
    http_state: HttpState,
    listeners: Listeners,
    reload_requests: tokio::sync::mpsc::Receiver<ReloadRequest>,
    signals: Signals,
    generation: u64,
    backoff: RestartBackoff,
}

impl Controller {
    /// Sets up what outlives iterations for the first config and binds its listeners.
    pub(super) async fn spawn(first: &Loaded) -> anyhow::Result<Self> {
        let process = Process::new(first)?;
        let (reload, reload_requests) = ReloadHandle::channel();
        let http_state = HttpState::new(process.store.clone(), process.registry.clone(), reload);
        http_state
            .policy
            .store(Arc::new(http::Policy::from(&first.config.controller)));
        let signals = Signals::new()?;
        let mut listeners = Listeners::default();
        let wanted = &first.config.controller;
        if let Err(error) = listeners
            .ensure(
                &http_state,
                wanted.listen,
                wanted.metrics_listen,
                &Limits::from(&wanted.http),
            )
            .await
        {
            process.managed.stop().await;
            anyhow::bail!("{error}");
        }
        if let Err(error) = listeners
            .ensure_webhook(webhook_listen(wanted), &process.webhook_slot)
            .await
        {
            process.managed.stop().await;
            listeners.shutdown().await;
            anyhow::bail!("{error}");
        }
        Ok(Self {
            process,
            config_path: first.path.clone(),
            http_state,
            listeners,
            reload_requests,
            signals,
            generation: 0,
            backoff: RestartBackoff::default(),
        })
    }

    /// Runs one iteration after the other, each until a valid replacement, until a
    /// shutdown signal or an iteration that cannot start.
    pub(super) async fn run(&mut self, mut candidate: Candidate) -> anyhow::Result<()> {
        loop {
            let mut running = self.start_iteration(candidate)?;
            let end = loop {
                let wake = self.wake(&mut running).await;
                if let Some(end) = self.handle(&mut running, wake).await {
                    break end;
                }
            };
            let End::Replace(next, why) = end else {
                running.iteration.stop(running.grace).await;
                return Ok(());
            };
            tracing::info!(
                generation = running.generation,
                reason = why,
                "Restarting the controller iteration"
            );
            running.iteration.stop(running.grace).await;
            self.stop_removed_instances(&running.config, &next.loaded)
                .await;
            candidate = *next;
        }
    }

    /// Drains and stops the managed HAProxy of every instance the new config no
    /// longer has (or no longer manages); the others keep running across the swap.
    async fn stop_removed_instances(&self, old: &Loaded, new: &Loaded) {
        let kept: std::collections::BTreeSet<&str> = new
            .config
            .haproxy
            .instances
            .iter()
            .filter(|i| i.managed)
            .map(|i| i.name.as_str())
            .collect();
        for removed in old
            .config
            .haproxy
            .instances
            .iter()
            .filter(|i| i.managed && !kept.contains(i.name.as_str()))
        {
            tracing::info!(
                instance = %removed.name,
                "Managed instance removed from the config; draining and stopping its HAProxy"
            );
            self.process.managed.stop_instance(&removed.name).await;
        }
    }

    /// Publishes the candidate's config (status store, HTTP policy) and starts the
    /// next iteration from it.
    fn start_iteration(&mut self, candidate: Candidate) -> anyhow::Result<Running> {
        self.generation += 1;
        self.publish_config(&candidate.loaded);
        let grace =
            ITERATION_GRACE.max(candidate.loaded.config.controller.deployment_timeout.get());
        let config = candidate.loaded.clone();
        let started = tokio::time::Instant::now();
        let recovering = self.backoff.attempt() > 0;
        let recovered_at = started + self.backoff.reset_after();
        let iteration = Iteration::start(&self.process, candidate, self.generation)?;
        self.http_state
            .approve
            .set_publisher(iteration.kernel.bus().publisher());
        Ok(Running {
            iteration,
            config,
            generation: self.generation,
            grace,
            started,
            restart_at: None,
            recovering,
            recovered_at,
        })
    }

    /// What the status store and the HTTP server show of the config that starts.
    fn publish_config(&self, loaded: &Loaded) {
        let config = &loaded.config;
        let store = &self.process.store;
        self.http_state
            .policy
            .store(Arc::new(http::Policy::from(&config.controller)));
        store.set_config(config_status(loaded));
        store.set_liveness_grace(config.controller.liveness_grace.get());
        store.set_template_places(loaded.templates_at.clone());
        if let Some(leader) = self.process.leadership() {
            store.set_leadership(leader);
        }
        store.set_watched_resources(config.watched_resources.resources.keys().cloned());
        store.set_static_instances(config.haproxy.instances.iter().map(|i| i.name.clone()));
    }

    /// Waits for whatever may end or change the running iteration.
    async fn wake(&mut self, running: &mut Running) -> Wake {
        tokio::select! {
            // The watcher gone (it failed): the kernel reports that; this branch
            // just stops yielding.
            Some(change) = running.iteration.config_changes.recv() => match change {
                config::ConfigChange::Loaded(loaded) => Wake::Loaded(loaded),
                config::ConfigChange::Invalid(errors) => Wake::Invalid(errors),
            },
            Some(request) = self.reload_requests.recv() => Wake::Reload(request),
            _ = self.signals.hangup.recv() => Wake::Reload(ReloadRequest::new(ReloadSource::Sighup)),
            _ = self.signals.terminate.recv() => Wake::Shutdown("SIGTERM"),
            _ = self.signals.interrupt.recv() => Wake::Shutdown("SIGINT"),
            failure = running.iteration.kernel.failed() => Wake::ComponentFailed(failure),
            () = hapwright_eventbus::sleep_until(running.restart_at) => Wake::Restart,
            () = tokio::time::sleep_until(running.recovered_at), if running.recovering => Wake::Recovered,
        }
    }

    /// Decides what a wake-up means for the running iteration (`None`: it keeps
    /// running, as it does after an invalid config or a component failure).
    async fn handle(&mut self, running: &mut Running, wake: Wake) -> Option<End> {
        match wake {
            Wake::Shutdown(why) => {
                tracing::info!(reason = why, "Shutting down");
                Some(End::Shutdown)
            }
            Wake::ComponentFailed(failure) => {
                self.component_failed(running, &failure);
                None
            }
            Wake::Recovered => {
                tracing::info!(
                    generation = running.generation,
                    "Components ran well since the last restart"
                );
                self.backoff.reset();
                self.process.store.components_recovered();
                running.recovering = false;
                None
            }
            Wake::Restart => Self::restart(running),
            Wake::Invalid(errors) => self.reload(Err(errors), None).await,
            Wake::Loaded(loaded) if loaded.hash == running.config.hash => {
                // Back to the running config after an invalid edit: clear the error.
                self.keep_config(&loaded);
                None
            }
            Wake::Loaded(loaded) => self.reload(Ok(*loaded), None).await,
            Wake::Reload(request) => self.reload_requested(running, request).await,
        }
    }

    /// A mandatory component exited: the iteration is rebuilt after the backoff's
    /// delay (unless a rebuild is already scheduled) and keeps running meanwhile.
    fn component_failed(&mut self, running: &mut Running, failure: &ComponentFailure) {
        self.process.store.component_failed(&failure.component);
        running.recovering = false;
        if running.restart_at.is_some() {
            tracing::warn!(
                component = %failure.component,
                reason = %failure.reason,
                "Mandatory component exited; a restart is already scheduled"
            );
            return;
        }
        let delay = self.backoff.next_delay(running.started.elapsed());
        self.process
            .kernel_metrics
            .record_restart(&failure.component);
        tracing::warn!(
            component = %failure.component,
            reason = %failure.reason,
            attempt = self.backoff.attempt(),
            ?delay,
            generation = running.generation,
            "Mandatory component exited; restarting the controller iteration"
        );
        running.restart_at = Some(tokio::time::Instant::now() + delay);
    }

    /// The restart delay is over: the iteration is rebuilt from its own config.
    fn restart(running: &mut Running) -> Option<End> {
        match prepare(running.config.clone()) {
            Ok(next) => Some(End::Replace(
                Box::new(next),
                "restarting after a component failure",
            )),
            Err(errors) => {
                // The running config passed these checks before; only a changed
                // template file on disk could fail them now.
                for error in &errors {
                    tracing::error!(error = %error, "Cannot rebuild the controller iteration");
                }
                running.restart_at = None;
                None
            }
        }
    }

    /// SIGHUP or `POST /-/reload`: loads the config file again. A file equal to the
    /// running config rebuilds nothing, except on SIGHUP (the operator's way to force
    /// a full re-sync).
    async fn reload_requested(&mut self, running: &Running, request: ReloadRequest) -> Option<End> {
        let source = request.source;
        tracing::info!(?source, "Reloading the controller config");
        running
            .iteration
            .kernel
            .bus()
            .publisher()
            .publish(ReloadRequested { source });
        // Reading and checking the files blocks: off the async workers.
        let path = self.config_path.clone();
        let loaded = tokio::task::spawn_blocking(move || config::load(&path))
            .await
            .unwrap_or_else(|join| {
                Err(vec![Diagnostic::error(format!(
                    "loading the config file failed: {join}"
                ))])
            });
        match loaded {
            // The file (templates are inline) equals the running config.
            Ok(loaded) if loaded.hash == running.config.hash && source != ReloadSource::Sighup => {
                tracing::info!(?source, "Controller config unchanged; nothing to reload");
                self.keep_config(&loaded);
                request.answer(ReloadOutcome::Unchanged);
                None
            }
            other => self.reload(other, Some(request)).await,
        }
    }

    /// The config on disk equals the running one: a successful reload that changes
    /// nothing.
    fn keep_config(&self, loaded: &Loaded) {
        self.process.reload_metrics.record(true);
        self.process.store.set_config(config_status(loaded));
    }

    /// Checks a new config completely and moves the listeners to it; only a config
    /// that passes both replaces the running iteration. Answers the reload request
    /// that asked for it, if one did.
    async fn reload(
        &mut self,
        loaded: Result<Loaded, Vec<Diagnostic>>,
        mut asked: Option<ReloadRequest>,
    ) -> Option<End> {
        let candidate = loaded.and_then(prepare);
        // A positive verdict goes out before the listeners move: a listener that is
        // rebound drains its connections, this request's among them.
        if candidate.is_ok()
            && let Some(request) = asked.take()
        {
            request.answer(ReloadOutcome::Accepted);
        }
        let candidate = match candidate {
            Ok(next) => self
                .move_listeners(&next.loaded.config.controller)
                .await
                .map(|()| next),
            Err(errors) => Err(errors),
        };
        match candidate {
            Ok(next) => {
                self.process.reload_metrics.record(true);
                tracing::info!(hash = %next.loaded.hash.short(), "New controller config accepted");
                Some(End::Replace(Box::new(next), "valid new config"))
            }
            Err(errors) => {
                self.process.reload_metrics.record(false);
                for error in &errors {
                    tracing::error!(error = %error, "New controller config rejected; the running one stays");
                }
                if let Some(request) = asked.take() {
                    request.answer(ReloadOutcome::Rejected(
                        errors.iter().map(ToString::to_string).collect(),
                    ));
                }
                self.process.store.config_rejected(errors);
                None
            }
        }
    }

    /// Binds the new config's listeners while the old iteration still runs: an
    /// address that cannot be bound rejects the config like any other error.
    async fn move_listeners(&mut self, wanted: &config::Controller) -> Result<(), Vec<Diagnostic>> {
        let moved = match self
            .listeners
            .ensure(
                &self.http_state,
                wanted.listen,
                wanted.metrics_listen,
                &Limits::from(&wanted.http),
            )
            .await
        {
            Ok(()) => self
                .listeners
                .ensure_webhook(webhook_listen(wanted), &self.process.webhook_slot)
                .await
                .map_err(|error| error.to_string()),
            Err(error) => Err(error.to_string()),
        };
        moved.map_err(|error| {
            vec![
                Diagnostic::error(error).at(hapwright_eventbus::model::SourceLocation::new(
                    self.config_path.display().to_string(),
                    None,
                    None,
                )),
            ]
        })
    }

    /// Releases what outlives iterations: the Lease, the managed HAProxy processes
    /// and the listeners.
    pub(super) async fn shutdown(self) {
        if let Some(election) = self.process.leader {
            // Release the Lease so a standby replica takes over without waiting for
            // it to expire.
            election.shutdown().await;
        }
        self.process.managed.stop().await;
        self.listeners.shutdown().await;
    }
}

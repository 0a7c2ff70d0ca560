//! The config-file watcher: notices changes of the config file and of every
//! `passwordFile` (through their directories, like the files source, so ConfigMap
//! and Secret volume swaps are seen), reloads and validates, and publishes
//! `ConfigLoaded` or `ConfigInvalid` (for the status page and `/debug/events`), and
//! hands the typed result to the app's reinit loop ([`ConfigChange`]).

use std::path::PathBuf;
use std::time::Duration;

use hapwright_eventbus::model::{ContentHash, Diagnostic};
use hapwright_eventbus::{Component, ComponentError, ConfigInvalid, ConfigLoaded, Context};
use hapwright_watchers::filewatch::{FileWatch, WatchOptions};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::{Loaded, load};

/// What the watcher found, for the reinit loop.
#[derive(Debug)]
pub enum ConfigChange {
    /// A valid configuration with another hash than the one before (or the running
    /// one again after an invalid spell).
    Loaded(Box<Loaded>),
    /// The files are invalid; every located error.
    Invalid(Vec<Diagnostic>),
}

/// Watches the config file and its password files.
///
/// It starts from the configuration the current iteration runs ([`Loaded`]), and
/// publishes:
/// - `ConfigLoaded` (and [`ConfigChange::Loaded`] with the typed [`Loaded`] to its
///   owner) when the files changed and the result is valid with a different hash; also
///   when the files return to the running configuration after an invalid spell, so
///   the app can clear the error (same hash: nothing to rebuild);
/// - `ConfigInvalid` (and [`ConfigChange::Invalid`]) with every located error when the
///   result is invalid (as `check` judges it: the file, then every template
///   compiled), once per distinct set of errors. The running configuration
///   stays.
///
/// The configuration types live in this crate, above the event catalogue, so the
/// events carry only the path and hash; the configuration itself travels to the reinit
/// loop, the watcher's owner, over a typed channel.
///
/// While the files on disk are invalid the component is `Unhealthy` with the first
/// error as reason.
#[derive(Debug)]
pub struct ConfigWatcher {
    changes: mpsc::UnboundedSender<ConfigChange>,
    path: PathBuf,
    files: Vec<PathBuf>,
    running: ContentHash,
    options: WatchOptions,
}

impl ConfigWatcher {
    /// Component name.
    pub const NAME: &'static str = "config-watcher";

    /// A watcher for the files of `loaded`, the configuration now running, that hands
    /// every change to `changes`.
    pub fn new(loaded: &Loaded, changes: mpsc::UnboundedSender<ConfigChange>) -> Self {
        Self {
            changes,
            path: loaded.path.clone(),
            files: loaded.watched_files.clone(),
            running: loaded.hash,
            options: WatchOptions {
                settle: Duration::from_millis(100),
                max_settle: Duration::from_secs(2),
                rescan_interval: Duration::from_secs(60),
            },
        }
    }

    /// Replaces the settle time and rescan interval.
    #[must_use]
    pub fn with_timing(mut self, settle: Duration, rescan_interval: Duration) -> Self {
        self.options.settle = settle;
        self.options.max_settle = (settle * 20).max(Duration::from_millis(200));
        self.options.rescan_interval = rescan_interval;
        self
    }
}

#[async_trait::async_trait]
impl Component for ConfigWatcher {
    fn name(&self) -> &str {
        Self::NAME
    }

    async fn run(self: Box<Self>, ctx: Context) -> Result<(), ComponentError> {
        let span = tracing::info_span!("config_watcher", path = %self.path.display());
        run(*self, ctx).instrument(span).await
    }
}

async fn run(watcher: ConfigWatcher, ctx: Context) -> Result<(), ComponentError> {
    let ConfigWatcher {
        changes,
        path,
        files,
        running,
        options,
    } = watcher;
    let mut watch = FileWatch::new(files, options)?;
    let mut current = running;
    let mut invalid: Option<Vec<Diagnostic>> = None;
    // The first pass runs right away: the files may have changed between the load
    // that produced `running` and the moment the watch was set up.
    let mut first = true;
    loop {
        if !first
            && ctx
                .cancellation_token()
                .run_until_cancelled(watch.next())
                .await
                .is_none()
        {
            return Ok(());
        }
        first = false;
        let load_path = path.clone();
        // The verdict covers everything `check` checks: a template that does not
        // compile is a rejection like a YAML error, with the same health and events.
        let outcome = tokio::task::spawn_blocking(move || {
            let loaded = load(&load_path)?;
            crate::build::renderer(&loaded.config)
                .map_err(|errors| loaded.templates_at.locate(errors))?;
            Ok(loaded)
        })
        .await?;
        match outcome {
            Ok(loaded) => {
                let recovered = invalid.take().is_some();
                if loaded.hash == current && !recovered {
                    continue;
                }
                ctx.health().healthy();
                // The controller logs the verdict (accepted or rejected) once it has
                // also bound the listen addresses.
                tracing::debug!(hash = %loaded.hash.short(), "Config file changed and passed the checks");
                current = loaded.hash;
                ctx.publisher().publish(ConfigLoaded {
                    path: path.display().to_string(),
                    hash: loaded.hash,
                });
                let _ = changes.send(ConfigChange::Loaded(Box::new(loaded)));
            }
            Err(errors) => {
                if invalid.as_ref() == Some(&errors) {
                    continue;
                }
                for error in &errors {
                    tracing::warn!(%error, "Config file is invalid; keeping the running configuration");
                }
                if let Some(first) = errors.first() {
                    let more = errors.len() - 1;
                    ctx.health().unhealthy(if more == 0 {
                        first.to_string()
                    } else {
                        format!("{first} (and {more} more)")
                    });
                }
                invalid = Some(errors.clone());
                ctx.publisher().publish(ConfigInvalid {
                    path: path.display().to_string(),
                    errors: errors.clone(),
                });
                let _ = changes.send(ConfigChange::Invalid(errors));
            }
        }
    }
}

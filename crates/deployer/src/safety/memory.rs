//! What the valve remembers: every config let through within the last
//! `confirmAfter` (the high-water mark is made of them), since when a removal has been
//! held, and where the record of a held removal is kept.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use hapwright_eventbus::model::RenderedConfig;
use tokio::time::Instant;

use super::record::{self, ValveRecord};
use super::{Footprint, keep};
use crate::haproxy::config::Config as Model;

/// A config the valve let through: the render, its parsed model and its footprint.
#[derive(Clone, Debug)]
pub struct Released {
    /// The rendered config.
    pub config: Arc<RenderedConfig>,
    /// Its parsed `haproxy.cfg`.
    pub model: Arc<Model>,
    /// What it serves.
    pub footprint: Arc<Footprint>,
}

impl Released {
    /// `config` with its model, measured.
    pub fn new(config: Arc<RenderedConfig>, model: Arc<Model>) -> Self {
        let footprint = Arc::new(Footprint::of(&config, &model));
        Self {
            config,
            model,
            footprint,
        }
    }
}

/// What a render is measured against: the largest footprint let through within the
/// window, and the configs it is made of (newest first), from which a held removal's
/// items are kept.
#[derive(Clone, Debug)]
pub struct HighWater {
    /// Every backend and map of the configs, each with its largest count.
    pub footprint: Footprint,
    /// The configs let through within the window, newest (the running one) first.
    pub sources: Vec<Released>,
}

struct Entry {
    released: Released,
    /// When a later config replaced it; `None` for the running one.
    replaced_at: Option<Instant>,
}

/// What the valve remembers across controller config reloads and, while a removal
/// is held, across restarts (see [`ValveRecord`]). Kept by the process, so a reload of
/// hapwright's own config does not make the next render an "initial" one that is never
/// held.
#[derive(Clone, Default)]
pub struct Memory {
    inner: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("Memory")
            .field("window", &state.window.len())
            .field("held_since", &state.held_since)
            .field("record_dirs", &state.record_dirs)
            .finish()
    }
}

#[derive(Default)]
struct State {
    /// Oldest first; the last one runs.
    window: Vec<Entry>,
    held_since: Option<(Instant, SystemTime)>,
    /// Config directories the record of a held removal is written to.
    record_dirs: Vec<PathBuf>,
    /// Whether the record was looked for (once per process).
    record_loaded: bool,
    /// Whether a record is on disk (so ending a hold removes it).
    record_written: bool,
}

impl Memory {
    /// Empty: the first render is never held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps the record of a held removal in `dirs` (the config directories of the
    /// socket instances). The first call of the process reads the record back: a
    /// removal held before a restart is measured against the same footprint and keeps
    /// its start. Errors reading or writing the record are logged; the valve then works
    /// from memory as before.
    pub fn keep_in(&self, dirs: Vec<PathBuf>) {
        let mut state = self.lock();
        state.record_dirs = dirs;
        if state.record_loaded {
            return;
        }
        state.record_loaded = true;
        let Some(found) = record::read_newest(&state.record_dirs) else {
            return;
        };
        let ValveRecord {
            held_since,
            baseline,
            ..
        } = found;
        let config = Arc::new(baseline.into_config());
        let model = Arc::new(crate::haproxy::config::parse_lenient(config.main()).0);
        let released = Released::new(config, model);
        let age = SystemTime::now()
            .duration_since(held_since)
            .unwrap_or_default();
        let now = Instant::now();
        let since = now.checked_sub(age).unwrap_or(now);
        tracing::warn!(
            backends = released.footprint.backends(),
            servers = released.footprint.servers(),
            map_entries = released.footprint.map_entries(),
            held_for = ?age,
            "Safety valve: a removal held before the restart stays held"
        );
        state.window = vec![Entry {
            released,
            replaced_at: None,
        }];
        state.held_since = Some((since, held_since));
        state.record_written = true;
    }

    /// The high-water mark over the configs that ran within the last `window`, or
    /// `None` when nothing was let through yet. Configs replaced longer ago are
    /// forgotten.
    pub fn high_water(&self, window: Duration) -> Option<HighWater> {
        let mut state = self.lock();
        let now = Instant::now();
        state.window.retain(|entry| {
            entry
                .replaced_at
                .is_none_or(|at| now.duration_since(at) < window)
        });
        if state.window.is_empty() {
            return None;
        }
        let sources: Vec<Released> = state
            .window
            .iter()
            .rev()
            .map(|entry| entry.released.clone())
            .collect();
        let footprint = Footprint::high_water(sources.iter().map(|r| r.footprint.as_ref()));
        Some(HighWater { footprint, sources })
    }

    /// How many configs the window holds.
    pub fn window_len(&self) -> usize {
        self.lock().window.len()
    }

    /// Records a config let through: it runs from now on, the one before was replaced
    /// now.
    pub fn released(&self, released: Released) {
        let mut state = self.lock();
        let now = Instant::now();
        if let Some(last) = state.window.last_mut() {
            last.replaced_at = Some(now);
        }
        // A config the new one covers adds nothing to the mark, and would leave the
        // window before it: forgotten now, so a steady stream of renders keeps one.
        state
            .window
            .retain(|entry| !released.footprint.covers(&entry.released.footprint));
        state.window.push(Entry {
            released,
            replaced_at: None,
        });
        self.persist(&mut state);
    }

    /// Records a config let through that ends a hold by going out itself (confirmed,
    /// approved, or the valve turned off): what ran before is forgotten, so the removal
    /// it makes is not measured again.
    pub fn released_over(&self, released: Released) {
        let mut state = self.lock();
        state.window = vec![Entry {
            released,
            replaced_at: None,
        }];
        state.held_since = None;
        self.persist(&mut state);
    }

    /// Since when a removal has been held, if one is.
    pub fn held_since(&self) -> Option<(Instant, SystemTime)> {
        self.lock().held_since
    }

    /// Records the start of a hold (kept when one is running) and writes the record;
    /// returns the start.
    pub fn hold(&self) -> (Instant, SystemTime) {
        let mut state = self.lock();
        if let Some(since) = state.held_since {
            return since;
        }
        let since = (Instant::now(), SystemTime::now());
        state.held_since = Some(since);
        self.persist(&mut state);
        since
    }

    /// Ends a hold without forgetting the window (the sources came back).
    pub fn end_hold(&self) {
        let mut state = self.lock();
        state.held_since = None;
        self.persist(&mut state);
    }

    /// Writes the record while a removal is held, removes it otherwise.
    fn persist(&self, state: &mut State) {
        match state.held_since {
            Some((_, since)) => {
                let sources: Vec<&Released> =
                    state.window.iter().rev().map(|e| &e.released).collect();
                let Some((newest, older)) = sources.split_first() else {
                    return;
                };
                let baseline = keep::fold(newest, older);
                let record = ValveRecord::new(since, &baseline);
                record::write_all(&state.record_dirs, &record);
                state.record_written = true;
            }
            None if state.record_written => {
                record::remove_all(&state.record_dirs);
                state.record_written = false;
            }
            None => {}
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

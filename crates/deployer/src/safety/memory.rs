//! What the valve remembers: every config let through within the last
//! `confirmAfter` (the high-water mark is made of them), since when a removal has been
//! held, and where the record of a held removal is kept.

use std::collections::VecDeque;
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
    pub footprint: Arc<Footprint>,
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
    /// The high-water mark of every config let through within the window (those
    /// `window` forgot as covered by a later one too, which change nothing in it),
    /// kept as configs come and go.
    mark: MarkQueue,
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
        state.mark = MarkQueue::of(&released.footprint);
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
        let expired = |at: Option<Instant>| at.is_some_and(|at| now.duration_since(at) >= window);
        state.window.retain(|entry| !expired(entry.replaced_at));
        state.mark.forget(expired);
        if state.window.is_empty() {
            return None;
        }
        let sources: Vec<Released> = state
            .window
            .iter()
            .rev()
            .map(|entry| entry.released.clone())
            .collect();
        let footprint = state.mark.high();
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
        if released.footprint.covers(&state.mark.high()) {
            // It covers every config of the window: the mark is its own, and the
            // others would leave the window before it.
            state.mark = MarkQueue::of(&released.footprint);
            state.window.clear();
        } else {
            state.mark.push(&released.footprint, now);
            // The config it replaces, when the new one covers it, adds nothing to
            // the mark and would leave the window before it: forgotten now. (Only
            // that one is compared: each comparison walks every backend.)
            if state
                .window
                .last()
                .is_some_and(|last| released.footprint.covers(&last.released.footprint))
            {
                state.window.pop();
            }
        }
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
        state.mark = MarkQueue::of(&released.footprint);
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

/// The high-water mark of a window of footprints that come in at one end and leave
/// at the other, as two stacks: the older part with, for each footprint, the mark of
/// it and every newer one of that part, and the newer part with the mark of all of
/// it. A footprint comes in with one merge and leaves with none, besides one merge
/// per footprint when the older part runs out, so a long window (a route added and
/// removed again every few seconds, each leaving a config the next does not cover)
/// costs a few merges per render, not one per config in it.
#[derive(Debug, Default)]
struct MarkQueue {
    /// When each footprint, oldest first, was replaced (`None`: it runs).
    replaced: VecDeque<Option<Instant>>,
    /// The older part, the oldest last: each footprint's mark with the ones before
    /// it in the vector.
    older: Vec<Arc<Footprint>>,
    /// The newer part's footprints, the newest last, and their mark.
    newer: Vec<Arc<Footprint>>,
    newer_mark: Option<Arc<Footprint>>,
    /// The mark of the whole window, once asked for, until it changes.
    high: std::sync::OnceLock<Arc<Footprint>>,
}

impl MarkQueue {
    /// A window of one footprint.
    fn of(footprint: &Arc<Footprint>) -> Self {
        let mut queue = Self::default();
        queue.replaced.push_back(None);
        queue.newer.push(Arc::clone(footprint));
        queue.newer_mark = Some(Arc::clone(footprint));
        queue.high = std::sync::OnceLock::from(Arc::clone(footprint));
        queue
    }

    /// `footprint` runs from `now` on; the one before it was replaced now.
    fn push(&mut self, footprint: &Arc<Footprint>, now: Instant) {
        self.high = std::sync::OnceLock::new();
        if let Some(last) = self.replaced.back_mut() {
            *last = Some(now);
        }
        self.replaced.push_back(None);
        self.newer_mark = Some(match self.newer_mark.take() {
            Some(mark) => Arc::new(Footprint::high_water([mark.as_ref(), footprint.as_ref()])),
            None => Arc::clone(footprint),
        });
        self.newer.push(Arc::clone(footprint));
    }

    /// Forgets the oldest footprints while `expired` says so of when they were
    /// replaced (the one running never is).
    fn forget(&mut self, expired: impl Fn(Option<Instant>) -> bool) {
        while self.replaced.len() > 1 && self.replaced.front().is_some_and(|at| expired(*at)) {
            self.high = std::sync::OnceLock::new();
            self.replaced.pop_front();
            if self.older.is_empty() {
                // The newer part becomes the older one, each footprint with its
                // mark of those newer than it.
                let mut mark: Option<Arc<Footprint>> = None;
                for footprint in self.newer.drain(..).rev() {
                    let merged = match &mark {
                        Some(mark) => {
                            Arc::new(Footprint::high_water([mark.as_ref(), footprint.as_ref()]))
                        }
                        None => footprint,
                    };
                    self.older.push(Arc::clone(&merged));
                    mark = Some(merged);
                }
                self.newer_mark = None;
            }
            self.older.pop();
        }
    }

    /// The high-water mark of the window.
    fn high(&self) -> Arc<Footprint> {
        Arc::clone(self.high.get_or_init(|| {
            let marks = self.older.last().into_iter().chain(&self.newer_mark);
            Arc::new(Footprint::high_water(marks.map(Arc::as_ref)))
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use proptest::prelude::*;
    use tokio::time::Instant;

    use super::{Footprint, MarkQueue};

    fn footprint(backends: &BTreeMap<u8, u8>, entries: u8) -> Arc<Footprint> {
        Arc::new(Footprint {
            backends: backends
                .iter()
                .map(|(name, servers)| (format!("be_{name}"), usize::from(*servers)))
                .collect(),
            maps: [("hosts.map".to_owned(), usize::from(entries))].into(),
        })
    }

    proptest! {
        /// After every step of random releases and waits, the queue's mark is the
        /// mark of every footprint released within the window, built whole.
        #[test]
        fn the_queue_keeps_the_mark_of_the_window(
            steps in prop::collection::vec(
                (prop::collection::btree_map(0u8..12, 0u8..4, 0..8), 0u8..6, 0u64..40),
                1..60,
            ),
        ) {
            let window = Duration::from_millis(50);
            let start = Instant::now();
            let mut queue = MarkQueue::default();
            // Every footprint released, with when it was replaced.
            let mut plain: Vec<(Arc<Footprint>, Option<Instant>)> = Vec::new();
            let mut now = start;
            for (backends, entries, wait) in steps {
                now += Duration::from_millis(wait);
                let expired = |at: Option<Instant>| at.is_some_and(|at| now.duration_since(at) >= window);
                queue.forget(expired);
                plain.retain(|(_, at)| !expired(*at));
                let expected = Footprint::high_water(plain.iter().map(|(f, _)| f.as_ref()));
                let high = queue.high();
                prop_assert_eq!(high.as_ref(), &expected);
                let released = footprint(&backends, entries);
                if let Some(last) = plain.last_mut() {
                    last.1 = Some(now);
                }
                plain.push((Arc::clone(&released), None));
                queue.push(&released, now);
                let expected = Footprint::high_water(plain.iter().map(|(f, _)| f.as_ref()));
                let high = queue.high();
                prop_assert_eq!(high.as_ref(), &expected);
            }
        }
    }
}

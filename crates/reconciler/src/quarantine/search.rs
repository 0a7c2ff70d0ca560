//! The bounded culprit search: which of the changes since the last good state make a
//! candidate fail, and which largest set of them still validates.
//!
//! The search knows nothing about templates or HAProxy: a change is an index
//! `0..n`, and a [`Probe`] says whether the last good state with a given set of
//! changes applied validates. The caller wires a probe to the real render and
//! validation steps (or, in tests, to a fake).
//!
//! # Algorithm
//!
//! Adaptive bisection over the changed set, accumulating what passes:
//!
//! 1. The baseline (no change applied: the last good objects) is probed unless the
//!    caller knows it validates. When it fails, the error does not depend on the
//!    changed objects (a template bug, an environment problem) and the search gives
//!    up: [`Outcome::Rejected`] with [`Rejection::BaselineFails`].
//! 2. A group of changes is probed together with everything accepted so far. If it
//!    passes, the whole group is accepted. If it fails and holds one change, that
//!    change is a culprit. Otherwise it is split in halves, and the left half is
//!    searched first. When the left half turned out clean, the right half together
//!    with the accepted changes is exactly the group that just failed, so it is not
//!    probed again but split at once.
//! 3. After each culprit, the changes still pending are probed together, once: with
//!    a single culprit (the common case) they pass and the search ends.
//! 4. When every change turned out a culprit and the baseline was not probed (the
//!    caller knew it validated), it is probed now: a failure that every change hits
//!    may be the environment's (a server name that no longer resolves) and not the
//!    objects'. When the baseline fails too, the search gives up with
//!    [`Rejection::BaselineFails`]; when it passes, every change is a culprit and
//!    the baseline's output is returned.
//!
//! The accepted set only ever grows by a probe that passed with exactly the new
//! accepted set, so the set the search returns is one that validated (its probe
//! output is returned with it). Culprits that only fail together (A and B each fine,
//! A+B not) are handled the same way: the one tried after the other was accepted is
//! the culprit.
//!
//! There is no rule on how many changes may fail: one bad object beside one good
//! change is isolated like one among fifty, and so are two bad objects beside one
//! good change. A template bug that every new object hits is still told apart from a
//! bad object: either the baseline, rendered with the new templates, fails (step 1
//! or 4), or every object fails on its own and each is a culprit, reported with its
//! error, while the last good state keeps serving.
//!
//! # Bound
//!
//! At most `max_probes` probes per search, the baseline included. One culprit among
//! `n` changes costs about `log2(n)` probes; `k` culprits about `k·(log2(n) + 1)`.
//! When the bound is hit, the search gives up ([`Rejection::BoundReached`]) and the
//! caller falls back to rejecting the whole change, as without quarantine.

use std::future::Future;

/// Says whether the last good state with a set of changes applied validates.
///
/// `applied` lists change indexes in ascending order. `Output` is what a passing
/// probe produced (the rendered and validated config), `Error` why a probe failed.
pub trait Probe {
    /// What a passing probe produced.
    type Output;
    /// Why a probe failed.
    type Error;

    /// Tries the last good state plus the changes in `applied`.
    fn probe(
        &mut self,
        applied: &[usize],
    ) -> impl Future<Output = Result<Self::Output, Self::Error>>;

    /// True when `error` says nothing about the objects (the validating tool itself
    /// failed: missing binary, timeout): the search then stops at once.
    fn is_tool_failure(&self, error: &Self::Error) -> bool {
        let _ = error;
        false
    }
}

/// Why the search gave up: the caller rejects the whole change, as without
/// quarantine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The baseline (no change applied) fails too: the error does not depend on the
    /// changed objects.
    BaselineFails,
    /// The search needed more probes than allowed.
    BoundReached,
    /// There were no changes to search (the failing state equals the last good one).
    NothingChanged,
    /// A probe failed for a reason unrelated to the objects (see
    /// [`Probe::is_tool_failure`]).
    ToolFailure,
}

impl Rejection {
    /// A short, stable name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BaselineFails => "baseline_fails",
            Self::BoundReached => "bound_reached",
            Self::NothingChanged => "nothing_changed",
            Self::ToolFailure => "tool_failure",
        }
    }
}

/// The result of a search.
#[derive(Debug)]
pub enum Outcome<O, E> {
    /// The culprits were isolated.
    Found {
        /// The changes that validate together, ascending.
        accepted: Vec<usize>,
        /// What the probe of exactly `accepted` produced (the baseline's when nothing
        /// was accepted: it is always probed then).
        output: Option<O>,
        /// Each culprit with the error of the probe that singled it out, ascending.
        culprits: Vec<(usize, E)>,
        /// Probes made.
        probes: usize,
    },
    /// The search gave up; reject the whole change.
    Rejected {
        /// Why.
        reason: Rejection,
        /// Probes made.
        probes: usize,
        /// The error of the probe that made the search give up: the baseline's
        /// for [`Rejection::BaselineFails`], the tool's for
        /// [`Rejection::ToolFailure`]; `None` otherwise.
        error: Option<E>,
    },
}

/// Search settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Most probes one search may make, the baseline included.
    pub max_probes: usize,
    /// The baseline is known to validate (the last good state was validated with the
    /// same templates), so it is not probed.
    pub baseline_valid: bool,
}

/// A unit of pending work.
enum Task<E> {
    /// Probe `items` with the accepted changes.
    Group { items: Vec<usize> },
    /// After the left half of a split: search `right`. When the left half brought no
    /// culprit (`culprits_before` culprits were known before it), `right` with the
    /// accepted changes is the group that failed with `error`, so it is not probed
    /// again.
    Right {
        items: Vec<usize>,
        culprits_before: usize,
        error: Option<E>,
    },
}

/// Finds the culprits among `changes` changes (indexes `0..changes`) whose full set
/// is known to fail (with `error`, when the caller has it). See the
/// [module docs](self).
pub async fn search<P: Probe>(
    probe: &mut P,
    changes: usize,
    error: Option<P::Error>,
    settings: Settings,
) -> Outcome<P::Output, P::Error> {
    search_with_suspects(probe, changes, error, settings, &[]).await
}

/// [`search`], starting from a guess: `suspects` are the changes the error most
/// likely comes from (see [`super::hints`]). The first split puts every other change
/// on the left, so a right guess of one culprit costs two probes (the others
/// together, then the suspect alone for its own error) instead of about `log2(n)`;
/// a wrong guess costs one probe more than no guess, after which the search goes on
/// by halves. Suspects out of range, or a guess of half the changes or more, are
/// ignored.
pub async fn search_with_suspects<P: Probe>(
    probe: &mut P,
    changes: usize,
    error: Option<P::Error>,
    settings: Settings,
    suspects: &[usize],
) -> Outcome<P::Output, P::Error> {
    search_with_units(probe, changes, error, settings, suspects, &[]).await
}

/// [`search_with_suspects`] where the changes at `units` are whole payloads (an
/// `http` source's download). A payload is one change like any object: accepted or
/// held back whole, never item by item, so a failing download goes back to its last
/// accepted version while the other changes go on, even when it is one of only two
/// changes. `units` must be in range; they are searched like the other changes.
pub async fn search_with_units<P: Probe>(
    probe: &mut P,
    changes: usize,
    error: Option<P::Error>,
    settings: Settings,
    suspects: &[usize],
    units: &[usize],
) -> Outcome<P::Output, P::Error> {
    let mut suspects: Vec<usize> = suspects.iter().copied().filter(|i| *i < changes).collect();
    suspects.sort_unstable();
    suspects.dedup();
    if suspects.len() * 2 >= changes {
        suspects.clear();
    }
    // The others first, then the suspects; the first split falls between them.
    let mut first_split = (!suspects.is_empty()).then_some(changes - suspects.len());
    let order: Vec<usize> = (0..changes)
        .filter(|i| suspects.binary_search(i).is_err())
        .chain(suspects.iter().copied())
        .collect();
    let mut probes = 0;
    if changes == 0 {
        return Outcome::Rejected {
            reason: Rejection::NothingChanged,
            probes,
            error: None,
        };
    }
    let mut output = None;
    if !settings.baseline_valid {
        match probe_baseline(probe, settings, &mut probes).await {
            Ok(baseline) => output = Some(baseline),
            Err(rejected) => return rejected,
        }
    }
    let mut accepted: Vec<usize> = Vec::new();
    let mut culprits: Vec<(usize, P::Error)> = Vec::new();
    let mut stack = vec![Task::Right {
        items: order,
        culprits_before: 0,
        error,
    }];
    while let Some(task) = stack.pop() {
        // `failed`: the group with the accepted changes is known to fail, with this
        // error if it is at hand.
        let (items, failed) = match task {
            Task::Group { items } => (items, None),
            Task::Right {
                items,
                culprits_before,
                error,
            } if culprits.len() == culprits_before => (items, Some(error)),
            Task::Right { items, .. } => (items, None),
        };
        let error = match failed {
            Some(Some(error)) => Some(error),
            // Known to fail, but a single change still needs its own error.
            Some(None) if items.len() > 1 => None,
            _ => {
                if probes >= settings.max_probes {
                    return Outcome::Rejected {
                        reason: Rejection::BoundReached,
                        probes,
                        error: None,
                    };
                }
                probes += 1;
                let candidate = merged(&accepted, &items);
                match probe.probe(&candidate).await {
                    Ok(passed) => {
                        accepted = candidate;
                        output = Some(passed);
                        continue;
                    }
                    Err(failed) if probe.is_tool_failure(&failed) => {
                        return Outcome::Rejected {
                            reason: Rejection::ToolFailure,
                            probes,
                            error: Some(failed),
                        };
                    }
                    Err(failed) => Some(failed),
                }
            }
        };
        if let [culprit] = items[..] {
            if let Some(error) = error {
                culprits.push((culprit, error));
            }
            // Optimistic: most likely the rest of the changes are fine, so try all of
            // them at once before going on splitting.
            if stack.len() > 1 {
                let mut rest: Vec<usize> = stack
                    .drain(..)
                    .flat_map(|task| match task {
                        Task::Group { items } | Task::Right { items, .. } => items,
                    })
                    .collect();
                rest.sort_unstable();
                stack.push(Task::Group { items: rest });
            }
            continue;
        }
        let mid = first_split.take().unwrap_or(items.len() / 2);
        let (left, right) = items.split_at(mid);
        stack.push(Task::Right {
            items: right.to_vec(),
            culprits_before: culprits.len(),
            error,
        });
        stack.push(Task::Group {
            items: left.to_vec(),
        });
    }
    debug_assert!(units.iter().all(|unit| *unit < changes), "units in range");
    if accepted.is_empty() && output.is_none() {
        // Every change failed on its own and the baseline was taken on trust: make
        // sure the failure is the changes' and not the environment's.
        match probe_baseline(probe, settings, &mut probes).await {
            Ok(baseline) => output = Some(baseline),
            Err(rejected) => return rejected,
        }
    }
    culprits.sort_by_key(|(index, _)| *index);
    Outcome::Found {
        accepted,
        output,
        culprits,
        probes,
    }
}

/// The union of two ascending index lists, ascending.
/// Probes the last good state alone (counted in `probes`, within the bound): its
/// output, or the rejection to return when it fails (the failure does not depend
/// on the changes) or the bound is reached.
async fn probe_baseline<P: Probe>(
    probe: &mut P,
    settings: Settings,
    probes: &mut usize,
) -> Result<P::Output, Outcome<P::Output, P::Error>> {
    if *probes >= settings.max_probes {
        return Err(Outcome::Rejected {
            reason: Rejection::BoundReached,
            probes: *probes,
            error: None,
        });
    }
    *probes += 1;
    probe.probe(&[]).await.map_err(|error| {
        let reason = if probe.is_tool_failure(&error) {
            Rejection::ToolFailure
        } else {
            Rejection::BaselineFails
        };
        Outcome::Rejected {
            reason,
            probes: *probes,
            error: Some(error),
        }
    })
}

fn merged(a: &[usize], b: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    out.extend_from_slice(a);
    out.extend_from_slice(b);
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests;

use std::collections::BTreeSet;

use super::*;

/// A fake validator: a set of changes fails when it contains a bad change, or both
/// changes of an interacting pair, or always when `broken` (a template bug).
#[derive(Clone, Debug, Default)]
struct Fake {
    bad: BTreeSet<usize>,
    pairs: Vec<(usize, usize)>,
    broken: bool,
    probes: usize,
}

impl Fake {
    fn valid(&self, applied: &[usize]) -> bool {
        let set: BTreeSet<usize> = applied.iter().copied().collect();
        !self.broken
            && self.bad.is_disjoint(&set)
            && !self
                .pairs
                .iter()
                .any(|(a, b)| set.contains(a) && set.contains(b))
    }
}

impl Probe for Fake {
    type Output = Vec<usize>;
    type Error = String;

    async fn probe(&mut self, applied: &[usize]) -> Result<Vec<usize>, String> {
        assert!(
            applied.windows(2).all(|w| w[0] < w[1]),
            "applied changes are ascending and distinct: {applied:?}"
        );
        self.probes += 1;
        if self.valid(applied) {
            Ok(applied.to_vec())
        } else {
            Err(format!("fails with {applied:?}"))
        }
    }
}

fn run(fake: &mut Fake, changes: usize, settings: Settings) -> Outcome<Vec<usize>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(search(fake, changes, None, settings))
}

const BOUNDED: Settings = Settings {
    max_probes: 16,
    baseline_valid: true,
};

/// A small deterministic generator, so a failing case can be replayed by its seed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn one_bad_change_among_fifty_one_is_isolated_in_a_few_probes() {
    let mut max = 0;
    for bad in 0..51 {
        let mut fake = Fake {
            bad: BTreeSet::from([bad]),
            ..Fake::default()
        };
        let Outcome::Found {
            accepted,
            output,
            culprits,
            probes,
        } = run(&mut fake, 51, BOUNDED)
        else {
            panic!("bad change {bad}: the search gave up");
        };
        let expected: Vec<usize> = (0..51).filter(|i| *i != bad).collect();
        assert_eq!(accepted, expected, "bad change {bad}");
        assert_eq!(output, Some(expected), "the output is the accepted set's");
        assert_eq!(culprits.len(), 1);
        assert_eq!(culprits[0].0, bad);
        assert!(
            culprits[0].1.contains(&bad.to_string()),
            "the culprit's error comes from a probe that included it: {}",
            culprits[0].1
        );
        // Bisection: one probe per level of a 51-wide split (6 levels), plus one
        // for the rest once the culprit is known.
        assert!(probes <= 7, "bad change {bad}: {probes} probes");
        max = max.max(probes);
        assert_eq!(probes, fake.probes);
    }
    eprintln!("most probes for one culprit among 51: {max}");
}

#[test]
fn a_broken_template_is_rejected_after_one_probe() {
    let mut fake = Fake {
        broken: true,
        ..Fake::default()
    };
    let settings = Settings {
        max_probes: 16,
        baseline_valid: false,
    };
    let outcome = run(&mut fake, 1000, settings);
    assert!(
        matches!(
            outcome,
            Outcome::Rejected {
                reason: Rejection::BaselineFails,
                probes: 1,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(fake.probes, 1);
}

/// The culprit indexes of a search that found some, or the reason it gave up.
fn verdict(outcome: &Outcome<Vec<usize>, String>) -> Result<(Vec<usize>, Vec<usize>), Rejection> {
    match outcome {
        Outcome::Found {
            accepted, culprits, ..
        } => Ok((accepted.clone(), culprits.iter().map(|(i, _)| *i).collect())),
        Outcome::Rejected { reason, .. } => Err(*reason),
    }
}

#[test]
fn one_bad_object_beside_one_good_change_is_isolated() {
    for bad in 0..2 {
        for baseline_valid in [true, false] {
            let mut fake = Fake {
                bad: BTreeSet::from([bad]),
                ..Fake::default()
            };
            let settings = Settings {
                max_probes: 16,
                baseline_valid,
            };
            let outcome = run(&mut fake, 2, settings);
            let good = 1 - bad;
            assert_eq!(
                verdict(&outcome),
                Ok((vec![good], vec![bad])),
                "bad {bad}, baseline valid {baseline_valid}: {outcome:?}"
            );
            let Outcome::Found { output, probes, .. } = outcome else {
                unreachable!()
            };
            assert_eq!(output, Some(vec![good]), "the good change's render");
            // Each change once (the bad one for its own error), plus the baseline
            // when it was not known to validate.
            assert_eq!(probes, 2 + usize::from(!baseline_valid));
        }
    }
}

#[test]
fn one_bad_object_alone_is_its_own_culprit_once_the_baseline_validates() {
    let mut fake = Fake {
        bad: BTreeSet::from([0]),
        ..Fake::default()
    };
    let outcome = run(&mut fake, 1, BOUNDED);
    assert_eq!(verdict(&outcome), Ok((vec![], vec![0])), "{outcome:?}");
    let Outcome::Found { output, probes, .. } = outcome else {
        unreachable!()
    };
    assert_eq!(output, Some(vec![]), "the baseline's render goes on");
    assert_eq!(probes, 2, "the change for its own error, then the baseline");
}

#[test]
fn two_bad_objects_beside_one_good_change_are_isolated() {
    for good in 0..3 {
        let mut fake = Fake {
            bad: (0..3).filter(|i| *i != good).collect(),
            ..Fake::default()
        };
        let outcome = run(&mut fake, 3, BOUNDED);
        let bad: Vec<usize> = (0..3).filter(|i| *i != good).collect();
        assert_eq!(
            verdict(&outcome),
            Ok((vec![good], bad)),
            "good {good}: {outcome:?}"
        );
    }
}

#[test]
fn every_change_failing_because_of_the_templates_gives_up_and_says_so() {
    // A template bug that every render hits, the last good objects included: with
    // the baseline known to validate (it is not, any more), every change fails on
    // its own, and the baseline probed at the end fails too.
    let mut fake = Fake {
        broken: true,
        ..Fake::default()
    };
    let outcome = run(&mut fake, 3, BOUNDED);
    assert_eq!(
        verdict(&outcome),
        Err(Rejection::BaselineFails),
        "{outcome:?}"
    );
    let Outcome::Rejected { error, probes, .. } = &outcome else {
        unreachable!()
    };
    assert_eq!(
        error.as_deref(),
        Some("fails with []"),
        "the baseline's own error is reported"
    );
    assert_eq!(*probes, fake.probes);
    assert_eq!(Rejection::BaselineFails.as_str(), "baseline_fails");
    // Probed first when not known to validate: one probe.
    let mut fake = Fake {
        broken: true,
        ..Fake::default()
    };
    let settings = Settings {
        max_probes: 16,
        baseline_valid: false,
    };
    let outcome = run(&mut fake, 2, settings);
    assert!(
        matches!(
            outcome,
            Outcome::Rejected {
                reason: Rejection::BaselineFails,
                probes: 1,
                ..
            }
        ),
        "{outcome:?}"
    );
}

#[test]
fn every_object_failing_on_its_own_is_quarantined_one_by_one() {
    // A template bug that only the new objects hit (a snippet included once per
    // service): the baseline validates, every object fails, each is a culprit.
    let mut fake = Fake {
        bad: BTreeSet::from([0, 1, 2, 3]),
        ..Fake::default()
    };
    let outcome = run(&mut fake, 4, BOUNDED);
    assert_eq!(
        verdict(&outcome),
        Ok((vec![], vec![0, 1, 2, 3])),
        "{outcome:?}"
    );
}

#[test]
fn the_bound_is_never_exceeded_and_gives_up_cleanly() {
    // 20 independent culprits among 1000 need far more than 16 probes.
    let mut fake = Fake {
        bad: (0..1000).step_by(50).collect(),
        ..Fake::default()
    };
    let outcome = run(&mut fake, 1000, BOUNDED);
    assert!(
        matches!(
            outcome,
            Outcome::Rejected {
                reason: Rejection::BoundReached,
                probes: 16,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(fake.probes, 16);
}

#[test]
fn a_bad_object_among_a_thousand_at_start_up_leaves_the_rest() {
    // The initial sync: the last good state is empty and has not been validated.
    let mut fake = Fake {
        bad: BTreeSet::from([617]),
        ..Fake::default()
    };
    let settings = Settings {
        max_probes: 16,
        baseline_valid: false,
    };
    let Outcome::Found {
        accepted, culprits, ..
    } = run(&mut fake, 1000, settings)
    else {
        panic!("the search gave up");
    };
    assert_eq!(accepted.len(), 999);
    assert_eq!(culprits.iter().map(|c| c.0).collect::<Vec<_>>(), [617]);
}

#[test]
fn random_culprits_and_interactions_always_deploy_a_valid_maximal_set() {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut found = 0;
    for case in 0..3000 {
        let changes = 1 + rng.below(200);
        let mut fake = Fake::default();
        for _ in 0..rng.below(4) {
            fake.bad.insert(rng.below(changes));
        }
        for _ in 0..rng.below(3) {
            let (a, b) = (rng.below(changes), rng.below(changes));
            if a != b {
                fake.pairs.push((a, b));
            }
        }
        fake.broken = rng.below(50) == 0;
        let settings = Settings {
            max_probes: 1 + rng.below(40),
            baseline_valid: rng.below(2) == 0 && !fake.broken,
        };
        let all_fail = !fake.valid(&(0..changes).collect::<Vec<_>>());
        if !all_fail {
            // The search is only started for a failing change set.
            continue;
        }
        let outcome = run(&mut fake, changes, settings);
        assert!(
            fake.probes <= settings.max_probes,
            "case {case}: {} probes over a bound of {}",
            fake.probes,
            settings.max_probes
        );
        match outcome {
            Outcome::Found {
                accepted,
                output,
                culprits,
                probes,
            } => {
                found += 1;
                assert_eq!(probes, fake.probes, "case {case}");
                assert!(fake.valid(&accepted), "case {case}: deployed set fails");
                assert_eq!(output.as_ref(), Some(&accepted), "case {case}");
                let culprit_set: BTreeSet<usize> = culprits.iter().map(|c| c.0).collect();
                let accepted_set: BTreeSet<usize> = accepted.iter().copied().collect();
                assert!(culprit_set.is_disjoint(&accepted_set), "case {case}");
                assert_eq!(
                    culprit_set.len() + accepted_set.len(),
                    changes,
                    "case {case}: every change is accepted or a culprit"
                );
                for culprit in &culprit_set {
                    let mut with = accepted.clone();
                    with.push(*culprit);
                    with.sort_unstable();
                    assert!(
                        !fake.valid(&with),
                        "case {case}: culprit {culprit} would have validated"
                    );
                }
                if fake.pairs.is_empty() {
                    assert_eq!(culprit_set, fake.bad, "case {case}");
                }
            }
            Outcome::Rejected { reason, probes, .. } => {
                assert_eq!(probes, fake.probes, "case {case}");
                match reason {
                    Rejection::BaselineFails => assert!(fake.broken, "case {case}"),
                    Rejection::BoundReached => assert_eq!(probes, settings.max_probes),
                    Rejection::NothingChanged | Rejection::ToolFailure => {
                        panic!("case {case}: unexpected {reason:?}")
                    }
                }
            }
        }
    }
    assert!(found > 500, "only {found} searches found culprits");
}

#[test]
fn suspects_change_the_probes_never_the_result() {
    // Random culprits and random guesses (right, wrong, partly right): the outcome
    // is the same as without a guess; a right guess of one culprit costs two probes.
    let mut rng = XorShift(0x5eed_cafe);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    for case in 0..2_000 {
        let changes = 2 + rng.below(60);
        let bad: BTreeSet<usize> = (0..1 + rng.below(3)).map(|_| rng.below(changes)).collect();
        let suspects: Vec<usize> = match case % 3 {
            0 => bad.iter().copied().collect(),
            1 => (0..1 + rng.below(3)).map(|_| rng.below(changes)).collect(),
            _ => Vec::new(),
        };
        let mut plain = Fake {
            bad: bad.clone(),
            ..Fake::default()
        };
        let mut guided = plain.clone();
        let expected = runtime.block_on(search(&mut plain, changes, None, BOUNDED));
        let got = runtime.block_on(search_with_suspects(
            &mut guided,
            changes,
            None,
            BOUNDED,
            &suspects,
        ));
        match (&expected, &got) {
            (
                Outcome::Found {
                    accepted: a,
                    culprits: c,
                    ..
                },
                Outcome::Found {
                    accepted: b,
                    culprits: d,
                    probes,
                    ..
                },
            ) => {
                assert_eq!(a, b, "case {case}: accepted");
                let c: Vec<usize> = c.iter().map(|(i, _)| *i).collect();
                let d: Vec<usize> = d.iter().map(|(i, _)| *i).collect();
                assert_eq!(c, d, "case {case}: culprits");
                if bad.len() == 1 && suspects == bad.iter().copied().collect::<Vec<_>>() {
                    assert_eq!(*probes, 2, "case {case}: a right guess");
                }
            }
            (Outcome::Rejected { reason: r, .. }, Outcome::Rejected { reason: s, .. }) => {
                // The bound may be hit at different points; both give up.
                assert!(
                    r == s || *r == Rejection::BoundReached || *s == Rejection::BoundReached,
                    "case {case}: {r:?} vs {s:?}"
                );
            }
            (Outcome::Found { .. }, Outcome::Rejected { reason, .. })
            | (Outcome::Rejected { reason, .. }, Outcome::Found { .. }) => {
                // Only the bound may differ between the two orders.
                assert_eq!(*reason, Rejection::BoundReached, "case {case}");
            }
        }
    }
}

#[test]
fn a_failing_payload_is_held_back_even_as_one_of_two_changes() {
    // Change 0 is a downloaded list that fails, change 1 an object that is fine.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let mut fake = Fake {
        bad: BTreeSet::from([0]),
        ..Fake::default()
    };
    // As an object, it is held back and the other object goes on.
    let objects = runtime.block_on(search(&mut fake.clone(), 2, None, BOUNDED));
    assert_eq!(verdict(&objects), Ok((vec![1], vec![0])), "{objects:?}");
    // As a payload unit, it is held back and the object goes on.
    let outcome = runtime.block_on(search_with_units(&mut fake, 2, None, BOUNDED, &[], &[0]));
    let Outcome::Found {
        accepted, culprits, ..
    } = outcome
    else {
        panic!("the payload is isolated: {outcome:?}");
    };
    assert_eq!(accepted, [1]);
    assert_eq!(culprits.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0]);
}

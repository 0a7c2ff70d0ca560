//! Renders the routing example (`testdata/routing/`) for N services a number of
//! times, for profilers: `valgrind --tool=callgrind
//! --toggle-collect='*Renderer::render*' target/release/examples/profile_render 1000 3`
//! counts only the renders (on every thread: the files render on the renderer's thread
//! pool), not building the cluster. The warm-up render is counted too; subtract one
//! render's worth or compare totals.
//!
//! Under valgrind the content hash runs sha2's portable SHA-256 (valgrind hides the
//! CPU's SHA extensions), about 12.8 M instructions per render at 1,000 services and
//! 132 M at 10,000; natively, with SHA-NI, it is a small fraction of that. Subtract
//! the inclusive cost of `sha2::sha256::compress256` when comparing with wall time.
//! The warm-up render also fills the per-change `sort_by` memo of the resource lists,
//! so the timed renders show the steady state.
//!
//! Usage: `profile_render [services=1000] [renders=3] [full|change]`; prints the time
//! per render. `full` (the default) renders everything each time, as
//! [`Renderer::render_full`] does; `change` applies a change to one endpoint slice
//! (then its undoing, and so on) to the latest resources and renders incrementally,
//! as the controller does on an endpoint change.

#[path = "../testdata/fixtures.rs"]
mod fixtures;

use std::collections::BTreeMap;
use std::sync::Arc;

use hapwright_eventbus::model::{ResourceChange, ResourceSnapshot};
use hapwright_reconciler::renderer::{Renderer, Resources};

/// The allocator the `hapwright` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let services: usize = args.next().map_or(1_000, |a| a.parse().expect("services"));
    let renders: usize = args.next().map_or(3, |a| a.parse().expect("renders"));
    let change = match args.next().as_deref() {
        None | Some("full") => false,
        Some("change") => true,
        Some(other) => panic!("mode: full or change, not {other}"),
    };
    let renderer = Renderer::new(fixtures::routing_templates(), &fixtures::WATCHED)
        .expect("the routing example loads");
    let cluster = fixtures::cluster(services);
    let mut resources = Resources::new();
    for (name, snapshot) in &cluster {
        resources.update(&Arc::from(*name), snapshot.clone(), None);
    }
    let changed = change.then(|| one_change(&cluster, services));
    // The first render builds the per-change lookup indexes; profile the steady state.
    let first = std::time::Instant::now();
    let warm_up = renderer.render(&resources).expect("renders");
    let first = first.elapsed();
    let started = std::time::Instant::now();
    let bytes = timed(&renderer, &resources, changed.as_ref(), renders);
    let elapsed = started.elapsed();
    drop(warm_up);
    println!(
        "{services} services: first render {:.3} ms (builds the lookup indexes), then {:.3} ms per render ({} bytes of haproxy.cfg)",
        first.as_secs_f64() * 1e3,
        elapsed.as_secs_f64() * 1e3 / renders.max(1) as f64,
        bytes / renders.max(1)
    );
}

/// The profiled part: `renders` renders; returns the bytes of `haproxy.cfg` rendered.
/// Full renders, or (with `changed`) incremental renders after applying the change
/// or its undoing to the latest resources, as the controller applies each update to
/// what it rendered last.
#[inline(never)]
fn timed(
    renderer: &Renderer,
    resources: &Resources,
    changed: Option<&Change>,
    renders: usize,
) -> usize {
    let mut bytes = 0;
    let mut current = resources.clone();
    for round in 0..renders {
        let config = match changed {
            None => renderer.render_full(resources),
            Some(change) => {
                let snapshot = if round % 2 == 0 {
                    &change.after
                } else {
                    &change.before
                };
                current.update(&change.source, snapshot.clone(), Some(&change.change));
                renderer.render(&current)
            }
        }
        .expect("renders");
        bytes += config.main().len();
    }
    bytes
}

/// One endpoint slice's two versions and the change between them.
struct Change {
    source: Arc<str>,
    before: Arc<ResourceSnapshot>,
    after: Arc<ResourceSnapshot>,
    change: ResourceChange,
}

/// One endpoint of one slice (in the middle) no longer ready, and back.
fn one_change(cluster: &BTreeMap<&'static str, Arc<ResourceSnapshot>>, services: usize) -> Change {
    let (after, change) = fixtures::one_endpoint_change(cluster, services);
    Change {
        source: Arc::from("endpoints"),
        before: cluster.get("endpoints").expect("endpoints").clone(),
        after,
        change,
    }
}

//! Templates read resource objects in place: the renderer keeps no converted copy of
//! the objects, and a render allocates for what the template touches, not for every
//! object. A test binary of its own: it counts every allocation of the process
//! (through a counting global allocator), so no other test may run in it.

#[path = "../testdata/fixtures.rs"]
mod fixtures;

use std::alloc::System;
use std::sync::Arc;

use hapwright_reconciler::renderer::{Renderer, Resources, Templates};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Objects per resource kind (four kinds).
const OBJECTS: usize = 1_000;

fn renderer(main: &str) -> Renderer {
    Renderer::new(Templates::new(main), &fixtures::WATCHED).expect("templates load")
}

#[test]
fn objects_are_read_in_place_and_renders_allocate_for_what_they_touch() {
    let cluster = fixtures::cluster(OBJECTS);
    let text: usize = cluster
        .values()
        .flat_map(|snapshot| snapshot.list())
        .map(|object| object.len())
        .sum();
    let one = renderer("{{ (resources.services.list()|first).metadata.name }}");
    let every = renderer(
        "{% for kind in ['services', 'endpoints', 'ingresses', 'secrets'] %}\
         {% for o in resources[kind] %}{{ o.metadata.name }}\n{% endfor %}{% endfor %}",
    );

    // The stores over the snapshots: no converted copy of any object.
    let region = Region::new(GLOBAL);
    let mut resources = Resources::new();
    for (name, snapshot) in &cluster {
        resources.update(&Arc::from(*name), snapshot.clone(), None);
    }
    let stats = region.change();
    let held = stats
        .bytes_allocated
        .saturating_sub(stats.bytes_deallocated);

    // A render that reads one object allocates for that object.
    let region = Region::new(GLOBAL);
    let rendered = one.render(&resources).expect("renders");
    let one_allocated = region.change().bytes_allocated;
    drop(rendered);

    // A render that reads every object keeps at most an index of each.
    let region = Region::new(GLOBAL);
    let rendered = every.render(&resources).expect("renders");
    let output = rendered.main().len();
    drop(rendered);
    let stats = region.change();
    let kept = stats
        .bytes_allocated
        .saturating_sub(stats.bytes_deallocated);

    eprintln!(
        "objects' text {text} bytes; stores hold {held}; one-object render allocated \
         {one_allocated}; an every-object render kept {kept} ({output} bytes of output)"
    );
    // Converted value trees took over five times the text; lazy views keep an index
    // of a few bytes per JSON value, built when an object is first read.
    assert!(
        held < text,
        "the stores hold {held} bytes for {text} bytes of objects: a copy of the objects"
    );
    assert!(
        held + kept < text * 3 / 2,
        "the stores and a render reading every object kept {} bytes ({text} bytes of objects)",
        held + kept
    );
    // The per-version list of the store read (one value per object) and the render
    // itself, not a copy of any object.
    assert!(
        one_allocated < text / 10,
        "a render reading one object allocated {one_allocated} bytes ({text} bytes of objects)"
    );
}

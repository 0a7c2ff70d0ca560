//! A template that would render a gigabyte is stopped at `templating.maxOutputBytes`
//! while it renders, so the process never holds the gigabyte. A test binary of its
//! own: the peak resident size (`VmHWM`) is per process, and no other test may
//! allocate meanwhile.

use hapwright_reconciler::renderer::{DEFAULT_MAX_OUTPUT_BYTES, Renderer, Resources, Templates};

/// The process's peak resident set size, in bytes.
fn peak_resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .expect("VmHWM in /proc/self/status");
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .expect("VmHWM is a number of kB");
    kib * 1024
}

#[test]
fn a_gigabyte_render_stops_at_the_default_cap_with_bounded_memory() {
    // 100 pieces of 10 MB: 1 GB of output with very little template work.
    let mut templates =
        Templates::new("global\n{% for i in range(100) %}{{ 'x' * 10000000 }}\n{% endfor %}\n");
    templates.limits.fuel = None;
    let renderer = Renderer::new(templates, &[] as &[&str]).expect("templates load");
    let before = peak_resident_bytes();

    let errors = renderer
        .render(&Resources::new())
        .expect_err("a gigabyte of output is refused");

    let grown = peak_resident_bytes().saturating_sub(before);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let location = errors[0].location.as_ref().expect("located");
    assert_eq!(
        (location.file.as_str(), location.line),
        ("haproxy.cfg", Some(2))
    );
    assert!(
        errors[0].message.contains(&format!(
            "grew past templating.maxOutputBytes ({DEFAULT_MAX_OUTPUT_BYTES})"
        )),
        "{}",
        errors[0]
    );
    // The cap, one 10 MB piece in flight and the allocator's slack; a render that ran
    // to the end would hold the whole gigabyte (twice, with its markers stripped).
    let bound = DEFAULT_MAX_OUTPUT_BYTES.bytes() * 3;
    assert!(
        grown < bound,
        "peak memory grew by {} MiB during the render (bound {} MiB)",
        grown >> 20,
        bound >> 20
    );
}

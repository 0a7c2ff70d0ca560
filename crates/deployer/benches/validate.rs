//! Validation time against bare `haproxy -c` on the same files (target: at most
//! 1.2× the bare run), plus phase 1 alone and the structural-equivalence check that
//! replaces phase 2 for an endpoint change.
//!
//! Configs have N backends with 3 servers each and an N-entry host map used through
//! a relative path, as in shared/reference/haproxy-2.6.md §0.
//!
//! Run: `cargo bench -p hapwright-deployer --bench validate`
//! (`HAPWRIGHT_TEST_HAPROXY` selects the binary; default `/usr/sbin/haproxy`).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use hapwright_deployer::component::validator;
use hapwright_eventbus::model::{RenderedConfig, SourceMap};

fn haproxy() -> PathBuf {
    if let Some(path) = std::env::var_os("HAPWRIGHT_TEST_HAPROXY") {
        return PathBuf::from(path);
    }
    let debian = Path::new("/usr/sbin/haproxy");
    if debian.exists() {
        debian.to_path_buf()
    } else {
        PathBuf::from("haproxy")
    }
}

/// `haproxy.cfg` and `maps/hosts.map` for `backends` backends.
fn generate(backends: usize) -> (String, String) {
    let mut config = String::from(
        "global\n    log stderr format short local0 notice\n    setenv CFG_VERSION 1\n\n\
         defaults\n    mode http\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend fe_main\n    bind \"127.0.0.1:${HTTP_PORT}\"\n    \
         use_backend %[req.hdr(host),lower,word(1,:),map(maps/hosts.map,be_default)]\n    \
         default_backend be_default\n\n\
         backend be_default\n    http-request return status 404 content-type text/plain string \"no route\\n\"\n\n",
    );
    let mut map = String::new();
    for i in 0..backends {
        map.push_str(&format!("host{i}.example.com be_{i}\n"));
        config.push_str(&format!("backend be_{i}\n    balance roundrobin\n"));
        for s in 0..3 {
            config.push_str(&format!("    server s{s} 127.0.0.1:{}\n", 9001 + s));
        }
        config.push('\n');
    }
    (config, map)
}

/// `haproxy -c -f haproxy.cfg` in `dir`, as a user would run it.
fn bare(binary: &Path, dir: &Path, env: &BTreeMap<String, String>) -> std::process::Output {
    let output = std::process::Command::new(binary)
        .args(["-c", "-f", "haproxy.cfg"])
        .current_dir(dir)
        .envs(env)
        .output()
        .expect("haproxy runs");
    assert!(output.status.success(), "bare haproxy -c failed");
    black_box(output)
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let binary = haproxy();
    let env: BTreeMap<String, String> = [("HTTP_PORT".to_owned(), "18080".to_owned())].into();
    let mut group = c.benchmark_group("validate");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(8));
    for backends in [100, 1_000, 10_000] {
        let (main, map) = generate(backends);
        let rendered = RenderedConfig::new(
            main.as_str(),
            [("hosts.map".to_owned(), Arc::<str>::from(map.as_str()))].into(),
            BTreeMap::new(),
            BTreeMap::new(),
            SourceMap::default(),
        );
        let config = validator::Config {
            binary: binary.clone(),
            envs: vec![env.clone()],
            timeout: Duration::from_secs(60),
            scratch_root: None,
            equivalence: true,
        };
        // Bare haproxy -c on the same files, already on disk.
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("maps")).expect("maps dir");
        std::fs::write(dir.path().join("haproxy.cfg"), &main).expect("write config");
        std::fs::write(dir.path().join("maps/hosts.map"), &map).expect("write map");
        group.bench_with_input(
            BenchmarkId::new("haproxy_c", backends),
            &backends,
            |b, _| {
                b.iter(|| bare(&binary, dir.path(), &env));
            },
        );
        group.bench_with_input(
            BenchmarkId::new("hapwright", backends),
            &backends,
            |b, _| {
                b.to_async(&runtime).iter(|| async {
                    let warnings = validator::validate(&rendered, &config)
                        .await
                        .expect("generated config is valid");
                    black_box(warnings)
                });
            },
        );
        // What hapwright adds to one run, measured on interleaved pairs (bare, then
        // hapwright) so both sides see the same background load.
        group.bench_with_input(BenchmarkId::new("overhead", backends), &backends, |b, _| {
            b.iter_custom(|iterations| {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    let started = Instant::now();
                    bare(&binary, dir.path(), &env);
                    let bare_time = started.elapsed();
                    let started = Instant::now();
                    let warnings = runtime
                        .block_on(validator::validate(&rendered, &config))
                        .expect("generated config is valid");
                    black_box(warnings);
                    total += started.elapsed().saturating_sub(bare_time);
                }
                total
            });
        });
        group.bench_with_input(BenchmarkId::new("phase1", backends), &backends, |b, _| {
            b.iter(|| black_box(validator::validate_phase1(&rendered).expect("phase 1 passes")));
        });
        // An endpoint change: one server of the last backend moves. The check runs on
        // every such change instead of `haproxy -c`.
        let (_, baseline_model) =
            validator::validate_phase1_parsed(&rendered).expect("phase 1 passes");
        let baseline = validator::equivalence::Baseline {
            rendered: Arc::new(rendered.clone()),
            model: Arc::new(baseline_model),
        };
        let last = "    server s2 127.0.0.1:9003\n\n";
        let at = main.rfind(&last).expect("the last server line");
        let moved = format!(
            "{}    server s2 127.0.0.2:9003\n\n{}",
            &main[..at],
            &main[at + last.len()..]
        );
        let candidate = RenderedConfig::new(
            moved.as_str(),
            [("hosts.map".to_owned(), Arc::<str>::from(map.as_str()))].into(),
            BTreeMap::new(),
            BTreeMap::new(),
            SourceMap::default(),
        );
        let (_, candidate_model) =
            validator::validate_phase1_parsed(&candidate).expect("phase 1 passes");
        assert!(
            validator::equivalence::compare(&baseline, &candidate, &candidate_model)
                .is_equivalent()
        );
        group.bench_with_input(
            BenchmarkId::new("equivalence", backends),
            &backends,
            |b, _| {
                b.iter(|| {
                    black_box(validator::equivalence::compare(
                        &baseline,
                        &candidate,
                        &candidate_model,
                    ))
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

#[path = "../testdata/fixtures.rs"]
mod fixtures;
use hapwright_reconciler::renderer::Renderer;
fn time(label: &str, t: hapwright_reconciler::renderer::Templates, n: usize) {
    let r = Renderer::new(t, &fixtures::WATCHED).unwrap();
    let res = fixtures::resources(n);
    r.render(&res).unwrap();
    let k = 10;
    let s = std::time::Instant::now();
    for _ in 0..k { r.render(&res).unwrap(); }
    println!("{label}: {:.2} ms", s.elapsed().as_secs_f64() * 1e3 / k as f64);
}
fn main() {
    let n: usize = std::env::args().nth(1).map_or(1000, |a| a.parse().unwrap());
    let full = fixtures::routing_templates();
    time("full", full.clone(), n);
    let mut t = full.clone();
    for v in t.maps.values_mut() { v.clear(); }
    time("no maps", t.clone(), n);
    let mut t2 = t.clone();
    t2.snippets.insert("backend".into(), String::new());
    time("no maps, empty backend", t2, n);
    let mut t3 = full.clone();
    t3.maps.insert("paths.map".into(), String::new());
    time("hosts only", t3, n);
    let mut t4 = full.clone();
    t4.limits.fuel = None;
    time("no fuel", t4, n);
}

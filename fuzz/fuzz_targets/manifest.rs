//! Fuzzes the manifest reader of the files source (UTF-8 check, YAML/JSON documents
//! under the parser budgets, object keys): no input may panic, and a file it accepts
//! holds only objects with a name.

#![no_main]

use hapwright_watchers::manifest::{Filter, parse};
use hapwright_watchers::yaml::Limits;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    if let Ok(manifest) = parse(data, "fuzz.yaml", &Filter::default(), &limits) {
        for key in manifest.objects.keys() {
            assert!(!key.name.is_empty(), "an accepted object has a name");
        }
    }
    // The same bytes kept only for one kind: never more objects than unfiltered.
    let filter = Filter {
        kind: Some("Service".to_owned()),
        ..Filter::default()
    };
    if let (Ok(all), Ok(services)) = (
        parse(data, "fuzz.yaml", &Filter::default(), &limits),
        parse(data, "fuzz.yaml", &filter, &limits),
    ) {
        assert!(services.objects.len() <= all.objects.len());
    }
});

//! Fuzzes the HTTP source's payload reader in each format (JSON, YAML, lines, text):
//! no body may panic it, and the `lines` and `text` formats accept every UTF-8 body.

#![no_main]

use hapwright_watchers::config::HttpFormat;
use hapwright_watchers::http::payload::parse;
use hapwright_watchers::yaml::Limits;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    for format in [HttpFormat::Json, HttpFormat::Yaml, HttpFormat::Lines, HttpFormat::Text] {
        let parsed = parse(data, format, "fuzz-source", &limits);
        if std::str::from_utf8(data).is_ok() && matches!(format, HttpFormat::Lines | HttpFormat::Text) {
            assert!(parsed.is_ok(), "{format:?} accepts any UTF-8 body");
        }
    }
});

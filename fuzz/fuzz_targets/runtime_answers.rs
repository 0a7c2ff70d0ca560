//! Fuzzes the readers of what HAProxy answers on its runtime API and master CLI
//! (`show proc`, `reload`, versions, alerts, `show servers conn`, map and ACL
//! listings, pattern files): no answer may panic them, and what they read back is
//! part of the answer.

#![no_main]

use hapwright_deployer::client::master::{
    Version, alert_lines, parse_reload_answer, parse_show_proc,
};
use hapwright_deployer::client::runtime::{
    chunk_lines, parse_pattern_listing, parse_server_connections, pattern_lines,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = parse_show_proc(&text);
    let _ = parse_reload_answer(&text);
    if let Some(version) = Version::parse(&text) {
        let shown = format!("{}.{}", version.major, version.minor);
        assert_eq!(Version::parse(&shown), Some(version), "a version reads back");
    }
    for alert in alert_lines(text.lines()) {
        assert!(!alert.contains('\n'), "one alert per line");
    }
    let _ = parse_server_connections(&text, "be_app", "srv1");
    for pattern in parse_pattern_listing(&text) {
        assert!(text.contains(pattern.as_str()), "a listed pattern comes from the answer");
    }
    let lines: Vec<&str> = pattern_lines(&text).collect();
    for line in &lines {
        assert!(text.contains(line), "a pattern line comes from the file");
    }
    let chunks = chunk_lines(&lines, 1024);
    for chunk in &chunks {
        assert!(
            chunk.len() <= 1024 || chunk.matches('\n').count() == 1,
            "a chunk over the limit holds one line"
        );
    }
    let joined: String = lines.iter().map(|line| format!("{line}\n")).collect();
    assert_eq!(chunks.concat(), joined, "chunking keeps every line, in order");
});

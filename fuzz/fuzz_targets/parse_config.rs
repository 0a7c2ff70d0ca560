//! Fuzzes the HAProxy config tokenizer, model, printer and phase-1 checks: none may
//! panic on any input, and whatever parses must read back identically after
//! printing.

#![no_main]

use hapwright_deployer::haproxy::config::{FileNames, parse, parse_lenient, phase1, print};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let rendered = FileNames::from_paths(["haproxy.cfg", "maps/hosts.map"]);
    let _ = phase1(&text, &rendered);
    let (config, _errors) = parse_lenient(&text);
    let _ = print(&config);
    if let Ok(config) = parse(&text) {
        let printed = print(&config);
        let again = parse(&printed).expect("printed config parses");
        assert_eq!(print(&again), printed, "printing is stable");
        assert_eq!(again.sections.len(), config.sections.len());
    }
});

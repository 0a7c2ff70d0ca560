//! Fuzzes the readers of the Data Plane API's answers (typed JSON bodies, error
//! bodies, the raw configuration with or without its JSON wrapper): no answer may
//! panic them.

#![no_main]

use hapwright_deployer::client::dataplane::{
    MapEntry, Reload, RuntimeServer, StoredFile, decode, error_message, raw_configuration_answer,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data).into_owned();
    let _ = decode::<Reload>("/services/haproxy/reloads/x", &text);
    let _ = decode::<RuntimeServer>("/services/haproxy/runtime/servers/x", &text);
    let _ = decode::<Vec<MapEntry>>("/services/haproxy/runtime/maps_entries", &text);
    let _ = decode::<Vec<StoredFile>>("/services/haproxy/storage/maps", &text);
    let _ = decode::<i64>("/services/haproxy/configuration/version", &text);
    let message = error_message(&text);
    assert_eq!(message, message.trim(), "the message is trimmed");
    let (version, config) = raw_configuration_answer(text.clone(), Some(7));
    if config == text {
        assert_eq!(version, Some(7), "a plain answer takes the header's version");
    }
});

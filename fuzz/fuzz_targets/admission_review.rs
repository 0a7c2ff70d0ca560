//! Fuzzes the webhook's AdmissionReview reader: no request body may panic it, and
//! one it accepts is JSON that names `admission.k8s.io/v1` `AdmissionReview`
//! (read lossily: serde_json, like the API server, skips unknown keys without
//! checking the UTF-8 of what they hold).

#![no_main]

use hapwright_app::webhook::review::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if parse(data).is_ok() {
        let value: serde_json::Value =
            serde_json::from_str(&String::from_utf8_lossy(data)).expect("an accepted review is JSON");
        assert_eq!(value["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(value["kind"], "AdmissionReview");
    }
});

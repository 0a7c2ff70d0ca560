//! Reads criterion's results: every `<target>/criterion/**/new/estimates.json`, keyed
//! by the benchmark id (the directory path between `criterion/` and `/new`, e.g.
//! `render/10000` or `validate/haproxy_c/100`).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// One benchmark's estimates, in nanoseconds per iteration.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Estimate {
    /// The median's point estimate.
    pub median_ns: f64,
    /// Lower bound of the median's confidence interval.
    pub low_ns: f64,
    /// Upper bound of the median's confidence interval.
    pub high_ns: f64,
    /// The mean's point estimate.
    pub mean_ns: f64,
}

impl Estimate {
    /// The median in milliseconds.
    pub fn median_ms(&self) -> f64 {
        self.median_ns / 1e6
    }
}

/// Parses one `estimates.json`.
pub fn parse_estimates(text: &str) -> Option<Estimate> {
    let value: Value = serde_json::from_str(text).ok()?;
    let number = |pointer: &str| value.pointer(pointer).and_then(Value::as_f64);
    Some(Estimate {
        median_ns: number("/median/point_estimate")?,
        low_ns: number("/median/confidence_interval/lower_bound")?,
        high_ns: number("/median/confidence_interval/upper_bound")?,
        mean_ns: number("/mean/point_estimate")?,
    })
}

/// Every benchmark under `criterion_dir`, by id.
pub fn collect(criterion_dir: &Path) -> BTreeMap<String, Estimate> {
    let mut out = BTreeMap::new();
    walk(criterion_dir, criterion_dir, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Estimate>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name().is_some_and(|n| n == "report") {
            continue;
        }
        if path.file_name().is_some_and(|n| n == "new") {
            let estimates = path.join("estimates.json");
            if let Some(estimate) = std::fs::read_to_string(&estimates)
                .ok()
                .and_then(|t| parse_estimates(&t))
                && let Some(id) = dir
                    .strip_prefix(root)
                    .ok()
                    .map(|p| p.to_string_lossy().into_owned())
            {
                out.insert(id, estimate);
            }
            continue;
        }
        walk(root, &path, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{"mean":{"confidence_interval":{"confidence_level":0.95,"lower_bound":10.0,"upper_bound":12.0},"point_estimate":11.0,"standard_error":0.5},
        "median":{"confidence_interval":{"confidence_level":0.95,"lower_bound":9.0,"upper_bound":10.5},"point_estimate":10.0,"standard_error":0.4},
        "median_abs_dev":null,"slope":null,"std_dev":null}"#;

    #[test]
    fn estimates_parse() {
        let e = parse_estimates(SAMPLE).expect("parses");
        assert_eq!(
            e,
            Estimate {
                median_ns: 10.0,
                low_ns: 9.0,
                high_ns: 10.5,
                mean_ns: 11.0
            }
        );
        assert!(parse_estimates("{}").is_none());
        assert!(parse_estimates("not json").is_none());
    }

    #[test]
    fn collect_walks_ids() {
        let dir = tempfile::tempdir().expect("tempdir");
        for id in ["render/10", "validate/haproxy_c/100"] {
            let new = dir.path().join(id).join("new");
            std::fs::create_dir_all(&new).expect("mkdir");
            std::fs::write(new.join("estimates.json"), SAMPLE).expect("write");
            std::fs::create_dir_all(dir.path().join(id).join("base")).expect("mkdir");
        }
        std::fs::create_dir_all(dir.path().join("report")).expect("mkdir");
        let found = collect(dir.path());
        assert_eq!(
            found.keys().collect::<Vec<_>>(),
            ["render/10", "validate/haproxy_c/100"]
        );
    }
}

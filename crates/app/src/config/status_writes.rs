//! The `controller.status` section: how statuses are written back.

#[allow(unused_imports)]
use super::*;

/// The `controller.status` section: the rate limit of status writes (a token
/// bucket: `burst` writes at once, then `qps` per second).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct StatusWrites {
    /// Status writes per second, sustained.
    pub qps: u32,
    /// Status writes allowed at once after a quiet period.
    pub burst: u32,
}

impl Default for StatusWrites {
    fn default() -> Self {
        let rate = hapwright_watchers::kubernetes::RateLimit::default();
        Self {
            qps: rate.qps as u32,
            burst: rate.burst,
        }
    }
}

impl StatusWrites {
    /// The writer's rate limit.
    pub fn rate_limit(&self) -> hapwright_watchers::kubernetes::RateLimit {
        hapwright_watchers::kubernetes::RateLimit {
            qps: f64::from(self.qps),
            burst: self.burst,
        }
    }

    pub(super) fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        for (field, value) in [("qps", self.qps), ("burst", self.burst)] {
            if value == 0 {
                issues.push(ConfigIssue::new(
                    field,
                    format!("{field} must be at least 1"),
                ));
            }
        }
        issues
    }
}

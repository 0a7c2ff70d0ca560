//! The `controller.quarantine` section.

#[allow(unused_imports)]
use super::*;

/// The `controller.quarantine` section: how hard hapwright looks for the objects
/// that make a change fail, so one bad object does not block everyone else's
/// changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Quarantine {
    /// Extra renders and validations one failed reconciliation may spend on the
    /// search (one bad object among `n` changes costs about `log2(n) + 1`). When
    /// the search needs more, the whole change is rejected as it would be without
    /// quarantine. `0` turns quarantine off.
    pub max_validations: usize,
}

impl Default for Quarantine {
    fn default() -> Self {
        Self {
            max_validations: 16,
        }
    }
}

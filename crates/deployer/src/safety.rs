//! The safety valve: a validated render that would remove more than a configured
//! share of what the instances served within the last `confirmAfter` is held.
//!
//! A source that suddenly returns nothing (a lost mount, an RBAC change, an emptied
//! directory, a deleted namespace) renders a perfectly valid config without backends;
//! deploying it takes every route down. The scheduler measures each validated render
//! ([`Footprint`] → [`assess`]) against the high-water mark of the configs it let
//! through within the window ([`Memory::high_water`]), so a removal arriving as a
//! stream of renders is measured whole, and holds a render whose [`SafetyRemoval`]
//! exceeds `controller.safety.maxRemoval`. What is counted:
//!
//! - **backends**: `backend` and `listen` sections, by name;
//! - **servers**: `server` lines, as the net drop per backend (a backend's servers
//!   swapped for others of the same number is no removal; a removed backend's
//!   servers all count);
//! - **map entries**: the entry lines (not blank, not `#` comments) of every map
//!   file, as the net drop per map file, since routes often live in maps.
//!
//! Servers added at runtime are `server` lines of the rendered config too, so they
//! are counted the same way whichever way they are deployed.
//!
//! While a removal is held, the render goes out with what it removes kept
//! ([`keep_held`]), and the hold is recorded beside the deployed files
//! ([`ValveRecord`]) so it outlives a restart.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use hapwright_eventbus::config::{ConfigIssue, Duration};
use hapwright_eventbus::model::RenderedConfig;
use hapwright_eventbus::{RemovalCount, SafetyRemoval};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::haproxy::config::Config as Model;

/// Removed backends named in a [`SafetyRemoval`]; the counts cover the rest.
const NAMED_BACKENDS: usize = 20;

/// The `controller.safety` section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Config {
    /// Largest share of the running backends, servers or map entries one change
    /// may remove before it is held (`50%`); `off` (or `0`) turns the valve off.
    pub max_removal: MaxRemoval,
    /// A held change goes out by itself once the drop has persisted this long: a
    /// source that really shrank is not blocked forever.
    pub confirm_after: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_removal: MaxRemoval::Percent(50),
            confirm_after: Duration::from_secs(300),
        }
    }
}

impl Config {
    /// Semantic checks, with the key of each problem.
    pub fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        if self.max_removal.is_on() && self.confirm_after.get().is_zero() {
            issues.push(ConfigIssue::new(
                "confirmAfter",
                "confirmAfter must be longer than 0s (turn the valve off with maxRemoval: off)",
            ));
        }
        issues
    }
}

/// `maxRemoval`: a whole percentage from 1 to 100, or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxRemoval {
    /// The valve is off: every validated render is deployed.
    Off,
    /// Hold a render that removes more than this percentage.
    Percent(u8),
}

impl MaxRemoval {
    /// Whether the valve is on.
    pub fn is_on(self) -> bool {
        matches!(self, Self::Percent(_))
    }
}

/// Why a `maxRemoval` value was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The text is neither `off` nor a percentage.
    #[error(
        "invalid maxRemoval `{0}`: expected a percentage such as `50%`, or `off` to turn the safety valve off"
    )]
    ParsePercent(String),
    /// The percentage is over 100.
    #[error("invalid maxRemoval `{0}`: a percentage from 0% to 100%")]
    PercentRange(String),
}

impl FromStr for MaxRemoval {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        if trimmed.eq_ignore_ascii_case("off") {
            return Ok(Self::Off);
        }
        let number = trimmed.strip_suffix('%').unwrap_or(trimmed).trim();
        let value: u32 = number
            .parse()
            .map_err(|_| Error::ParsePercent(text.to_owned()))?;
        match value {
            0 => Ok(Self::Off),
            1..=100 => Ok(Self::Percent(value as u8)),
            _ => Err(Error::PercentRange(text.to_owned())),
        }
    }
}

impl fmt::Display for MaxRemoval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::Percent(value) => write!(f, "{value}%"),
        }
    }
}

impl Serialize for MaxRemoval {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MaxRemoval {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = MaxRemoval;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a percentage such as `50%`, or `off`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
                // YAML 1.1 reads a bare `off` as false.
                if v {
                    Err(E::custom(
                        "maxRemoval: true is not a percentage; write e.g. `50%`",
                    ))
                } else {
                    Ok(MaxRemoval::Off)
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                v.to_string().parse().map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                v.to_string().parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

// === impl Footprint ===

/// What a config serves, as the safety valve counts it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Servers per backend (`backend` and `listen` sections), by backend name.
    backends: BTreeMap<String, usize>,
    /// Entries per map file, by map name.
    maps: BTreeMap<String, usize>,
}

impl Footprint {
    /// The footprint of a rendered config, from the validator's parsed model of its
    /// `haproxy.cfg`.
    pub fn of(config: &RenderedConfig, model: &Model) -> Self {
        let backends = model
            .server_proxies()
            .filter_map(|section| {
                let name = section.name.clone()?;
                Some((name, section.server_count()))
            })
            .collect();
        let maps = config
            .maps()
            .iter()
            .map(|(name, text)| (name.clone(), MAP_COUNTS.entries(name, text)))
            .collect();
        Self { backends, maps }
    }

    /// The high-water mark of `footprints`: every backend and map any of them has,
    /// each with the largest count any of them has.
    pub fn high_water<'a>(footprints: impl IntoIterator<Item = &'a Footprint>) -> Self {
        let mut high = Self::default();
        for footprint in footprints {
            high.backends = merge_max(std::mem::take(&mut high.backends), &footprint.backends);
            high.maps = merge_max(std::mem::take(&mut high.maps), &footprint.maps);
        }
        high
    }

    /// Whether every backend and map of `other` is here with at least its count:
    /// `other` adds nothing to a high-water mark that has `self`.
    pub fn covers(&self, other: &Footprint) -> bool {
        covers_counts(&self.backends, &other.backends) && covers_counts(&self.maps, &other.maps)
    }

    /// Number of backends.
    pub fn backends(&self) -> usize {
        self.backends.len()
    }

    /// Number of servers over every backend.
    pub fn servers(&self) -> usize {
        self.backends.values().sum()
    }

    /// Number of entries over every map file.
    pub fn map_entries(&self) -> usize {
        self.maps.values().sum()
    }
}

fn map_entries(text: &str) -> usize {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .count()
}

/// The entry counts of the maps of the last configs counted, by map name, with the
/// content counted: a map handed out again (the same allocation) is not read again,
/// and a map that changed in a few lines is counted from its last version, over the
/// lines around the bytes that differ ([`changed_lines`](crate::haproxy::config::changed_lines)):
/// the lines before and after them are the same lines in both versions. Every
/// deployment of a config with 10,000 hosts counts its maps.
struct MapCounts(crate::haproxy::config::LastVersions<usize, 32>);

static MAP_COUNTS: MapCounts = MapCounts(crate::haproxy::config::LastVersions::new());

impl MapCounts {
    /// [`map_entries`] of the map `name` whose content is `text`.
    fn entries(&self, name: &str, text: &std::sync::Arc<str>) -> usize {
        let count = match self.0.get(name) {
            Some((last, count)) if std::sync::Arc::ptr_eq(&last, text) => return count,
            Some((last, count)) => {
                let (old, new) = crate::haproxy::config::changed_lines(&last, text);
                count - map_entries(old) + map_entries(new)
            }
            None => map_entries(text),
        };
        self.0.put(name, text, count);
        count
    }
}

/// Whether every name of `need` is in `have` with at least its count: one walk of
/// both maps in name order.
fn covers_counts(have: &BTreeMap<String, usize>, need: &BTreeMap<String, usize>) -> bool {
    let mut have = have.iter();
    'need: for (name, &count) in need {
        for (candidate, &has) in have.by_ref() {
            match candidate.as_str().cmp(name.as_str()) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal if has >= count => continue 'need,
                _ => return false,
            }
        }
        return false;
    }
    true
}

/// `high` with every name of `other` in it, each with the larger of its two counts
/// (0 where one has none): one walk of both maps in name order rather than a lookup
/// and a copy of the name per entry, which at 10,000 backends and a window of a few
/// configs took milliseconds on every render.
fn merge_max(
    high: BTreeMap<String, usize>,
    other: &BTreeMap<String, usize>,
) -> BTreeMap<String, usize> {
    if high.is_empty() {
        return other.clone();
    }
    let mut merged = Vec::with_capacity(high.len().max(other.len()));
    let mut mine = high.into_iter().peekable();
    let mut theirs = other.iter().peekable();
    loop {
        let order = match (mine.peek(), theirs.peek()) {
            (Some((a, _)), Some((b, _))) => a.as_str().cmp(b.as_str()),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => break,
        };
        match order {
            std::cmp::Ordering::Less => merged.extend(mine.next()),
            std::cmp::Ordering::Greater => {
                merged.extend(theirs.next().map(|(name, &count)| (name.clone(), count)));
            }
            std::cmp::Ordering::Equal => {
                if let (Some((name, a)), Some((_, &b))) = (mine.next(), theirs.next()) {
                    merged.push((name, a.max(b)));
                }
            }
        }
    }
    // In name order already: built in one pass.
    merged.into_iter().collect()
}

/// What going from `running` to `next` removes (see the [module docs](self)).
pub fn assess(running: &Footprint, next: &Footprint) -> SafetyRemoval {
    let mut removal = SafetyRemoval {
        backends: RemovalCount {
            removed: 0,
            total: running.backends(),
        },
        servers: RemovalCount {
            removed: 0,
            total: running.servers(),
        },
        map_entries: RemovalCount {
            removed: 0,
            total: running.map_entries(),
        },
        removed_backends: Vec::new(),
    };
    for (name, &servers) in &running.backends {
        match next.backends.get(name) {
            Some(&now) => removal.servers.removed += servers.saturating_sub(now),
            None => {
                removal.backends.removed += 1;
                removal.servers.removed += servers;
                if removal.removed_backends.len() < NAMED_BACKENDS {
                    removal.removed_backends.push(name.clone());
                }
            }
        }
    }
    for (name, &entries) in &running.maps {
        let now = next.maps.get(name).copied().unwrap_or(0);
        removal.map_entries.removed += entries.saturating_sub(now);
    }
    removal
}

/// Whether `removal` goes over `max`: some count loses more than that share.
pub fn exceeds(removal: &SafetyRemoval, max: MaxRemoval) -> bool {
    let MaxRemoval::Percent(max) = max else {
        return false;
    };
    [removal.backends, removal.servers, removal.map_entries]
        .into_iter()
        // removed / total > max / 100, in integers.
        .any(|count| count.removed * 100 > count.total * usize::from(max))
}

mod keep;
mod memory;
mod record;

pub use keep::{KEPT_HEADER, Kept, keep_held};
pub use memory::{HighWater, Memory, Released};
pub use record::{VALVE_RECORD_FILE, ValveRecord};

#[cfg(test)]
mod tests;

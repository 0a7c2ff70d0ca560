//! Value types shared by the config sections of several crates: human-readable
//! [`Duration`]s (`200ms`, `2s`, `1m30s`), [`ByteSize`]s (`10MiB`), redacted
//! [`Secret`]s, semantic [`ConfigIssue`]s, and the [`did_you_mean`] suggestion used
//! in unknown-key errors.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

// === impl Duration ===

/// A duration written as one or more `<number><unit>` groups: `200ms`, `2s`, `1m`,
/// `1h`, `1m30s`, `1.5s`. Units are `ms`, `s`, `m` and `h`; a bare number is rejected
/// because its unit would be a guess.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(std::time::Duration);

/// Why a duration or byte size could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} `{text}`: {reason}")]
pub struct ParseUnitError {
    what: &'static str,
    text: String,
    reason: String,
}

impl ParseUnitError {
    fn new(what: &'static str, text: &str, reason: impl Into<String>) -> Self {
        Self {
            what,
            text: text.to_owned(),
            reason: reason.into(),
        }
    }
}

impl Duration {
    /// A duration of `millis` milliseconds.
    pub const fn from_millis(millis: u64) -> Self {
        Self(std::time::Duration::from_millis(millis))
    }

    /// A duration of `secs` seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Self(std::time::Duration::from_secs(secs))
    }

    /// The standard-library duration.
    pub const fn get(self) -> std::time::Duration {
        self.0
    }
}

impl From<std::time::Duration> for Duration {
    fn from(duration: std::time::Duration) -> Self {
        Self(duration)
    }
}

impl From<Duration> for std::time::Duration {
    fn from(duration: Duration) -> Self {
        duration.0
    }
}

impl FromStr for Duration {
    type Err = ParseUnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| ParseUnitError::new("duration", text, reason);
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(err("empty; write e.g. `200ms`, `2s`, `1m` or `1h`"));
        }
        let mut rest = trimmed;
        let mut total = 0f64;
        while !rest.is_empty() {
            let number_len = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            if number_len == 0 {
                return Err(err("expected a number; write e.g. `200ms`, `2s`, `1m`"));
            }
            let number: f64 = rest[..number_len]
                .parse()
                .map_err(|_| err("malformed number"))?;
            rest = &rest[number_len..];
            let unit_len = rest
                .find(|c: char| !c.is_ascii_alphabetic())
                .unwrap_or(rest.len());
            let seconds_per_unit = match &rest[..unit_len] {
                "ms" => 0.001,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                "" => return Err(err("missing unit (ms, s, m or h)")),
                other => {
                    return Err(err(&format!("unknown unit `{other}` (use ms, s, m or h)")));
                }
            };
            rest = &rest[unit_len..];
            total += number * seconds_per_unit;
        }
        if !total.is_finite() || total > 1e12 {
            return Err(err("too large"));
        }
        Ok(Self(std::time::Duration::from_secs_f64(total)))
    }
}

impl fmt::Display for Duration {
    /// The shortest exact spelling: `200ms`, `2s`, `1m30s`, `1h`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0.as_millis();
        if millis == 0 {
            return f.write_str("0s");
        }
        if !millis.is_multiple_of(1000) {
            return write!(f, "{millis}ms");
        }
        let mut secs = millis / 1000;
        let hours = secs / 3600;
        secs %= 3600;
        let minutes = secs / 60;
        secs %= 60;
        if hours > 0 {
            write!(f, "{hours}h")?;
        }
        if minutes > 0 {
            write!(f, "{minutes}m")?;
        }
        if secs > 0 {
            write!(f, "{secs}s")?;
        }
        Ok(())
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = StringOrNumber::deserialize(deserializer)?.0;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Accepts a string or a bare number (as its text), so `debounce: 200` reaches the
/// parser and gets the helpful "missing unit" error rather than a type error.
struct StringOrNumber(String);

impl<'de> Deserialize<'de> for StringOrNumber {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = StringOrNumber;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string such as `200ms`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(StringOrNumber(v.to_owned()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(StringOrNumber(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(StringOrNumber(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(StringOrNumber(v.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

// === impl ByteSize ===

/// A size in bytes, written as a plain number of bytes or with a unit: `512KiB`,
/// `10MiB`, `1GiB` (powers of 1024) or `10MB` (powers of 1000).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// `n` mebibytes.
    pub const fn mib(n: u64) -> Self {
        Self(n * 1024 * 1024)
    }

    /// The number of bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = ParseUnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| ParseUnitError::new("size", text, reason);
        let trimmed = text.trim();
        let number_len = trimmed
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(trimmed.len());
        if number_len == 0 {
            return Err(err("expected a number of bytes, e.g. `10MiB`"));
        }
        let number: u64 = trimmed[..number_len]
            .parse()
            .map_err(|_| err("number too large"))?;
        let factor: u64 = match trimmed[number_len..].trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            other => {
                return Err(err(&format!(
                    "unknown unit `{other}` (use B, KiB, MiB, GiB, KB, MB or GB)"
                )));
            }
        };
        number
            .checked_mul(factor)
            .map(Self)
            .ok_or_else(|| err("too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        for (unit, factor) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if bytes >= factor && bytes.is_multiple_of(factor) {
                return write!(f, "{}{unit}", bytes / factor);
            }
        }
        write!(f, "{bytes}B")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = StringOrNumber::deserialize(deserializer)?.0;
        text.parse().map_err(serde::de::Error::custom)
    }
}

// === impl Secret ===

/// A secret value (a password read from a `passwordFile`, an `env` value read from a
/// file). `Debug`, `Display` and `Serialize` print `<redacted>`; only
/// [`expose`](Self::expose) gives the value. Every value is registered with the
/// process-wide [`redact`](crate::redact) set when it is wrapped, so it is also hidden
/// where it shows up inside other text (an error excerpt, a log line).
/// Equality compares the values, so a changed password counts as a changed config.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<Arc<str>>) -> Self {
        let value = value.into();
        crate::redact::global().register([&*value]);
        Self(value)
    }

    /// The secret value. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("<redacted>")
    }
}

// === impl ConfigIssue ===

/// A semantic problem found in a parsed config section, addressed by the key path
/// relative to the section (`services.indexBy`, `instances[1].dataplane.passwordFile`).
/// The config loader turns the path into a file, line and column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Key path, dot-separated, with `[N]` for sequence elements.
    pub path: String,
    /// What is wrong, in one sentence.
    pub message: String,
}

impl ConfigIssue {
    /// An issue at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }

    /// The same issue under a parent key (`prefix.path`).
    #[must_use]
    pub fn under(mut self, prefix: &str) -> Self {
        if !prefix.is_empty() {
            self.path = if self.path.is_empty() {
                prefix.to_owned()
            } else if self.path.starts_with('[') {
                format!("{prefix}{}", self.path)
            } else {
                format!("{prefix}.{}", self.path)
            };
        }
        self
    }
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

// === did you mean ===

/// The candidate closest to `unknown` by edit distance (case-insensitive, with
/// adjacent transpositions), when it is close enough to be a plausible typo:
/// at most one edit for short words, up to a third of the length for longer ones.
pub fn did_you_mean<'a, I>(unknown: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    let wanted = unknown.to_lowercase();
    let limit = (wanted.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|candidate| (edit_distance(&wanted, &candidate.to_lowercase()), candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Optimal-string-alignment distance: insertions, deletions, substitutions and
/// transpositions of neighbours each cost one.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let width = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * width];
    for i in 0..=a.len() {
        d[i * width] = i;
    }
    for (j, cell) in d.iter_mut().enumerate().take(width) {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[(i - 1) * width + j] + 1)
                .min(d[i * width + j - 1] + 1)
                .min(d[(i - 1) * width + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[(i - 2) * width + j - 2] + 1);
            }
            d[i * width + j] = best;
        }
    }
    d[a.len() * width + b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(text: &str) -> std::time::Duration {
        text.parse::<Duration>().unwrap().get()
    }

    #[test]
    fn durations_parse_every_unit_and_combinations() {
        assert_eq!(d("200ms"), std::time::Duration::from_millis(200));
        assert_eq!(d("2s"), std::time::Duration::from_secs(2));
        assert_eq!(d("1m"), std::time::Duration::from_secs(60));
        assert_eq!(d("1h"), std::time::Duration::from_secs(3600));
        assert_eq!(d("1m30s"), std::time::Duration::from_secs(90));
        assert_eq!(d("1.5s"), std::time::Duration::from_millis(1500));
        assert_eq!(d("0s"), std::time::Duration::ZERO);
    }

    #[test]
    fn bad_durations_say_why() {
        let err = |t: &str| t.parse::<Duration>().unwrap_err().to_string();
        assert!(err("200").contains("missing unit"), "{}", err("200"));
        assert!(err("2d").contains("unknown unit `d`"));
        assert!(err("").contains("empty"));
        assert!(err("ms").contains("expected a number"));
        assert!(err("1..2s").contains("malformed"));
    }

    #[test]
    fn durations_display_round_trips() {
        for text in ["200ms", "2s", "1m30s", "1h", "1h1m1s", "0s", "1500ms"] {
            assert_eq!(d(text), d(&text.parse::<Duration>().unwrap().to_string()));
        }
        assert_eq!(Duration::from_secs(90).to_string(), "1m30s");
        assert_eq!(Duration::from_millis(250).to_string(), "250ms");
    }

    #[test]
    fn durations_deserialize_from_numbers_with_a_unit_hint() {
        let err = serde_json::from_str::<Duration>("200").unwrap_err();
        assert!(err.to_string().contains("missing unit"), "{err}");
        let ok: Duration = serde_json::from_str("\"5s\"").unwrap();
        assert_eq!(ok, Duration::from_secs(5));
    }

    #[test]
    fn byte_sizes() {
        assert_eq!("10MiB".parse::<ByteSize>().unwrap(), ByteSize::mib(10));
        assert_eq!("1024".parse::<ByteSize>().unwrap(), ByteSize(1024));
        assert_eq!("2KB".parse::<ByteSize>().unwrap(), ByteSize(2000));
        assert!("10XB".parse::<ByteSize>().is_err());
        assert!("99999999999999999999GiB".parse::<ByteSize>().is_err());
        assert_eq!(ByteSize::mib(10).to_string(), "10MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
        let from_json: ByteSize = serde_json::from_str("4096").unwrap();
        assert_eq!(from_json, ByteSize(4096));
    }

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret:?}"), "Secret(<redacted>)");
        assert_eq!(secret.to_string(), "<redacted>");
        assert_eq!(serde_json::to_string(&secret).unwrap(), "\"<redacted>\"");
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn suggestions_for_typos() {
        let keys = ["debounce", "maxWait", "listen", "logLevel"];
        assert_eq!(did_you_mean("debunce", keys), Some("debounce"));
        assert_eq!(did_you_mean("maxwait", keys), Some("maxWait"));
        assert_eq!(did_you_mean("lsiten", keys), Some("listen"));
        assert_eq!(did_you_mean("colour", keys), None);
        assert_eq!(did_you_mean("x", keys), None);
    }
}

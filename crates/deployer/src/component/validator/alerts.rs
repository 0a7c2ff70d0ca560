//! Reads `haproxy -c` stderr: `[ALERT]` and `[WARNING]` lines become structured
//! messages with the rendered file and line they point at.
//!
//! HAProxy 2.6 writes `[ALERT]    (pid) : config : <message>`, where the message
//! carries its location in one of three forms — `parsing [file:line] : …`,
//! `Parsing [file:line]: …`, `[file:line] : …` — or somewhere inside
//! (`Binding [file:line] for frontend …`, `… at line 2 of file 'files/ips.acl'`),
//! or not at all (`Proxy 'fe': unable to find required use_backend: 'be_x'.`).
//! Lines that do not start with `[` continue the previous message (HAProxy prints
//! the offending line and a caret under it); they are dropped, since the
//! diagnostic carries the rendered line itself. Except after a message that ends
//! with `:`: from HAProxy 3.0 on, an alert about a bind line names the bind and
//! puts the cause on indented lines below (`'bind :443' in section 'frontend' :`,
//! then `  'crt-list' : error processing line 1 … : inconsistencies between private
//! key and certificate …`); those lines are the message, joined to it.

use std::sync::LazyLock;

use hapwright_eventbus::model::Severity;
use regex::Regex;

/// One `[ALERT]` or `[WARNING]` message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Alert {
    /// `[ALERT]` is an error, `[WARNING]` a warning.
    pub severity: Severity,
    /// The message without prefixes and without a leading location.
    pub message: String,
    /// File and line the message points at, relative to the scratch directory.
    pub location: Option<(String, u32)>,
}

static PID_PREFIX: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s*\(\d+\)\s*:\s*(?:config\s*:\s*)?").expect("constant regex is valid")
});
static LEADING_LOCATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:[Pp]arsing\s*)?\[([^\]]+):(\d+)\]\s*:?\s*").expect("constant regex is valid")
});
static PATTERN_FILE_LOCATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"at line (\d+) of file '([^']+)'").expect("constant regex is valid")
});
static INNER_LOCATION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\[([^\]\s:]+):(\d+)\]").expect("constant regex is valid"));

/// Summary lines that repeat what the other alerts already say.
fn is_summary(message: &str) -> bool {
    message.starts_with("Error(s) found in configuration file")
        || message.starts_with("Fatal errors found in configuration")
}

/// Makes a path HAProxy printed relative to the scratch directory.
fn relative(path: &str, scratch: &str) -> String {
    let path = path
        .strip_prefix(scratch)
        .map(|p| p.trim_start_matches('/'))
        .unwrap_or(path);
    path.strip_prefix("./").unwrap_or(path).to_owned()
}

/// Parses `haproxy -c` stderr. `scratch` is the scratch directory's path, removed
/// from file names and messages so they read as paths relative to the config
/// directory.
pub(crate) fn parse_stderr(stderr: &str, scratch: &str) -> Vec<Alert> {
    let mut alerts: Vec<Alert> = Vec::new();
    // Whether the last alert's message ended with `:` and takes the indented lines
    // that follow.
    let mut continues = false;
    for line in stderr.lines() {
        let (severity, rest) = if let Some(rest) = line.strip_prefix("[ALERT]") {
            (Severity::Error, rest)
        } else if let Some(rest) = line.strip_prefix("[WARNING]") {
            (Severity::Warning, rest)
        } else {
            // [NOTICE] banners, continuation lines (the echoed line and its caret),
            // or the cause of an alert that ended with `:`.
            if continues
                && line.starts_with(char::is_whitespace)
                && let Some(last) = alerts.last_mut()
            {
                let text = line.trim();
                let text = if scratch.is_empty() {
                    text.to_owned()
                } else {
                    text.replace(&format!("{scratch}/"), "")
                };
                last.message = format!("{} {text}", last.message.trim_end());
            } else {
                continues = false;
            }
            continue;
        };
        let rest = match PID_PREFIX.find(rest) {
            Some(found) => &rest[found.end()..],
            None => rest.trim_start(),
        };
        if is_summary(rest) {
            continue;
        }
        let mut location = None;
        let mut message = rest.to_owned();
        if let Some(captures) = LEADING_LOCATION.captures(rest)
            && let (Some(all), Some(file), Some(number)) =
                (captures.get(0), captures.get(1), captures.get(2))
            && let Ok(number) = number.as_str().parse::<u32>()
        {
            location = Some((relative(file.as_str(), scratch), number));
            message = rest[all.end()..].to_owned();
        } else if let Some(captures) = INNER_LOCATION.captures(rest)
            && let (Some(file), Some(number)) = (captures.get(1), captures.get(2))
            && let Ok(number) = number.as_str().parse::<u32>()
        {
            location = Some((relative(file.as_str(), scratch), number));
        }
        // A pattern file's own line is more precise than the line that loads it.
        if let Some(captures) = PATTERN_FILE_LOCATION.captures(&message)
            && let (Some(number), Some(file)) = (captures.get(1), captures.get(2))
            && let Ok(number) = number.as_str().parse::<u32>()
        {
            let loaded_at = location
                .as_ref()
                .map(|(file, line)| format!(" (loaded at {file}:{line})"))
                .unwrap_or_default();
            location = Some((relative(file.as_str(), scratch), number));
            message = format!("{message}{loaded_at}");
        }
        if !scratch.is_empty() {
            message = message.replace(&format!("{scratch}/"), "");
        }
        continues = message.trim_end().ends_with(':');
        alerts.push(Alert {
            severity,
            message,
            location,
        });
    }
    alerts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alert_ending_with_a_colon_takes_the_indented_cause_below_it() {
        let stderr = "[NOTICE]   (6139) : haproxy version is 3.4.7-1\n\
[ALERT]    (6139) : config : parsing [/tmp/scratch/haproxy.cfg:7] : 'bind :18443' in section 'frontend' : \n  \
'crt-list' : error processing line 1 in file '/tmp/scratch/files/l' : inconsistencies between private key and certificate loaded 'certs/bad.pem'.\n  \
unable to load SSL private key into SSL Context 'certs/bad.pem': passed a null parameter.\n\
[ALERT]    (6139) : config : Error(s) found in configuration file : /tmp/scratch/haproxy.cfg\n";
        let alerts = parse_stderr(stderr, "/tmp/scratch");
        assert_eq!(alerts.len(), 1, "{alerts:?}");
        assert_eq!(alerts[0].location, Some(("haproxy.cfg".to_owned(), 7)));
        assert_eq!(
            alerts[0].message,
            "'bind :18443' in section 'frontend' : 'crt-list' : error processing line 1 in \
             file 'files/l' : inconsistencies between private key and certificate loaded \
             'certs/bad.pem'. unable to load SSL private key into SSL Context 'certs/bad.pem': \
             passed a null parameter."
        );
    }

    fn one(line: &str) -> Alert {
        let mut alerts = parse_stderr(line, "/tmp/scratch");
        assert_eq!(alerts.len(), 1, "{alerts:?}");
        alerts.remove(0)
    }

    fn at(file: &str, line: u32) -> Option<(String, u32)> {
        Some((file.to_owned(), line))
    }

    #[test]
    fn three_location_formats() {
        let a = one(
            "[ALERT]    (32760) : config : parsing [haproxy.cfg:12] : unknown keyword 'frobnicate' in 'frontend' section",
        );
        assert_eq!(a.severity, Severity::Error);
        assert_eq!(a.location, at("haproxy.cfg", 12));
        assert_eq!(
            a.message,
            "unknown keyword 'frobnicate' in 'frontend' section"
        );
        let b = one(
            "[ALERT]    (321) : config : Parsing [haproxy.cfg:15]: backend 'be_a' has the same name as backend 'be_a' declared at haproxy.cfg:12.",
        );
        assert_eq!(b.location, at("haproxy.cfg", 15));
        assert!(b.message.starts_with("backend 'be_a' has the same name"));
        let c = one(
            "[ALERT]    (310) : config : [haproxy.cfg:12] : 'server be_a/s1' : invalid port '99999'",
        );
        assert_eq!(c.location, at("haproxy.cfg", 12));
        assert_eq!(c.message, "'server be_a/s1' : invalid port '99999'");
        let d = one(
            "[ALERT]    (18905) : config : parsing [haproxy.cfg:13]: unmatched quote at position 15:",
        );
        assert_eq!(d.location, at("haproxy.cfg", 13));
        assert_eq!(d.message, "unmatched quote at position 15:");
    }

    #[test]
    fn locations_inside_and_missing() {
        let a = one(
            "[ALERT]    (15024) : Binding [/tmp/scratch/haproxy.cfg:19] for frontend fe_main: cannot bind socket (Address already in use) for [127.0.0.1:9001]",
        );
        assert_eq!(a.location, at("haproxy.cfg", 19));
        assert!(
            a.message
                .starts_with("Binding [haproxy.cfg:19] for frontend fe_main")
        );
        let b = one(
            "[ALERT]    (32764) : config : Proxy 'fe': unable to find required use_backend: 'be_missing'.",
        );
        assert_eq!(b.location, None);
        assert_eq!(
            b.message,
            "Proxy 'fe': unable to find required use_backend: 'be_missing'."
        );
        let c = one(
            "[WARNING]  (18900) : config : 'http-request' rules ignored for proxy 'foo' as they require HTTP mode.",
        );
        assert_eq!(c.severity, Severity::Warning);
        assert_eq!(c.location, None);
    }

    #[test]
    fn pattern_file_lines_win() {
        let a = one(
            "[ALERT]    (23261) : config : parsing [haproxy.cfg:7] : error detected while parsing ACL 'bad' : 'not-an-ip' is not a valid IPv4 or IPv6 address at line 2 of file 'files/ips.acl'.",
        );
        assert_eq!(a.location, at("files/ips.acl", 2));
        assert!(
            a.message.ends_with("(loaded at haproxy.cfg:7)"),
            "{}",
            a.message
        );
    }

    #[test]
    fn banners_summaries_and_carets_are_dropped() {
        let stderr = "[NOTICE]   (1) : haproxy version is 2.6.12\n[ALERT]    (1) : config : parsing [haproxy.cfg:13]: unmatched quote at position 15:\n  server s1 \"127.0.0.1:80 \n            ^\n[ALERT]    (1) : config : Error(s) found in configuration file : haproxy.cfg\n[ALERT]    (1) : config : Fatal errors found in configuration.\n";
        let alerts = parse_stderr(stderr, "");
        assert_eq!(alerts.len(), 1);
        assert_eq!(parse_stderr("", ""), []);
        assert_eq!(parse_stderr("[ALERT]", "")[0].message, "");
    }
}

//! Redaction of secret values wherever hapwright shows content it did not write
//! itself: log lines, every HTTP response (the debug endpoints, the status page) and
//! error excerpts.
//!
//! Structural redaction (certificate files, PEM blocks, the `data` of Secret objects)
//! only catches secrets where they are expected. A password read from a Secret and
//! rendered into a `userlist`, a token in a map or an `Authorization` header in a file
//! looks like any other text, so the [`Redactor`] also matches the *actual values*:
//! every value of every Kubernetes Secret that enters a resource snapshot, every
//! [`Secret`](crate::config::Secret) read from the config (Data Plane passwords, `env`
//! values read from files), in the forms they can appear in (as is, base64 as stored
//! in the Secret, each line of a multi-line value, JSON- and HTML-escaped).
//!
//! Values shorter than [`MIN_SECRET_LEN`] bytes are not matched: redacting every
//! `admin` or `true` would garble the output and tell an attacker which short words
//! are secrets. Values are remembered for the life of the process (a rotated password
//! may still sit in an old error message), up to [`MAX_VALUES`]; beyond that the
//! values registered longest ago are forgotten first.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use base64::Engine as _;
use serde_json::Value;

/// What a secret value is replaced with. Plain ASCII without `<`, `>` or quotes, so
/// it reads the same in JSON, HTML and log lines.
pub const PLACEHOLDER: &str = "[redacted]";

/// Shortest value (in bytes) that is matched.
pub const MIN_SECRET_LEN: usize = 8;

/// Most values remembered at once.
pub const MAX_VALUES: usize = 65_536;

/// Each segment of the matcher holds more than this many times the forms of the
/// segment after it: at most about log8(forms) + 1 segments to scan (6 at
/// [`MAX_VALUES`]), while a new form is built into a matcher again only about
/// log8(forms) times, each with at most 8 times its share of forms.
const SEGMENT_RATIO: usize = 8;

static GLOBAL: LazyLock<Redactor> = LazyLock::new(Redactor::new);

/// The process-wide redactor: sources register into it, log writers and the HTTP
/// server redact through it.
pub fn global() -> &'static Redactor {
    &GLOBAL
}

/// A set of secret values and the matcher built from them.
#[derive(Debug, Default)]
pub struct Redactor {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Every matched form, with the sequence number of its last registration.
    forms: HashMap<Arc<str>, u64>,
    next_seq: u64,
    /// Forms registered since the matcher was last built, not in any segment yet.
    pending: Vec<Arc<str>>,
    /// The matcher's segments, largest (oldest) first: each form is in exactly one.
    /// A new segment takes the pending forms, then merges with the segments before
    /// it while they are not more than [`SEGMENT_RATIO`] times larger, so
    /// registering a Secret costs its own forms plus, amortized, a logarithmic share
    /// of rebuilds, never a rebuild over every secret, and a redaction scans a
    /// handful of automatons.
    segments: Vec<Segment>,
    /// The segments' matchers, built lazily on the first redaction after a change;
    /// `None` when stale.
    matcher: Option<Arc<Matcher>>,
}

#[derive(Debug)]
struct Segment {
    forms: Vec<Arc<str>>,
    matcher: Arc<Windows>,
}

/// How many bytes of each form the automatons hold: a form longer than this is
/// found by a window of it (from its middle, where PEM and other encoded values
/// differ from each other; their first bytes are the same `-----BEGIN` for every
/// key) and then compared whole. A Secret's forms (its values encoded and escaped
/// four ways, and each line of a key) are tens of kilobytes; their windows are a
/// few, so building a segment for a new Secret takes well under a millisecond.
const WINDOW: usize = 32;

/// One segment's automaton over the windows of its forms, and per window the forms
/// it stands for, with where the window starts in each.
#[derive(Debug)]
struct Windows {
    automaton: AhoCorasick,
    forms: Vec<Vec<(usize, Arc<str>)>>,
}

impl Windows {
    fn build(forms: &[Arc<str>]) -> Result<Self, aho_corasick::BuildError> {
        let mut index: HashMap<&[u8], usize> = HashMap::new();
        let mut patterns: Vec<&[u8]> = Vec::new();
        let mut by_window: Vec<Vec<(usize, Arc<str>)>> = Vec::new();
        for form in forms {
            let bytes = form.as_bytes();
            // Windows are bytes: they need not end on a character boundary.
            let offset = bytes.len().saturating_sub(WINDOW) / 2;
            let window = &bytes[offset..(offset + WINDOW).min(bytes.len())];
            let id = *index.entry(window).or_insert_with(|| {
                patterns.push(window);
                by_window.push(Vec::new());
                patterns.len() - 1
            });
            by_window[id].push((offset, form.clone()));
        }
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .kind(Some(AhoCorasickKind::ContiguousNFA))
            .build(&patterns)?;
        Ok(Self {
            automaton,
            forms: by_window,
        })
    }

    /// Every occurrence of every form in `haystack`, as (start, end), in no order.
    fn occurrences(&self, haystack: &[u8], out: &mut Vec<(usize, usize)>) {
        for found in self.automaton.find_overlapping_iter(haystack) {
            for (offset, form) in &self.forms[found.pattern().as_usize()] {
                let Some(start) = found.start().checked_sub(*offset) else {
                    continue;
                };
                if haystack[start..].starts_with(form.as_bytes()) {
                    out.push((start, start + form.len()));
                }
            }
        }
    }
}

/// Leftmost-longest matching over several segments, exactly as one leftmost-longest
/// automaton over all their forms would match: at each point the match that starts
/// first wins, and of those starting there the longest.
#[derive(Debug)]
struct Matcher {
    segments: Vec<Arc<Windows>>,
}

impl Matcher {
    fn occurrences(&self, haystack: &[u8]) -> Vec<(usize, usize)> {
        let mut found = Vec::new();
        for segment in &self.segments {
            segment.occurrences(haystack, &mut found);
        }
        found
    }

    fn is_match(&self, haystack: &[u8]) -> bool {
        !self.occurrences(haystack).is_empty()
    }

    /// `haystack` with every match replaced by [`PLACEHOLDER`]; `None` when nothing
    /// matched.
    fn replace_all(&self, haystack: &[u8]) -> Option<Vec<u8>> {
        let mut found = self.occurrences(haystack);
        if found.is_empty() {
            return None;
        }
        found.sort_unstable_by_key(|&(start, end)| (start, std::cmp::Reverse(end)));
        let mut out = Vec::with_capacity(haystack.len());
        let mut cursor = 0;
        for (start, end) in found {
            if start < cursor {
                continue;
            }
            out.extend_from_slice(&haystack[cursor..start]);
            out.extend_from_slice(PLACEHOLDER.as_bytes());
            cursor = end;
        }
        out.extend_from_slice(&haystack[cursor..]);
        Some(out)
    }
}

impl Redactor {
    /// An empty redactor (tests; the process uses [`global`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Remembers `values` (and their other forms) as secrets.
    pub fn register<S: AsRef<str>>(&self, values: impl IntoIterator<Item = S>) {
        let mut forms = Vec::new();
        for value in values {
            forms_of(value.as_ref(), &mut forms);
        }
        if forms.is_empty() {
            return;
        }
        let mut inner = self.write();
        for form in forms {
            let seq = inner.next_seq;
            inner.next_seq += 1;
            if let Some(known) = inner.forms.get_mut(form.as_str()) {
                *known = seq;
                continue;
            }
            let form: Arc<str> = form.into();
            inner.forms.insert(form.clone(), seq);
            inner.pending.push(form);
            inner.matcher = None;
        }
        if inner.forms.len() > MAX_VALUES {
            // Forget the oldest tenth at once, so a steady stream of new values does
            // not rebuild the matcher on every registration.
            let keep = MAX_VALUES - MAX_VALUES / 10;
            inner.forget_oldest(keep);
        }
    }

    /// Registers the values of `object` when it is a Kubernetes Secret: every entry of
    /// `data` (base64 as stored, and decoded when it is text) and of `stringData`.
    pub fn register_object(&self, object: &Value) {
        if object.get("kind").and_then(Value::as_str) != Some("Secret") {
            return;
        }
        let mut values: Vec<String> = Vec::new();
        if let Some(Value::Object(data)) = object.get("data") {
            for encoded in data.values().filter_map(Value::as_str) {
                values.push(encoded.to_owned());
                let compact: String = encoded.split_whitespace().collect();
                if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(compact)
                    && let Ok(text) = String::from_utf8(bytes)
                {
                    values.push(text);
                }
            }
        }
        if let Some(Value::Object(data)) = object.get("stringData") {
            values.extend(data.values().filter_map(Value::as_str).map(str::to_owned));
        }
        self.register(values);
    }

    /// How many forms are matched (for tests and the debug output).
    pub fn len(&self) -> usize {
        self.read().forms.len()
    }

    /// No secret is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `text` with every known secret replaced by [`PLACEHOLDER`]; borrowed when
    /// nothing matched.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let Some(matcher) = self.matcher() else {
            return Cow::Borrowed(text);
        };
        match matcher.replace_all(text.as_bytes()) {
            // Whole UTF-8 patterns match whole characters of UTF-8 text, so the
            // result is UTF-8.
            Some(out) => Cow::Owned(
                String::from_utf8(out)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            ),
            None => Cow::Borrowed(text),
        }
    }

    /// Like [`redact`](Self::redact), for bytes that may not be UTF-8 (log writers).
    pub fn redact_bytes<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        let Some(matcher) = self.matcher() else {
            return Cow::Borrowed(bytes);
        };
        match matcher.replace_all(bytes) {
            Some(out) => Cow::Owned(out),
            None => Cow::Borrowed(bytes),
        }
    }

    /// Whether `text` contains a known secret.
    pub fn contains_secret(&self, text: &str) -> bool {
        self.matcher().is_some_and(|m| m.is_match(text.as_bytes()))
    }

    fn matcher(&self) -> Option<Arc<Matcher>> {
        {
            let inner = self.read();
            if inner.forms.is_empty() {
                return None;
            }
            if let Some(matcher) = &inner.matcher {
                return Some(matcher.clone());
            }
        }
        let mut inner = self.write();
        if inner.matcher.is_none() {
            if let Err(error) = inner.build() {
                // Only a pattern set beyond aho-corasick's size limits fails;
                // MAX_VALUES keeps far below them. Without a matcher nothing would
                // be redacted, so drop the oldest half and let the next call retry.
                tracing::error!(%error, forms = inner.forms.len(), "Cannot build the secret matcher; forgetting the oldest secrets");
                let keep = inner.forms.len() / 2;
                inner.forget_oldest(keep);
                return None;
            }
            inner.matcher = Some(Arc::new(Matcher {
                segments: inner.segments.iter().map(|s| s.matcher.clone()).collect(),
            }));
        }
        inner.matcher.clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    /// Keeps the `keep` most recently registered forms. The segments are rebuilt
    /// from what is kept (rare: at most once per [`MAX_VALUES`] / 10 new forms).
    fn forget_oldest(&mut self, keep: usize) {
        if self.forms.len() <= keep {
            return;
        }
        let mut seqs: Vec<u64> = self.forms.values().copied().collect();
        let cut = seqs.len() - keep;
        let (_, threshold, _) = seqs.select_nth_unstable(cut);
        let threshold = *threshold;
        self.forms.retain(|_, seq| *seq >= threshold);
        self.segments.clear();
        self.pending = self.forms.keys().cloned().collect();
        self.matcher = None;
    }

    /// Puts the pending forms into a segment of their own, merged with the segments
    /// before it while those are not larger.
    fn build(&mut self) -> Result<(), aho_corasick::BuildError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut forms = std::mem::take(&mut self.pending);
        while let Some(last) = self.segments.last()
            && last.forms.len() <= forms.len() * SEGMENT_RATIO
        {
            let last = self.segments.pop().expect("a last segment");
            forms.extend(last.forms);
        }
        // Leftmost-longest (in `Matcher`): when one secret contains another, the
        // whole longer one is replaced, not a piece of it.
        match Windows::build(&forms) {
            Ok(matcher) => {
                self.segments.push(Segment {
                    forms,
                    matcher: Arc::new(matcher),
                });
                Ok(())
            }
            Err(error) => {
                // Keep every form matchable once the caller made room.
                self.pending = forms;
                Err(error)
            }
        }
    }
}

/// Appends the forms `value` can take in hapwright's output to `out`.
fn forms_of(value: &str, out: &mut Vec<String>) {
    let start = out.len();
    let mut push = |form: String| {
        if form.len() >= MIN_SECRET_LEN && !out[start..].contains(&form) {
            out.push(form);
        }
    };
    let trimmed = value.trim();
    for candidate in [value, trimmed] {
        push(candidate.to_owned());
        push(json_escaped(candidate));
        push(html_escaped(candidate));
        push(html_escaped(&json_escaped(candidate)));
    }
    // A multi-line value (a private key, a kubeconfig) shows up one line at a time
    // in error excerpts.
    if trimmed.contains('\n') {
        for line in trimmed.lines() {
            let line = line.trim();
            push(line.to_owned());
            push(html_escaped(line));
        }
    }
    // A credentials line (`user:hash` of an htpasswd file, as basic authentication
    // Secrets hold it) is rendered apart: the user name into one place, the hash
    // into a `userlist`'s `password`. The part after the name is a secret of its own.
    for line in trimmed.lines() {
        let line = line.trim();
        if let Some((_, credential)) = line.split_once(':')
            && !line.contains(char::is_whitespace)
        {
            push(credential.to_owned());
            push(html_escaped(credential));
        }
    }
}

fn json_escaped(value: &str) -> String {
    let quoted = Value::String(value.to_owned()).to_string();
    quoted[1..quoted.len() - 1].to_owned()
}

/// The escaping of the status page's template engine (minijinja's HTML escape).
fn html_escaped(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#x27;"),
            '/' => out.push_str("&#x2f;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn values_are_replaced_in_every_form_they_appear_in() {
        let redactor = Redactor::new();
        redactor.register(["p@ss\"w/rd<1>"]);
        let raw = "user admin insecure-password p@ss\"w/rd<1> # end";
        assert_eq!(
            redactor.redact(raw),
            "user admin insecure-password [redacted] # end"
        );
        let json = json!({ "line": raw }).to_string();
        assert!(!redactor.redact(&json).contains("w/rd"), "{json}");
        let html = html_escaped(raw);
        assert!(!redactor.redact(&html).contains("rd&lt;1"), "{html}");
        assert_eq!(
            redactor.redact_bytes(raw.as_bytes()).as_ref(),
            b"user admin insecure-password [redacted] # end"
        );
    }

    #[test]
    fn short_values_and_unrelated_text_are_left_alone() {
        let redactor = Redactor::new();
        redactor.register(["admin", "true"]);
        assert!(redactor.is_empty());
        let text = "stats socket /run/admin.sock level admin";
        assert!(matches!(redactor.redact(text), Cow::Borrowed(_)));
    }

    #[test]
    fn secret_objects_register_decoded_and_stored_forms_and_each_key_line() {
        let redactor = Redactor::new();
        let key = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n";
        let encoded = base64::engine::general_purpose::STANDARD.encode(key);
        let token = base64::engine::general_purpose::STANDARD.encode("tok-4f9a8b7c6d");
        redactor.register_object(&json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "s" },
            "data": { "tls.key": encoded, "token": token },
            "stringData": { "plain": "plain-secret-value" },
        }));
        assert_eq!(
            redactor.redact("Bearer tok-4f9a8b7c6d"),
            "Bearer [redacted]"
        );
        assert_eq!(redactor.redact(&token), "[redacted]");
        assert_eq!(redactor.redact("x plain-secret-value"), "x [redacted]");
        assert_eq!(
            redactor.redact("line 3: MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
            "line 3: [redacted]"
        );
        // An htpasswd line's hash is a secret apart from the user name.
        let htpasswd =
            "alice:$apr1$Qx1lW5Zb$0123456789abcdefghijk.\nbob:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n";
        redactor.register_object(&json!({
            "kind": "Secret",
            "data": { "auth": base64::engine::general_purpose::STANDARD.encode(htpasswd) },
        }));
        assert_eq!(
            redactor.redact("user alice password $apr1$Qx1lW5Zb$0123456789abcdefghijk."),
            "user alice password [redacted]"
        );
        assert_eq!(
            redactor.redact("user bob password {SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g="),
            "user bob password [redacted]"
        );
        // Other kinds are not secrets.
        let other = Redactor::new();
        other.register_object(&json!({"kind": "ConfigMap", "data": {"a": "not-a-secret-value"}}));
        assert!(other.is_empty());
    }

    #[test]
    fn the_oldest_values_are_forgotten_beyond_the_cap() {
        let redactor = Redactor::new();
        redactor.register((0..MAX_VALUES + 1).map(|i| format!("value-{i:08}")));
        assert!(redactor.len() <= MAX_VALUES);
        assert_eq!(redactor.redact("value-00000000"), "value-00000000");
        let last = format!("value-{MAX_VALUES:08}");
        assert_eq!(redactor.redact(&last), PLACEHOLDER);
    }

    /// The redaction of `text` by one leftmost-longest automaton over every form
    /// `redactor` knows: the plain rebuild the segmented matcher must equal.
    fn rebuilt(redactor: &Redactor, text: &str) -> String {
        let inner = redactor.read();
        if inner.forms.is_empty() {
            return text.to_owned();
        }
        let patterns: Vec<&str> = inner.forms.keys().map(|form| &**form).collect();
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .unwrap();
        let mut out = String::new();
        matcher.replace_all_with(text, &mut out, |_, _, out| {
            out.push_str(PLACEHOLDER);
            true
        });
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Secrets registered a few at a time, with redactions in between (so the
        /// matcher is in several segments), redact exactly as a matcher rebuilt over
        /// every secret. A two-letter alphabet makes secrets overlap, contain each
        /// other and share prefixes.
        #[test]
        fn segments_redact_exactly_as_one_rebuilt_matcher(
            batches in proptest::collection::vec(
                proptest::collection::vec("[ab]{8,12}|[ab]{3,6}\n[ab]{8,10}|[a-c]{8,9}", 0..6),
                1..12,
            ),
            texts in proptest::collection::vec("[a-c\n]{0,120}", 1..6),
        ) {
            let redactor = Redactor::new();
            for batch in &batches {
                redactor.register(batch);
                for text in &texts {
                    let expected = rebuilt(&redactor, text);
                    proptest::prop_assert_eq!(&redactor.redact(text).into_owned(), &expected);
                    proptest::prop_assert_eq!(
                        redactor.redact_bytes(text.as_bytes()).into_owned(),
                        expected.as_bytes()
                    );
                    proptest::prop_assert_eq!(redactor.contains_secret(text), expected != *text);
                }
            }
            let inner = redactor.read();
            let segmented: usize = inner.segments.iter().map(|s| s.forms.len()).sum();
            proptest::prop_assert_eq!(segmented + inner.pending.len(), inner.forms.len());
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Secrets longer than the window the automatons hold (found by a window
        /// from their middle, then compared whole), overlapping, containing each
        /// other and sharing windows, with texts built from pieces of them: redacted
        /// exactly as one automaton over the whole secrets redacts.
        #[test]
        fn long_secrets_redact_exactly_as_one_rebuilt_matcher(
            batches in proptest::collection::vec(
                proptest::collection::vec("[ab]{30,70}|a{20,40}b{10,40}|[ab]{8,20}", 0..5),
                1..8,
            ),
            picks in proptest::collection::vec((0usize..64, 0usize..80, 0usize..80, "[ab\n]{0,8}"), 1..12),
        ) {
            let redactor = Redactor::new();
            let mut known: Vec<String> = Vec::new();
            for batch in &batches {
                redactor.register(batch);
                known.extend(batch.iter().cloned());
                // Texts of whole secrets, their pieces and filler, so matches occur.
                let mut text = String::new();
                for (which, from, to, filler) in &picks {
                    if let Some(secret) = (!known.is_empty()).then(|| &known[which % known.len()]) {
                        let (a, b) = ((*from).min(secret.len()), (*to).min(secret.len()));
                        text.push_str(if from % 3 == 0 { secret } else { &secret[a.min(b)..a.max(b)] });
                    }
                    text.push_str(filler);
                }
                let expected = rebuilt(&redactor, &text);
                proptest::prop_assert_eq!(&redactor.redact(&text).into_owned(), &expected);
                proptest::prop_assert_eq!(redactor.contains_secret(&text), expected != text);
            }
        }
    }

    #[test]
    fn a_new_secret_builds_a_small_segment_not_every_secret_again() {
        let redactor = Redactor::new();
        for i in 0..1_000 {
            redactor.register([format!("secret-value-{i:06}")]);
            assert_eq!(
                redactor.redact(&format!("x secret-value-{i:06} y")),
                "x [redacted] y"
            );
        }
        let sizes: Vec<usize> = redactor
            .read()
            .segments
            .iter()
            .map(|s| s.forms.len())
            .collect();
        assert_eq!(sizes.iter().sum::<usize>(), 1_000);
        // Each segment is more than 8 times the next: few segments to scan.
        assert!(
            sizes.windows(2).all(|w| w[0] > w[1] * SEGMENT_RATIO),
            "{sizes:?}"
        );
        assert!(sizes.len() <= 5, "{sizes:?}");
        assert_eq!(redactor.redact("secret-value-000000"), PLACEHOLDER);
        // Registering a known value again changes nothing to match.
        redactor.register(["secret-value-000001"]);
        assert!(redactor.read().matcher.is_some());
    }
}

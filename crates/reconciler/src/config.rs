//! The template sections of the config file: `haproxyConfig`, `templateSnippets`,
//! `maps`, `files`, `sslCertificates`, `extraContext`, `templating` and
//! `validationTests`, plus the debounce timings of the `controller` section.
//!
//! In the config file these keys sit at the top level next to `watchedResources`,
//! `haproxy` and `controller`; the app assembles them into one [`Config`].

use std::collections::BTreeMap;

use hapwright_eventbus::config::{ByteSize, ConfigIssue, Duration};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Everything the renderer and the validation tests need from the config file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The main template, rendered to `haproxy.cfg`. Required.
    pub haproxy_config: Template,
    /// Named snippets for `{% include "name" %}` and `render_glob("prefix-*")`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub template_snippets: BTreeMap<String, Template>,
    /// Map files, rendered to `maps/<name>`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub maps: BTreeMap<String, Template>,
    /// Other files (error pages, ACL lists), rendered to `files/<name>`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, Template>,
    /// Certificates (PEM bundles), rendered to `certs/<name>`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ssl_certificates: BTreeMap<String, Template>,
    /// Any YAML value; templates see it as `extraContext`. Default: an empty mapping.
    #[serde(default = "empty_object")]
    pub extra_context: Value,
    /// Jinja environment settings.
    #[serde(default)]
    pub templating: Templating,
    /// Named render tests run by `hapwright test`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub validation_tests: BTreeMap<String, ValidationTest>,
    /// Status templates by watched resource name: each renders, per object of that
    /// resource, the content of the object's `status`, which the leader writes back
    /// to Kubernetes after a deployment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub status_templates: BTreeMap<String, Template>,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// One template's source text. In `maps`, `files` and `sslCertificates` it may also be
/// a file set: `forEach` and `name` together make it render one file per item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    /// Jinja source.
    pub template: String,
    /// A file set's list: a Jinja expression evaluated in the render context
    /// (`resources`, `extraContext`, `shared`), giving one file per item. The item is
    /// `item` in `name` and `template`.
    #[serde(default, rename = "forEach", skip_serializing_if = "Option::is_none")]
    pub for_each: Option<String>,
    /// A file set's file name, a Jinja template rendered per item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Template {
    /// Whether this is a file set (`forEach` given).
    pub fn is_set(&self) -> bool {
        self.for_each.is_some()
    }
}

/// Jinja environment settings, with Jinja2's defaults (all off), and the cap on
/// rendered output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Templating {
    /// Remove the first newline after a block tag.
    #[serde(default)]
    pub trim_blocks: bool,
    /// Strip whitespace from the start of a line up to a block tag.
    #[serde(default)]
    pub lstrip_blocks: bool,
    /// Fail on undefined variables instead of rendering them empty.
    #[serde(default)]
    pub strict_undefined: bool,
    /// Bytes one rendered file may have, and all rendered files of one render
    /// together; a render that grows past it stops with an error at the template line
    /// that wrote last, so a runaway loop cannot fill the controller's memory.
    #[serde(default = "default_max_output_bytes")]
    pub max_output_bytes: ByteSize,
    /// Instructions one file's render may execute (0: unlimited), so a runaway loop
    /// fails with its template line instead of hanging the controller. Raise it for
    /// a very large config that legitimately does more work.
    #[serde(default = "default_fuel")]
    pub fuel: u64,
    /// How deep includes (cost 10), macro calls (cost 4) and `render_glob`s may
    /// nest, so a self-including snippet fails instead of overflowing the stack
    /// (at most 500, the engine's own cap).
    #[serde(default = "default_recursion_limit")]
    pub recursion_limit: usize,
}

fn default_max_output_bytes() -> ByteSize {
    crate::renderer::DEFAULT_MAX_OUTPUT_BYTES
}

fn default_fuel() -> u64 {
    crate::renderer::RenderLimits::default()
        .fuel
        .unwrap_or_default()
}

fn default_recursion_limit() -> usize {
    crate::renderer::RenderLimits::default().recursion_limit
}

/// The engine's own cap on [`Templating::recursion_limit`].
const MAX_RECURSION_LIMIT: usize = 500;

impl Default for Templating {
    fn default() -> Self {
        Self {
            trim_blocks: false,
            lstrip_blocks: false,
            strict_undefined: false,
            max_output_bytes: default_max_output_bytes(),
            fuel: default_fuel(),
            recursion_limit: default_recursion_limit(),
        }
    }
}

/// One render test: fixtures stand in for the watched resources, then every
/// assertion is checked against the rendered files.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ValidationTest {
    /// What the test is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Objects per watched resource name (`services: [ {apiVersion: v1, ...} ]`).
    #[serde(default)]
    pub fixtures: BTreeMap<String, Vec<Value>>,
    /// Merged over the top-level `extraContext` for this test (mappings recursively).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_context: Option<Value>,
    /// Checks on the render result, in order.
    #[serde(default)]
    pub assertions: Vec<Assertion>,
    /// The deployment status templates see as `deployment`: which instances serve
    /// the render. Without it, one instance named `haproxy` serves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<TestDeployment>,
}

/// The deployment a validation test's status templates see.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TestDeployment {
    /// The fleet, in any order.
    pub instances: Vec<TestInstance>,
}

/// One instance of a [`TestDeployment`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TestInstance {
    /// Instance name.
    pub name: String,
    /// Whether it serves every fixture object (`serving`, the default), runs an
    /// older config (`lagging`), failed its last deployment (`failing`, with
    /// `error`) or never got a config (`pending`).
    #[serde(default)]
    pub state: TestInstanceState,
    /// The error of a `failing` instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The state of a [`TestInstance`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TestInstanceState {
    /// It runs the render.
    #[default]
    Serving,
    /// It runs an older config.
    Lagging,
    /// Its last deployment failed.
    Failing,
    /// Nothing was deployed to it yet.
    Pending,
}

/// The kind of check an [`Assertion`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AssertionType {
    /// The rendered config passes both validation phases.
    HaproxyValid,
    /// `target` matches the regex `pattern`.
    Contains,
    /// `target` does not match the regex `pattern`.
    NotContains,
    /// `target` matches `pattern` exactly `count` times.
    MatchCount,
    /// The regexes in `patterns` match `target` in this order.
    MatchOrder,
    /// `target` is exactly `expected` (a string).
    Equals,
    /// The JSONPath `path`, evaluated on the render context, yields `expected`.
    Jsonpath,
}

impl AssertionType {
    /// The name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            AssertionType::HaproxyValid => "haproxy_valid",
            AssertionType::Contains => "contains",
            AssertionType::NotContains => "not_contains",
            AssertionType::MatchCount => "match_count",
            AssertionType::MatchOrder => "match_order",
            AssertionType::Equals => "equals",
            AssertionType::Jsonpath => "jsonpath",
        }
    }

    /// Fields this type requires, then fields it accepts besides `type` and
    /// `description`.
    fn fields(self) -> (&'static [&'static str], &'static [&'static str]) {
        match self {
            AssertionType::HaproxyValid => (&[], &[]),
            AssertionType::Contains | AssertionType::NotContains => {
                (&["target", "pattern"], &["target", "pattern"])
            }
            AssertionType::MatchCount => (
                &["target", "pattern", "count"],
                &["target", "pattern", "count"],
            ),
            AssertionType::MatchOrder => (&["target", "patterns"], &["target", "patterns"]),
            AssertionType::Equals => (&["target", "expected"], &["target", "expected"]),
            AssertionType::Jsonpath => (&["path", "expected"], &["path", "expected"]),
        }
    }
}

/// One check of a validation test. Which fields apply depends on `type`; the config
/// loader rejects missing and inapplicable ones (see [`Assertion::validate`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Assertion {
    /// What to check.
    #[serde(rename = "type")]
    pub kind: AssertionType,
    /// Shown in test output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The rendered file: `haproxy.cfg`, `map:<name>`, `file:<name>`,
    /// `cert:<name>` (or the paths `maps/<name>`, `files/<name>`, `certs/<name>`), or
    /// `rendering_error` (the render error text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// A regex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// Regexes expected in this order (`match_order`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patterns: Option<Vec<String>>,
    /// Expected number of matches (`match_count`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Expected value: the whole file for `equals` (a string), any value for
    /// `jsonpath`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<Value>,
    /// JSONPath into the render context (`jsonpath`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// Name of the assertion target that holds the render error text.
pub const RENDERING_ERROR_TARGET: &str = "rendering_error";

/// The prefix of assertion targets that name a rendered status:
/// `status/<resource>/<namespace>/<name>` (`status/<resource>/<name>` for objects
/// without a namespace).
pub const STATUS_TARGET_PREFIX: &str = "status/";

/// The object a `status/...` assertion target names: watched resource, namespace
/// (empty when the target has none) and name; `None` for other targets or a
/// malformed one.
pub fn status_target(target: &str) -> Option<(&str, &str, &str)> {
    let rest = target.strip_prefix(STATUS_TARGET_PREFIX)?;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [resource, name] if !resource.is_empty() && !name.is_empty() => Some((resource, "", name)),
        [resource, namespace, name]
            if !resource.is_empty() && !namespace.is_empty() && !name.is_empty() =>
        {
            Some((resource, namespace, name))
        }
        _ => None,
    }
}

/// An assertion target as a path relative to the config directory. Targets may be
/// written as paths (`maps/hosts.map`) or with a kind prefix (`map:hosts.map`,
/// `file:503.http`, `cert:site.pem`); both name the same file.
pub fn target_path(target: &str) -> String {
    for (prefix, dir) in [("map:", "maps/"), ("file:", "files/"), ("cert:", "certs/")] {
        if let Some(name) = target.strip_prefix(prefix) {
            return format!("{dir}{name}");
        }
    }
    target.to_owned()
}

impl Assertion {
    fn present(&self) -> [(&'static str, bool); 6] {
        [
            ("target", self.target.is_some()),
            ("pattern", self.pattern.is_some()),
            ("patterns", self.patterns.is_some()),
            ("count", self.count.is_some()),
            ("expected", self.expected.is_some()),
            ("path", self.path.is_some()),
        ]
    }

    /// Checks that the fields fit the type and that regexes compile. Paths are
    /// relative to the assertion.
    pub fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        let (required, accepted) = self.kind.fields();
        for (field, present) in self.present() {
            if present && !accepted.contains(&field) {
                issues.push(ConfigIssue::new(
                    field,
                    format!(
                        "`{field}` is not used by `{}` assertions",
                        self.kind.as_str()
                    ),
                ));
            } else if !present && required.contains(&field) {
                issues.push(ConfigIssue::new(
                    "type",
                    format!("`{}` assertions need `{field}`", self.kind.as_str()),
                ));
            }
        }
        if let Some(pattern) = &self.pattern
            && let Err(error) = regex::Regex::new(pattern)
        {
            issues.push(ConfigIssue::new(
                "pattern",
                format!("invalid regex: {error}"),
            ));
        }
        if let Some(patterns) = &self.patterns {
            if patterns.len() < 2 {
                issues.push(ConfigIssue::new(
                    "patterns",
                    "`match_order` needs at least two patterns",
                ));
            }
            for (index, pattern) in patterns.iter().enumerate() {
                if let Err(error) = regex::Regex::new(pattern) {
                    issues.push(ConfigIssue::new(
                        format!("patterns[{index}]"),
                        format!("invalid regex: {error}"),
                    ));
                }
            }
        }
        if self.kind == AssertionType::Equals
            && let Some(expected) = &self.expected
            && !expected.is_string()
        {
            issues.push(ConfigIssue::new(
                "expected",
                "`equals` compares file content: `expected` must be a string",
            ));
        }
        issues
    }
}

impl Config {
    /// Every rendered file's path relative to the config directory whose name the
    /// config fixes: `haproxy.cfg`, `maps/<name>`, `files/<name>`, `certs/<name>`
    /// (file sets name their files per item, so they are not here).
    pub fn rendered_paths(&self) -> Vec<String> {
        std::iter::once("haproxy.cfg".to_owned())
            .chain(self.sections().flat_map(|(_, dir, group)| {
                group
                    .iter()
                    .filter(|(_, t)| !t.is_set())
                    .map(move |(n, _)| format!("{dir}/{n}"))
            }))
            .collect()
    }

    /// The directories (`maps`, `files`, `certs`) that have a file set: any valid
    /// file name there may be rendered.
    pub fn set_directories(&self) -> Vec<&'static str> {
        self.sections()
            .filter(|(_, _, group)| group.values().any(Template::is_set))
            .map(|(_, dir, _)| dir)
            .collect()
    }

    /// `maps`, `files` and `sslCertificates`: their config key, directory and entries.
    fn sections(
        &self,
    ) -> impl Iterator<Item = (&'static str, &'static str, &BTreeMap<String, Template>)> {
        [
            ("maps", "maps", &self.maps),
            ("files", "files", &self.files),
            ("sslCertificates", "certs", &self.ssl_certificates),
        ]
        .into_iter()
    }

    /// Whether `path` (relative to the config directory) may be a rendered file: a
    /// fixed one, or a valid name in a directory with a file set.
    pub fn may_render(&self, path: &str) -> bool {
        if self.rendered_paths().iter().any(|p| p == path) {
            return true;
        }
        path.split_once('/').is_some_and(|(dir, name)| {
            self.set_directories().contains(&dir) && file_name_problem(name).is_none()
        })
    }

    /// Semantic checks: file names usable as paths, assertion fields and regexes,
    /// assertion targets that name a rendered file. Paths are relative to the top of
    /// the config file.
    pub fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        for (section, _, names) in self.sections() {
            for (name, template) in names {
                if let Some(problem) = file_name_problem(name) {
                    issues.push(ConfigIssue::new(format!("{section}.{name}"), problem));
                }
                match (&template.for_each, &template.name) {
                    (Some(_), None) => issues.push(ConfigIssue::new(
                        format!("{section}.{name}.forEach"),
                        "a file set needs `name` too: the file name template, rendered per item",
                    )),
                    (None, Some(_)) => issues.push(ConfigIssue::new(
                        format!("{section}.{name}.name"),
                        "`name` belongs to a file set: give `forEach` too (the list to render \
                         one file per item of)",
                    )),
                    (Some(list), Some(file)) => {
                        for (field, value) in [("forEach", list), ("name", file)] {
                            if value.trim().is_empty() {
                                issues.push(ConfigIssue::new(
                                    format!("{section}.{name}.{field}"),
                                    "must not be empty",
                                ));
                            }
                        }
                    }
                    (None, None) => {}
                }
            }
        }
        let single = std::iter::once(("haproxyConfig".to_owned(), &self.haproxy_config))
            .chain(
                self.template_snippets
                    .iter()
                    .map(|(n, t)| (format!("templateSnippets.{n}"), t)),
            )
            .chain(
                self.status_templates
                    .iter()
                    .map(|(n, t)| (format!("statusTemplates.{n}"), t)),
            );
        for (at, template) in single {
            for (field, present) in [
                ("forEach", template.for_each.is_some()),
                ("name", template.name.is_some()),
            ] {
                if present {
                    issues.push(ConfigIssue::new(
                        format!("{at}.{field}"),
                        "only maps, files and sslCertificates entries may be file sets",
                    ));
                }
            }
        }
        if self.templating.max_output_bytes.bytes() == 0 {
            issues.push(ConfigIssue::new(
                "templating.maxOutputBytes",
                "must be more than 0 bytes (every rendered file would be refused)",
            ));
        }
        if !(1..=MAX_RECURSION_LIMIT).contains(&self.templating.recursion_limit) {
            issues.push(ConfigIssue::new(
                "templating.recursionLimit",
                format!("must be between 1 and {MAX_RECURSION_LIMIT}"),
            ));
        }
        for name in self.template_snippets.keys() {
            if name.trim().is_empty() {
                issues.push(ConfigIssue::new(
                    format!("templateSnippets.{name}"),
                    "snippet names must not be empty",
                ));
            }
        }
        let targets = self.rendered_paths();
        for (test_name, test) in &self.validation_tests {
            let at = format!("validationTests.{test_name}");
            // `_global` may hold only fixtures: it is merged into every test.
            if test.assertions.is_empty() && test_name != "_global" {
                issues.push(ConfigIssue::new(
                    format!("{at}.assertions"),
                    "a test needs at least one assertion",
                ));
            }
            for (index, assertion) in test.assertions.iter().enumerate() {
                let at = format!("{at}.assertions[{index}]");
                issues.extend(assertion.validate().into_iter().map(|i| i.under(&at)));
                if let Some(target) = &assertion.target
                    && target.starts_with(STATUS_TARGET_PREFIX)
                {
                    match status_target(target) {
                        Some((resource, _, _)) if self.status_templates.contains_key(resource) => {}
                        Some((resource, _, _)) => issues.push(ConfigIssue::new(
                            format!("{at}.target"),
                            format!(
                                "`{target}`: `{resource}` has no status template (statusTemplates                                  has: {})",
                                if self.status_templates.is_empty() {
                                    "none".to_owned()
                                } else {
                                    self.status_templates
                                        .keys()
                                        .cloned()
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                }
                            ),
                        )),
                        None => issues.push(ConfigIssue::new(
                            format!("{at}.target"),
                            format!(
                                "`{target}` is not a status target: write                                  status/<resource>/<namespace>/<name> (status/<resource>/<name>                                  for objects without a namespace)"
                            ),
                        )),
                    }
                    continue;
                }
                if let Some(target) = &assertion.target
                    && target != RENDERING_ERROR_TARGET
                    && !targets.contains(&target_path(target))
                    && !self.may_render(&target_path(target))
                {
                    issues.push(ConfigIssue::new(
                        format!("{at}.target"),
                        format!(
                            "`{target}` is not a rendered file (one of: {}, {RENDERING_ERROR_TARGET}; \
                             maps, files and certificates may also be written `map:<name>`, \
                             `file:<name>`, `cert:<name>`; statuses \
                             `status/<resource>/<namespace>/<name>`)",
                            targets.join(", ")
                        ),
                    ));
                }
            }
        }
        issues
    }
}

/// Why `name` cannot be a rendered file's name, if it cannot.
pub fn file_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("file names must not be empty")
    } else if name.contains('/') || name.contains('\\') {
        Some("file names must not contain `/` (files land directly in their directory)")
    } else if name == "." || name == ".." {
        Some("`.` and `..` are not file names")
    } else if name.chars().any(char::is_control) {
        Some("file names must not contain control characters")
    } else if name.starts_with('.') {
        Some(
            "file names must not start with `.` (hapwright keeps its state record and \
             temporary files under such names)",
        )
    } else if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        Some(
            "file names may only contain ASCII letters, digits, `.`, `_` and `-` (they are \
             written into HAProxy's config and runtime commands)",
        )
    } else {
        None
    }
}

/// The debounce timings of the `controller` section, used by the debouncer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Debounce {
    /// Quiet period after the last resource change before a reconciliation.
    pub debounce: Duration,
    /// Longest time a constant stream of changes may delay a reconciliation.
    pub max_wait: Duration,
    /// The first change after a quiet period reconciles at once.
    pub leading_edge: bool,
}

impl Default for Debounce {
    fn default() -> Self {
        Self {
            debounce: Duration::from_millis(200),
            max_wait: Duration::from_secs(2),
            leading_edge: true,
        }
    }
}

#[cfg(test)]
mod target_tests {
    use super::*;

    #[test]
    fn kind_prefixed_targets_name_the_same_files() {
        assert_eq!(target_path("map:hosts.map"), "maps/hosts.map");
        assert_eq!(target_path("file:503.http"), "files/503.http");
        assert_eq!(target_path("cert:site.pem"), "certs/site.pem");
        assert_eq!(target_path("maps/hosts.map"), "maps/hosts.map");
        assert_eq!(target_path("haproxy.cfg"), "haproxy.cfg");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        serde_saphyr::from_str(text).unwrap()
    }

    #[test]
    fn file_names_are_restricted_to_a_safe_character_set() {
        for good in ["hosts.map", "503.http", "default.pem", "a_b-c.crtlist"] {
            assert_eq!(file_name_problem(good), None, "{good}");
        }
        for bad in [
            "with space.map",
            "semi;colon.map",
            "new\nline.map",
            ".hapwright-state.json",
            "../escape",
            "tab\t.map",
            "ümlaut.map",
        ] {
            assert!(file_name_problem(bad).is_some(), "{bad:?}");
        }
        let config =
            parse("haproxyConfig: { template: x }\nmaps: { \"a;b.map\": { template: x } }\n");
        let issues = config.validate();
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert!(
            issues[0].to_string().contains("maps.a;b.map"),
            "{}",
            issues[0]
        );
    }

    #[test]
    fn full_section_parses_with_jinja_defaults() {
        let config = parse(
            r#"
haproxyConfig: { template: "global\n" }
templateSnippets: { backend-servers: { template: "x" } }
maps: { hosts.map: { template: "a b" } }
files: { 503.http: { template: "HTTP/1.0 503" } }
sslCertificates: { default.pem: { template: "" } }
extraContext: { httpPort: 8080, nested: [1, {a: b}] }
validationTests:
  basic-route:
    description: routes
    fixtures:
      services: [ {apiVersion: v1, kind: Service, metadata: {name: web}} ]
    assertions:
      - { type: haproxy_valid }
      - { type: contains, target: haproxy.cfg, pattern: 'backend default_web' }
      - { type: not_contains, target: maps/hosts.map, pattern: 'x' }
      - { type: match_count, target: haproxy.cfg, pattern: 'server ', count: 2 }
      - { type: match_order, target: haproxy.cfg, patterns: [a, b] }
      - { type: equals, target: files/503.http, expected: "HTTP/1.0 503\n" }
      - { type: jsonpath, path: '$.resources.services[0].metadata.name', expected: web }
"#,
        );
        assert_eq!(config.templating, Templating::default());
        assert!(!config.templating.trim_blocks && !config.templating.strict_undefined);
        assert_eq!(config.extra_context["httpPort"], 8080);
        assert_eq!(config.validation_tests["basic-route"].assertions.len(), 7);
        assert!(config.validate().is_empty(), "{:?}", config.validate());
        assert_eq!(
            config.rendered_paths(),
            [
                "haproxy.cfg",
                "maps/hosts.map",
                "files/503.http",
                "certs/default.pem"
            ]
        );
    }

    #[test]
    fn fuel_and_recursion_limit_have_defaults_and_load() {
        let config = parse("haproxyConfig: { template: x }\n");
        assert_eq!(config.templating.fuel, 50_000_000);
        assert_eq!(config.templating.recursion_limit, 200);
        let config =
            parse("haproxyConfig: { template: x }\ntemplating: { fuel: 0, recursionLimit: 300 }\n");
        assert_eq!(config.templating.fuel, 0);
        assert_eq!(config.templating.recursion_limit, 300);
        let config = parse("haproxyConfig: { template: x }\ntemplating: { recursionLimit: 501 }\n");
        let issues = config.validate();
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!(issues[0].path, "templating.recursionLimit");
    }

    #[test]
    fn max_output_bytes_is_a_size_with_a_default() {
        let config = parse("haproxyConfig: { template: x }\n");
        assert_eq!(
            config.templating.max_output_bytes,
            crate::renderer::DEFAULT_MAX_OUTPUT_BYTES
        );
        let config =
            parse("haproxyConfig: { template: x }\ntemplating: { maxOutputBytes: 64MiB }\n");
        assert_eq!(config.templating.max_output_bytes, ByteSize::mib(64));
        assert!(config.validate().is_empty());
        let config = parse("haproxyConfig: { template: x }\ntemplating: { maxOutputBytes: 0 }\n");
        let issues = config.validate();
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!(issues[0].path, "templating.maxOutputBytes");
    }

    #[test]
    fn extra_context_defaults_to_an_empty_mapping() {
        let config = parse("haproxyConfig: { template: x }\n");
        assert_eq!(config.extra_context, serde_json::json!({}));
    }

    #[test]
    fn assertion_fields_must_fit_the_type() {
        let config = parse(
            r#"
haproxyConfig: { template: x }
maps: { "a/b": { template: x } }
validationTests:
  t:
    assertions:
      - { type: contains, target: haproxy.cfg }
      - { type: haproxy_valid, count: 3 }
      - { type: match_count, target: nope.cfg, pattern: '(', count: 1 }
      - { type: match_order, target: haproxy.cfg, patterns: [a] }
      - { type: equals, target: haproxy.cfg, expected: 3 }
  empty:
    assertions: []
"#,
        );
        let issues: Vec<String> = config.validate().iter().map(ToString::to_string).collect();
        let expect = [
            "maps.a/b: file names must not contain `/`",
            "validationTests.t.assertions[0].type: `contains` assertions need `pattern`",
            "validationTests.t.assertions[1].count: `count` is not used by `haproxy_valid` assertions",
            "validationTests.t.assertions[2].pattern: invalid regex",
            "validationTests.t.assertions[2].target: `nope.cfg` is not a rendered file",
            "validationTests.t.assertions[3].patterns: `match_order` needs at least two patterns",
            "validationTests.t.assertions[4].expected: `equals` compares file content",
            "validationTests.empty.assertions: a test needs at least one assertion",
        ];
        for wanted in expect {
            assert!(
                issues.iter().any(|i| i.starts_with(wanted)),
                "missing {wanted:?} in {issues:#?}"
            );
        }
        assert_eq!(issues.len(), expect.len(), "{issues:#?}");
    }

    #[test]
    fn unknown_assertion_types_are_rejected() {
        let err = serde_saphyr::from_str::<Config>(
            "haproxyConfig: {template: x}\nvalidationTests: {t: {assertions: [{type: containz}]}}\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("containz"), "{err}");
    }
}

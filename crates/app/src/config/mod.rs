//! The controller's config file: the whole-file [`Config`], the
//! [`Controller`] section, [`load`] with located errors, and the [`ConfigWatcher`]
//! component that reloads it when the file or a password file changes.
//!
//! Each crate owns the types of its section: `watchedResources` is
//! [`hapwright_watchers::Config`], the template keys are
//! [`hapwright_reconciler::config::Config`], `haproxy` is
//! [`hapwright_deployer::config::Config`]. This module assembles them, resolves
//! relative paths against the config file's directory, runs every section's semantic
//! checks plus the cross-section ones, reads password files, and turns every problem
//! into a [`Diagnostic`] at `file:line:column`.
//!
//! One file per section of the `controller` key and per step:
//!
//! ```text
//! mod.rs            the whole-file Config, its checks across sections
//! controller        the controller section: timings, logging, and its checks
//! http              controller.http: the listeners
//! leader_election   controller.leaderElection
//! quarantine        controller.quarantine
//! status_writes     controller.status: status write-back
//! tracing_config    controller.tracing: OTLP traces
//! webhook           controller.webhook: the admission webhook
//! templates         where the templates live (TemplatePlaces)
//! load              load and parse, with located errors
//! locate            YAML key paths → file positions
//! watch             the config-file watcher component
//! ```

mod controller;
mod http;
mod leader_election;
mod load;
mod locate;
mod quarantine;
mod status_writes;
mod templates;
mod tracing_config;
mod watch;
mod webhook;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use hapwright_deployer::config as deployer;
use hapwright_deployer::safety as deployer_safety;
use hapwright_eventbus::config::{ByteSize, ConfigIssue, Duration};
use hapwright_eventbus::model::{ContentHash, Diagnostic, SourceLocation};
use hapwright_reconciler::config as reconciler;
use hapwright_watchers::yaml::{self, Limits};
use serde::{Deserialize, Serialize};

pub use controller::*;
pub use http::*;
pub use leader_election::*;
pub use load::*;
pub use locate::Locator;
pub use quarantine::*;
pub use status_writes::*;
pub use templates::*;
pub use tracing_config::*;
pub use watch::{ConfigChange, ConfigWatcher};
pub use webhook::*;

/// Config files larger than this are rejected before parsing.
pub const MAX_CONFIG_SIZE: u64 = 10 * 1024 * 1024;

/// The whole config file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "RawConfig", rename_all = "camelCase")]
pub struct Config {
    /// `watchedResources`.
    pub watched_resources: hapwright_watchers::Config,
    /// `haproxyConfig`, `templateSnippets`, `maps`, `files`, `sslCertificates`,
    /// `extraContext`, `templating`, `validationTests`, `statusTemplates`.
    #[serde(flatten)]
    pub templates: reconciler::Config,
    /// `haproxy`.
    pub haproxy: deployer::Config,
    /// `controller`.
    pub controller: Controller,
}

/// The file's top level as written; [`Config`] groups the template keys.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    #[serde(default)]
    watched_resources: hapwright_watchers::Config,
    haproxy_config: reconciler::Template,
    #[serde(default)]
    template_snippets: std::collections::BTreeMap<String, reconciler::Template>,
    #[serde(default)]
    maps: std::collections::BTreeMap<String, reconciler::Template>,
    #[serde(default)]
    files: std::collections::BTreeMap<String, reconciler::Template>,
    #[serde(default)]
    ssl_certificates: std::collections::BTreeMap<String, reconciler::Template>,
    #[serde(default = "empty_object")]
    extra_context: serde_json::Value,
    #[serde(default)]
    templating: reconciler::Templating,
    #[serde(default)]
    validation_tests: std::collections::BTreeMap<String, reconciler::ValidationTest>,
    #[serde(default)]
    status_templates: std::collections::BTreeMap<String, reconciler::Template>,
    #[serde(default)]
    haproxy: deployer::Config,
    #[serde(default)]
    controller: Controller,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

impl From<RawConfig> for Config {
    fn from(raw: RawConfig) -> Self {
        Self {
            watched_resources: raw.watched_resources,
            templates: reconciler::Config {
                haproxy_config: raw.haproxy_config,
                template_snippets: raw.template_snippets,
                maps: raw.maps,
                files: raw.files,
                ssl_certificates: raw.ssl_certificates,
                extra_context: raw.extra_context,
                templating: raw.templating,
                validation_tests: raw.validation_tests,
                status_templates: raw.status_templates,
            },
            haproxy: raw.haproxy,
            controller: raw.controller,
        }
    }
}

impl Config {
    /// Every section's semantic checks plus the cross-section ones, with paths from
    /// the top of the file. Does not touch the filesystem.
    pub fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues: Vec<ConfigIssue> = self
            .watched_resources
            .validate()
            .into_iter()
            .map(|i| i.under("watchedResources"))
            .collect();
        issues.extend(self.templates.validate());
        issues.extend(
            self.haproxy
                .validate()
                .into_iter()
                .map(|i| i.under("haproxy")),
        );
        issues.extend(
            self.controller
                .validate()
                .into_iter()
                .map(|i| i.under("controller")),
        );
        let watched: Vec<&str> = self
            .watched_resources
            .resources
            .keys()
            .map(String::as_str)
            .collect();
        if let Some(webhook) = &self.controller.webhook {
            issues.extend(
                webhook
                    .validate(&watched)
                    .into_iter()
                    .map(|i| i.under("controller.webhook")),
            );
            for name in &webhook.resources {
                if let Some(resource) = self.watched_resources.resources.get(name)
                    && let Err(error) = crate::webhook::Target::new(name, resource)
                {
                    issues.push(ConfigIssue::new(
                        format!("watchedResources.{name}.kubernetes.{}", error.field()),
                        format!("{} (the webhook evaluates it)", error.reason()),
                    ));
                }
            }
        }
        for resource in self.templates.status_templates.keys() {
            if !watched.contains(&resource.as_str()) {
                let hint =
                    hapwright_eventbus::config::did_you_mean(resource, watched.iter().copied())
                        .map(|s| format!(" did you mean {s}?"))
                        .unwrap_or_default();
                issues.push(ConfigIssue::new(
                    format!("statusTemplates.{resource}"),
                    format!(
                        "`{resource}` is not a watched resource;{hint} (watchedResources has: {})",
                        if watched.is_empty() {
                            "none".to_owned()
                        } else {
                            watched.join(", ")
                        }
                    ),
                ));
            }
        }
        for (test, spec) in &self.templates.validation_tests {
            for resource in spec.fixtures.keys() {
                if !watched.contains(&resource.as_str()) {
                    issues.push(ConfigIssue::new(
                        format!("validationTests.{test}.fixtures.{resource}"),
                        format!(
                            "`{resource}` is not a watched resource (watchedResources has: {})",
                            if watched.is_empty() {
                                "none".to_owned()
                            } else {
                                watched.join(", ")
                            }
                        ),
                    ));
                }
            }
        }
        issues
    }

    /// Makes relative paths absolute against `base` (the config file's directory).
    pub fn resolve_paths(&mut self, base: &Path) {
        self.watched_resources.resolve_paths(base);
        self.haproxy.resolve_paths(base);
        if let Some(webhook) = &mut self.controller.webhook {
            for path in [&mut webhook.cert_file, &mut webhook.key_file] {
                if path.is_relative() {
                    *path = base.join(&*path);
                }
            }
        }
    }
}

/// Where one inline template is written in the config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TemplatePlace {
    /// Line of the template's first line.
    line: u32,
    /// Column where the template's text starts on its lines.
    column: u32,
    /// A block scalar (`|`, `>`): template line N is config line `line + N - 1`. A
    /// flow scalar is mapped for its first line only.
    block: bool,
}

#[cfg(test)]
mod safety_tests {
    use super::*;
    use crate::config::leader_election::leader_election_tests::parse_controller;
    use hapwright_deployer::safety::MaxRemoval;

    #[test]
    fn safety_keys_load_with_defaults_and_off() {
        let defaults = parse_controller("  logLevel: info\n").unwrap();
        assert_eq!(
            defaults.controller.safety.max_removal,
            MaxRemoval::Percent(50)
        );
        assert_eq!(
            defaults.controller.safety.confirm_after,
            Duration::from_secs(300)
        );
        let config =
            parse_controller("  safety: { maxRemoval: 30%, confirmAfter: 10m }\n").unwrap();
        assert_eq!(
            config.controller.safety.max_removal,
            MaxRemoval::Percent(30)
        );
        assert_eq!(
            config.controller.safety.confirm_after,
            Duration::from_secs(600)
        );
        let off = parse_controller("  safety: { maxRemoval: off }\n").unwrap();
        assert_eq!(off.controller.safety.max_removal, MaxRemoval::Off);
    }

    #[test]
    fn bad_safety_keys_are_located() {
        let errors = parse_controller("  safety:\n    maxRemoval: 150%\n").unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("hapwright.yaml:4:")
                && errors[0].contains("controller.safety.maxRemoval")
                && errors[0].contains("a percentage from 0% to 100%"),
            "{errors:?}"
        );
        let errors = parse_controller("  safety:\n    confirmAfter: 0s\n").unwrap_err();
        assert!(
            errors[0].contains("hapwright.yaml:4:")
                && errors[0].contains("controller.safety.confirmAfter"),
            "{errors:?}"
        );
        let errors = parse_controller("  safety:\n    maxRemovel: 20%\n").unwrap_err();
        assert!(errors[0].contains("maxRemovel"), "{errors:?}");
    }
}

#[cfg(test)]
mod status_template_tests {
    use super::*;

    fn parse_text(text: &str) -> Result<(Config, TemplatePlaces), Vec<String>> {
        parse(
            text,
            Path::new("/etc/hapwright/hapwright.yaml"),
            "hapwright.yaml",
        )
        .map(|(config, _)| {
            let places = TemplatePlaces::new(text, "hapwright.yaml", &config);
            (config, places)
        })
        .map_err(|ds| ds.iter().map(ToString::to_string).collect())
    }

    const WATCHED: &str = "watchedResources:\n  ingresses:\n    kubernetes: { apiVersion: networking.k8s.io/v1, kind: Ingress }\nhaproxyConfig: { template: x }\n";

    #[test]
    fn status_keys_load_with_defaults() {
        let (config, _) = parse_text(&format!(
            "{WATCHED}statusTemplates:\n  ingresses:\n    template: 'a: 1'\n"
        ))
        .unwrap();
        assert_eq!(
            config.templates.status_templates["ingresses"].template,
            "a: 1"
        );
        assert_eq!(
            config.controller.status,
            StatusWrites { qps: 10, burst: 20 }
        );
        let (config, _) = parse_text(&format!(
            "{WATCHED}controller:\n  status: {{ qps: 2, burst: 5 }}\n"
        ))
        .unwrap();
        assert_eq!(config.controller.status.rate_limit().qps, 2.0);
        assert_eq!(config.controller.status.rate_limit().burst, 5);
    }

    #[test]
    fn a_status_template_for_an_unwatched_resource_and_a_zero_rate_are_located() {
        let errors = parse_text(&format!(
            "{WATCHED}statusTemplates:\n  ingress:\n    template: 'a: 1'\ncontroller:\n  status: {{ qps: 0 }}\n"
        ))
        .unwrap_err()
        .join("\n");
        assert!(
            errors.contains("hapwright.yaml:6:")
                && errors.contains("statusTemplates.ingress")
                && errors.contains("`ingress` is not a watched resource; did you mean ingresses?"),
            "{errors}"
        );
        assert!(
            errors.contains("controller.status.qps: qps must be at least 1"),
            "{errors}"
        );
    }

    #[test]
    fn status_template_errors_name_the_config_file_line() {
        let text = format!(
            "{WATCHED}statusTemplates:\n  ingresses:\n    template: |\n      a: 1\n      b: {{{{ object. }}}}\n"
        );
        let (config, places) = parse_text(&text).unwrap();
        let errors = crate::build::renderer(&config).unwrap_err();
        let shown: Vec<String> = places
            .locate(errors)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(
            shown.iter().any(|e| e.starts_with("hapwright.yaml:9:")
                && e.contains("statusTemplates.ingresses line 2")),
            "{shown:?}"
        );
    }
}

//! Turns a loaded [`Config`] into the inputs of each crate's components: the renderer's
//! templates, the validator's settings, the socket instances, and the snapshots
//! `render` reads once from files or fixtures.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hapwright_deployer::client::socket::InstanceConfig;
use hapwright_deployer::component::validator;
use hapwright_eventbus::model::{Diagnostic, FileKind, RenderedConfig, ResourceSnapshot};
use hapwright_reconciler::quarantine;
use hapwright_reconciler::renderer::{
    FileSet, RenderLimits, Renderer, Templates, TemplatingSettings,
};
use hapwright_reconciler::status::StatusTemplates;
use hapwright_watchers::config::{FilesConfig, WatchedResource};
use hapwright_watchers::files::{ScanMode, Scanner};
use hapwright_watchers::yaml::Limits;

use crate::config::Config;

/// How long one `haproxy -c` run may take before it counts as failed.
pub const VALIDATION_TIMEOUT: Duration = Duration::from_secs(30);

/// The renderer's input, from the template sections of the config.
pub fn templates(config: &Config) -> Templates {
    let section = &config.templates;
    let bodies = |map: &BTreeMap<String, hapwright_reconciler::config::Template>| {
        map.iter()
            .filter(|(_, t)| !t.is_set())
            .map(|(name, t)| (name.clone(), t.template.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    let sets = [
        (FileKind::Map, &section.maps),
        (FileKind::File, &section.files),
        (FileKind::Certificate, &section.ssl_certificates),
    ]
    .into_iter()
    .flat_map(|(kind, group)| {
        group.iter().filter_map(move |(key, t)| {
            Some(FileSet {
                kind,
                key: key.clone(),
                for_each: t.for_each.clone()?,
                name: t.name.clone()?,
                template: t.template.clone(),
            })
        })
    })
    .collect();
    Templates {
        main: section.haproxy_config.template.clone(),
        snippets: bodies(&section.template_snippets),
        maps: bodies(&section.maps),
        files: bodies(&section.files),
        certificates: bodies(&section.ssl_certificates),
        sets,
        extra_context: section.extra_context.clone(),
        settings: TemplatingSettings {
            trim_blocks: section.templating.trim_blocks,
            lstrip_blocks: section.templating.lstrip_blocks,
            strict_undefined: section.templating.strict_undefined,
        },
        limits: RenderLimits {
            max_output_bytes: section.templating.max_output_bytes,
            fuel: Some(section.templating.fuel).filter(|fuel| *fuel > 0),
            recursion_limit: section.templating.recursion_limit,
        },
    }
}

/// Names of the watched resources, as templates see them (`resources.<name>`).
pub fn watched_names(config: &Config) -> Vec<String> {
    config.watched_resources.resources.keys().cloned().collect()
}

/// Compiles every template and runs the load-time checks (references to watched
/// resources, snippets, include cycles); the status templates are compiled too, so
/// every caller (`check`, config reloads, `test`) rejects a broken one.
pub fn renderer(config: &Config) -> Result<Renderer, Vec<Diagnostic>> {
    let renderer = Renderer::new(templates(config), &watched_names(config));
    match (renderer, status_templates(config)) {
        (Ok(renderer), Ok(_)) => Ok(renderer),
        (renderer, status) => Err(renderer
            .err()
            .into_iter()
            .flatten()
            .chain(status.err().into_iter().flatten())
            .collect()),
    }
}

/// The status templates (`statusTemplates`), compiled in the environment of the
/// other templates.
pub fn status_templates(config: &Config) -> Result<StatusTemplates, Vec<Diagnostic>> {
    status_templates_with(config, &templates(config))
}

/// The status templates (`statusTemplates`), compiled in the environment of
/// `templates` (the config's, or with a test's `extraContext`).
pub fn status_templates_with(
    config: &Config,
    templates: &Templates,
) -> Result<StatusTemplates, Vec<Diagnostic>> {
    let status: BTreeMap<String, String> = config
        .templates
        .status_templates
        .iter()
        .map(|(name, t)| (name.clone(), t.template.clone()))
        .collect();
    StatusTemplates::new(templates, &status, &watched_names(config))
}

/// The validator's settings: the configured binary, one environment per distinct
/// instance `env` (an instance without `env` validates with none).
pub fn validator_config(config: &Config) -> validator::Config {
    let envs: BTreeSet<BTreeMap<String, String>> = config
        .haproxy
        .instances
        .iter()
        .map(hapwright_deployer::config::Instance::environment)
        .collect();
    validator::Config {
        binary: config.haproxy.binary.clone(),
        envs: envs.into_iter().collect(),
        timeout: VALIDATION_TIMEOUT,
        scratch_root: None,
        equivalence: config.haproxy.phase2_equivalence,
    }
}

/// The validation step of the quarantine search: the validator component's own
/// [`validator::Service`], so phase 2 is satisfied by structural equivalence against
/// the last render that passed `haproxy -c` in the component or in an earlier probe.
/// A search's first probe, the changes other than the suspects, usually differs from
/// the running config only in values phase 1 checks completely, so it costs no
/// `haproxy -c`. Probes are not counted in the validation metrics.
pub fn quarantine_validate(service: validator::Service) -> quarantine::Validate {
    validate_through(service)
}

/// The validation step of the admission webhook: a [`validator::Service`] of its
/// own (reviews are candidates, not what runs, so they never become the running
/// config's baseline). Most reviews differ from the last one only in an object's
/// values (an endpoint address, a port), so most are answered without starting
/// HAProxy.
pub fn webhook_validate(config: validator::Config) -> quarantine::Validate {
    validate_through(validator::Service::new(config))
}

/// A validation step answering through `service`.
fn validate_through(service: validator::Service) -> quarantine::Validate {
    Arc::new(move |rendered: Arc<RenderedConfig>| {
        let service = service.clone();
        Box::pin(async move {
            service
                .validate(&rendered, None)
                .await
                .map(drop)
                .map_err(|rejection| quarantine::Failure {
                    errors: rejection.errors,
                    tool_failure: rejection.tool_failure,
                })
        })
    })
}

/// The instances reached through local sockets.
pub fn socket_instances(config: &Config) -> Vec<InstanceConfig> {
    config
        .haproxy
        .instances
        .iter()
        .filter_map(InstanceConfig::from_config)
        .map(|instance| instance.with_dynamic_backends(config.haproxy.dynamic_backends))
        .collect()
}

/// Reads one watched resource once: from `fixtures/<name>/` when given, otherwise from
/// its configured `files` source. A resource without a fixtures directory has no
/// objects, as in `validationTests`, so fixtures need only the resources a render is
/// about; a missing `fixtures` directory itself is an error.
pub fn scan_once(
    name: &str,
    resource: &WatchedResource,
    fixtures: Option<&Path>,
) -> Result<Arc<ResourceSnapshot>, Vec<Diagnostic>> {
    let files = match (fixtures, &resource.files) {
        (Some(dir), _) if !dir.is_dir() => {
            return Err(vec![Diagnostic::error(format!(
                "--fixtures {}: not a directory",
                dir.display()
            ))]);
        }
        (Some(dir), _) if !dir.join(name).exists() => {
            return Ok(Arc::new(ResourceSnapshot::new(resource.index_by.clone())));
        }
        (Some(dir), _) => FilesConfig::new(dir.join(name)),
        (None, Some(files)) => files.clone(),
        (None, None) => {
            return Err(vec![Diagnostic::error(format!(
                "watchedResources.{name} is not a `files` source; pass --fixtures DIR with a \
                 `{name}/` directory of manifests"
            ))]);
        }
    };
    let filter = resource.filter();
    let mut scanner = Scanner::new(
        name,
        &files,
        filter,
        resource.index_by.clone(),
        Limits::default(),
    );
    scanner.scan(ScanMode::Full);
    let mut errors: Vec<Diagnostic> = scanner.file_errors().into_iter().cloned().collect();
    if let Some(reason) = scanner.health().reason
        && errors.is_empty()
    {
        errors.push(Diagnostic::error(format!(
            "watchedResources.{name}: {reason}"
        )));
    }
    if errors.is_empty() {
        Ok(Arc::new(scanner.snapshot().clone()))
    } else {
        Err(errors)
    }
}

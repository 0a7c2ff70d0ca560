//! Loading the config file: [`load`] and [`parse`] with located errors.

#[allow(unused_imports)]
use super::*;

/// A loaded, valid configuration.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The configuration, paths resolved, passwords read.
    pub config: Config,
    /// The config file as given.
    pub path: PathBuf,
    /// Hash over the config file and every password: equal hashes mean an identical
    /// effective configuration.
    pub hash: ContentHash,
    /// Files whose change means the configuration may have changed: the config file
    /// and every `passwordFile`.
    pub watched_files: Vec<PathBuf>,
    /// Where each inline template is written, to locate template errors in the file.
    pub templates_at: TemplatePlaces,
    /// Where each watched resource is configured, by name, for its source's errors.
    pub resources_at: std::collections::BTreeMap<String, SourceLocation>,
}

/// Where each `watchedResources.<name>` entry of `config` is in `text`.
fn resource_places(
    text: &str,
    display: &str,
    config: &Config,
) -> std::collections::BTreeMap<String, SourceLocation> {
    let locator = Locator::new(text);
    config
        .watched_resources
        .resources
        .keys()
        .filter_map(|name| {
            let (line, column) = locator.locate(&format!("watchedResources.{name}"))?;
            Some((
                name.clone(),
                SourceLocation::new(display, Some(line), Some(column)),
            ))
        })
        .collect()
}

/// Loads and validates the config file at `path`: read (at most
/// [`MAX_CONFIG_SIZE`]), parse (unknown keys, types, durations), resolve relative
/// paths against the file's directory, run every semantic check and read password
/// files. Every problem comes back as a diagnostic at `file:line:column`; parsing
/// stops at the first syntax or type error, semantic checks report all problems.
pub fn load(path: &Path) -> Result<Loaded, Vec<Diagnostic>> {
    let display = path.display().to_string();
    let at_file = |message: String| {
        vec![Diagnostic::error(message).at(SourceLocation::new(display.clone(), None, None))]
    };
    let meta = std::fs::metadata(path)
        .map_err(|error| at_file(format!("cannot read config file: {error}")))?;
    if meta.len() > MAX_CONFIG_SIZE {
        return Err(at_file(format!(
            "config file is too large: {} bytes, over the {} byte limit",
            meta.len(),
            MAX_CONFIG_SIZE
        )));
    }
    let bytes = std::fs::read(path)
        .map_err(|error| at_file(format!("cannot read config file: {error}")))?;
    let text = yaml::decode_utf8(&bytes, &display).map_err(|d| vec![d])?;
    parse(text, path, &display).map(|(config, hash)| Loaded {
        watched_files: std::iter::once(path.to_path_buf())
            .chain(config.haproxy.secret_files())
            .collect(),
        templates_at: TemplatePlaces::new(text, &display, &config),
        resources_at: resource_places(text, &display, &config),
        config,
        path: path.to_path_buf(),
        hash,
    })
}

/// Parses config text as if it were the file at `path` (which sets the base for
/// relative paths and the file name in errors).
pub fn parse(
    text: &str,
    path: &Path,
    display: &str,
) -> Result<(Config, ContentHash), Vec<Diagnostic>> {
    let blank = text.lines().all(|line| {
        let line = line.trim();
        line.is_empty() || line.starts_with('#') || line == "---" || line == "..."
    });
    if blank {
        return Err(vec![
            Diagnostic::error(
                "the config file is empty (it needs at least `haproxyConfig: { template: … }`)",
            )
            .at(SourceLocation::new(display, None, None)),
        ]);
    }
    let mut config: Config =
        yaml::parse_typed(text, display, &Limits::default()).map_err(|d| vec![d])?;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let base = absolute
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    config.resolve_paths(&base);
    let mut issues = config.validate();
    issues.extend(
        config
            .haproxy
            .load_secrets()
            .into_iter()
            .map(|i| i.under("haproxy")),
    );
    if !issues.is_empty() {
        let locator = Locator::new(text);
        return Err(issues
            .into_iter()
            .map(|issue| {
                let (line, column) = locator.locate(&issue.path).unzip();
                Diagnostic::error(issue.to_string()).at(SourceLocation::new(display, line, column))
            })
            .collect());
    }
    let mut hashed = text.as_bytes().to_vec();
    let static_passwords = config
        .haproxy
        .instances
        .iter()
        .filter_map(|instance| instance.dataplane.as_ref()?.password.as_ref());
    let discovery_password = config
        .haproxy
        .discovery
        .as_ref()
        .and_then(|d| d.kubernetes.as_ref()?.password.as_ref());
    for password in static_passwords.chain(discovery_password) {
        hashed.push(0);
        hashed.extend_from_slice(password.expose().as_bytes());
    }
    Ok((config, ContentHash::of(&hashed)))
}

#[cfg(test)]
mod wording_tests {
    use super::*;

    fn error(text: &str) -> String {
        let errors = parse(
            text,
            Path::new("/nonexistent/hapwright.yaml"),
            "hapwright.yaml",
        )
        .unwrap_err();
        errors[0].to_string()
    }

    #[test]
    fn parser_jargon_reads_as_plain_words_with_the_fix() {
        let cases = [
            (
                "haproxyConfig: { template: x }\nwatchedResources:\n  s:\n    files: { path: . }\n    indexBy: metadata.name\n",
                "hapwright.yaml:5:14: watchedResources.s.indexBy: expected a list (e.g. `[metadata.name]`)",
            ),
            (
                "haproxyConfig: x\n",
                "hapwright.yaml:1:16: haproxyConfig: expected `{ template: … }`",
            ),
            (
                "haproxyConfig: { template: x }\nmaps:\n  hosts.map: x\n",
                "hapwright.yaml:3:14: maps.hosts.map: expected `{ template: … }`",
            ),
            (
                "haproxyConfig: { template: x }\ntemplating: { fuel: lots }\n",
                "hapwright.yaml:2:21: templating.fuel: expected a whole number",
            ),
            (
                "haproxyConfig: { template: x }\ntemplating: { trimBlocks: maybe }\n",
                "hapwright.yaml:2:27: templating.trimBlocks: expected true or false",
            ),
            (
                "haproxyConfig: { template: x }\ncontroller:\n  listen: localhost:9400\n",
                "hapwright.yaml:3:11: controller.listen: expected ip:port (host names are not accepted)",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(error(text), expected, "{text}");
        }
    }

    #[test]
    fn a_duplicate_key_has_no_placeholder_path() {
        let message = error("haproxyConfig: { template: x }\ncontroller: {}\ncontroller: {}\n");
        assert!(message.starts_with("hapwright.yaml:3:"), "{message}");
        assert!(!message.contains("?:"), "{message}");
        assert!(message.contains("duplicate"), "{message}");
    }

    #[test]
    fn an_empty_file_says_so() {
        for text in ["", "\n\n", "# nothing yet\n---\n"] {
            let message = error(text);
            assert!(
                message.starts_with("hapwright.yaml: the config file is empty"),
                "{message}"
            );
        }
    }
}

//! Where the templates of the config file live ([`TemplatePlaces`]).

#[allow(unused_imports)]
use super::*;

/// Where each inline template (`haproxyConfig`, snippets, maps, files,
/// certificates) is written in the config file, so an error in a template also names
/// the config file line users edit: `hapwright.yaml:87:47 (maps/hosts.map line 4)`.
#[derive(Clone, Debug, Default)]
pub struct TemplatePlaces {
    file: String,
    places: std::collections::BTreeMap<String, TemplatePlace>,
}

impl TemplatePlaces {
    /// Finds every template of `config` in `text`, the file shown as `display`.
    pub fn new(text: &str, display: &str, config: &Config) -> Self {
        let locator = Locator::new(text);
        let lines: Vec<&str> = text.lines().collect();
        let templates = &config.templates;
        let names = std::iter::once(("haproxy.cfg".to_owned(), "haproxyConfig".to_owned()))
            .chain(
                templates
                    .template_snippets
                    .keys()
                    .map(|n| (n.clone(), format!("templateSnippets.{n}"))),
            )
            .chain(
                templates
                    .maps
                    .keys()
                    .map(|n| (format!("maps/{n}"), format!("maps.{n}"))),
            )
            .chain(
                templates
                    .files
                    .keys()
                    .map(|n| (format!("files/{n}"), format!("files.{n}"))),
            )
            .chain(
                templates
                    .ssl_certificates
                    .keys()
                    .map(|n| (format!("certs/{n}"), format!("sslCertificates.{n}"))),
            )
            .chain(templates.status_templates.keys().map(|n| {
                (
                    hapwright_reconciler::status::template_name(n),
                    format!("statusTemplates.{n}"),
                )
            }));
        let mut places = std::collections::BTreeMap::new();
        for (name, key) in names {
            let path = format!("{key}.template");
            let (Some((key_line, key_column)), Some((line, column))) =
                (locator.locate(&path), locator.value_at(&path))
            else {
                continue;
            };
            let Some(text_line) = lines.get(key_line as usize - 1) else {
                continue;
            };
            // After `template:` on the key's line: a block indicator, or the value.
            let after_key: String = text_line
                .chars()
                .skip(key_column as usize - 1)
                .skip_while(|c| *c != ':')
                .skip(1)
                .collect();
            let first = match after_key.trim_start().chars().next() {
                Some(c @ ('|' | '>')) => Some(c),
                _ => lines
                    .get(line as usize - 1)
                    .and_then(|l| l.chars().nth(column as usize - 1)),
            };
            let place = match first {
                Some('|' | '>') => {
                    // The content starts on the next line, at the indent of its first
                    // non-blank line.
                    let indent = lines
                        .iter()
                        .skip(key_line as usize)
                        .find(|l| !l.trim().is_empty())
                        .map_or(0, |l| l.len() - l.trim_start().len());
                    TemplatePlace {
                        line: key_line + 1,
                        column: u32::try_from(indent).unwrap_or(0) + 1,
                        block: true,
                    }
                }
                Some('"' | '\'') => TemplatePlace {
                    line,
                    column: column + 1,
                    block: false,
                },
                _ => TemplatePlace {
                    line,
                    column,
                    block: false,
                },
            };
            places.insert(name, place);
        }
        Self {
            file: display.to_owned(),
            places,
        }
    }

    /// Adds the config file place to every diagnostic that points at a line of an
    /// inline template.
    pub fn locate(&self, errors: Vec<Diagnostic>) -> Vec<Diagnostic> {
        errors
            .into_iter()
            .map(|error| match self.config_place(&error) {
                Some(place) => error.in_config(place),
                None => error,
            })
            .collect()
    }

    pub(super) fn config_place(&self, error: &Diagnostic) -> Option<SourceLocation> {
        let template = error.template_location()?;
        let place = self.places.get(&template.file)?;
        let line = template.line?;
        let (line, column) = if place.block {
            (
                place.line + line - 1,
                Some(place.column + template.column.unwrap_or(1) - 1),
            )
        } else if line == 1 {
            (
                place.line,
                Some(place.column + template.column.unwrap_or(1) - 1),
            )
        } else {
            (place.line, None)
        };
        Some(SourceLocation::new(self.file.clone(), Some(line), column))
    }
}

#[cfg(test)]
mod template_places_tests {
    use super::*;

    fn places(text: &str) -> TemplatePlaces {
        let (config, _) = parse(
            text,
            Path::new("/nonexistent/hapwright.yaml"),
            "hapwright.yaml",
        )
        .unwrap();
        TemplatePlaces::new(text, "hapwright.yaml", &config)
    }

    fn shown(places: &TemplatePlaces, error: Diagnostic) -> String {
        places.locate(vec![error])[0].to_string()
    }

    #[test]
    fn template_errors_name_the_config_file_line_and_column() {
        let text = "\
haproxyConfig:
  template: |
    global
        bogus on
maps:
  hosts.map: { template: \"{{ x | uper }}\" }
templateSnippets:
  be:
    template: >-
      backend {{ y }}
";
        let places = places(text);
        let at = |file: &str, line, column| {
            Diagnostic::error("oops").at(SourceLocation::new(file, Some(line), column))
        };
        assert_eq!(
            shown(&places, at("maps/hosts.map", 1, Some(8))),
            "hapwright.yaml:6:34 (maps/hosts.map line 1): oops"
        );
        assert_eq!(
            shown(&places, at("be", 1, None)),
            "hapwright.yaml:10:7 (be line 1): oops"
        );
        // A rendered line names its template line and where that is in the file.
        let rendered = Diagnostic::error("unknown keyword 'bogus'")
            .at(SourceLocation::new("haproxy.cfg", Some(2), None))
            .from_origin(SourceLocation::new("haproxy.cfg", Some(2), None));
        assert_eq!(
            shown(&places, rendered),
            "haproxy.cfg:2: unknown keyword 'bogus' (from haproxy.cfg:2, hapwright.yaml:4:5)"
        );
        // Anything else is left alone.
        assert_eq!(
            shown(&places, at("services.yaml", 3, None)),
            "services.yaml:3: oops"
        );
    }
}

//! Structured errors and warnings with optional source locations.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A place in a file: the controller config, a manifest, a template or a rendered
/// file. Lines and columns are 1-based.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceLocation {
    /// File or template name.
    pub file: String,
    /// Line, when known.
    pub line: Option<u32>,
    /// Column, when known.
    pub column: Option<u32>,
}

impl SourceLocation {
    /// A location with a line and, optionally, a column.
    pub fn new(file: impl Into<String>, line: Option<u32>, column: Option<u32>) -> Self {
        Self {
            file: file.into(),
            line,
            column,
        }
    }
}

impl fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        Ok(())
    }
}

/// How serious a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; nothing was rejected.
    Warning,
    /// The checked thing was rejected.
    #[default]
    Error,
}

/// One error or warning, as users see it in logs, `/debug` and the status page.
///
/// `location` is where the problem was detected (a rendered `haproxy.cfg` line, a
/// manifest file); `origin` is the user's source that produced it (the template or
/// snippet line), when the two differ.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// What went wrong, in one sentence.
    pub message: String,
    /// Where it was detected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<SourceLocation>,
    /// The template line that produced the faulty output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<SourceLocation>,
    /// The offending source line, as written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_line: Option<String>,
    /// Where the template behind `origin` (or `location`, for a template error) is
    /// written in the controller's config file, for templates written inline: the
    /// place users edit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<SourceLocation>,
}

impl Diagnostic {
    /// An error without a location.
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            message: message.into(),
            location: None,
            origin: None,
            source_line: None,
            config: None,
        }
    }

    /// A warning without a location.
    pub fn warning(message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(message)
        }
    }

    /// Sets where the problem was detected.
    #[must_use]
    pub fn at(mut self, location: SourceLocation) -> Self {
        self.location = Some(location);
        self
    }

    /// Sets the template line that produced the faulty output.
    #[must_use]
    pub fn from_origin(mut self, origin: SourceLocation) -> Self {
        self.origin = Some(origin);
        self
    }

    /// Sets where the template is written in the config file.
    #[must_use]
    pub fn in_config(mut self, config: SourceLocation) -> Self {
        self.config = Some(config);
        self
    }

    /// The template place this diagnostic points at: the origin of a rendered line,
    /// otherwise the location itself (a template error).
    pub fn template_location(&self) -> Option<&SourceLocation> {
        self.origin.as_ref().or(self.location.as_ref())
    }

    /// Attaches the offending source line.
    #[must_use]
    pub fn with_source_line(mut self, line: impl Into<String>) -> Self {
        self.source_line = Some(line.into());
        self
    }
}

impl fmt::Display for Diagnostic {
    /// `file:line:col: message (from template:line)`, the form compilers use. With a
    /// config file place, a template error reads `hapwright.yaml:87:47 (maps/hosts.map
    /// line 4): message` and a rendered line's origin `(from snippet:3,
    /// hapwright.yaml:40:9)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.location, &self.config) {
            (Some(location), Some(config)) if self.origin.is_none() => {
                write!(f, "{config} ({}", location.file)?;
                if let Some(line) = location.line {
                    write!(f, " line {line}")?;
                }
                f.write_str("): ")?;
            }
            (Some(location), _) => write!(f, "{location}: ")?,
            (None, _) => {}
        }
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        f.write_str(&self.message)?;
        if let Some(origin) = &self.origin {
            match &self.config {
                Some(config) => write!(f, " (from {origin}, {config})")?,
                None => write!(f, " (from {origin})")?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostic {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_templates_name_the_config_file_line() {
        let d = Diagnostic::error("unknown filter `uper`")
            .at(SourceLocation::new("maps/hosts.map", Some(4), Some(12)))
            .in_config(SourceLocation::new("hapwright.yaml", Some(87), Some(16)));
        assert_eq!(
            d.to_string(),
            "hapwright.yaml:87:16 (maps/hosts.map line 4): unknown filter `uper`"
        );
        let d = Diagnostic::error("unknown keyword 'bnd'")
            .at(SourceLocation::new("haproxy.cfg", Some(12), None))
            .from_origin(SourceLocation::new("frontend-http", Some(3), None))
            .in_config(SourceLocation::new("hapwright.yaml", Some(40), Some(7)));
        assert_eq!(
            d.to_string(),
            "haproxy.cfg:12: unknown keyword 'bnd' (from frontend-http:3, hapwright.yaml:40:7)"
        );
    }

    #[test]
    fn display_reads_like_a_compiler_message() {
        let d = Diagnostic::error("unknown keyword 'bnd'")
            .at(SourceLocation::new("haproxy.cfg", Some(12), None))
            .from_origin(SourceLocation::new("frontend-http", Some(3), Some(5)));
        assert_eq!(
            d.to_string(),
            "haproxy.cfg:12: unknown keyword 'bnd' (from frontend-http:3:5)"
        );
        let w = Diagnostic::warning("slow").at(SourceLocation::new("f", None, Some(3)));
        assert_eq!(w.to_string(), "f: warning: slow");
        assert_eq!(Diagnostic::error("plain").to_string(), "plain");
    }
}

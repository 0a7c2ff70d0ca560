//! Where each key of a YAML document is: a map from key paths (`haproxy.instances[1].
//! dataplane.passwordFile`, spelled like serde's error paths) to line and column, so
//! semantic errors found after parsing point at the right place in the file.

use std::collections::HashMap;

use serde_saphyr::granit_parser::{Event, Parser};

/// Line and column (both 1-based) of every key and sequence element of the first
/// document.
#[derive(Debug, Default)]
pub struct Locator {
    positions: HashMap<String, (u32, u32)>,
    /// Where each scalar value starts (a block scalar at its `|` or `>`).
    values: HashMap<String, (u32, u32)>,
}

enum MapState {
    Key,
    Value(String),
}

enum Kind {
    Map(MapState),
    Seq(usize),
    Ignore,
}

struct Frame {
    path: String,
    kind: Kind,
}

/// Placeholder key for complex (non-scalar) keys, which no path can address.
const COMPLEX_KEY: &str = "\u{0}complex";

fn child(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

impl Locator {
    /// Indexes `text`. Input that does not parse yields a partial index.
    pub fn new(text: &str) -> Self {
        let mut positions: HashMap<String, (u32, u32)> = HashMap::new();
        let mut values: HashMap<String, (u32, u32)> = HashMap::new();
        let mut frames: Vec<Frame> = Vec::new();
        let mut record = |path: String, line: usize, col: usize| {
            let position = (
                u32::try_from(line).unwrap_or(u32::MAX),
                u32::try_from(col + 1).unwrap_or(u32::MAX),
            );
            positions.entry(path).or_insert(position);
        };
        for item in Parser::new_from_str(text) {
            let Ok((event, span)) = item else { break };
            let (line, col) = (span.start.line(), span.start.col());
            match event {
                Event::DocumentEnd => break,
                Event::Scalar(value, ..) => match frames.last_mut() {
                    Some(Frame {
                        path,
                        kind: Kind::Map(state),
                    }) => match state {
                        MapState::Key => {
                            record(child(path, &value), line, col);
                            *state = MapState::Value(value.into_owned());
                        }
                        MapState::Value(key) => {
                            let path = child(path, key);
                            values.entry(path.clone()).or_insert((
                                u32::try_from(line).unwrap_or(u32::MAX),
                                u32::try_from(col + 1).unwrap_or(u32::MAX),
                            ));
                            record(path, line, col);
                            *state = MapState::Key;
                        }
                    },
                    Some(Frame {
                        path,
                        kind: Kind::Seq(index),
                    }) => {
                        record(format!("{path}[{index}]"), line, col);
                        *index += 1;
                    }
                    _ => {}
                },
                Event::Alias(_) => match frames.last_mut() {
                    Some(Frame {
                        kind: Kind::Map(state),
                        path,
                    }) => match state {
                        MapState::Key => *state = MapState::Value(COMPLEX_KEY.to_owned()),
                        MapState::Value(key) => {
                            record(child(path, key), line, col);
                            *state = MapState::Key;
                        }
                    },
                    Some(Frame {
                        path,
                        kind: Kind::Seq(index),
                    }) => {
                        record(format!("{path}[{index}]"), line, col);
                        *index += 1;
                    }
                    _ => {}
                },
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    let (path, ignore) = match frames.last_mut() {
                        None => (String::new(), false),
                        Some(Frame {
                            kind: Kind::Ignore, ..
                        }) => (String::new(), true),
                        Some(Frame {
                            kind: Kind::Map(MapState::Key),
                            ..
                        }) => (String::new(), true),
                        Some(Frame {
                            path,
                            kind: Kind::Map(MapState::Value(key)),
                        }) => (child(path, key), false),
                        Some(Frame {
                            path,
                            kind: Kind::Seq(index),
                        }) => {
                            let element = format!("{path}[{index}]");
                            *index += 1;
                            (element, false)
                        }
                    };
                    if !ignore && !path.is_empty() {
                        record(path.clone(), line, col);
                    }
                    let kind = if ignore {
                        Kind::Ignore
                    } else if matches!(event, Event::MappingStart(..)) {
                        Kind::Map(MapState::Key)
                    } else {
                        Kind::Seq(0)
                    };
                    frames.push(Frame { path, kind });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    frames.pop();
                    if let Some(Frame {
                        kind: Kind::Map(state),
                        ..
                    }) = frames.last_mut()
                    {
                        *state = match state {
                            MapState::Value(_) => MapState::Key,
                            MapState::Key => MapState::Value(COMPLEX_KEY.to_owned()),
                        };
                    }
                }
                _ => {}
            }
        }
        Self { positions, values }
    }

    /// Line and column where the scalar value of exactly `path` starts (for a block
    /// scalar, its `|` or `>` indicator).
    pub fn value_at(&self, path: &str) -> Option<(u32, u32)> {
        self.values.get(path).copied()
    }

    /// Line and column of `path`, or of its nearest ancestor that exists in the file
    /// (a defaulted key is reported at its parent).
    pub fn locate(&self, path: &str) -> Option<(u32, u32)> {
        let mut current = path;
        loop {
            if let Some(position) = self.positions.get(current) {
                return Some(*position);
            }
            let cut = current.rfind(['.', '['])?;
            current = &current[..cut];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_elements_and_fallbacks() {
        let text = "\
controller:
  debounce: 200ms
maps:
  hosts.map: { template: x }
haproxy:
  instances:
    - name: a
    - name: b
      dataplane: {url: u, passwordFile: p}
? [complex]
: 1
after: 2
";
        let locator = Locator::new(text);
        assert_eq!(locator.locate("controller"), Some((1, 1)));
        assert_eq!(locator.locate("controller.debounce"), Some((2, 3)));
        assert_eq!(locator.locate("maps.hosts.map"), Some((4, 3)));
        assert_eq!(locator.locate("maps.hosts.map.template"), Some((4, 16)));
        assert_eq!(locator.locate("haproxy.instances[1]"), Some((8, 7)));
        assert_eq!(
            locator.locate("haproxy.instances[1].dataplane.passwordFile"),
            Some((9, 27))
        );
        // Missing keys fall back to their nearest ancestor.
        assert_eq!(
            locator.locate("haproxy.instances[1].dataplane.caFile"),
            Some((9, 7))
        );
        assert_eq!(locator.locate("controller.maxWait"), Some((1, 1)));
        assert_eq!(locator.locate("after"), Some((12, 1)));
        assert_eq!(locator.locate("nothing"), None);
    }
}

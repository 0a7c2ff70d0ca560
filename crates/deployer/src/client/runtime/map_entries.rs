//! A map change applied entry by entry: `add map`, `set map` and `del map` on the
//! running map instead of building a new version of all of it (`prepare map`, every
//! entry again, `commit map`). At 10,000 routes a new route then costs one command,
//! not the 10,000-entry transaction (about 11 ms on HAProxy 2.6, haproxy-2.6.md §0).
//!
//! The result is the same map only where the order of the entries cannot matter and
//! every entry can be named on a command line, so [`entry_commands`] answers `None`
//! (replace the map whole) unless
//!
//! - the caller knows the file is used only by map converters whose lookups do not
//!   depend on the order with unique keys: exact matches (`map(` / `map_str(`) and
//!   prefix matches (`map_beg(`, which HAProxy indexes in a prefix tree and answers
//!   with the longest matching key);
//! - every line that differs (those between the start and the end both contents
//!   share) is exactly `KEY VALUE`, two plain words (printable ASCII without quotes,
//!   backslashes, `;`, `#` or `<`), so a command carries them as they are and
//!   HAProxy reads the file the same way;
//! - no key appears twice among those lines, nor on a line both contents share
//!   (`add map` of an existing key would add a second entry, and `del map` removes
//!   every entry of a key); the shared lines are the same entries before and after;
//! - the change needs at most [`MAX_ENTRY_COMMANDS`] commands (a large change is
//!   better made atomic).
//!
//! Each entry changes atomically; a request during the update sees every key either
//! as before or as after.

use std::collections::HashMap;

use super::{
    MAX_PAYLOAD_BYTES, RuntimeClient, RuntimeError, chain_commands, cli_word, is_empty,
    pattern_lines,
};

/// Most commands a map change is applied with entry by entry.
pub const MAX_ENTRY_COMMANDS: usize = 64;

/// The commands that turn the order-free map `file` (as HAProxy names it) from `old`
/// into `new`, when entry by entry gives the same map (module docs); `None`: replace
/// it whole.
///
/// Only the lines between the start and the end both contents share are read
/// entry by entry (a new route in a map of 10,000 is one line, not 20,000 entries
/// to index): those lines must be plain, unique and the change at most
/// [`MAX_ENTRY_COMMANDS`] commands, and none of their keys may be the key of a
/// shared line. Shared lines are the same entries before and after and get no
/// command; lookups of their keys are untouched. When many lines differ, both
/// contents are read whole, as [`entry_commands_whole`] does.
pub fn entry_commands(file: &str, old: &str, new: &str) -> Option<Vec<String>> {
    let (a, b) = (old.as_bytes(), new.as_bytes());
    let prefix = crate::haproxy::config::common_prefix(a, b);
    let suffix = crate::haproxy::config::common_suffix(a, b, a.len().min(b.len()) - prefix);
    // Whole lines: back to the start of the line the first difference is on, on to
    // the end of the line the last one is on in either text (the same length in
    // both, since the texts after it are the same).
    let start = memchr::memrchr(b'\n', &a[..prefix]).map_or(0, |i| i + 1);
    let (old_end, new_end) = (a.len() - suffix, b.len() - suffix);
    let at_line_end = |text: &[u8], end: usize| end == start || text[end - 1] == b'\n';
    let to_line_end = if at_line_end(a, old_end) && at_line_end(b, new_end) {
        0
    } else {
        memchr::memchr(b'\n', &a[old_end..]).map_or(a.len() - old_end, |i| i + 1)
    };
    let (old_stop, new_stop) = (old_end + to_line_end, new_end + to_line_end);
    let (old_middle, new_middle) = (&old[start..old_stop], &new[start..new_stop]);
    if old_middle.len().max(new_middle.len()) > MIDDLE_BYTES {
        return entry_commands_whole(file, old, new);
    }
    let (old_entries, old_index) = entries(old_middle)?;
    let (new_entries, new_index) = entries(new_middle)?;
    let commands = commands_between(file, &old_entries, &old_index, &new_entries, &new_index)?;
    // A key of the changed lines on a shared line would be a second entry of it.
    let shared = [&old[..start], &old[old_stop..]];
    let keys = old_index
        .keys()
        .chain(new_index.keys().filter(|k| !old_index.contains_key(*k)));
    for key in keys {
        if shared.iter().any(|text| has_key(text, key)) {
            return None;
        }
    }
    Some(commands)
}

/// Most bytes of changed lines [`entry_commands`] reads on their own; past that the
/// change is large, and both contents are read whole.
const MIDDLE_BYTES: usize = 16 * 1024;

/// [`entry_commands`] reading both contents whole: every line plain and every key
/// unique in both.
pub fn entry_commands_whole(file: &str, old: &str, new: &str) -> Option<Vec<String>> {
    let (old, old_index) = entries(old)?;
    let (new, new_index) = entries(new)?;
    commands_between(file, &old, &old_index, &new, &new_index)
}

/// The `set`, `add` and `del map` commands from `old` to `new`; `None` past
/// [`MAX_ENTRY_COMMANDS`].
fn commands_between(
    file: &str,
    old: &[(&str, &str)],
    old_index: &HashMap<&str, &str>,
    new: &[(&str, &str)],
    new_index: &HashMap<&str, &str>,
) -> Option<Vec<String>> {
    let file = cli_word(file);
    let mut commands = Vec::new();
    for (key, value) in new {
        match old_index.get(key) {
            Some(previous) if previous == value => continue,
            Some(_) => commands.push(format!("set map {file} {key} {value}")),
            None => commands.push(format!("add map {file} {key} {value}")),
        }
        if commands.len() > MAX_ENTRY_COMMANDS {
            return None;
        }
    }
    for (key, _) in old.iter().filter(|(key, _)| !new_index.contains_key(key)) {
        commands.push(format!("del map {file} {key}"));
        if commands.len() > MAX_ENTRY_COMMANDS {
            return None;
        }
    }
    Some(commands)
}

/// Whether a line of `text` has `key` as its key: the first word, after leading
/// blanks, as HAProxy reads a pattern file.
fn has_key(text: &str, key: &str) -> bool {
    let bytes = text.as_bytes();
    memchr::memmem::find_iter(bytes, key.as_bytes()).any(|at| {
        let line_start = memchr::memrchr(b'\n', &bytes[..at]).map_or(0, |i| i + 1);
        let before_blank = bytes[line_start..at]
            .iter()
            .all(|&c| c == b' ' || c == b'\t');
        let after = bytes.get(at + key.len()).copied();
        before_blank && matches!(after, None | Some(b' ' | b'\t' | b'\n' | b'\r'))
    })
}

type Entries<'a> = (Vec<(&'a str, &'a str)>, HashMap<&'a str, &'a str>);

/// The entries of a map's content in order, and by key; `None` unless every line is
/// two plain words and every key is unique.
fn entries(content: &str) -> Option<Entries<'_>> {
    let mut list = Vec::new();
    let mut index = HashMap::new();
    for line in pattern_lines(content) {
        let mut words = line.split(' ').filter(|w| !w.is_empty());
        let (Some(key), Some(value), None) = (words.next(), words.next(), words.next()) else {
            return None;
        };
        if !plain(key) || !plain(value) || index.insert(key, value).is_some() {
            return None;
        }
        list.push((key, value));
    }
    Some((list, index))
}

/// A word a command line and a map file both carry as it is.
fn plain(word: &str) -> bool {
    word.bytes()
        .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\'' | b'\\' | b';' | b'#' | b'<'))
}

impl RuntimeClient {
    /// Sends `commands` ([`entry_commands`]) chained in lines under
    /// [`MAX_PAYLOAD_BYTES`]; every answer must be empty. Returns how many.
    pub async fn update_map_entries(&self, commands: &[String]) -> Result<usize, RuntimeError> {
        for batch in chain_commands(commands, MAX_PAYLOAD_BYTES) {
            let answer = self.chained(&batch).await?;
            if !is_empty(&answer) {
                return Err(RuntimeError::Refused {
                    command: format!(
                        "{} (a batch of {})",
                        batch.first().copied().unwrap_or_default(),
                        batch.len()
                    ),
                    answer,
                });
            }
        }
        Ok(commands.len())
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_ENTRY_COMMANDS, entry_commands};

    #[test]
    fn added_changed_and_removed_entries_become_commands() {
        let old = "a.test be_a\nb.test be_b\n# comment\n\nc.test be_c\n";
        let new = "a.test be_a\nb.test be_x\nd.test be_d\n";
        assert_eq!(
            entry_commands("/run/maps/hosts.map", old, new),
            Some(vec![
                "set map /run/maps/hosts.map b.test be_x".to_owned(),
                "add map /run/maps/hosts.map d.test be_d".to_owned(),
                "del map /run/maps/hosts.map c.test".to_owned(),
            ])
        );
        assert_eq!(entry_commands("m", old, old), Some(Vec::new()));
        // The file name is escaped as every command does.
        assert_eq!(
            entry_commands("my maps/h.map", "", "k v\n"),
            Some(vec!["add map my\\ maps/h.map k v".to_owned()])
        );
    }

    #[test]
    fn what_commands_cannot_carry_exactly_replaces_the_map() {
        let old = "a.test be_a\n";
        for new in [
            "a.test be_a\nb.test be b\n",        // three words
            "a.test be_a\nb.test\n",             // no value
            "a.test be_a\na.test be_b\n",        // a duplicate key
            "a.test be_a\nb.test be;shutdown\n", // a separator
            "a.test be_a\nb.test \"be_b\"\n",    // quotes
            "a.test be_a\nb.test be_b <<\n",     // a payload marker
            "a.test be_a\nb.tést be_b\n",        // not ASCII
            "a.test be_a\nb.test\tbe_b\n",       // a tab
        ] {
            assert_eq!(entry_commands("m", old, new), None, "{new:?}");
            assert_eq!(entry_commands("m", new, old), None, "{new:?}");
        }
        // The changed lines are whole lines of both texts: here the old text's
        // second line is the end of the new text's second line.
        assert_eq!(
            entry_commands("m", "a.test x\nz.test y\n", "a.test x\nq.test rz.test y\n"),
            None
        );
        // A key of a changed line that an unchanged line has too.
        assert_eq!(
            entry_commands(
                "m",
                "a.test x\nb.test y\n",
                "a.test x\nb.test y\n\ta.test z\n"
            ),
            None
        );
        assert_eq!(
            entry_commands(
                "m",
                "a.test x\n# b.test\nab.test y\n",
                "a.test x\n# b.test\nab.test y\nb.test z\n"
            ),
            Some(vec!["add map m b.test z".to_owned()])
        );
        let many: String = (0..=MAX_ENTRY_COMMANDS)
            .map(|i| format!("h{i}.test be_{i}\n"))
            .collect();
        assert_eq!(entry_commands("m", "", &many), None);
    }
}

#[cfg(test)]
mod differential {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::entry_commands;

    /// The map `commands` leave of `old`, with HAProxy's meaning of each command on
    /// unique keys; `None` when one would fail (a key to set or delete is missing, a
    /// key to add is present).
    fn apply(
        old: &BTreeMap<String, String>,
        commands: &[String],
    ) -> Option<BTreeMap<String, String>> {
        let mut map = old.clone();
        for command in commands {
            let words: Vec<&str> = command.split(' ').collect();
            match words.as_slice() {
                ["add", "map", "m", key, value] => {
                    map.insert((*key).to_owned(), (*value).to_owned())
                        .is_none()
                        .then_some(())?;
                }
                ["set", "map", "m", key, value] => {
                    map.insert((*key).to_owned(), (*value).to_owned())?;
                }
                ["del", "map", "m", key] => {
                    map.remove(*key)?;
                }
                _ => return None,
            }
        }
        Some(map)
    }

    fn content(map: &BTreeMap<String, String>) -> String {
        map.iter().map(|(k, v)| format!("{k} {v}\n")).collect()
    }

    proptest! {
        /// Whenever entry commands are given, they turn the old map into the new one.
        #[test]
        fn entry_commands_give_the_new_map(
            old in prop::collection::btree_map("[a-e]{1,2}\\.test", "be_[a-c]", 0..30),
            new in prop::collection::btree_map("[a-e]{1,2}\\.test", "be_[a-c]", 0..30),
        ) {
            if let Some(commands) = entry_commands("m", &content(&old), &content(&new)) {
                prop_assert_eq!(apply(&old, &commands), Some(new));
            }
        }
    }

    /// A map as HAProxy loads a pattern file: entries in file order, the key the
    /// first word after leading blanks, the value the rest of the line.
    fn loaded(content: &str) -> Vec<(String, String)> {
        content
            .lines()
            .map(|line| line.trim_start_matches([' ', '\t']))
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(|line| {
                let (key, value) = line.split_once([' ', '\t']).unwrap_or((line, ""));
                (key.to_owned(), value.trim().to_owned())
            })
            .collect()
    }

    /// HAProxy's meaning of each command on a map with possibly repeated keys:
    /// `add` appends an entry, `set` changes every entry of the key, `del` removes
    /// every entry of the key.
    fn apply_loaded(map: &mut Vec<(String, String)>, commands: &[String]) {
        for command in commands {
            let words: Vec<&str> = command.split(' ').collect();
            match words.as_slice() {
                ["add", "map", "m", key, value] => {
                    map.push(((*key).to_owned(), (*value).to_owned()))
                }
                ["set", "map", "m", key, value] => {
                    for entry in map.iter_mut().filter(|(k, _)| k == key) {
                        entry.1 = (*value).to_owned();
                    }
                }
                ["del", "map", "m", key] => map.retain(|(k, _)| k != key),
                _ => panic!("unexpected command {command}"),
            }
        }
    }

    /// What an exact lookup of each key answers (the first entry of the key).
    fn lookups(map: &[(String, String)]) -> BTreeMap<String, String> {
        let mut answers = BTreeMap::new();
        for (key, value) in map {
            answers.entry(key.clone()).or_insert_with(|| value.clone());
        }
        answers
    }

    /// A map file line: mostly `KEY VALUE`, sometimes a comment, a blank line, a
    /// third word, leading blanks or a tab.
    fn line() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => ("[a-f]{1,2}", "[a-c]{1,2}").prop_map(|(k, v)| format!("{k}.test {v}")),
            1 => ("[a-f]{1,2}", "[a-c]{1,2}").prop_map(|(k, v)| format!("{k}.test {v} extra")),
            1 => ("[a-f]{1,2}", "[a-c]{1,2}").prop_map(|(k, v)| format!("  {k}.test\t{v}")),
            1 => "[a-f]{1,2}".prop_map(|k| format!("# {k}.test comment")),
            1 => Just(String::new()),
        ]
    }

    /// An edit of a list of lines: some inserted, removed or replaced in one place.
    fn edited() -> impl Strategy<Value = (Vec<String>, Vec<String>)> {
        prop::collection::vec(line(), 0..40).prop_flat_map(|old| {
            let len = old.len();
            (
                Just(old),
                0..=len,
                0..4usize,
                prop::collection::vec(line(), 0..4),
                prop::bool::ANY,
            )
                .prop_map(|(old, at, removed, inserted, trailing)| {
                    let mut new = old.clone();
                    let end = (at + removed).min(new.len());
                    new.splice(at..end, inserted);
                    let join = |lines: &[String]| {
                        let mut text = lines.join("\n");
                        if trailing && !text.is_empty() {
                            text.push('\n');
                        }
                        text
                    };
                    (vec![join(&old)], vec![join(&new)])
                })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Reading only the changed lines agrees with reading both contents whole
        /// whenever the whole reading gives commands, and whatever commands it gives
        /// leave every key answering as HAProxy answers after loading the new file,
        /// also with repeated keys, comments and other lines around the change.
        #[test]
        fn changed_lines_only_agree_with_the_whole_contents((old, new) in edited()) {
            let (old, new) = (&old[0], &new[0]);
            let fast = super::entry_commands("m", old, new);
            let whole = super::entry_commands_whole("m", old, new);
            if whole.is_some() {
                prop_assert_eq!(&fast, &whole);
            }
            if let Some(commands) = fast {
                let mut live = loaded(old);
                apply_loaded(&mut live, &commands);
                prop_assert_eq!(lookups(&live), lookups(&loaded(new)));
            }
        }
    }
}

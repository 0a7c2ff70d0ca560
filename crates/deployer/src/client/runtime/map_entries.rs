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
//! - every entry line of both contents is exactly `KEY VALUE`, two plain words
//!   (printable ASCII without quotes, backslashes, `;`, `#` or `<`), so a command
//!   carries them as they are and HAProxy reads the file the same way;
//! - no key appears twice in either content (`add map` of an existing key would add
//!   a second entry, and `del map` removes every entry of a key);
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
pub fn entry_commands(file: &str, old: &str, new: &str) -> Option<Vec<String>> {
    let (old, old_index) = entries(old)?;
    let (new, new_index) = entries(new)?;
    let file = cli_word(file);
    let mut commands = Vec::new();
    for (key, value) in &new {
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
}

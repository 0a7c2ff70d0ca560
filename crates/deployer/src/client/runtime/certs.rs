//! Certificates and crt-list entries through the runtime API: added, replaced and
//! removed without a reload (HAProxy 2.2 and later, so every supported line).
//!
//! Every operation converges when it finds its work half done (a controller killed
//! between two commands, a retry after a refused step): a certificate that already
//! exists is updated, an entry that is already in the list is replaced, and what is
//! already gone counts as removed. Payloads (the PEM with its private key) never
//! appear in errors: those quote the command line only.

use super::{RuntimeClient, RuntimeError, cli_word};

impl RuntimeClient {
    /// The crt-lists (and certificate directories, which HAProxy keeps as crt-lists)
    /// it loaded: `show ssl crt-list`.
    pub async fn crt_lists(&self) -> Result<Vec<String>, RuntimeError> {
        let answer = self.query("show ssl crt-list").await?;
        Ok(answer
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect())
    }

    /// The entries of one crt-list as (certificate, line number):
    /// `show ssl crt-list -n <list>`.
    pub async fn crt_list_entries(&self, list: &str) -> Result<Vec<(String, u32)>, RuntimeError> {
        let command = format!("show ssl crt-list -n {}", cli_word(list));
        let answer = self.query(&command).await?;
        parse_crt_list_entries(&answer).ok_or(RuntimeError::Unexpected { command, answer })
    }

    /// A certificate HAProxy does not know yet: `new ssl cert`, then `set ssl cert`
    /// and `commit ssl cert`, the three in one session (one round trip). One that
    /// already exists (an earlier attempt got that far) is updated. When HAProxy
    /// refuses the PEM (garbage at `set`, a key that does not match the certificate
    /// at `commit`), the transaction is aborted and the empty store just created
    /// removed again, so nothing is left behind.
    pub async fn add_certificate(&self, file: &str, pem: &str) -> Result<(), RuntimeError> {
        let word = cli_word(file);
        let requests = [
            format!("new ssl cert {word}"),
            super::set_cert_request(&word, pem),
            format!("commit ssl cert {word}"),
        ];
        let answers = self.session(&requests).await?;
        let refused = |index: usize| RuntimeError::Refused {
            command: super::first_line(&requests[index]),
            answer: answers[index].clone(),
        };
        let (new, set, commit) = (&answers[0], &answers[1], &answers[2]);
        let created = new.contains("New empty certificate store");
        // `set` and `commit` ran after a refused `new` too: on a store that is not
        // there they change nothing.
        if !created && !new.contains("already exists") {
            return Err(refused(0));
        }
        let outcome =
            if !(set.contains("Transaction created") || set.contains("Transaction updated")) {
                Err(refused(1))
            } else if !commit.contains("Success") {
                Err(refused(2))
            } else {
                Ok(())
            };
        match outcome {
            Ok(()) => Ok(()),
            Err(error) => {
                // A refused commit leaves its transaction open.
                let _ = self
                    .command(&format!("abort ssl cert {}", cli_word(file)))
                    .await;
                if created {
                    let _ = self
                        .command(&format!("del ssl cert {}", cli_word(file)))
                        .await;
                }
                Err(error)
            }
        }
    }

    /// Removes a certificate no crt-list entry uses any more: `del ssl cert`. One
    /// HAProxy does not know is already removed.
    pub async fn delete_certificate(&self, file: &str) -> Result<(), RuntimeError> {
        self.expect(&format!("del ssl cert {}", cli_word(file)), |a| {
            a.contains("deleted") || a.contains("doesn't exist")
        })
        .await
        .map(drop)
    }

    /// Puts `line` (a crt-list line: the certificate, then `[options]` and SNI
    /// filters) into `list`, replacing the entries of the same certificate there.
    ///
    /// The `del` and the `add` go in one session (one round trip). When the `del`
    /// finds several entries of the certificate (it deletes none then), they are
    /// deleted by line number, the one just added with them, and the line is added
    /// again.
    pub async fn set_crt_list_entry(
        &self,
        list: &str,
        cert: &str,
        line: &str,
    ) -> Result<(), RuntimeError> {
        let del = format!("del ssl crt-list {} {}", cli_word(list), cli_word(cert));
        let add = format!("add ssl crt-list {} <<\n{line}\n\n", cli_word(list));
        let answers = self.session(&[del.clone(), add.clone()]).await?;
        let added = answers[1].contains("Success");
        match deleted_or_none(&answers[0]) {
            DelAnswer::Done if added => Ok(()),
            DelAnswer::Done => Err(RuntimeError::Refused {
                command: super::first_line(&add),
                answer: answers[1].clone(),
            }),
            DelAnswer::Several => {
                self.delete_crt_list_entry(list, cert).await?;
                self.expect(&add, |a| a.contains("Success")).await.map(drop)
            }
            DelAnswer::Refused => Err(RuntimeError::Refused {
                command: del,
                answer: answers[0].clone(),
            }),
        }
    }

    /// Removes every entry of `cert` from `list`: `del ssl crt-list` by name, which
    /// HAProxy answers for a certificate with no entry or one; only when it has
    /// several are they listed (`show ssl crt-list -n`, every entry of the list) and
    /// deleted by line number. Refused when HAProxy will not delete an entry (the
    /// default certificate of a bind line cannot go at runtime).
    pub async fn delete_crt_list_entry(&self, list: &str, cert: &str) -> Result<(), RuntimeError> {
        let request = format!("del ssl crt-list {} {}", cli_word(list), cli_word(cert));
        let answer = self.command(&request).await?;
        match deleted_or_none(&answer) {
            DelAnswer::Done => return Ok(()),
            DelAnswer::Refused => {
                return Err(RuntimeError::Refused {
                    command: request,
                    answer,
                });
            }
            DelAnswer::Several => {}
        }
        let entries = self.crt_list_entries(list).await?;
        let mut lines: Vec<u32> = entries
            .iter()
            .filter(|(c, _)| c == cert)
            .map(|(_, line)| *line)
            .collect();
        // From the last, so the earlier line numbers stay valid.
        lines.sort_unstable_by(|a, b| b.cmp(a));
        for line in lines {
            self.expect(
                &format!(
                    "del ssl crt-list {} {}",
                    cli_word(list),
                    cli_word(&format!("{cert}:{line}"))
                ),
                crt_list_entry_deleted,
            )
            .await?;
        }
        Ok(())
    }
}

/// What a `del ssl crt-list <list> <cert>` did.
enum DelAnswer {
    /// Deleted the entry, or there was none (the certificate is not loaded, or has
    /// no entry in this list).
    Done,
    /// The certificate has several entries: none was deleted.
    Several,
    /// HAProxy will not delete it (the default certificate of a bind line).
    Refused,
}

fn deleted_or_none(answer: &str) -> DelAnswer {
    let none =
        answer.contains("' does not exist!") || answer.contains("' can't be found in crt-list '");
    if crt_list_entry_deleted(answer) || none {
        DelAnswer::Done
    } else if answer.contains("in several entries") {
        DelAnswer::Several
    } else {
        DelAnswer::Refused
    }
}

/// HAProxy's answer to a `del ssl crt-list` that deleted the entry (`Entry '…'
/// deleted in crtlist '…'!`); a refusal reads `… cannot be deleted, …`.
fn crt_list_entry_deleted(answer: &str) -> bool {
    answer.contains("' deleted in crtlist '")
}

/// Parses `show ssl crt-list -n <list>`: `# <list>`, then `<cert>:<line> ...` per
/// entry. `None` when a line is not of that form.
pub fn parse_crt_list_entries(answer: &str) -> Option<Vec<(String, u32)>> {
    let mut entries = Vec::new();
    for line in answer.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let first = line.split_whitespace().next()?;
        let (cert, number) = first.rsplit_once(':')?;
        entries.push((cert.to_owned(), number.parse().ok()?));
    }
    Some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crt_list_entries_parse_with_their_line_numbers() {
        let answer = "# files/tls.crtlist\ncerts/a.pem:1 [alpn h2 ] a.example.com\n\
                      certs/b.pem:2 b.example.com other.example.com\n";
        assert_eq!(
            parse_crt_list_entries(answer).unwrap(),
            [("certs/a.pem".to_owned(), 1), ("certs/b.pem".to_owned(), 2)]
        );
        assert_eq!(parse_crt_list_entries("# files/empty\n").unwrap(), []);
        assert!(parse_crt_list_entries("Can't display the crt-list").is_none());
    }
}

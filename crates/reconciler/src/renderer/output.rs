//! Where a file's render is written: markers are stripped as the engine writes
//! (see [`source_map`](super::source_map)), and the output is refused as soon as it
//! grows past `templating.maxOutputBytes`, for this file alone or for all files of
//! the render together, so a runaway loop stops early instead of filling memory.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use hapwright_eventbus::config::ByteSize;
use hapwright_eventbus::model::LineOrigin;

use super::escape::{Escaping, Refusal};
use super::fragments::Direct;
use super::source_map::{Mark, MarkerTable, Stripped, Stripper};

/// The output budget of one render, shared by every file rendering in parallel.
#[derive(Debug)]
pub(crate) struct Budget {
    cap: ByteSize,
    used: AtomicU64,
}

impl Budget {
    /// A budget of `cap` bytes for each file and for all files together.
    pub(crate) fn new(cap: ByteSize) -> Self {
        Self {
            cap,
            used: AtomicU64::new(0),
        }
    }

    /// Counts `bytes` of a file that was not written through an [`Output`] (reused
    /// from an earlier render) towards the total.
    pub(crate) fn charge(&self, bytes: usize) {
        self.used.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The cap, per file and in total.
    pub(crate) fn cap(&self) -> ByteSize {
        self.cap
    }
}

/// Which limit a render ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// This file alone grew past the cap.
    File,
    /// All files of the render together grew past the cap.
    Total,
}

/// A render stopped by the cap: which limit, and the template line that wrote last.
#[derive(Clone, Debug)]
pub(crate) struct Exceeded {
    pub(crate) scope: Scope,
    pub(crate) origin: Option<LineOrigin>,
}

/// A value refused where it landed ([`super::escape`]), and the template line that
/// printed it.
#[derive(Clone, Debug)]
pub(crate) struct RefusedValue {
    pub(crate) refusal: Refusal,
    pub(crate) origin: Option<LineOrigin>,
    /// The 1-based line of the rendered file the value would have landed on.
    pub(crate) line: usize,
}

/// One file's output: an [`io::Write`] for the engine that strips markers, escapes
/// untrusted values for where they land, and refuses to grow past the [`Budget`].
pub(crate) struct Output<'a> {
    stripper: Stripper<'a>,
    budget: &'a Budget,
    exceeded: Option<Exceeded>,
    refused: Option<RefusedValue>,
    /// Tell the fragment tracking about every piece written ([`super::fragments`]).
    tracked: bool,
}

impl<'a> Output<'a> {
    /// An empty output; `capacity` is a guess of the file's size.
    pub(crate) fn new(
        table: &'a MarkerTable,
        budget: &'a Budget,
        capacity: usize,
        escaping: Escaping,
    ) -> Self {
        Self {
            stripper: Stripper::new(table, capacity).escaping(escaping),
            budget,
            exceeded: None,
            refused: None,
            tracked: false,
        }
    }

    /// Tells the fragment tracking of this thread about every piece written.
    pub(crate) fn track(&mut self) {
        self.tracked = true;
    }

    /// Why the output was refused, if it was.
    pub(crate) fn exceeded(&self) -> Option<&Exceeded> {
        self.exceeded.as_ref()
    }

    /// The value refused where it landed, if one was.
    pub(crate) fn refused(&self) -> Option<&RefusedValue> {
        self.refused.as_ref()
    }

    /// Writes `text` as the engine would: a file put together again from its
    /// pieces goes through the same marker stripping and budget.
    pub(crate) fn put(&mut self, text: &str) -> io::Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        self.push(text)
    }

    /// Where the output is now ([`super::source_map::Stripper::mark`]).
    pub(crate) fn mark(&self) -> Mark {
        self.stripper.mark()
    }

    /// Whether the next piece would be stripped as at `mark` of the earlier output
    /// `text`.
    pub(crate) fn same_state(&self, mark: &Mark, text: &str) -> bool {
        self.stripper.same_state(mark, text)
    }

    /// Appends what the earlier output (`text`, `lines`) got between `from` and
    /// `to` ([`super::source_map::Stripper::copy`]), within the budget.
    pub(crate) fn copy(
        &mut self,
        text: &str,
        lines: &[Option<u32>],
        from: &Mark,
        to: &Mark,
    ) -> io::Result<()> {
        if self.exceeded.is_some() || self.refused.is_some() {
            return Err(io::Error::other("rendered output was refused before"));
        }
        self.stripper.copy(text, lines, from, to);
        self.charge((to.text() - from.text()) as u64)
    }

    /// The text and its line origins.
    pub(crate) fn finish(self) -> Stripped {
        self.stripper.finish()
    }

    fn refuse(&mut self, scope: Scope) -> io::Error {
        self.exceeded = Some(Exceeded {
            scope,
            origin: self.stripper.last_origin().cloned(),
        });
        io::Error::other("rendered output is larger than templating.maxOutputBytes")
    }
}

impl io::Write for Output<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.exceeded.is_some() || self.refused.is_some() {
            return Err(io::Error::other("rendered output was refused before"));
        }
        if !self.tracked {
            // The engine writes whole strings: the stripper keeps the bytes and
            // checks the whole text once, at the end.
            return self.push_bytes(buf).map(|()| buf.len());
        }
        // The engine writes whole strings, so every piece is valid UTF-8.
        let piece =
            std::str::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        match super::fragments::track_write(piece) {
            Direct::Own => self.push(piece)?,
            Direct::Fragment => {
                // A snippet output printed directly: remember where it went.
                let before = self.stripper.mark();
                self.push(piece)?;
                super::fragments::track_marks(before, self.stripper.mark());
            }
            Direct::Loop(lengths) => {
                // A loop printed directly: remember where it and each item went.
                let before = self.stripper.mark();
                let mut marks = Vec::with_capacity(lengths.len() + 1);
                marks.push(before);
                let mut rest = piece;
                for length in lengths {
                    let Some((item, after)) = rest.split_at_checked(length) else {
                        marks.clear();
                        break;
                    };
                    self.push(item)?;
                    marks.push(self.stripper.mark());
                    rest = after;
                }
                if !rest.is_empty() {
                    marks.clear();
                    self.push(rest)?;
                }
                super::fragments::track_marks(before, self.stripper.mark());
                super::fragments::track_item_marks(marks);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Output<'_> {
    fn push(&mut self, piece: &str) -> io::Result<()> {
        self.push_bytes(piece.as_bytes())
    }

    /// [`Self::push`] of the bytes of a whole string.
    fn push_bytes(&mut self, piece: &[u8]) -> io::Result<()> {
        if self.exceeded.is_some() || self.refused.is_some() {
            return Err(io::Error::other("rendered output was refused before"));
        }
        let before = self.stripper.len();
        self.stripper.push_bytes(piece);
        if let Some(refusal) = self.stripper.refused() {
            self.refused = Some(RefusedValue {
                refusal: refusal.clone(),
                origin: self.stripper.last_origin().cloned(),
                line: self.stripper.line_count() + 1,
            });
            return Err(io::Error::other("a value was refused where it landed"));
        }
        self.charge((self.stripper.len() - before) as u64)
    }

    /// Counts `grown` more bytes of text against this file's cap and the budget.
    fn charge(&mut self, grown: u64) -> io::Result<()> {
        let cap = self.budget.cap.bytes();
        if self.stripper.len() as u64 > cap {
            return Err(self.refuse(Scope::File));
        }
        let used = self.budget.used.fetch_add(grown, Ordering::Relaxed) + grown;
        if used > cap {
            return Err(self.refuse(Scope::Total));
        }
        Ok(())
    }
}

//! Positions: the protocol's (line, UTF-16 column) pairs and byte offsets into a document,
//! both ways, and incremental edits of a document.
//!
//! Every conversion clamps: a line past the end maps to the end of the text, a column past
//! the end of its line to the line's end, a column inside a character to that character's
//! start. A client's malformed position therefore never panics; it lands somewhere valid.

use lsp_types::{Position, Range};

/// Bytes between two marks of [`LineIndex`]: a position or an offset costs a scan of at
/// most this many bytes, however long its line.
const MARK_BYTES: usize = 256;

/// UTF-16 units of a text.
fn utf16_len(s: &str) -> u64 {
    if s.is_ascii() {
        s.len() as u64
    } else {
        s.chars().map(|c| c.len_utf16() as u64).sum()
    }
}

/// The starts of the lines of a text (after each `\n`), and marks every [`MARK_BYTES`]
/// bytes (on character boundaries) with the UTF-16 units before them, so that a column is
/// found without a scan of its whole line.
#[derive(Clone, Debug)]
pub struct LineIndex {
    starts: Vec<usize>,
    len: usize,
    /// `(byte offset, UTF-16 units of the text before it)`, from `(0, 0)`, increasing.
    marks: Vec<(usize, u64)>,
}

impl LineIndex {
    pub fn new(text: &str) -> LineIndex {
        let mut starts = vec![0];
        starts.extend(memchr::memchr_iter(b'\n', text.as_bytes()).map(|i| i + 1));
        let mut marks = vec![(0, 0)];
        let (mut at, mut units) = (0usize, 0u64);
        while text.len() - at > MARK_BYTES {
            let mut next = at + MARK_BYTES;
            while !text.is_char_boundary(next) {
                next += 1;
            }
            units += utf16_len(&text[at..next]);
            at = next;
            marks.push((at, units));
        }
        LineIndex {
            starts,
            len: text.len(),
            marks,
        }
    }

    /// The UTF-16 units of the text before a byte offset on a character boundary.
    fn units_before(&self, text: &str, offset: usize) -> u64 {
        let k = self.marks.partition_point(|&(o, _)| o <= offset) - 1;
        let (at, units) = self.marks[k];
        units + utf16_len(&text[at..offset])
    }

    /// The byte range of line `k` without its line break (`\n` or `\r\n`).
    fn line(&self, text: &str, k: usize) -> (usize, usize) {
        let lo = self.starts[k];
        let mut hi = self.starts.get(k + 1).map_or(self.len, |&s| s - 1);
        if hi > lo && text.as_bytes().get(hi - 1) == Some(&b'\r') {
            hi -= 1;
        }
        (lo, hi)
    }

    /// The byte offset of a position (clamped, on a character boundary).
    pub fn offset(&self, text: &str, pos: Position) -> usize {
        let k = pos.line as usize;
        if k >= self.starts.len() {
            return self.len;
        }
        let (lo, hi) = self.line(text, k);
        let target = self.units_before(text, lo) + u64::from(pos.character);
        // The scan starts at the last mark inside the line before the column, or at the
        // line's start.
        let m = self.marks.partition_point(|&(o, u)| o <= hi && u <= target) - 1;
        let (mut at, mut units) = match self.marks[m] {
            (o, u) if o > lo => (o, u),
            _ => (lo, self.units_before(text, lo)),
        };
        for c in text[at..hi].chars() {
            let w = c.len_utf16() as u64;
            if units + w > target {
                return at;
            }
            units += w;
            at += c.len_utf8();
        }
        hi
    }

    /// The position of a byte offset (clamped to the text; inside a character, its start).
    pub fn position(&self, text: &str, offset: usize) -> Position {
        let mut offset = offset.min(self.len);
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let k = self.starts.partition_point(|&s| s <= offset) - 1;
        let lo = self.starts[k];
        let character = self.units_before(text, offset) - self.units_before(text, lo);
        Position {
            line: k as u32,
            character: u32::try_from(character).unwrap_or(u32::MAX),
        }
    }

    /// The range of a byte range.
    pub fn range(&self, text: &str, lo: usize, hi: usize) -> Range {
        Range {
            start: self.position(text, lo),
            end: self.position(text, hi.max(lo)),
        }
    }

    /// The byte range of line `k` without its break, and its start offset; `None` past the end.
    pub fn line_range(&self, text: &str, k: usize) -> Option<(usize, usize)> {
        (k < self.starts.len()).then(|| self.line(text, k))
    }
}

/// The positions of increasing byte offsets, found by one walk forward over the text (an
/// offset before the last one is found by the index).
#[derive(Debug)]
pub struct Walker<'a> {
    idx: &'a LineIndex,
    text: &'a str,
    at: usize,
    line: usize,
    units: u64,
}

impl<'a> Walker<'a> {
    pub fn new(idx: &'a LineIndex, text: &'a str) -> Self {
        Walker {
            idx,
            text,
            at: 0,
            line: 0,
            units: 0,
        }
    }

    /// As [`LineIndex::position`].
    pub fn position(&mut self, offset: usize) -> Position {
        let mut offset = offset.min(self.idx.len);
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        if offset < self.at {
            return self.idx.position(self.text, offset);
        }
        let k = self.idx.starts.partition_point(|&s| s <= offset) - 1;
        if k == self.line {
            self.units += utf16_len(&self.text[self.at..offset]);
        } else {
            self.units = utf16_len(&self.text[self.idx.starts[k]..offset]);
            self.line = k;
        }
        self.at = offset;
        Position {
            line: k as u32,
            character: u32::try_from(self.units).unwrap_or(u32::MAX),
        }
    }
}

/// The line breaks in some bytes, counted 64 bytes at a time (a loop the compiler turns into
/// vector instructions).
fn newlines(b: &[u8]) -> usize {
    let chunks = b.chunks_exact(64);
    let tail = chunks.remainder().iter().filter(|&&c| c == b'\n').count();
    chunks
        .map(|c| c.iter().map(|&x| u8::from(x == b'\n')).sum::<u8>() as usize)
        .sum::<usize>()
        + tail
}

/// The byte offset of a position, as [`LineIndex::offset`] finds it, by one scan of the text
/// up to it (no index is built: an edit costs the bytes before it, not the whole text's lines).
fn offset_in(text: &str, pos: Position) -> usize {
    let b = text.as_bytes();
    // Whole blocks of fewer line breaks than are left to pass are counted, not searched.
    let (mut at, mut left) = (0, pos.line as usize);
    for block in b.chunks(1 << 16) {
        let n = newlines(block);
        if n >= left {
            break;
        }
        left -= n;
        at += block.len();
    }
    let lo = match left {
        0 => at,
        k => match memchr::memchr_iter(b'\n', &b[at..]).nth(k - 1) {
            Some(i) => at + i + 1,
            None => return text.len(),
        },
    };
    let mut hi = memchr::memchr(b'\n', &b[lo..]).map_or(text.len(), |i| lo + i);
    if hi > lo && b[hi - 1] == b'\r' {
        hi -= 1;
    }
    let mut units = 0u32;
    for (i, c) in text[lo..hi].char_indices() {
        let w = c.len_utf16() as u32;
        if units + w > pos.character {
            return lo + i;
        }
        units += w;
    }
    hi
}

/// Applies one change of `textDocument/didChange`: the whole text when `range` is `None`,
/// else the replacement of that range (clamped; a reversed range is taken in order).
pub fn apply_change(text: &mut String, range: Option<Range>, new: &str) {
    match range {
        None => {
            text.clear();
            text.push_str(new);
        }
        Some(r) => {
            let a = offset_in(text, r.start);
            let b = offset_in(text, r.end);
            let (a, b) = (a.min(b), a.max(b));
            text.replace_range(a..b, new);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(line: u32, character: u32) -> Position {
        Position { line, character }
    }

    #[test]
    fn utf16_columns() {
        // `é` is 2 bytes and 1 UTF-16 unit; `𝔸` is 4 bytes and 2 units.
        let t = "aé𝔸b\nx";
        let i = LineIndex::new(t);
        assert_eq!(i.offset(t, pos(0, 0)), 0);
        assert_eq!(i.offset(t, pos(0, 1)), 1);
        assert_eq!(i.offset(t, pos(0, 2)), 3);
        // Inside the surrogate pair: the character's start.
        assert_eq!(i.offset(t, pos(0, 3)), 3);
        assert_eq!(i.offset(t, pos(0, 4)), 7);
        assert_eq!(i.offset(t, pos(0, 99)), 8);
        assert_eq!(i.offset(t, pos(1, 1)), 10);
        assert_eq!(i.offset(t, pos(7, 0)), t.len());
        assert_eq!(i.position(t, 7), pos(0, 4));
        assert_eq!(i.position(t, 4), pos(0, 2));
        assert_eq!(i.position(t, 9), pos(1, 0));
        assert_eq!(i.position(t, 1000), pos(1, 1));
    }

    #[test]
    fn crlf_line_end_is_not_a_column() {
        let t = "ab\r\ncd";
        let i = LineIndex::new(t);
        assert_eq!(i.offset(t, pos(0, 5)), 2);
        assert_eq!(i.offset(t, pos(1, 1)), 5);
    }

    #[test]
    fn incremental_edits() {
        let mut t = String::from("param a = 1;\nparam b = 2;\n");
        apply_change(&mut t, Some(Range::new(pos(1, 6), pos(1, 7))), "bee");
        assert_eq!(t, "param a = 1;\nparam bee = 2;\n");
        // A reversed range and an out-of-range end are clamped, not a panic.
        apply_change(&mut t, Some(Range::new(pos(9, 0), pos(1, 14))), "");
        assert_eq!(t, "param a = 1;\nparam bee = 2;");
        apply_change(&mut t, None, "x");
        assert_eq!(t, "x");
    }

    #[test]
    fn marks_agree_with_a_scan_of_the_line() {
        // Long lines of one-, two-, three- and four-byte characters, CRLF and lone CR, so
        // that marks fall inside lines and next to multi-byte characters.
        let line: String = (0..700).map(|i| ["a", "é", "€", "𝔸", "\r"][i % 5]).collect();
        let t = format!("{line}\r\n{line}\n\n{line}");
        let i = LineIndex::new(&t);
        for l in 0..5u32 {
            for c in (0..1800u32).step_by(7).chain([u32::MAX]) {
                let o = i.offset(&t, pos(l, c));
                assert_eq!(o, offset_in(&t, pos(l, c)), "{l}:{c}");
                if l < 4 && c < 1700 {
                    let p = i.position(&t, o);
                    assert_eq!(p, Walker::new(&i, &t).position(o));
                    let slow = t[..o].rsplit('\n').next().unwrap().encode_utf16().count() as u32;
                    assert_eq!((p.line, p.character), (l, slow), "{l}:{c}");
                }
            }
        }
    }
}

//! Positions: the protocol's (line, UTF-16 column) pairs and byte offsets into a document,
//! both ways, and incremental edits of a document.
//!
//! Every conversion clamps: a line past the end maps to the end of the text, a column past
//! the end of its line to the line's end, a column inside a character to that character's
//! start. A client's malformed position therefore never panics; it lands somewhere valid.

use lsp_types::{Position, Range};

/// The starts of the lines of a text (after each `\n`).
#[derive(Clone, Debug)]
pub struct LineIndex {
    starts: Vec<usize>,
    len: usize,
}

impl LineIndex {
    pub fn new(text: &str) -> LineIndex {
        let mut starts = vec![0];
        starts.extend(
            text.bytes()
                .enumerate()
                .filter(|&(_, b)| b == b'\n')
                .map(|(i, _)| i + 1),
        );
        LineIndex {
            starts,
            len: text.len(),
        }
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

    /// The position of a byte offset (clamped to the text; inside a character, its start).
    pub fn position(&self, text: &str, offset: usize) -> Position {
        let mut offset = offset.min(self.len);
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let k = self.starts.partition_point(|&s| s <= offset) - 1;
        let lo = self.starts[k];
        let character = text[lo..offset].chars().map(|c| c.len_utf16() as u32).sum();
        Position {
            line: k as u32,
            character,
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

/// Applies one change of `textDocument/didChange`: the whole text when `range` is `None`,
/// else the replacement of that range (clamped; a reversed range is taken in order).
pub fn apply_change(text: &mut String, range: Option<Range>, new: &str) {
    match range {
        None => {
            text.clear();
            text.push_str(new);
        }
        Some(r) => {
            let idx = LineIndex::new(text);
            let a = idx.offset(text, r.start);
            let b = idx.offset(text, r.end);
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
}

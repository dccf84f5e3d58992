//! Text a producer wrote, made safe for a terminal and a line-oriented log.

use std::borrow::Cow;

/// `s` with its control characters (C0 but tab, DEL, C1) and bidirectional overrides
/// written as Rust escapes (`\n`, `\u{1b}`), so an aggregate ID or an error quoting a
/// payload can neither start a forged log line nor send the terminal a sequence.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn unsafe_char(c: char) -> bool {
    (c.is_control() && c != '\t') || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::escape_controls;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(escape_controls("plain ünïcode\ttab"), "plain ünïcode\ttab");
        assert_eq!(
            escape_controls("a\nERROR forged\r\u{1b}[31mred\u{7f}\u{85}\u{202e}"),
            "a\\nERROR forged\\r\\u{1b}[31mred\\u{7f}\\u{85}\\u{202e}"
        );
    }
}

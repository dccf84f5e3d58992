//! The tokenizer: PostgreSQL's lexical rules for the subset (identifiers fold to lower
//! case, `""` and `''` escapes, `E''` strings, comments, operators cut as the server cuts them).

/// One token and the byte offset it starts at (for messages).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    pub(crate) kind: Tok,
    pub(crate) at: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// An unquoted identifier or keyword, folded to lower case (ASCII only, as PostgreSQL
    /// does in a UTF-8 database).
    Ident(String),
    /// A `"quoted"` identifier, case kept.
    Quoted(String),
    /// A string constant, escapes resolved.
    Str(String),
    /// A numeric constant as written (`12`, `1.5`, `1e3`).
    Number(String),
    /// An operator (`->>`, `||`, `=`, `<>`; `!=` is reported as `<>`).
    Op(String),
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    Dot,
    /// `::`
    Cast,
    /// `$1`: a parameter, which no field expression can have.
    Param(String),
    Semicolon,
    Colon,
}

/// PostgreSQL's longest identifier (`NAMEDATALEN - 1` bytes); longer ones are truncated.
const MAX_IDENT: usize = 63;

const OP_CHARS: &[u8] = b"+-*/<>=~!@#%^&|`?";

pub(crate) fn tokenize(src: &str) -> Result<Vec<Token>, String> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let at = i;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if b[i..].starts_with(b"--") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if b[i..].starts_with(b"/*") {
            i = skip_block_comment(b, i)?;
            continue;
        }
        let kind = match c {
            b'(' => {
                i += 1;
                Tok::LParen
            }
            b')' => {
                i += 1;
                Tok::RParen
            }
            b'[' => {
                i += 1;
                Tok::LBracket
            }
            b']' => {
                i += 1;
                Tok::RBracket
            }
            b',' => {
                i += 1;
                Tok::Comma
            }
            b';' => {
                i += 1;
                Tok::Semicolon
            }
            b':' if b.get(i + 1) == Some(&b':') => {
                i += 2;
                Tok::Cast
            }
            b':' => {
                i += 1;
                Tok::Colon
            }
            b'.' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let (n, end) = number(b, i);
                i = end;
                Tok::Number(n)
            }
            b'.' => {
                i += 1;
                Tok::Dot
            }
            b'\'' => {
                let (s, end) = quoted(src, i, b'\'')?;
                i = end;
                Tok::Str(s)
            }
            b'"' => {
                let (s, end) = quoted(src, i, b'"')?;
                if s.is_empty() {
                    return Err(format!("zero-length delimited identifier at offset {at}"));
                }
                i = end;
                Tok::Quoted(truncate(s))
            }
            b'$' => {
                let mut j = i + 1;
                while j < b.len() && b[j].is_ascii_digit() {
                    j += 1;
                }
                if j == i + 1 {
                    return Err(format!(
                        "dollar-quoted strings are not supported (offset {at}): write '…' with '' for a quote"
                    ));
                }
                let p = src[i..j].to_owned();
                i = j;
                Tok::Param(p)
            }
            b'0'..=b'9' => {
                let (n, end) = number(b, i);
                i = end;
                Tok::Number(n)
            }
            c if (c == b'e' || c == b'E') && b.get(i + 1) == Some(&b'\'') => {
                let (s, end) = escape_string(src, i + 1)?;
                i = end;
                Tok::Str(s)
            }
            c if (c == b'b' || c == b'B' || c == b'x' || c == b'X' || c == b'n' || c == b'N')
                && b.get(i + 1) == Some(&b'\'') =>
            {
                return Err(format!(
                    "{}'…' constants are not supported (offset {at})",
                    c as char
                ));
            }
            c if (c == b'u' || c == b'U') && b.get(i + 1) == Some(&b'&') => {
                return Err(format!(
                    "U&'…' constants and identifiers are not supported (offset {at})"
                ));
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                let mut j = i;
                while j < b.len()
                    && (b[j].is_ascii_alphanumeric()
                        || b[j] == b'_'
                        || b[j] == b'$'
                        || b[j] >= 0x80)
                {
                    j += 1;
                }
                let word = src[i..j].to_ascii_lowercase();
                i = j;
                Tok::Ident(truncate(word))
            }
            c if OP_CHARS.contains(&c) => {
                let (op, end) = operator(b, i);
                i = end;
                Tok::Op(if op == "!=" { "<>".to_owned() } else { op })
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(format!("syntax error at or near \"{ch}\" (offset {at})"));
            }
        };
        out.push(Token { kind, at });
    }
    Ok(out)
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_IDENT {
        let mut end = MAX_IDENT;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

fn skip_block_comment(b: &[u8], mut i: usize) -> Result<usize, String> {
    // Block comments nest in PostgreSQL.
    let start = i;
    let mut depth = 0;
    while i < b.len() {
        if b[i..].starts_with(b"/*") {
            depth += 1;
            i += 2;
        } else if b[i..].starts_with(b"*/") {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return Ok(i);
            }
        } else {
            i += 1;
        }
    }
    Err(format!("unterminated /* comment at offset {start}"))
}

/// `'…'` or `"…"`, the quote doubled inside; returns the content and the end offset.
fn quoted(src: &str, start: usize, q: u8) -> Result<(String, usize), String> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = start + 1;
    loop {
        match b.get(i) {
            None => {
                let what = if q == b'\'' {
                    "quoted string"
                } else {
                    "quoted identifier"
                };
                return Err(format!("unterminated {what} at offset {start}"));
            }
            Some(&c) if c == q => {
                if b.get(i + 1) == Some(&q) {
                    out.push(q);
                    i += 2;
                } else {
                    i += 1;
                    break;
                }
            }
            Some(&c) => {
                out.push(c);
                i += 1;
            }
        }
    }
    // Only ASCII quote bytes were removed, so the rest is still UTF-8.
    Ok((String::from_utf8(out).expect("utf-8 kept"), i))
}

/// An `E'…'` string starting at the quote: backslash escapes as PostgreSQL reads them.
fn escape_string(src: &str, start: usize) -> Result<(String, usize), String> {
    let b = src.as_bytes();
    let mut out: Vec<u8> = Vec::new();
    let mut i = start + 1;
    loop {
        let Some(&c) = b.get(i) else {
            return Err(format!("unterminated quoted string at offset {start}"));
        };
        match c {
            b'\'' if b.get(i + 1) == Some(&b'\'') => {
                out.push(b'\'');
                i += 2;
            }
            b'\'' => {
                i += 1;
                break;
            }
            b'\\' => {
                let Some(&e) = b.get(i + 1) else {
                    return Err(format!("unterminated quoted string at offset {start}"));
                };
                i += 2;
                match e {
                    b'b' => out.push(8),
                    b'f' => out.push(12),
                    b'n' => out.push(b'\n'),
                    b'r' => out.push(b'\r'),
                    b't' => out.push(b'\t'),
                    b'0'..=b'7' => {
                        let mut v = u32::from(e - b'0');
                        for _ in 0..2 {
                            match b.get(i) {
                                Some(&d @ b'0'..=b'7') => {
                                    v = v * 8 + u32::from(d - b'0');
                                    i += 1;
                                }
                                _ => break,
                            }
                        }
                        out.push((v & 0xff) as u8);
                    }
                    b'x' => {
                        let mut v = 0u32;
                        let mut n = 0;
                        while n < 2 {
                            match b.get(i).and_then(|d| (*d as char).to_digit(16)) {
                                Some(d) => {
                                    v = v * 16 + d;
                                    i += 1;
                                    n += 1;
                                }
                                None => break,
                            }
                        }
                        if n == 0 {
                            out.push(b'x');
                        } else {
                            out.push(v as u8);
                        }
                    }
                    b'u' | b'U' => {
                        let len = if e == b'u' { 4 } else { 8 };
                        let hex = src.get(i..i + len).unwrap_or("");
                        let ch = (hex.len() == len)
                            .then(|| u32::from_str_radix(hex, 16).ok())
                            .flatten()
                            .and_then(char::from_u32)
                            .filter(|c| *c != '\0')
                            .ok_or_else(|| {
                                format!("invalid Unicode escape in E'' string at offset {start}")
                            })?;
                        i += len;
                        let mut buf = [0; 4];
                        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                    }
                    other => out.push(other),
                }
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    if out.contains(&0) {
        return Err(format!(
            "invalid byte sequence for encoding \"UTF8\": 0x00 (E'' string at offset {start})"
        ));
    }
    let s = String::from_utf8(out).map_err(|_| {
        format!("invalid byte sequence for encoding \"UTF8\" in the E'' string at offset {start}")
    })?;
    Ok((s, i))
}

fn number(b: &[u8], start: usize) -> (String, usize) {
    let mut i = start;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i < b.len() && b[i] == b'.' && !b[i + 1..].starts_with(b".") {
        i += 1;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        if j < b.len() && b[j].is_ascii_digit() {
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            i = j;
        }
    }
    (String::from_utf8_lossy(&b[start..i]).into_owned(), i)
}

/// The operator starting at `start`, cut as PostgreSQL's scanner cuts it: it stops
/// before a comment start, and a multi-character operator may not end in `+` or `-`
/// unless it holds one of `~ ! @ # % ^ & | ` ?` (so `=-1` is `=` then `-1`).
fn operator(b: &[u8], start: usize) -> (String, usize) {
    let mut end = start;
    while end < b.len() && OP_CHARS.contains(&b[end]) {
        if end > start && (b[end..].starts_with(b"--") || b[end..].starts_with(b"/*")) {
            break;
        }
        end += 1;
    }
    let mut len = end - start;
    if len > 1 {
        let op = &b[start..end];
        if !op.iter().any(|c| b"~!@#%^&|`?".contains(c)) {
            while len > 1 && (op[len - 1] == b'+' || op[len - 1] == b'-') {
                len -= 1;
            }
        }
    }
    (
        String::from_utf8_lossy(&b[start..start + len]).into_owned(),
        start + len,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(s: &str) -> Vec<Tok> {
        tokenize(s).unwrap().into_iter().map(|t| t.kind).collect()
    }

    #[test]
    fn identifiers_fold_and_quoted_keep_case() {
        assert_eq!(
            kinds(r#"Foo "Bo""dy""#),
            vec![Tok::Ident("foo".into()), Tok::Quoted("Bo\"dy".into())]
        );
    }

    #[test]
    fn strings_and_escape_strings() {
        assert_eq!(kinds("'it''s'"), vec![Tok::Str("it's".into())]);
        assert_eq!(kinds(r"'a\n'"), vec![Tok::Str(r"a\n".into())]);
        assert_eq!(
            kinds(r"E'a\n\x41\101\u00e9\''"),
            vec![Tok::Str("a\nAAé'".into())]
        );
        assert!(tokenize("'open").is_err());
        assert!(tokenize("$$x$$").is_err());
    }

    #[test]
    fn operators_are_cut_as_postgres_cuts_them() {
        assert_eq!(
            kinds("a->>-1"),
            vec![
                Tok::Ident("a".into()),
                Tok::Op("->>".into()),
                Tok::Op("-".into()),
                Tok::Number("1".into())
            ]
        );
        assert_eq!(kinds("!=")[0], Tok::Op("<>".into()));
        assert_eq!(kinds("||-")[0], Tok::Op("||-".into()));
        assert_eq!(
            kinds("x::int -- c\n/* a /* b */ */ 1.5e3 .5"),
            vec![
                Tok::Ident("x".into()),
                Tok::Cast,
                Tok::Ident("int".into()),
                Tok::Number("1.5e3".into()),
                Tok::Number(".5".into())
            ]
        );
    }
}

//! Secrets never reach logs, errors or files: the one place that knows where a connection
//! string keeps its passwords. Every output that can show a URL masks it here.
//!
//! A connection string that no parser would accept is still masked: where parsers
//! disagree (an unencoded `@`, `/` or `?` in a password), the widest reading is hidden.

use std::ops::Range;

const MASK: &str = "***";

/// A password in a connection string.
struct Secret {
    /// The bytes to hide.
    value: Range<usize>,
    /// The bytes to remove with it to leave a string without it (its key, its `:`).
    whole: Range<usize>,
}

/// Masks every password of a connection string, in any form walfold accepts:
/// `postgresql://u:***@h1,h2/db` (also `postgres://`), `?password=***` and
/// `&sslpassword=***` (keys URL-encoded or not), and libpq's key=value form
/// (`host=h password=***`, `password = ***` for `password = 'quoted pw'`).
pub fn redact_url(conninfo: &str) -> String {
    let mut out = String::with_capacity(conninfo.len());
    let mut at = 0;
    for range in merged(secrets(conninfo).into_iter().map(|s| s.value)) {
        out.push_str(&conninfo[at..range.start]);
        out.push_str(MASK);
        at = range.end;
    }
    out.push_str(&conninfo[at..]);
    out
}

/// `url` without its passwords (user info, password parameters), and whether it had
/// any: what `walfold init` writes to a file.
pub fn without_password(url: &str) -> (String, bool) {
    let found = secrets(url);
    let mut out = String::with_capacity(url.len());
    let mut at = 0;
    for range in merged(found.iter().map(|s| s.whole.clone())) {
        out.push_str(&url[at..range.start]);
        at = range.end;
    }
    out.push_str(&url[at..]);
    // A query left empty by removing its only parameters.
    if out.ends_with('?') {
        out.pop();
    }
    (out, !found.is_empty())
}

/// `text` (a message that may quote a config file) with every URL in it masked.
pub(crate) fn redact_urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = url_start(rest) {
        let len = rest[start..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`'))
            .unwrap_or(rest.len() - start);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..start + len]));
        rest = &rest[start + len..];
    }
    out.push_str(rest);
    keyword_passwords_in(&out)
}

/// `text` with the value after every `password =` (any case, `sslpassword` too) masked
/// to the end of its line: a key=value connection string quoted in a message, where
/// nothing says where a password with spaces or quotes in it ends.
fn keyword_passwords_in(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (i, _) in lower.match_indices("password") {
        if i < at {
            continue;
        }
        let after = i + "password".len();
        let spaces = |from: usize| {
            from + text[from..].len() - text[from..].trim_start_matches([' ', '\t']).len()
        };
        let eq = spaces(after);
        if !text[eq..].starts_with('=') {
            continue;
        }
        let value = spaces(eq + 1);
        let end = text[value..].find('\n').map_or(text.len(), |n| value + n);
        if value == end || text[value..end] == *MASK {
            continue;
        }
        out.push_str(&text[at..value]);
        out.push_str(MASK);
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

/// Where the first `postgres://` or `postgresql://` of `text` starts.
fn url_start(text: &str) -> Option<usize> {
    let lower = text.to_ascii_lowercase();
    lower
        .find("postgres://")
        .into_iter()
        .chain(lower.find("postgresql://"))
        .min()
}

fn secrets(conninfo: &str) -> Vec<Secret> {
    let start = conninfo.len() - conninfo.trim_start().len();
    let head = conninfo[start..].to_ascii_lowercase();
    let mut out = Vec::new();
    match ["postgresql://", "postgres://"]
        .iter()
        .find(|p| head.starts_with(*p))
    {
        Some(scheme) => url_secrets(conninfo, start + scheme.len(), &mut out),
        None => keyword_secrets(conninfo, &mut out),
    }
    out
}

/// A URL: the password of the user info, then the query's password parameters.
fn url_secrets(s: &str, start: usize, out: &mut Vec<Secret>) {
    let rest = &s[start..];
    let mut query_from = start;
    if let Some(pw) = userinfo_password(rest) {
        out.push(Secret {
            value: start + pw.start..start + pw.end,
            whole: start + pw.start - 1..start + pw.end,
        });
        query_from = start + pw.end;
    }
    if let Some(q) = s[query_from..].find('?') {
        query_secrets(s, query_from + q + 1, out);
    }
}

/// The password in `user:password@host…` (after the scheme). tokio-postgres ends the
/// user info at the first `@`; an operator who left an `@`, `/` or `?` unencoded in the
/// password meant the last `@` before the query: the span covers both.
fn userinfo_password(rest: &str) -> Option<Range<usize>> {
    let colon = rest.find(':')?;
    let first_at = rest
        .find('@')
        .filter(|&at| colon < at && !rest[..at].contains('/'));
    let query = query_start(rest).unwrap_or(rest.len());
    let last_at = rest[..query].rfind('@').filter(|&at| colon < at);
    let end = first_at.max(last_at)?;
    Some(colon + 1..end)
}

/// The first `?` followed by a `key=`: where a query can start.
fn query_start(rest: &str) -> Option<usize> {
    rest.match_indices('?').map(|(i, _)| i).find(|&i| {
        let after = &rest[i + 1..];
        let key = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '%')))
            .unwrap_or(after.len());
        key > 0 && after[key..].starts_with('=')
    })
}

/// `key=value&…` from `from` to the end. A password parameter's value runs on over
/// following pieces without `=` (an unencoded `&` in it).
fn query_secrets(s: &str, from: usize, out: &mut Vec<Secret>) {
    let mut pieces = Vec::new();
    let mut at = from;
    for piece in s[from..].split('&') {
        pieces.push(at..at + piece.len());
        at += piece.len() + 1;
    }
    let mut i = 0;
    while i < pieces.len() {
        let piece = pieces[i].clone();
        i += 1;
        let Some(eq) = s[piece.clone()].find('=') else {
            continue;
        };
        if !is_secret_key(&s[piece.start..piece.start + eq]) {
            continue;
        }
        let mut end = piece.end;
        while i < pieces.len() && !s[pieces[i].clone()].contains('=') {
            end = pieces[i].end;
            i += 1;
        }
        // Removed with the `&` before it, or the `&` after it when it comes first.
        let whole = if piece.start > from {
            piece.start - 1..end
        } else if end < s.len() {
            piece.start..end + 1
        } else {
            piece.start..end
        };
        out.push(Secret {
            value: piece.start + eq + 1..end,
            whole,
        });
    }
}

/// libpq's `key = value …`, values bare (with `\` escapes) or in single quotes. A
/// `dbname` may itself be a connection string (libpq expands it).
fn keyword_secrets(s: &str, out: &mut Vec<Secret>) {
    let b = s.as_bytes();
    let space = |i: usize| i < b.len() && b[i].is_ascii_whitespace();
    let mut i = 0;
    loop {
        while space(i) {
            i += 1;
        }
        if i >= b.len() {
            return;
        }
        let key_start = i;
        while i < b.len() && b[i] != b'=' && !b[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &s[key_start..i];
        while space(i) {
            i += 1;
        }
        if i >= b.len() || b[i] != b'=' {
            continue;
        }
        i += 1;
        while space(i) {
            i += 1;
        }
        let value_start = i;
        let quoted = i < b.len() && b[i] == b'\'';
        if quoted {
            i += 1;
        }
        while i < b.len()
            && !(if quoted {
                b[i] == b'\''
            } else {
                b[i].is_ascii_whitespace()
            })
        {
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
        if quoted && i < b.len() {
            i += 1;
        }
        i = i.min(b.len());
        if is_secret_key(key) {
            out.push(Secret {
                value: value_start..i,
                whole: key_start..i,
            });
        } else if key == "dbname" {
            let from = value_start + usize::from(quoted);
            let to = if quoted && i > from && b[i - 1] == b'\'' {
                i - 1
            } else {
                i
            };
            for nested in secrets(&s[from..to]) {
                out.push(Secret {
                    value: from + nested.value.start..from + nested.value.end,
                    whole: from + nested.whole.start..from + nested.whole.end,
                });
            }
        }
    }
}

/// `password`, `sslpassword`, in any case, URL-encoded or not.
fn is_secret_key(key: &str) -> bool {
    let b = key.as_bytes();
    let mut decoded = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).and_then(|&c| hex(c)),
            b.get(i + 2).and_then(|&c| hex(c)),
        ) {
            (b'%', Some(h), Some(l)) => {
                decoded.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                decoded.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded)
        .trim()
        .to_ascii_lowercase()
        .contains("password")
}

/// Sorted, overlapping ranges joined.
fn merged(ranges: impl Iterator<Item = Range<usize>>) -> Vec<Range<usize>> {
    let mut all: Vec<Range<usize>> = ranges.collect();
    all.sort_by_key(|r| r.start);
    let mut out: Vec<Range<usize>> = Vec::with_capacity(all.len());
    for r in all {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (input, redacted); the secret is always `s3cret` (or contains it).
    const FORMS: &[(&str, &str)] = &[
        (
            "postgresql://app:s3cret@db:5432/app?sslmode=require",
            "postgresql://app:***@db:5432/app?sslmode=require",
        ),
        ("postgres://app:s3cret@db/app", "postgres://app:***@db/app"),
        ("POSTGRESQL://app:s3cret@db/app", "POSTGRESQL://app:***@db/app"),
        (
            "postgresql://app:s3cret@h1:5432,h2:5433,[::1]:5434/app?target_session_attrs=read-write",
            "postgresql://app:***@h1:5432,h2:5433,[::1]:5434/app?target_session_attrs=read-write",
        ),
        ("postgresql://:s3cret@db/app", "postgresql://:***@db/app"),
        // Unencoded `@`, `/`, `?` in the password.
        ("postgresql://app:s3c@ret@db/app", "postgresql://app:***@db/app"),
        ("postgresql://app:s3c/ret@db/app", "postgresql://app:***@db/app"),
        ("postgresql://app:s3c?ret@db/app?x=1", "postgresql://app:***@db/app?x=1"),
        ("postgresql://app:s3c%40ret@db/app", "postgresql://app:***@db/app"),
        (
            "postgresql://app@db/app?password=s3cret",
            "postgresql://app@db/app?password=***",
        ),
        (
            "postgres://h1,h2:5433/app?sslmode=verify-full&password=s3cret&connect_timeout=5",
            "postgres://h1,h2:5433/app?sslmode=verify-full&password=***&connect_timeout=5",
        ),
        (
            "postgresql://app@db/app?sslpassword=s3cret&PASSWORD=s3cret",
            "postgresql://app@db/app?sslpassword=***&PASSWORD=***",
        ),
        (
            "postgresql://app@db/app?pass%77ord=s3cret&%70assword=s3cret",
            "postgresql://app@db/app?pass%77ord=***&%70assword=***",
        ),
        (
            "postgresql://app@db/app?password=s3c%26ret",
            "postgresql://app@db/app?password=***",
        ),
        (
            "postgresql://app@db/app?password=s3c&ret&sslmode=disable",
            "postgresql://app@db/app?password=***&sslmode=disable",
        ),
        (
            "postgresql://db/app?password=s3c@ret&application_name=a@b",
            "postgresql://db/app?password=***&application_name=a@b",
        ),
        (
            "postgresql://app:s3cret@db/app?application_name=a@b",
            "postgresql://app:***@db/app?application_name=a@b",
        ),
        (
            "host=db user=app password=s3cret dbname=app",
            "host=db user=app password=*** dbname=app",
        ),
        (
            "host=db password = 's3cret with spaces' sslmode=require",
            "host=db password = *** sslmode=require",
        ),
        (
            r"host=db password='s3c\'ret' port=5432",
            "host=db password=*** port=5432",
        ),
        (r"password=s3c\ ret host=db", "password=*** host=db"),
        ("host=db sslpassword=s3cret", "host=db sslpassword=***"),
        ("host=db password='s3cret", "host=db password=***"),
        (
            "dbname='postgresql://app:s3cret@db/app' user=x",
            "dbname='postgresql://app:***@db/app' user=x",
        ),
    ];

    #[test]
    fn masks_every_form() {
        for (input, expected) in FORMS {
            let out = redact_url(input);
            assert_eq!(&out, expected, "{input}");
            assert!(!out.contains("s3c"), "{input} → {out}");
        }
    }

    #[test]
    fn leaves_what_has_no_password() {
        for s in [
            "postgres://db/app",
            "postgresql://app@db:5432/app?sslmode=verify-full&sslrootcert=/ca.pem",
            "postgresql://[::1]:5432/app",
            "postgresql://db:5432/app?application_name=a@b",
            "postgresql:///app?host=/var/run/postgresql",
            "host=db port=5432 user=app",
            "",
        ] {
            assert_eq!(redact_url(s), s);
        }
    }

    #[test]
    fn never_panics() {
        let pieces = [
            "postgresql://",
            "postgres://",
            "u",
            ":",
            "s3cret",
            "@",
            "/",
            "?",
            "&",
            "=",
            "password",
            "sslpassword",
            "%70",
            "'",
            "\\",
            " ",
            ",",
            "é",
            "h",
            "[::1]",
        ];
        // Every string of three pieces.
        for a in pieces {
            for b in pieces {
                for c in pieces {
                    let s = format!("{a}{b}{c}");
                    let _ = redact_url(&s);
                    let _ = without_password(&s);
                    let _ = redact_urls_in(&s);
                }
            }
        }
    }

    #[test]
    fn leaves_the_password_out_of_a_url() {
        for (input, expected) in [
            (
                "postgresql://app:s3cr@t@db:5432/app?sslmode=require",
                "postgresql://app@db:5432/app?sslmode=require",
            ),
            (
                "postgres://app@db/app?password=x&sslmode=disable",
                "postgres://app@db/app?sslmode=disable",
            ),
            (
                "postgres://app@db/app?sslmode=disable&password=x",
                "postgres://app@db/app?sslmode=disable",
            ),
            (
                "postgres://app@db/app?password=x&sslpassword=y",
                "postgres://app@db/app",
            ),
            (
                "postgres://app@db/app?a=1&password=x&b=2",
                "postgres://app@db/app?a=1&b=2",
            ),
        ] {
            assert_eq!(
                without_password(input),
                (expected.to_owned(), true),
                "{input}"
            );
        }
        assert_eq!(
            without_password("postgres://db/app"),
            ("postgres://db/app".to_owned(), false)
        );
    }

    #[test]
    fn masks_urls_in_text() {
        assert_eq!(
            redact_urls_in("1 | url = \"postgresql://u:s3cret@h/db?password=s3cret\n  |  ^"),
            "1 | url = \"postgresql://u:***@h/db?password=***\n  |  ^"
        );
        assert_eq!(
            redact_urls_in(
                "2 | url = \"host=db user=u password=se\"cr et sslmode=require\"\n  |  ^\n\
                 PASSWORD = 'x y' port=5\npassword=***"
            ),
            "2 | url = \"host=db user=u password=***\n  |  ^\nPASSWORD = ***\npassword=***"
        );
    }
}

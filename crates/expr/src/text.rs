//! The string functions' algorithms, by characters as PostgreSQL counts them in a
//! UTF-8 database: `split_part`, `substring`, `strpos`, case mapping, trim, replace, LIKE.

/// `split_part` (PostgreSQL 14+: a negative field counts from the end).
pub(crate) fn split_part(s: &str, sep: &str, n: i64) -> Result<String, String> {
    if n == 0 {
        return Err("field position must not be zero".into());
    }
    if s.is_empty() {
        return Ok(String::new());
    }
    if sep.is_empty() {
        return Ok(if n == 1 || n == -1 {
            s.to_owned()
        } else {
            String::new()
        });
    }
    let field = if n > 0 {
        s.split(sep).nth((n - 1) as usize)
    } else {
        let count = s.matches(sep).count() as i64 + 1;
        let i = count + n;
        if i < 0 {
            None
        } else {
            s.split(sep).nth(i as usize)
        }
    };
    Ok(field.unwrap_or("").to_owned())
}

/// The range `substring(x, start, count)` selects over `len` items (1-based start,
/// positions before 1 count towards `count`); `None` for an empty result.
pub(crate) fn substring_range(
    len: usize,
    start: i64,
    count: Option<i64>,
) -> Result<Option<(usize, usize)>, String> {
    let first = start.max(1);
    let end = match count {
        Some(c) if c < 0 => return Err("negative substring length not allowed".into()),
        // One past the last position, 1-based.
        Some(c) => (start + c).min(len as i64 + 1),
        None => len as i64 + 1,
    };
    if first >= end || first > len as i64 {
        return Ok(None);
    }
    Ok(Some(((first - 1) as usize, (end - 1) as usize)))
}

pub(crate) fn substring(s: &str, start: i64, count: Option<i64>) -> Result<String, String> {
    let len = s.chars().count();
    Ok(match substring_range(len, start, count)? {
        None => String::new(),
        Some((a, b)) => s.chars().skip(a).take(b - a).collect(),
    })
}

/// `strpos`: the 1-based character position of `needle` in `hay`, 0 when absent.
pub(crate) fn strpos(hay: &str, needle: &str) -> i64 {
    match hay.find(needle) {
        Some(at) => hay[..at].chars().count() as i64 + 1,
        None => 0,
    }
}

pub(crate) fn bytes_pos(hay: &[u8], needle: &[u8]) -> i64 {
    if needle.is_empty() {
        return 1;
    }
    hay.windows(needle.len())
        .position(|w| w == needle)
        .map_or(0, |i| i as i64 + 1)
}

/// `lower`/`upper` as in a UTF-8 locale: each character's simple case mapping
/// (a character whose mapping is several characters stays as it is).
pub(crate) fn change_case(s: &str, upper: bool) -> String {
    s.chars()
        .map(|c| {
            let mut m: Vec<char> = if upper {
                c.to_uppercase().collect()
            } else {
                c.to_lowercase().collect()
            };
            if m.len() == 1 {
                m.pop().expect("one")
            } else {
                c
            }
        })
        .collect()
}

/// `btrim`/`ltrim`/`rtrim`: removes characters of `chars` from the chosen ends.
pub(crate) fn trim(s: &str, chars: &str, left: bool, right: bool) -> String {
    let set = |c: char| chars.contains(c);
    let mut t = s;
    if left {
        t = t.trim_start_matches(set);
    }
    if right {
        t = t.trim_end_matches(set);
    }
    t.to_owned()
}

/// `replace`: an empty `from` leaves the string as it is.
pub(crate) fn replace(s: &str, from: &str, to: &str) -> String {
    if from.is_empty() {
        s.to_owned()
    } else {
        s.replace(from, to)
    }
}

/// LIKE over items (characters or bytes): `%` any run, `_` one item, `escape`
/// makes the next item literal. Follows PostgreSQL's `MatchText`, so a pattern
/// ending in a lone escape fails exactly when matching reaches it.
pub(crate) fn like<T: Copy + PartialEq>(
    s: &[T],
    p: &[T],
    pct: T,
    under: T,
    escape: Option<T>,
) -> Result<bool, String> {
    if p.len() == 1 && p[0] == pct {
        return Ok(true);
    }
    Ok(match_text(s, p, pct, under, escape)? == Match::True)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Match {
    True,
    False,
    /// No later start can match either.
    Abort,
}

const LONE_ESCAPE: &str = "LIKE pattern must not end with escape character";

fn match_text<T: Copy + PartialEq>(
    mut t: &[T],
    mut p: &[T],
    pct: T,
    under: T,
    esc: Option<T>,
) -> Result<Match, String> {
    while !t.is_empty() && !p.is_empty() {
        if Some(p[0]) == esc {
            p = &p[1..];
            if p.is_empty() {
                return Err(LONE_ESCAPE.into());
            }
            if p[0] != t[0] {
                return Ok(Match::False);
            }
        } else if p[0] == pct {
            p = &p[1..];
            while let Some(&c) = p.first() {
                if c == pct {
                    p = &p[1..];
                } else if c == under {
                    if t.is_empty() {
                        return Ok(Match::Abort);
                    }
                    t = &t[1..];
                    p = &p[1..];
                } else {
                    break;
                }
            }
            if p.is_empty() {
                return Ok(Match::True);
            }
            let first = if Some(p[0]) == esc {
                *p.get(1).ok_or(LONE_ESCAPE)?
            } else {
                p[0]
            };
            while !t.is_empty() {
                if t[0] == first {
                    let m = match_text(t, p, pct, under, esc)?;
                    if m != Match::False {
                        return Ok(m);
                    }
                }
                t = &t[1..];
            }
            return Ok(Match::Abort);
        } else if p[0] == under {
            t = &t[1..];
            p = &p[1..];
            continue;
        } else if p[0] != t[0] {
            return Ok(Match::False);
        }
        t = &t[1..];
        p = &p[1..];
    }
    if !t.is_empty() {
        return Ok(Match::False);
    }
    while p.first() == Some(&pct) {
        p = &p[1..];
    }
    Ok(if p.is_empty() {
        Match::True
    } else {
        Match::Abort
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_part_fields() {
        assert_eq!(split_part("a-b-c", "-", 2).unwrap(), "b");
        assert_eq!(split_part("a-b-c", "-", -1).unwrap(), "c");
        assert_eq!(split_part("a-b-c", "-", -3).unwrap(), "a");
        assert_eq!(split_part("a-b-c", "-", -4).unwrap(), "");
        assert_eq!(split_part("a-b-c", "-", 4).unwrap(), "");
        assert_eq!(split_part("abc", "", 1).unwrap(), "abc");
        assert_eq!(split_part("abc", "", 2).unwrap(), "");
        assert_eq!(split_part("", "-", 1).unwrap(), "");
        assert_eq!(split_part("a--b", "--", 2).unwrap(), "b");
        assert!(split_part("a", "-", 0).is_err());
    }

    #[test]
    fn substring_positions() {
        assert_eq!(substring("hello", 2, Some(3)).unwrap(), "ell");
        assert_eq!(substring("hello", 0, Some(3)).unwrap(), "he");
        assert_eq!(substring("hello", -1, Some(3)).unwrap(), "h");
        assert_eq!(substring("hello", -5, Some(3)).unwrap(), "");
        assert_eq!(substring("hello", 4, None).unwrap(), "lo");
        assert_eq!(substring("hello", 9, None).unwrap(), "");
        assert_eq!(substring("héllo", 2, Some(1)).unwrap(), "é");
        assert!(substring("hello", 1, Some(-1)).is_err());
    }

    #[test]
    fn positions_and_case() {
        assert_eq!(strpos("héllo", "l"), 3);
        assert_eq!(strpos("abc", ""), 1);
        assert_eq!(strpos("abc", "x"), 0);
        assert_eq!(change_case("ÄbC", false), "äbc");
        assert_eq!(change_case("straße", true), "STRAßE");
        assert_eq!(trim("xxaxx", "x", true, false), "axx");
        assert_eq!(replace("aaa", "", "b"), "aaa");
    }

    #[test]
    fn like_patterns() {
        let m = |s: &str, p: &str| {
            let s: Vec<char> = s.chars().collect();
            let p: Vec<char> = p.chars().collect();
            like(&s, &p, '%', '_', Some('\\'))
        };
        assert_eq!(m("abc", "a%"), Ok(true));
        assert_eq!(m("abc", "%c"), Ok(true));
        assert_eq!(m("abc", "a_c"), Ok(true));
        assert_eq!(m("abc", "a_"), Ok(false));
        assert_eq!(m("a%c", "a\\%c"), Ok(true));
        assert_eq!(m("abc", "a\\%c"), Ok(false));
        assert_eq!(m("", "%"), Ok(true));
        assert_eq!(m("aXbXc", "%X%X%"), Ok(true));
        assert_eq!(m("é", "_"), Ok(true));
        assert!(m("ab", "a\\").is_err());
        // Matching stops before the lone escape: no error, as in PostgreSQL.
        assert_eq!(m("b", "a\\"), Ok(false));
        assert_eq!(m("a", "a\\"), Ok(false));
    }
}

//! JSON with jsonb's semantics: input (numbers as numeric, the last of duplicate keys
//! wins, `\u0000` refused), jsonb's text form (`{"a": 1, "b": [1, 2]}`, keys shorter
//! first), equality, the `->`/`#>` lookups, `||`, and text-array path literals.

use std::cmp::Ordering;

use serde_json::{Number, Value as J};

use crate::numeric;

/// Parses JSON text as `::jsonb` does.
pub(crate) fn parse(text: &str) -> Result<J, String> {
    // walfold's bounded reader: JSON as deep as a payload column may be (serde_json
    // alone stops at 128 levels, so a payload read through an expression was refused
    // where the same value read as a column folded).
    let mut v: J = walfold_event::json::parse(text).map_err(|e| match e {
        walfold_event::json::JsonError::Invalid(e) => {
            format!("invalid input syntax for type json: {e}")
        }
        deep => format!("json {deep}"),
    })?;
    canonical(&mut v)?;
    Ok(v)
}

/// Numbers to numeric's form; strings with NUL refused (jsonb cannot hold them).
fn canonical(v: &mut J) -> Result<(), String> {
    match v {
        J::Number(n) => {
            let text = numeric::normalize(n.as_str())?;
            *n = Number::from_string_unchecked(text);
        }
        J::String(s) => {
            if s.contains('\0') {
                return Err(
                    "unsupported Unicode escape sequence: \\u0000 cannot be converted to text"
                        .into(),
                );
            }
        }
        J::Array(a) => {
            for x in a {
                canonical(x)?;
            }
        }
        J::Object(m) => {
            if m.keys().any(|k| k.contains('\0')) {
                return Err(
                    "unsupported Unicode escape sequence: \\u0000 cannot be converted to text"
                        .into(),
                );
            }
            for x in m.values_mut() {
                canonical(x)?;
            }
        }
        J::Null | J::Bool(_) => {}
    }
    Ok(())
}

/// jsonb's key order: shorter keys first, then bytewise.
fn key_order(a: &str, b: &str) -> Ordering {
    a.len()
        .cmp(&b.len())
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// The text `jsonb::text` gives.
pub(crate) fn to_text(v: &J) -> String {
    let mut out = String::new();
    write(v, &mut out);
    out
}

fn write(v: &J, out: &mut String) {
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => out.push_str(n.as_str()),
        J::String(s) => write_string(s, out),
        J::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write(x, out);
            }
            out.push(']');
        }
        J::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_by(|a, b| key_order(a, b));
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(k, out);
                out.push_str(": ");
                write(&m[k], out);
            }
            out.push('}');
        }
    }
}

/// PostgreSQL's `escape_json`.
fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// What `->>` gives: a string unquoted, JSON null as SQL NULL, anything else as text.
pub(crate) fn to_text_value(v: &J) -> Option<String> {
    match v {
        J::Null => None,
        J::String(s) => Some(s.clone()),
        other => Some(to_text(other)),
    }
}

/// jsonb equality (numbers by value).
pub(crate) fn equal(a: &J, b: &J) -> bool {
    match (a, b) {
        (J::Number(x), J::Number(y)) => numeric::compare(x.as_str(), y.as_str()).is_eq(),
        (J::Array(x), J::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| equal(p, q))
        }
        (J::Object(x), J::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| equal(v, w)))
        }
        (a, b) => a == b,
    }
}

pub(crate) fn field(v: J, key: &str) -> Option<J> {
    match v {
        J::Object(mut m) => m.remove(key),
        _ => None,
    }
}

/// Element `i` of an array (negative counts from the end).
pub(crate) fn index(v: J, i: i64) -> Option<J> {
    match v {
        J::Array(mut a) => {
            let len = a.len() as i64;
            let i = if i < 0 { len + i } else { i };
            (0..len).contains(&i).then(|| a.swap_remove(i as usize))
        }
        _ => None,
    }
}

/// `#>`: each step a key of an object or an index of an array (the step read as an
/// integer, negative from the end); `None` where the path leads nowhere or holds a NULL.
pub(crate) fn path(v: J, steps: &[Option<String>]) -> Option<J> {
    let mut cur = v;
    for step in steps {
        let step = step.as_deref()?;
        cur = match cur {
            J::Object(_) => field(cur, step)?,
            J::Array(_) => index(cur, parse_index(step)?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// A path step as an array index: an integer (PostgreSQL's `strtoint`, surrounding
/// blanks allowed); anything else selects nothing.
fn parse_index(step: &str) -> Option<i64> {
    let t = step.trim_start_matches(|c: char| c.is_ascii_whitespace());
    let t = t.trim_end_matches(|c: char| c.is_ascii_whitespace());
    let v: i64 = t.parse().ok()?;
    i32::try_from(v).ok().map(i64::from)
}

/// `jsonb || jsonb`: arrays concatenate (a scalar counts as a one-element array),
/// objects merge (the right side wins).
pub(crate) fn concat(a: J, b: J) -> J {
    match (a, b) {
        (J::Object(mut x), J::Object(y)) => {
            for (k, v) in y {
                x.insert(k, v);
            }
            J::Object(x)
        }
        (a, b) => {
            let mut out = into_array(a);
            out.extend(into_array(b));
            J::Array(out)
        }
    }
}

fn into_array(v: J) -> Vec<J> {
    match v {
        J::Array(a) => a,
        other => vec![other],
    }
}

/// A one-dimensional `text[]` literal (`{a,"b c",NULL}`) as PostgreSQL's array input
/// reads it; `None` elements are NULLs.
pub(crate) fn text_array(s: &str) -> Result<Vec<Option<String>>, String> {
    let bad = |why: &str| format!("malformed array literal: \"{s}\" ({why})");
    let t = s.trim_matches(|c: char| c.is_ascii_whitespace());
    let inner = t
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .ok_or_else(|| bad("array value must start with \"{\""))?;
    let mut out = Vec::new();
    if inner
        .trim_matches(|c: char| c.is_ascii_whitespace())
        .is_empty()
    {
        return Ok(out);
    }
    let mut chars = inner.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            chars.next();
        }
        let mut item = String::new();
        let mut quoted_any = false;
        // An element: quoted parts and unquoted parts, until a comma at depth 0.
        let mut trailing_ws = 0usize;
        loop {
            match chars.peek().copied() {
                None | Some(',') => break,
                Some('{') | Some('}') => return Err(bad("nested or unexpected braces")),
                Some('"') => {
                    chars.next();
                    quoted_any = true;
                    loop {
                        match chars.next() {
                            None => return Err(bad("unterminated quote")),
                            Some('"') => break,
                            Some('\\') => match chars.next() {
                                Some(c) => item.push(c),
                                None => return Err(bad("unexpected end of input")),
                            },
                            Some(c) => item.push(c),
                        }
                    }
                    trailing_ws = 0;
                }
                Some('\\') => {
                    chars.next();
                    match chars.next() {
                        Some(c) => item.push(c),
                        None => return Err(bad("unexpected end of input")),
                    }
                    trailing_ws = 0;
                }
                Some(c) => {
                    chars.next();
                    item.push(c);
                    if c.is_ascii_whitespace() {
                        trailing_ws += c.len_utf8();
                    } else {
                        trailing_ws = 0;
                    }
                }
            }
        }
        item.truncate(item.len() - trailing_ws);
        if item.is_empty() && !quoted_any {
            return Err(bad("empty element"));
        }
        if !quoted_any && item.eq_ignore_ascii_case("null") {
            out.push(None);
        } else {
            out.push(Some(item));
        }
        match chars.next() {
            None => break,
            Some(_) => continue,
        }
    }
    Ok(out)
}

/// An empty object, for tests and callers that build one.
#[cfg(test)]
fn obj(pairs: &[(&str, J)]) -> J {
    let mut m = serde_json::Map::new();
    for (k, v) in pairs {
        m.insert((*k).to_owned(), v.clone());
    }
    J::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_as_deep_as_walfold_reads_a_payload_parses() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(parse(&nested(200)).is_ok());
        assert!(parse(&nested(512)).is_ok());
        let err = parse(&nested(513)).unwrap_err();
        assert!(err.contains("512"), "{err}");
    }

    #[test]
    fn text_form_is_jsonb_s() {
        let v = parse(r#"{"bb": [1, 2.50, 1e2], "a": {"x": null}, "a": "s\"\n\u0001é"}"#).unwrap();
        assert_eq!(
            to_text(&v),
            r#"{"a": "s\"\n\u0001é", "bb": [1, 2.50, 100]}"#
        );
        assert!(parse(r#""\u0000""#).is_err());
        assert!(parse("{").is_err());
        assert_eq!(to_text(&obj(&[])), "{}");
    }

    #[test]
    fn lookups() {
        let v = parse(r#"{"a": [10, {"b": "x"}, null]}"#).unwrap();
        let p = |s: &[&str]| {
            let steps: Vec<Option<String>> = s.iter().map(|x| Some((*x).to_owned())).collect();
            path(v.clone(), &steps).map(|j| to_text(&j))
        };
        assert_eq!(p(&["a", "1", "b"]).as_deref(), Some("\"x\""));
        assert_eq!(p(&["a", "-3"]).as_deref(), Some("10"));
        assert_eq!(p(&["a", "x"]), None);
        assert_eq!(p(&[]).as_deref(), Some(r#"{"a": [10, {"b": "x"}, null]}"#));
        assert_eq!(index(parse("[1,2]").unwrap(), -3), None);
        assert!(equal(&parse("[1.0]").unwrap(), &parse("[1]").unwrap()));
    }

    #[test]
    fn array_literals() {
        assert_eq!(
            text_array(r#"{a, "b c" ,NULL,"NULL",x\,y}"#).unwrap(),
            vec![
                Some("a".into()),
                Some("b c".into()),
                None,
                Some("NULL".into()),
                Some("x,y".into())
            ]
        );
        assert_eq!(text_array(" { } ").unwrap(), vec![]);
        assert!(text_array("a,b").is_err());
        assert!(text_array("{{a}}").is_err());
        assert!(text_array("{a,,b}").is_err());
    }
}

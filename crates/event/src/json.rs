//! JSON as PostgreSQL's `jsonb` stores it. Text a producer wrote can be valid JSON that
//! `jsonb` refuses (a number past `numeric`'s range, a `\u0000`), or nested deeper than
//! walfold reads. [`parse`] and [`check_jsonb`] find such content before it reaches an
//! insert, so it becomes a dead letter with its reason; [`storable`] turns anything into
//! a value `jsonb` accepts, so recording that dead letter cannot fail the same way.

use std::borrow::Cow;

use serde_json::{Map, Value};

/// How deep walfold reads JSON. serde_json's own limit (128) refuses payloads PostgreSQL
/// stores; unbounded, a hostile payload would overflow the stack. 512 levels use well
/// under a tokio worker's 2 MiB stack wherever walfold parses, copies, compares, writes
/// and drops a value (1,000 levels were measured to fit in a debug build).
pub const MAX_DEPTH: usize = 512;

/// Why text is not JSON walfold reads; reads after the name of what held it
/// ("column `payload` is not JSON: …").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    #[error("is not JSON: {0}")]
    Invalid(String),
    #[error("is nested {depth} levels deep; walfold reads JSON up to {MAX_DEPTH}")]
    TooDeep { depth: usize },
}

/// Parses JSON text nested at most [`MAX_DEPTH`] levels deep.
pub fn parse(text: &str) -> Result<Value, JsonError> {
    parse_slice(text.as_bytes())
}

/// [`parse`] for bytes (a `jsonb` column's binary value, after its version byte).
pub fn parse_slice(bytes: &[u8]) -> Result<Value, JsonError> {
    read::<Value>(bytes)
}

/// Checks that `bytes` are JSON walfold reads, without building the tree.
pub fn validate(bytes: &[u8]) -> Result<(), JsonError> {
    read::<serde::de::IgnoredAny>(bytes).map(drop)
}

/// Whether `text` is JSON that `jsonb` stores as written, judged in one pass: valid JSON
/// (RFC 8259, which [`validate`] accepts), nested at most [`STORABLE_DEPTH`] levels, no
/// `\u0000` escape and every number within `numeric`'s range (what [`check_jsonb_text`]
/// finds nothing in). `false` says only that those checks must tell why, or find nothing
/// (deeper nesting is left to them): the hot path's payloads take this one pass instead of
/// a depth scan, a parse and a check.
pub fn is_storable(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    // One bit per open container, innermost lowest: 1 an object, 0 an array.
    let mut open: u64 = 0;
    let mut depth = 0;
    'value: loop {
        skip_whitespace(b, &mut i);
        match b.get(i) {
            Some(&c @ (b'{' | b'[')) => {
                if depth == STORABLE_DEPTH {
                    return false;
                }
                let object = c == b'{';
                open = open << 1 | u64::from(object);
                depth += 1;
                i += 1;
                skip_whitespace(b, &mut i);
                let close = if object { b'}' } else { b']' };
                if b.get(i) == Some(&close) {
                    i += 1;
                    open >>= 1;
                    depth -= 1;
                } else if object {
                    if !key(b, &mut i) {
                        return false;
                    }
                    continue 'value;
                } else {
                    continue 'value;
                }
            }
            Some(b'"') => {
                if !string(b, &mut i) {
                    return false;
                }
            }
            Some(b'-' | b'0'..=b'9') => {
                if !number(text, &mut i) {
                    return false;
                }
            }
            Some(b't') if b[i..].starts_with(b"true") => i += 4,
            Some(b'f') if b[i..].starts_with(b"false") => i += 5,
            Some(b'n') if b[i..].starts_with(b"null") => i += 4,
            _ => return false,
        }
        // After a value: its containers close, or a comma leads to the next value.
        loop {
            skip_whitespace(b, &mut i);
            if depth == 0 {
                return i == b.len();
            }
            let object = open & 1 == 1;
            match b.get(i) {
                Some(b',') => {
                    i += 1;
                    if object {
                        skip_whitespace(b, &mut i);
                        if !key(b, &mut i) {
                            return false;
                        }
                    }
                    continue 'value;
                }
                Some(b'}') if object => {}
                Some(b']') if !object => {}
                _ => return false,
            }
            i += 1;
            open >>= 1;
            depth -= 1;
        }
    }
}

/// How deep [`is_storable`] reads; deeper JSON is left to the full checks.
pub const STORABLE_DEPTH: u32 = 64;

fn skip_whitespace(b: &[u8], i: &mut usize) {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(*i) {
        *i += 1;
    }
}

/// An object's key and its colon, at `b[*i]`.
fn key(b: &[u8], i: &mut usize) -> bool {
    if b.get(*i) != Some(&b'"') || !string(b, i) {
        return false;
    }
    skip_whitespace(b, i);
    if b.get(*i) != Some(&b':') {
        return false;
    }
    *i += 1;
    true
}

/// A string at `b[*i]` (its opening quote) without a `\u0000` escape.
fn string(b: &[u8], i: &mut usize) -> bool {
    let mut j = *i + 1;
    loop {
        // Eight ordinary bytes at a time: none a quote, a backslash or a control byte.
        while let Some(&chunk) = b.get(j..).and_then(|r| r.first_chunk::<8>()) {
            if special(u64::from_le_bytes(chunk)) {
                break;
            }
            j += 8;
        }
        // Then byte by byte up to the quote or escape that stopped it.
        loop {
            match b.get(j) {
                Some(b'"') => {
                    *i = j + 1;
                    return true;
                }
                Some(b'\\') => {
                    match b.get(j + 1) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => j += 2,
                        Some(b'u') => match b.get(j + 2..j + 6) {
                            // Not `\u0000`, and not a surrogate: a lone one is not
                            // storable, and a pair is left to the full checks to judge.
                            Some(hex) if escape_is_plain(hex) => j += 6,
                            _ => return false,
                        },
                        _ => return false,
                    }
                    break;
                }
                Some(&c) if c >= 0x20 => j += 1,
                _ => return false,
            }
        }
    }
}

/// Whether a `\u` escape's four bytes are hex digits of a code point other than U+0000
/// and the surrogates (U+D800 to U+DFFF).
fn escape_is_plain(hex: &[u8]) -> bool {
    std::str::from_utf8(hex)
        .ok()
        .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))
        .and_then(|h| u16::from_str_radix(h, 16).ok())
        .is_some_and(|c| c != 0 && !(0xD800..=0xDFFF).contains(&c))
}

/// Whether any of eight bytes may be a quote, a backslash or below 0x20 (never `false`
/// when one is; a `true` is checked byte by byte).
fn special(x: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte below n sets its high bit here (n <= 0x80): zero is `below(x, 1)`.
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH;
    let quote = x ^ (ONES * u64::from(b'"'));
    let backslash = x ^ (ONES * u64::from(b'\\'));
    below(quote, 1) | below(backslash, 1) | below(x, 0x20) != 0
}

/// A number at `text[*i..]` (RFC 8259's grammar) that `numeric` holds.
fn number(text: &str, i: &mut usize) -> bool {
    let b = text.as_bytes();
    let start = *i;
    let mut j = start;
    if b.get(j) == Some(&b'-') {
        j += 1;
    }
    let digits = |j: &mut usize| {
        let from = *j;
        while b.get(*j).is_some_and(u8::is_ascii_digit) {
            *j += 1;
        }
        *j - from
    };
    let integer = match b.get(j) {
        Some(b'0') => {
            j += 1;
            1
        }
        Some(b'1'..=b'9') => digits(&mut j),
        _ => return false,
    };
    let mut fraction = 0;
    if b.get(j) == Some(&b'.') {
        j += 1;
        fraction = digits(&mut j);
        if fraction == 0 {
            return false;
        }
    }
    let mut exponent = false;
    if let Some(b'e' | b'E') = b.get(j) {
        j += 1;
        if let Some(b'+' | b'-') = b.get(j) {
            j += 1;
        }
        if digits(&mut j) == 0 {
            return false;
        }
        exponent = true;
    }
    *i = j;
    // Without an exponent, numeric's limits are digit counts (see `numeric_fits`).
    if !exponent && integer <= 131_072 && fraction <= 16383 {
        return true;
    }
    numeric_fits(&text[start..j])
}

/// Reads `bytes` as a `T`, once their depth is known to be at most [`MAX_DEPTH`] (so
/// the recursion serde_json is then allowed cannot overflow the stack), and checks
/// that nothing but whitespace follows.
fn read<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, JsonError> {
    let depth = depth(bytes);
    if depth > MAX_DEPTH {
        return Err(JsonError::TooDeep { depth });
    }
    let invalid = |e: serde_json::Error| JsonError::Invalid(e.to_string());
    let mut de = serde_json::Deserializer::from_slice(bytes);
    de.disable_recursion_limit();
    let value = T::deserialize(&mut de).map_err(invalid)?;
    de.end().map_err(invalid)?;
    Ok(value)
}

const SURROGATE: &str =
    "holds a lone Unicode surrogate escape (\\uD800 to \\uDFFF without its pair), which jsonb cannot store";

/// The code unit of a `\uXXXX` escape starting at `bytes[at]`, if one starts there.
fn escaped_unit(bytes: &[u8], at: usize) -> Option<u16> {
    if bytes.get(at..at + 2) != Some(b"\\u") {
        return None;
    }
    let hex = std::str::from_utf8(bytes.get(at + 2..at + 6)?).ok()?;
    u16::from_str_radix(hex, 16).ok()
}

/// [`check_jsonb`] for valid JSON text, read as text: numbers outside strings, escapes
/// inside them.
pub fn check_jsonb_text(text: &str) -> Result<(), String> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    if bytes[i] == b'\\' {
                        match escaped_unit(bytes, i) {
                            Some(0) => return Err(NUL.into()),
                            // A high surrogate and the low one after it: one character.
                            Some(0xD800..=0xDBFF)
                                if escaped_unit(bytes, i + 6)
                                    .is_some_and(|low| (0xDC00..=0xDFFF).contains(&low)) =>
                            {
                                i += 6;
                            }
                            Some(0xD800..=0xDFFF) => return Err(SURROGATE.into()),
                            _ => {}
                        }
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len()
                    && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let n = &text[start..i];
                if !numeric_fits(n) {
                    return Err(format!(
                        "holds a number jsonb cannot store (outside numeric's range): `{}`",
                        shorten(n)
                    ));
                }
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// The deepest nesting of arrays and objects in JSON text, outside strings. Iterative:
/// it must not itself be the stack overflow it guards against.
fn depth(bytes: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Why `jsonb` would refuse `value`: a number outside `numeric`'s range, or a `\u0000`
/// in a string or key. `Ok` for a value it stores.
pub fn check_jsonb(value: &Value) -> Result<(), String> {
    match first_unstorable(value, numeric_fits) {
        None => Ok(()),
        Some(Unstorable::Number(n)) => Err(format!(
            "holds a number jsonb cannot store (outside numeric's range): `{}`",
            shorten(n)
        )),
        Some(Unstorable::Nul) => Err(NUL.into()),
    }
}

/// What in a value `jsonb` refuses.
enum Unstorable<'a> {
    Number(&'a str),
    Nul,
}

/// The first part of `value` that `jsonb` refuses, judging numbers by `fits`. Iterative:
/// the value may be deep.
fn first_unstorable(value: &Value, fits: fn(&str) -> bool) -> Option<Unstorable<'_>> {
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Number(n) if !fits(n.as_str()) => return Some(Unstorable::Number(n.as_str())),
            Value::String(s) if s.contains('\0') => return Some(Unstorable::Nul),
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => {
                if map.keys().any(|k| k.contains('\0')) {
                    return Some(Unstorable::Nul);
                }
                stack.extend(map.values());
            }
            _ => {}
        }
    }
    None
}

const NUL: &str = "holds \\u0000, which jsonb cannot store";

/// `value` as `jsonb` stores it: unchanged when it can, else with each `\u0000` written
/// out as the six characters `\u0000` and each number outside `numeric`'s range (or
/// near it) as a string of its digits. Deterministic, so a dead letter recorded again
/// compares equal; for the raw content of dead letters, never for events.
pub fn storable(value: &Value) -> Cow<'_, Value> {
    if first_unstorable(value, numeric_surely_fits).is_none() {
        return Cow::Borrowed(value);
    }
    // Iterative, like everything that walks a value of unknown depth here.
    enum Step<'a> {
        Visit(&'a Value),
        Array(usize),
        Object(Vec<String>),
    }
    let mut steps = vec![Step::Visit(value)];
    let mut done: Vec<Value> = Vec::new();
    while let Some(step) = steps.pop() {
        match step {
            Step::Visit(v) => match v {
                Value::Number(n) if !numeric_surely_fits(n.as_str()) => {
                    done.push(Value::String(n.as_str().to_owned()))
                }
                Value::String(s) => done.push(Value::String(escape_nul(s).into_owned())),
                Value::Array(items) => {
                    steps.push(Step::Array(items.len()));
                    steps.extend(items.iter().rev().map(Step::Visit));
                }
                Value::Object(map) => {
                    steps.push(Step::Object(
                        map.keys().map(|k| escape_nul(k).into_owned()).collect(),
                    ));
                    steps.extend(map.values().rev().map(Step::Visit));
                }
                other => done.push(other.clone()),
            },
            Step::Array(n) => {
                let items = done.split_off(done.len() - n);
                done.push(Value::Array(items));
            }
            Step::Object(keys) => {
                let values = done.split_off(done.len() - keys.len());
                let map: Map<String, Value> = keys.into_iter().zip(values).collect();
                done.push(Value::Object(map));
            }
        }
    }
    Cow::Owned(done.pop().unwrap_or(Value::Null))
}

/// Text PostgreSQL can store: each NUL written out as `\u0000`.
pub fn escape_nul(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\\u0000"))
    } else {
        Cow::Borrowed(text)
    }
}

/// Whether PostgreSQL's `numeric` input accepts this JSON number: its most significant
/// digit at most 10^131071 (weight 32767 in base 10000) and at most 16383 digits after
/// the point, counted as `numeric_in` counts them (exponent applied, trailing zeros kept).
fn numeric_fits(text: &str) -> bool {
    let Some(n) = Parts::of(text) else {
        return false;
    };
    // numeric_in refuses exponents this large outright.
    const EXPONENT_MAX: i64 = i32::MAX as i64 / 2;
    if n.exponent.abs() >= EXPONENT_MAX {
        return false;
    }
    let scale = (n.fraction_digits - n.exponent).max(0);
    if scale > 16383 {
        return false;
    }
    match n.leading_digit_weight() {
        None => true,
        Some(weight) => weight + n.exponent < 131_072,
    }
}

/// A stricter [`numeric_fits`] with a wide margin, for dead letters' raw content: a
/// number it doubts is kept as a string, which is always stored.
fn numeric_surely_fits(text: &str) -> bool {
    Parts::of(text).is_some_and(|n| {
        n.exponent.abs() <= 1000 && n.fraction_digits <= 1000 && n.integer_digits <= 1000
    })
}

/// A JSON number's digits, as `numeric_in` reads them.
struct Parts<'a> {
    integer: &'a str,
    fraction: &'a str,
    integer_digits: i64,
    fraction_digits: i64,
    exponent: i64,
}

impl<'a> Parts<'a> {
    fn of(text: &'a str) -> Option<Parts<'a>> {
        let unsigned = text.strip_prefix('-').unwrap_or(text);
        let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
            Some(i) => {
                let e = unsigned[i + 1..].trim_start_matches('+');
                // An exponent past i64 is far past any limit: saturate.
                let exponent = e.parse::<i64>().unwrap_or(if e.starts_with('-') {
                    i64::MIN / 2
                } else {
                    i64::MAX / 2
                });
                (&unsigned[..i], exponent)
            }
            None => (unsigned, 0),
        };
        let (integer, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        if !integer
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
        {
            return None;
        }
        Some(Parts {
            integer,
            fraction,
            integer_digits: integer.len() as i64,
            fraction_digits: fraction.len() as i64,
            exponent,
        })
    }

    /// The power of ten of the first non-zero digit, before the exponent; `None` for zero.
    fn leading_digit_weight(&self) -> Option<i64> {
        let integer = self.integer.trim_start_matches('0');
        if !integer.is_empty() {
            return Some(integer.len() as i64 - 1);
        }
        self.fraction
            .bytes()
            .position(|b| b != b'0')
            .map(|i| -(i as i64) - 1)
    }
}

fn shorten(s: &str) -> Cow<'_, str> {
    if s.len() > 40 {
        Cow::Owned(format!("{}…", &s[..40]))
    } else {
        Cow::Borrowed(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_judged_as_numeric_in_judges_them() {
        // Each checked against PostgreSQL 15: `select ('{"n": X}'::jsonb)`.
        for fits in [
            "0",
            "-1.5",
            "9e131071",
            "1e-16383",
            "0.1e-16382",
            "0e-16383",
            "0e1000000",
            "12345678901234567890e131052",
            "0.0001e131075",
        ] {
            assert!(numeric_fits(fits), "{fits} fits");
        }
        for overflows in [
            "9e131072",
            "1e-16384",
            "0.1e-16383",
            "0e-16384",
            "1e1073741822",
            "1e1000000",
            "1e-1000000",
            "1e99999999999999999999999",
        ] {
            assert!(!numeric_fits(overflows), "{overflows} overflows");
        }
    }

    #[test]
    fn what_jsonb_refuses_is_named() {
        let v = parse(r#"{"a": [1, {"b": 1e1000000}]}"#).unwrap();
        assert!(check_jsonb(&v).unwrap_err().contains("`1e+1000000`"));
        let v = parse(r#"{"a": "x\u0000"}"#).unwrap();
        assert!(check_jsonb(&v).unwrap_err().contains("\\u0000"));
        let v = parse(r#"{"a\u0000": 1}"#).unwrap();
        assert!(check_jsonb(&v).is_err());
        assert!(check_jsonb(&parse(r#"{"a": [1, 2.5, "x"]}"#).unwrap()).is_ok());
    }

    #[test]
    fn text_is_checked_as_its_tree_is() {
        for text in [
            r#"{"a": [1, {"b": 1e1000000}]}"#,
            r#"{"a": "x\u0000"}"#,
            r#"{"a\u0000": 1}"#,
            r#"[-1e-16384]"#,
        ] {
            assert!(check_jsonb_text(text).is_err(), "{text}");
            assert!(check_jsonb(&parse(text).unwrap()).is_err(), "{text}");
        }
        for text in [
            r#"{"a": [1, 2.5, "x", -0.5e3, true, null]}"#,
            r#"{"a": "\\u0000", "1e1000000": "9e999999 \" 1e1000000"}"#,
            "12345678901234567890e131052",
        ] {
            assert!(check_jsonb_text(text).is_ok(), "{text}");
            assert!(check_jsonb(&parse(text).unwrap()).is_ok(), "{text}");
        }
        assert!(validate(b"{\"a\": [1, 2]}").is_ok());
        assert!(validate(b"{\"a\": [1, 2]").is_err());
    }

    /// What the one pass accepts, the full checks accept and find nothing in.
    fn agrees(text: &str) -> bool {
        let storable = is_storable(text);
        if storable {
            assert!(parse(text).is_ok(), "{text:?} is JSON");
            assert!(check_jsonb_text(text).is_ok(), "{text:?} is storable");
            assert!(
                check_jsonb(&parse(text).unwrap()).is_ok(),
                "{text:?} is storable"
            );
        }
        storable
    }

    #[test]
    fn a_lone_surrogate_escape_is_refused_and_a_pair_is_not() {
        for lone in [
            r#""\ud800""#,
            r#""\uDC00x""#,
            r#"["\ud800\u0041"]"#,
            r#""\udbff""#,
        ] {
            let why = check_jsonb_text(lone).unwrap_err();
            assert!(why.contains("lone Unicode surrogate"), "{lone}: {why}");
        }
        for ok in [r#""\ud83d\ude00""#, r#""\uD7FF\uE000""#, r#""\\ud800""#] {
            assert_eq!(check_jsonb_text(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn one_pass_accepts_only_what_the_full_checks_accept() {
        for ok in [
            r#"{"status": "paid", "amount": "1.25", "n": -0.5e3, "a": [1, true, false, null, {}], "e": []}"#,
            " \t\n\r[ 0 , -0, 1E5, 2e+5, 3e-5, 0.0, \"\\u00e9\\n\\\"\\\\u0000\" ] ",
            "\"x\"",
            "12345678901234567890e131052",
            "null",
            r#"{"": {"": [[[]]]}}"#,
            "\"é ✓\"",
        ] {
            assert!(agrees(ok), "{ok:?} in one pass");
        }
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        assert!(agrees(&deep(64)));
        for not in [
            "",
            " ",
            "{",
            "}",
            "[1,]",
            "[,1]",
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{1: 2}"#,
            "{} x",
            "01",
            "1.",
            ".5",
            "+1",
            "-",
            "1e",
            "1e+",
            "NaN",
            "tru",
            "nul",
            "\"a",
            "\"\\x\"",
            "\"\\u00g0\"",
            "\"\\u000\"",
            "\"\t\"",
            r#"{"a": "x\u0000"}"#,
            r#"{"a\u0000": 1}"#,
            r#"[1e1000000]"#,
            r#"[-1e-16384]"#,
            "[1]]",
            "[1}",
            r#"{"a": 1]"#,
            "\u{feff}{}",
            // jsonb refuses a lone surrogate; serde_json a lone one and reads a pair.
            r#""\ud800""#,
            r#""\uDC00""#,
            r#"["\ud800\u0041"]"#,
            r#""\ud83d\ude00""#,
        ] {
            assert!(!agrees(not), "{not:?} is left to the full checks");
        }
        assert!(!agrees(&deep(65)), "deeper than the one pass reads");
    }

    #[test]
    fn eight_bytes_at_a_time_miss_no_special_byte() {
        for c in 0..=255u8 {
            let is_special = c == b'"' || c == b'\\' || c < 0x20;
            for at in 0..8 {
                for fill in [b'a', 0x7f, 0xff, 0x20, 0x80] {
                    let mut bytes = [fill; 8];
                    bytes[at] = c;
                    if is_special {
                        assert!(special(u64::from_le_bytes(bytes)), "{c:#x} at {at}");
                    }
                }
            }
            if !is_special {
                assert!(!special(u64::from_le_bytes([c; 8])), "{c:#x}");
            }
        }
        // Strings longer than eight bytes, their quotes and escapes anywhere.
        for n in 0..40 {
            let s = "x".repeat(n);
            assert!(is_storable(&format!("[\"{s}\", \"{s}\\n{s}\"]")), "{n}");
            assert!(!is_storable(&format!("[\"{s}\u{1}{s}\"]")), "{n}");
            assert!(!is_storable(&format!("[\"{s}\\u0000{s}\"]")), "{n}");
            assert!(!is_storable(&format!("[\"{s}")), "{n}");
        }
    }

    #[test]
    fn one_pass_never_accepts_what_the_full_checks_refuse() {
        // Every prefix and single-byte change of JSON texts with every kind of token.
        let seeds = [
            r#"{"a": [1, -2.5e-3, "x\"\\\u00e9", true, false, null], "b": {"c": 0}}"#,
            r#"[{"k": "\u0000"}, 1e131072, 0.1, "\\u0000"]"#,
        ];
        let alphabet = b"{}[]\",:\\u0123456789eE+-. tfnrl\t\n";
        let mut accepted = 0;
        for seed in seeds {
            for end in 0..=seed.len() {
                if let Some(prefix) = seed.get(..end) {
                    accepted += usize::from(agrees(prefix));
                }
            }
            for at in 0..seed.len() {
                for &c in alphabet {
                    let mut bytes = seed.as_bytes().to_vec();
                    bytes[at] = c;
                    if let Ok(text) = String::from_utf8(bytes) {
                        accepted += usize::from(agrees(&text));
                    }
                }
            }
        }
        assert!(
            accepted > 100,
            "the mutations include storable JSON: {accepted}"
        );
    }

    #[test]
    fn deep_json_is_read_up_to_the_limit() {
        let nested = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        let v = parse(&nested(MAX_DEPTH)).unwrap();
        assert_eq!(serde_json::to_string(&v).unwrap(), nested(MAX_DEPTH));
        let e = parse(&nested(MAX_DEPTH + 1)).unwrap_err();
        assert_eq!(e, JsonError::TooDeep { depth: 513 });
        // Brackets inside strings are not nesting.
        let text = format!(r#"{{"a": "{}\"{}"}}"#, "[".repeat(2000), "{".repeat(2000));
        assert!(parse(&text).is_ok());
        // Trailing content is not JSON.
        assert!(parse("{} x").is_err());
    }

    #[test]
    fn anything_becomes_storable_deterministically() {
        let v = parse(r#"{"n": 1e1000000, "s": "a\u0000b", "k\u0000": [2, 1e-5000], "ok": 1.5}"#)
            .unwrap();
        let s = storable(&v).into_owned();
        assert_eq!(
            s,
            serde_json::json!({"n": "1e+1000000", "s": "a\\u0000b", "k\\u0000": [2, "1e-5000"], "ok": 1.5})
        );
        assert!(check_jsonb(&s).is_ok());
        assert_eq!(storable(&v).into_owned(), s);
        let fine = parse(r#"{"a": [1, "x"]}"#).unwrap();
        assert!(matches!(storable(&fine), Cow::Borrowed(_)));
        let deep = parse(&format!("{}1{}", "[".repeat(500), "]".repeat(500))).unwrap();
        assert_eq!(storable(&deep).into_owned(), deep);
        assert_eq!(escape_nul("a\0b"), "a\\u0000b");
    }
}

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
                        if bytes.get(i + 1) == Some(&b'u')
                            && bytes.get(i + 2..i + 6) == Some(b"0000")
                        {
                            return Err(NUL.into());
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

//! Casts: the input functions a constant or a text value goes through (`uuid_in`,
//! `int8in`, `boolin`, …, PostgreSQL 15's rules), explicit casts (`::t`,
//! `CAST(x AS t)`) and the implicit coercions operator resolution applies.

use uuid::Uuid;

use crate::bytes;
use crate::datum::{Datum, V};
use crate::json;
use crate::numeric;
use crate::types::Ty;

/// A cast's target: a type and, for `varchar(n)`/`char(n)`, a length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) ty: Ty,
    pub(crate) len: Option<usize>,
}

impl Target {
    pub(crate) fn name(&self) -> String {
        match self.len {
            Some(n) => format!("{}({n})", self.ty.name()),
            None => self.ty.name(),
        }
    }
}

/// The type's input function over `s`.
pub(crate) fn input(ty: Ty, s: &str) -> Result<V, String> {
    Ok(match ty {
        Ty::Unknown | Ty::Text | Ty::Varchar | Ty::Bpchar => V::Str(s.to_owned()),
        Ty::Name => V::Str(truncate_bytes(s, 63).to_owned()),
        Ty::Json | Ty::Jsonb => V::Json(json::parse(s)?),
        Ty::Bytea => V::Bytes(bytes::input(s)?),
        Ty::Uuid => V::Uuid(uuid_in(s)?),
        Ty::Int2 | Ty::Int4 | Ty::Int8 => V::Int(int_in(ty, s)?),
        Ty::Bool => V::Bool(bool_in(s)?),
        Ty::Numeric => V::Str(numeric::normalize(s)?),
        Ty::TextArray => {
            json::text_array(s)?;
            V::Str(s.to_owned())
        }
        Ty::Other(_) => {
            return Err(format!(
                "reading a constant as type {} is not supported",
                ty.name()
            ))
        }
    })
}

fn truncate_bytes(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `uuid_in`: 32 hex digits, upper or lower case, optionally in braces, a hyphen
/// allowed after any group of four digits.
fn uuid_in(s: &str) -> Result<Uuid, String> {
    let bad = || format!("invalid input syntax for type uuid: \"{s}\"");
    let b = s.as_bytes();
    let (mut i, braces) = if b.first() == Some(&b'{') {
        (1, true)
    } else {
        (0, false)
    };
    let mut out = [0u8; 16];
    for (n, byte) in out.iter_mut().enumerate() {
        let hi = b
            .get(i)
            .and_then(|c| (*c as char).to_digit(16))
            .ok_or_else(bad)?;
        let lo = b
            .get(i + 1)
            .and_then(|c| (*c as char).to_digit(16))
            .ok_or_else(bad)?;
        *byte = (hi << 4 | lo) as u8;
        i += 2;
        if b.get(i) == Some(&b'-') && n % 2 == 1 && n < 15 {
            i += 1;
        }
    }
    if braces {
        if b.get(i) != Some(&b'}') {
            return Err(bad());
        }
        i += 1;
    }
    if i != b.len() {
        return Err(bad());
    }
    Ok(Uuid::from_bytes(out))
}

fn int_bounds(ty: Ty) -> (i64, i64) {
    match ty {
        Ty::Int2 => (i16::MIN.into(), i16::MAX.into()),
        Ty::Int4 => (i32::MIN.into(), i32::MAX.into()),
        _ => (i64::MIN, i64::MAX),
    }
}

fn out_of_range(ty: Ty) -> String {
    format!("{} out of range", ty.name())
}

/// `int2in`/`int4in`/`int8in` (PostgreSQL 15: blanks around, a sign, decimal digits).
fn int_in(ty: Ty, s: &str) -> Result<i64, String> {
    let t = s.trim_matches(|c: char| c.is_ascii_whitespace() || c == '\u{b}');
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "invalid input syntax for type {}: \"{s}\"",
            ty.name()
        ));
    }
    let (min, max) = int_bounds(ty);
    let v: Option<i64> = t.parse::<i128>().ok().and_then(|v| i64::try_from(v).ok());
    match v {
        Some(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(format!(
            "value \"{s}\" is out of range for type {}",
            ty.name()
        )),
    }
}

/// `boolin`: blanks around; a prefix of true/false/yes/no, on/off, 1/0; any case.
fn bool_in(s: &str) -> Result<bool, String> {
    let t = s
        .trim_matches(|c: char| c.is_ascii_whitespace() || c == '\u{b}')
        .to_ascii_lowercase();
    let prefix = |word: &str, min: usize| t.len() >= min && word.starts_with(t.as_str());
    if prefix("true", 1) || prefix("yes", 1) || t == "on" || t == "1" {
        Ok(true)
    } else if prefix("false", 1) || prefix("no", 1) || prefix("off", 2) || t == "0" {
        Ok(false)
    } else {
        Err(format!("invalid input syntax for type boolean: \"{s}\""))
    }
}

/// An implicit coercion that operator or function resolution chose (so it exists).
pub(crate) fn coerce(d: Datum, to: Ty) -> Result<Datum, String> {
    if d.ty == to {
        return Ok(d);
    }
    let from = d.ty;
    let Some(v) = d.v else {
        return Ok(Datum::null(to));
    };
    let v = match (from, v) {
        (Ty::Unknown, V::Str(s)) => input(to, &s)?,
        (f, V::Str(s)) if f.is_string() && to.is_string() => {
            if f == Ty::Bpchar {
                V::Str(s.trim_end_matches(' ').to_owned())
            } else {
                V::Str(s)
            }
        }
        (f, V::Int(i)) if f.is_int() && to.is_int() => V::Int(i),
        (f, V::Int(i)) if f.is_int() && to == Ty::Numeric => V::Str(i.to_string()),
        (f, _) => {
            return Err(format!(
                "no implicit coercion from {} to {}",
                f.name(),
                to.name()
            ))
        }
    };
    Ok(Datum::new(to, v))
}

fn cannot(from: Ty, to: &Target) -> String {
    format!("cannot cast type {} to {}", from.name(), to.name())
}

/// Whether PostgreSQL has a cast from `from` to `to` (refused by type, NULL or not).
pub(crate) fn check(from: Ty, to: &Target) -> Result<(), String> {
    let ty = to.ty;
    let allowed = from == Ty::Unknown
        || from == ty
        || from.is_string()
        || ty.is_string()
        || match ty {
            Ty::Json | Ty::Jsonb => matches!(from, Ty::Json | Ty::Jsonb),
            Ty::Int2 | Ty::Int4 | Ty::Int8 => {
                from.is_int()
                    || matches!(from, Ty::Numeric | Ty::Jsonb)
                    || (from == Ty::Bool && ty == Ty::Int4)
            }
            Ty::Bool => matches!(from, Ty::Int4 | Ty::Jsonb),
            _ => false,
        };
    if allowed {
        Ok(())
    } else {
        Err(cannot(from, to))
    }
}

/// An explicit cast.
pub(crate) fn cast(d: Datum, to: Target) -> Result<Datum, String> {
    let from = d.ty;
    let ty = to.ty;
    check(from, &to)?;
    let Some(v) = d.v else {
        return Ok(Datum::null(ty));
    };
    let src = Datum::new(from, v);
    let v = if ty.is_string() {
        let s = match (&src.ty, src.v.as_ref()) {
            (Ty::Bool, Some(V::Bool(b))) => (if *b { "true" } else { "false" }).to_owned(),
            (Ty::Bpchar, _) if ty != Ty::Bpchar => src.into_string().unwrap_or_default(),
            _ => src.out().map(|c| c.into_owned()).unwrap_or_default(),
        };
        V::Str(fit_length(s, ty, to.len))
    } else if from.is_string() || from == Ty::Unknown {
        let s = src.into_string().unwrap_or_default();
        input(ty, &s)?
    } else {
        match (src.v.expect("not null"), ty) {
            (v, t) if from == t => v,
            (V::Json(j), Ty::Json | Ty::Jsonb) => V::Json(j),
            (V::Int(i), t) if t.is_int() => {
                let (min, max) = int_bounds(t);
                if !(min..=max).contains(&i) {
                    return Err(out_of_range(t));
                }
                V::Int(i)
            }
            (V::Bool(b), Ty::Int4) => V::Int(i64::from(b)),
            (V::Int(i), Ty::Bool) => V::Bool(i != 0),
            (V::Str(n), t) if from == Ty::Numeric => {
                let (min, max) = int_bounds(t);
                V::Int(numeric::round_to_int(&n, min, max).ok_or_else(|| out_of_range(t))?)
            }
            (V::Json(j), t) => jsonb_scalar(j, t)?,
            _ => return Err(cannot(from, &to)),
        }
    };
    Ok(Datum::new(ty, v))
}

/// `jsonb::int`/`jsonb::bool`: a number (rounded) or a boolean, else an error.
fn jsonb_scalar(j: serde_json::Value, t: Ty) -> Result<V, String> {
    use serde_json::Value as J;
    let kind = match &j {
        J::Null => "null",
        J::Bool(_) => "boolean",
        J::Number(_) => "numeric",
        J::String(_) => "string",
        J::Array(_) => "array",
        J::Object(_) => "object",
    };
    match (j, t) {
        (J::Bool(b), Ty::Bool) => Ok(V::Bool(b)),
        (J::Number(n), t) if t.is_int() => {
            let (min, max) = int_bounds(t);
            numeric::round_to_int(n.as_str(), min, max)
                .map(V::Int)
                .ok_or_else(|| out_of_range(t))
        }
        _ => Err(format!("cannot cast jsonb {kind} to type {}", t.name())),
    }
}

/// `varchar(n)` truncates, `char(n)` truncates and pads (explicit casts).
fn fit_length(s: String, ty: Ty, len: Option<usize>) -> String {
    let Some(n) = len else {
        return s;
    };
    let mut out: String = s.chars().take(n).collect();
    if ty == Ty::Bpchar {
        let have = out.chars().count();
        out.extend(std::iter::repeat_n(' ', n - have));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_input_forms() {
        let u = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11";
        for ok in [
            u,
            "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
            "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
            "a0eebc999c0b4ef8bb6d6bb9bd380a11",
            "a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11",
            "{a0eebc999c0b4ef8bb6d6bb9bd380a11}",
        ] {
            assert_eq!(uuid_in(ok).unwrap().to_string(), u, "{ok}");
        }
        for bad in [
            "",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a111",
            "a0eeb-c99-9c0b-4ef8-bb6d-6bb9bd380a11",
            " a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11-",
            "g0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        ] {
            assert!(uuid_in(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn integer_input() {
        assert_eq!(int_in(Ty::Int8, " -42 "), Ok(-42));
        assert_eq!(int_in(Ty::Int8, "+7"), Ok(7));
        assert_eq!(int_in(Ty::Int8, "9223372036854775807"), Ok(i64::MAX));
        assert!(int_in(Ty::Int8, "9223372036854775808")
            .unwrap_err()
            .contains("out of range for type bigint"));
        assert!(int_in(Ty::Int4, "2147483648").is_err());
        assert!(int_in(Ty::Int4, "1.0").is_err());
        assert!(int_in(Ty::Int4, "1 2").is_err());
        assert!(int_in(Ty::Int4, "").is_err());
    }

    #[test]
    fn boolean_input() {
        for t in ["t", "TRUE", " yes ", "on", "1", "tr", "y"] {
            assert_eq!(bool_in(t), Ok(true), "{t}");
        }
        for f in ["f", "False", "no", "off", "of", "0", "n"] {
            assert_eq!(bool_in(f), Ok(false), "{f}");
        }
        for bad in ["o", "2", "", "truee", "yess"] {
            assert!(bool_in(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn casts_refused_by_type() {
        let b = Datum::new(Ty::Bytea, V::Bytes(b"{}".to_vec()));
        let jsonb = Target {
            ty: Ty::Jsonb,
            len: None,
        };
        assert_eq!(
            cast(b, jsonb).unwrap_err(),
            "cannot cast type bytea to jsonb"
        );
        assert!(cast(Datum::null(Ty::Uuid), jsonb).is_err());
        let int = Target {
            ty: Ty::Int4,
            len: None,
        };
        let big = Datum::new(Ty::Int8, V::Int(1 << 40));
        assert_eq!(cast(big, int).unwrap_err(), "integer out of range");
    }
}

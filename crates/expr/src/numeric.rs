//! `numeric` as text: PostgreSQL's input rules and output form (no exponent, the
//! scale the input had), comparison, and rounding to an integer. JSON numbers go
//! through the same rules, as jsonb stores them as numeric.

use std::cmp::Ordering;

/// PostgreSQL refuses exponents beyond this in numeric input.
const MAX_EXPONENT: i64 = 1000;

/// The canonical text of numeric input `s` (`1.50e1` → `15.0`, `-0` → `0`), or an
/// error worded as PostgreSQL's.
pub(crate) fn normalize(s: &str) -> Result<String, String> {
    let bad = || format!("invalid input syntax for type numeric: \"{s}\"");
    let t = s.trim_matches(|c: char| c.is_ascii_whitespace());
    let (neg, body) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let lower = body.to_ascii_lowercase();
    if lower == "nan" && t.len() == body.len() {
        return Ok("NaN".into());
    }
    if lower == "infinity" || lower == "inf" {
        return Ok(if neg { "-Infinity" } else { "Infinity" }.into());
    }
    let (mant, exp) = match body.find(['e', 'E']) {
        Some(i) => {
            let e = &body[i + 1..];
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let v: i64 = e.parse().map_err(|_| bad())?;
            if !(-MAX_EXPONENT..=MAX_EXPONENT).contains(&v) {
                return Err(bad());
            }
            (&body[..i], v)
        }
        None => (body, 0),
    };
    let (int, frac) = match mant.split_once('.') {
        Some((i, f)) => (i, f),
        None => (mant, ""),
    };
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let scale = (frac.len() as i64 - exp).max(0) as usize;
    // The digits, and where the point goes counted from the left.
    let digits: String = format!("{int}{frac}");
    let point = int.len() as i64 + exp;
    let mut int_part = String::new();
    let mut frac_part = String::new();
    if point <= 0 {
        frac_part.extend(std::iter::repeat_n('0', (-point) as usize));
        frac_part.push_str(&digits);
    } else if point as usize >= digits.len() {
        int_part.push_str(&digits);
        int_part.extend(std::iter::repeat_n('0', point as usize - digits.len()));
    } else {
        int_part.push_str(&digits[..point as usize]);
        frac_part.push_str(&digits[point as usize..]);
    }
    frac_part.truncate(scale);
    while frac_part.len() < scale {
        frac_part.push('0');
    }
    let int_part = int_part.trim_start_matches('0');
    let int_part = if int_part.is_empty() { "0" } else { int_part };
    let zero = int_part == "0" && frac_part.bytes().all(|b| b == b'0');
    let mut out = String::new();
    if neg && !zero {
        out.push('-');
    }
    out.push_str(int_part);
    if !frac_part.is_empty() {
        out.push('.');
        out.push_str(&frac_part);
    }
    Ok(out)
}

/// Orders two canonical numerics (NaN above everything, as PostgreSQL sorts it).
pub(crate) fn compare(a: &str, b: &str) -> Ordering {
    rank(a).cmp(&rank(b)).then_with(|| {
        if rank(a) != 1 {
            return Ordering::Equal;
        }
        let (na, ia, fa) = parts(a);
        let (nb, ib, fb) = parts(b);
        let zero = |i: &str, f: &str| i == "0" && f.is_empty();
        let (na, nb) = (na && !zero(ia, fa), nb && !zero(ib, fb));
        let magnitude = ia
            .len()
            .cmp(&ib.len())
            .then_with(|| ia.cmp(ib))
            .then_with(|| fa.cmp(fb));
        match (na, nb) {
            (false, false) => magnitude,
            (true, true) => magnitude.reverse(),
            (true, false) => Ordering::Less,
            (false, true) => Ordering::Greater,
        }
    })
}

/// -Infinity 0, finite 1, Infinity 2, NaN 3.
fn rank(s: &str) -> u8 {
    match s {
        "-Infinity" => 0,
        "Infinity" => 2,
        "NaN" => 3,
        _ => 1,
    }
}

/// Sign, integer digits without leading zeros, fraction digits without trailing zeros.
fn parts(s: &str) -> (bool, &str, &str) {
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let (i, f) = s.split_once('.').unwrap_or((s, ""));
    let i = i.trim_start_matches('0');
    (
        neg,
        if i.is_empty() { "0" } else { i },
        f.trim_end_matches('0'),
    )
}

/// Rounds a canonical numeric to an integer, half away from zero, as the cast to
/// an integer type does; `None` when it does not fit `[min, max]` (or is not finite).
pub(crate) fn round_to_int(s: &str, min: i64, max: i64) -> Option<i64> {
    if rank(s) != 1 {
        return None;
    }
    let (neg, i, f) = parts(s);
    if i.len() > 19 {
        return None;
    }
    let mut v: i128 = i.parse().ok()?;
    if f.as_bytes().first().is_some_and(|d| *d >= b'5') {
        v += 1;
    }
    if neg {
        v = -v;
    }
    (i128::from(min)..=i128::from(max))
        .contains(&v)
        .then_some(v as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_as_numeric_out() {
        for (i, o) in [
            ("1", "1"),
            ("1.50", "1.50"),
            ("1e2", "100"),
            ("1.5e1", "15"),
            ("12.340e1", "123.40"),
            ("1e-3", "0.001"),
            ("-0", "0"),
            ("-0.00", "0.00"),
            ("0.1e-1", "0.01"),
            (" 007 ", "7"),
            ("-1.5E+1", "-15"),
            ("nan", "NaN"),
            ("-inf", "-Infinity"),
            (".5", "0.5"),
            ("5.", "5"),
        ] {
            assert_eq!(normalize(i).as_deref(), Ok(o), "{i}");
        }
        for bad in ["", "abc", "1e", "1e1001", "--1", ".", "1.2.3"] {
            assert!(normalize(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn compares_by_value() {
        assert_eq!(compare("1.0", "1"), Ordering::Equal);
        assert_eq!(compare("-2", "1"), Ordering::Less);
        assert_eq!(compare("-2", "-10"), Ordering::Greater);
        assert_eq!(compare("10", "9.99"), Ordering::Greater);
        assert_eq!(compare("NaN", "Infinity"), Ordering::Greater);
        assert_eq!(compare("0", "-0.0"), Ordering::Equal);
    }

    #[test]
    fn rounds_half_away_from_zero() {
        assert_eq!(round_to_int("1.5", i64::MIN, i64::MAX), Some(2));
        assert_eq!(round_to_int("-1.5", i64::MIN, i64::MAX), Some(-2));
        assert_eq!(round_to_int("1.49", i64::MIN, i64::MAX), Some(1));
        assert_eq!(round_to_int("40000", -32768, 32767), None);
        assert_eq!(round_to_int("NaN", i64::MIN, i64::MAX), None);
    }
}

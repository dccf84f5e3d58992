//! Parsing of `timestamptz` text in PostgreSQL's ISO output format into microseconds since the Unix epoch.

use crate::error::ValueError;

const MICROS_PER_SECOND: i64 = 1_000_000;
const SECONDS_PER_DAY: i64 = 86_400;

/// Parses `YYYY-MM-DD HH:MM:SS[.ffffff]±HH[:MM[:SS]]` (DateStyle ISO, as sent by
/// pgoutput), `infinity` or `-infinity`. BC dates are rejected.
pub(crate) fn parse_timestamptz(text: &str) -> Result<i64, ValueError> {
    parse(text, false, false)
}

/// Like `timestamptz` text, also in ISO 8601 (`T` between date and time, `Z` for UTC),
/// as JSON producers write it. With `assume_utc`, a time without an offset (a
/// `timestamp without time zone`) is taken as UTC.
pub fn parse_time(text: &str, assume_utc: bool) -> Result<i64, ValueError> {
    parse(text, true, assume_utc)
}

fn parse(text: &str, iso_8601: bool, assume_utc: bool) -> Result<i64, ValueError> {
    match text {
        "infinity" => return Ok(i64::MAX),
        "-infinity" => return Ok(i64::MIN),
        _ => {}
    }
    if text.ends_with(" BC") {
        return Err(ValueError::BcTimestamptz);
    }
    let mut s = Scanner {
        bytes: text.as_bytes(),
        pos: 0,
    };
    // Years past 9999 are printed with more digits; PostgreSQL's maximum is 294276.
    let (year, _) = s.digits(4, 6)?;
    s.expect(b'-')?;
    let (month, _) = s.digits(2, 2)?;
    s.expect(b'-')?;
    let (day, _) = s.digits(2, 2)?;
    if !(iso_8601 && s.eat(b'T')) {
        s.expect(b' ')?;
    }
    let (hour, _) = s.digits(2, 2)?;
    s.expect(b':')?;
    let (minute, _) = s.digits(2, 2)?;
    s.expect(b':')?;
    let (second, _) = s.digits(2, 2)?;
    let mut micros = 0;
    if s.eat(b':') {
        return Err(ValueError::InvalidTimestamptz);
    }
    if s.eat(b'.') {
        let (fraction, count) = s.digits(1, 6)?;
        micros = scale_fraction(fraction, count);
    }
    let (mut offset_hours, mut offset_minutes, mut offset_seconds) = (0, 0, 0);
    let sign = if s.eat(b'+') {
        1
    } else if s.eat(b'-') {
        -1
    } else if (iso_8601 && s.eat(b'Z')) || (assume_utc && s.pos == s.bytes.len()) {
        0
    } else {
        return Err(ValueError::InvalidTimestamptz);
    };
    if sign != 0 {
        offset_hours = s.digits(2, 2)?.0;
    }
    if sign != 0 && s.eat(b':') {
        offset_minutes = s.digits(2, 2)?.0;
        if s.eat(b':') {
            offset_seconds = s.digits(2, 2)?.0;
        }
    }
    if s.pos != s.bytes.len() {
        return Err(ValueError::InvalidTimestamptz);
    }
    let valid = year >= 1
        && (1..=12).contains(&month)
        && (1..=days_in_month(year, month)).contains(&day)
        && hour <= 23
        && minute <= 59
        && second <= 59
        && offset_hours <= 15
        && offset_minutes <= 59
        && offset_seconds <= 59;
    if !valid {
        return Err(ValueError::InvalidTimestamptz);
    }
    let offset = sign * (offset_hours * 3600 + offset_minutes * 60 + offset_seconds);
    let local_seconds = days_from_civil(year, month, day)
        .checked_mul(SECONDS_PER_DAY)
        .and_then(|s| s.checked_add(hour * 3600 + minute * 60 + second))
        .and_then(|s| s.checked_sub(offset));
    local_seconds
        .and_then(|s| s.checked_mul(MICROS_PER_SECOND))
        .and_then(|us| us.checked_add(micros))
        // i64::MAX and i64::MIN stand for the infinities; a finite value must not alias them.
        .filter(|&us| us != i64::MAX && us != i64::MIN)
        .ok_or(ValueError::TimestamptzOutOfRange)
}

/// `fraction` had `count` (1..=6) digits; scale it to microseconds.
fn scale_fraction(fraction: i64, count: usize) -> i64 {
    let mut value = fraction;
    for _ in count..6 {
        value *= 10;
    }
    value
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
/// Callers keep `year` within six digits, so nothing here can overflow.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12; // March = 0
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

struct Scanner<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Scanner<'_> {
    fn eat(&mut self, want: u8) -> bool {
        if self.bytes.get(self.pos) == Some(&want) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, want: u8) -> Result<(), ValueError> {
        if self.eat(want) {
            Ok(())
        } else {
            Err(ValueError::InvalidTimestamptz)
        }
    }

    /// Reads `min..=max` ASCII digits (greedy); returns the value and the digit count.
    fn digits(&mut self, min: usize, max: usize) -> Result<(i64, usize), ValueError> {
        let mut value: i64 = 0;
        let mut count = 0;
        while let Some(&b) = self.bytes.get(self.pos) {
            if !b.is_ascii_digit() {
                break;
            }
            if count == max {
                return Err(ValueError::InvalidTimestamptz);
            }
            value = value * 10 + i64::from(b - b'0');
            count += 1;
            self.pos += 1;
        }
        if count < min {
            return Err(ValueError::InvalidTimestamptz);
        }
        Ok((value, count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_examples() {
        // Expected values computed independently (Python datetime).
        let cases = [
            ("2026-11-30 02:25:48.123456+00", 1_796_005_548_123_456),
            ("2026-11-30 02:25:48+05:30", 1_795_985_748_000_000),
            ("1999-01-08 04:05:06-08", 915_797_106_000_000),
            ("1850-01-01 12:00:00.5+05:53:28", -3_786_803_607_500_000),
            ("0001-01-01 00:00:00+00", -62_135_596_800_000_000),
            ("2000-02-29 23:59:59.999999+00", 951_868_799_999_999),
            ("1969-12-31 23:59:59.9+00", -100_000),
            ("1970-01-01 00:00:00-03:30", 12_600_000_000),
            ("1970-01-01 00:00:00+00", 0),
            // From PostgreSQL: extract(epoch from '10000-01-01 00:00:00+00'::timestamptz).
            ("10000-01-01 00:00:00+00", 253_402_300_800_000_000),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_timestamptz(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn fraction_digits_scale() {
        let base = 1_796_005_548_000_000;
        for (frac, add) in [
            ("1", 100_000),
            ("12", 120_000),
            ("123", 123_000),
            ("1234", 123_400),
            ("12345", 123_450),
            ("123456", 123_456),
            ("000001", 1),
        ] {
            let text = format!("2026-11-30 02:25:48.{frac}+00");
            assert_eq!(parse_timestamptz(&text), Ok(base + add), "{text}");
        }
    }

    #[test]
    fn iso_8601_and_naive_times() {
        let at = 1_796_005_548_500_000; // 2026-11-30 02:25:48.5 UTC
        assert_eq!(parse_time("2026-11-30T02:25:48.5Z", false), Ok(at));
        assert_eq!(parse_time("2026-11-30T03:25:48.5+01:00", false), Ok(at));
        assert_eq!(parse_time("2026-11-30 02:25:48.5", true), Ok(at));
        assert_eq!(
            parse_time("2026-11-30 02:25:48.5", false),
            Err(ValueError::InvalidTimestamptz),
            "a timestamptz always has an offset"
        );
        assert_eq!(
            parse_time("2026-11-30T02:25:48.5Zx", false),
            Err(ValueError::InvalidTimestamptz)
        );
    }

    #[test]
    fn infinities() {
        assert_eq!(parse_timestamptz("infinity"), Ok(i64::MAX));
        assert_eq!(parse_timestamptz("-infinity"), Ok(i64::MIN));
        assert_eq!(
            parse_timestamptz("Infinity"),
            Err(ValueError::InvalidTimestamptz)
        );
    }

    #[test]
    fn bc_is_rejected() {
        assert_eq!(
            parse_timestamptz("0044-03-15 12:00:00+00 BC"),
            Err(ValueError::BcTimestamptz)
        );
    }

    #[test]
    fn past_i64_range_is_an_error() {
        // PostgreSQL's maximum; its epoch is 2000-01-01 so it does not fit as
        // microseconds since 1970 in an i64.
        assert_eq!(
            parse_timestamptz("294276-12-31 23:59:59.999999+00"),
            Err(ValueError::TimestamptzOutOfRange)
        );
        assert_eq!(
            parse_timestamptz("294247-01-10 04:00:54.775806+00"),
            Ok(i64::MAX - 1)
        );
    }

    #[test]
    fn malformed() {
        for bad in [
            "",
            "2026-11-30",
            "2026-11-30 02:25:48",
            "2026-11-30T02:25:48+00",
            "2026-11-30 02:25:48Z",
            "2026-11-30 02:25:48.+00",
            "2026-11-30 02:25:48.1234567+00",
            "2026-11-30 02:25:48+0",
            "2026-11-30 02:25:48+000",
            "2026-11-30 02:25:48+00:",
            "2026-11-30 02:25:48+00:00:",
            "2026-11-30 02:25:48+00:00:00:00",
            "2026-11-30 02:25:48+16",
            "2026-11-30 02:25:48+05:60",
            "2026-11-30 02:25:48+00 ",
            "2026-11-30 02:25:48:00+00",
            "2026-13-30 02:25:48+00",
            "2026-00-30 02:25:48+00",
            "2026-02-29 02:25:48+00",
            "1900-02-29 02:25:48+00",
            "2026-04-31 02:25:48+00",
            "2026-11-00 02:25:48+00",
            "2026-11-30 24:00:00+00",
            "2026-11-30 23:60:00+00",
            "2026-11-30 23:59:60+00",
            "0000-01-01 00:00:00+00",
            "026-11-30 02:25:48+00",
            "1234567-11-30 02:25:48+00",
            "2026-1-30 02:25:48+00",
            "+2026-11-30 02:25:48+00",
            "2026-11-30 02:25:48+\u{e9}",
        ] {
            assert_eq!(
                parse_timestamptz(bad),
                Err(ValueError::InvalidTimestamptz),
                "{bad}"
            );
        }
        assert_eq!(
            parse_timestamptz("2000-02-29 00:00:00+00"),
            Ok(951_782_400_000_000)
        );
    }
}

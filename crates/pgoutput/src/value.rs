//! Parsing of text-format column values into typed [`Value`]s by type OID.

use crate::error::ValueError;
use crate::timestamp::parse_timestamptz;

/// OIDs of the built-in types walfold names anywhere: the one table of them, read by
/// [`parse_text`], the outbox mapping and the expression evaluator.
pub mod oid {
    /// `bool`
    pub const BOOL: u32 = 16;
    /// `name`
    pub const NAME: u32 = 19;
    /// `int8` / `bigint`
    pub const INT8: u32 = 20;
    /// `int2` / `smallint`
    pub const INT2: u32 = 21;
    /// `int4` / `integer`
    pub const INT4: u32 = 23;
    /// `text`
    pub const TEXT: u32 = 25;
    /// `json`
    pub const JSON: u32 = 114;
    /// `bpchar` / `char(n)`
    pub const BPCHAR: u32 = 1042;
    /// `varchar`
    pub const VARCHAR: u32 = 1043;
    /// `timestamp` (without time zone)
    pub const TIMESTAMP: u32 = 1114;
    /// `timestamptz`
    pub const TIMESTAMPTZ: u32 = 1184;
    /// `numeric`
    pub const NUMERIC: u32 = 1700;
    /// `uuid`
    pub const UUID: u32 = 2950;
    /// `jsonb`
    pub const JSONB: u32 = 3802;

    /// `bytea`: sent as `\x` hex text.
    pub const BYTEA: u32 = 17;
    /// `oid`: also the type of a large object's reference (`lo_import`, JPA's `@Lob` on
    /// PostgreSQL), whose content logical decoding never sends.
    pub const OID: u32 = 26;
    /// `real`
    pub const FLOAT4: u32 = 700;
    /// `double precision`
    pub const FLOAT8: u32 = 701;
    /// `date`
    pub const DATE: u32 = 1082;
    /// `time` (without time zone)
    pub const TIME: u32 = 1083;
    /// `interval`
    pub const INTERVAL: u32 = 1186;
    /// `text[]`
    pub const TEXT_ARRAY: u32 = 1009;
    /// The array types of the other common element types: `bool[]`, `bytea[]`,
    /// `int2[]`, `int4[]`, `bpchar[]`, `varchar[]`, `int8[]`, `real[]`,
    /// `double precision[]`, `timestamp[]`, `date[]`, `timestamptz[]`, `numeric[]`,
    /// `json[]`, `uuid[]`, `jsonb[]`, `oid[]`.
    pub const OTHER_ARRAYS: [u32; 17] = [
        1000, 1001, 1005, 1007, 1014, 1015, 1016, 1021, 1022, 1115, 1182, 1185, 1231, 199, 2951,
        3807, 1028,
    ];
}

/// A column value in text format, parsed according to its type OID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value<'a> {
    /// `bool`.
    Bool(bool),
    /// `int2`, `int4` or `int8`.
    Int(i64),
    /// `numeric`, kept as validated text (a plain decimal, `NaN`, `Infinity` or `-Infinity`).
    Numeric(&'a str),
    /// `text`, `varchar`, `bpchar` or `name`.
    Text(&'a str),
    /// `json` or `jsonb`, kept as text (not parsed).
    Json(&'a str),
    /// `uuid`, as its 16 bytes.
    Uuid([u8; 16]),
    /// `timestamptz`, microseconds since 1970-01-01 00:00:00 UTC; `infinity` is
    /// `i64::MAX` and `-infinity` is `i64::MIN`.
    Timestamptz(i64),
    /// Any other type, as UTF-8 text.
    Other(&'a str),
}

/// Parses one text-format column value (a [`Column::Text`](crate::Column::Text)
/// payload) of the type `type_oid`.
pub fn parse_text(type_oid: u32, raw: &[u8]) -> Result<Value<'_>, ValueError> {
    let text = std::str::from_utf8(raw).map_err(|_| ValueError::InvalidUtf8 { type_oid })?;
    match type_oid {
        oid::BOOL => match text {
            "t" => Ok(Value::Bool(true)),
            "f" => Ok(Value::Bool(false)),
            _ => Err(ValueError::InvalidBool),
        },
        oid::INT2 => parse_int(text, i64::from(i16::MIN), i64::from(i16::MAX), type_oid),
        oid::INT4 => parse_int(text, i64::from(i32::MIN), i64::from(i32::MAX), type_oid),
        oid::INT8 => parse_int(text, i64::MIN, i64::MAX, type_oid),
        oid::NUMERIC => validate_numeric(text).map(Value::Numeric),
        oid::TEXT | oid::VARCHAR | oid::BPCHAR | oid::NAME => Ok(Value::Text(text)),
        oid::JSON | oid::JSONB => Ok(Value::Json(text)),
        oid::UUID => parse_uuid(text).map(Value::Uuid),
        oid::TIMESTAMPTZ => parse_timestamptz(text).map(Value::Timestamptz),
        _ => Ok(Value::Other(text)),
    }
}

fn all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn parse_int(text: &str, min: i64, max: i64, type_oid: u32) -> Result<Value<'static>, ValueError> {
    if !all_digits(text.strip_prefix('-').unwrap_or(text)) {
        return Err(ValueError::InvalidInt);
    }
    let value: i64 = text
        .parse()
        .map_err(|_| ValueError::IntOutOfRange { type_oid })?;
    if value < min || value > max {
        return Err(ValueError::IntOutOfRange { type_oid });
    }
    Ok(Value::Int(value))
}

fn validate_numeric(text: &str) -> Result<&str, ValueError> {
    if matches!(text, "NaN" | "Infinity" | "-Infinity") {
        return Ok(text);
    }
    let unsigned = text
        .strip_prefix('-')
        .or_else(|| text.strip_prefix('+'))
        .unwrap_or(text);
    let valid = match unsigned.split_once('.') {
        Some((int, frac)) => all_digits(int) && all_digits(frac),
        None => all_digits(unsigned),
    };
    if valid {
        Ok(text)
    } else {
        Err(ValueError::InvalidNumeric)
    }
}

fn hex_nibble(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn parse_uuid(text: &str) -> Result<[u8; 16], ValueError> {
    let bytes = text.as_bytes();
    if bytes.len() != 36 {
        return Err(ValueError::InvalidUuid);
    }
    let mut nibbles = Vec::with_capacity(32);
    for (i, &b) in bytes.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if b != b'-' {
                return Err(ValueError::InvalidUuid);
            }
        } else {
            nibbles.push(hex_nibble(b).ok_or(ValueError::InvalidUuid)?);
        }
    }
    let mut out = [0u8; 16];
    for (slot, pair) in out.iter_mut().zip(nibbles.chunks_exact(2)) {
        if let [hi, lo] = pair {
            *slot = hi << 4 | lo;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bools() {
        assert_eq!(parse_text(oid::BOOL, b"t"), Ok(Value::Bool(true)));
        assert_eq!(parse_text(oid::BOOL, b"f"), Ok(Value::Bool(false)));
        for bad in [&b"true"[..], b"T", b"", b"1"] {
            assert_eq!(parse_text(oid::BOOL, bad), Err(ValueError::InvalidBool));
        }
    }

    #[test]
    fn ints() {
        assert_eq!(parse_text(oid::INT2, b"-32768"), Ok(Value::Int(-32768)));
        assert_eq!(parse_text(oid::INT2, b"32767"), Ok(Value::Int(32767)));
        assert_eq!(
            parse_text(oid::INT2, b"32768"),
            Err(ValueError::IntOutOfRange { type_oid: 21 })
        );
        assert_eq!(
            parse_text(oid::INT4, b"-2147483648"),
            Ok(Value::Int(-2_147_483_648))
        );
        assert_eq!(
            parse_text(oid::INT4, b"2147483648"),
            Err(ValueError::IntOutOfRange { type_oid: 23 })
        );
        assert_eq!(
            parse_text(oid::INT8, b"-9223372036854775808"),
            Ok(Value::Int(i64::MIN))
        );
        assert_eq!(
            parse_text(oid::INT8, b"9223372036854775807"),
            Ok(Value::Int(i64::MAX))
        );
        assert_eq!(
            parse_text(oid::INT8, b"9223372036854775808"),
            Err(ValueError::IntOutOfRange { type_oid: 20 })
        );
        assert_eq!(
            parse_text(oid::INT8, b"99999999999999999999999999999"),
            Err(ValueError::IntOutOfRange { type_oid: 20 })
        );
        assert_eq!(parse_text(oid::INT8, b"007"), Ok(Value::Int(7)));
        for bad in [&b""[..], b"-", b"+1", b" 1", b"1 ", b"1.0", b"--1", b"0x10"] {
            assert_eq!(
                parse_text(oid::INT8, bad),
                Err(ValueError::InvalidInt),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn numerics() {
        for good in [
            "0",
            "12345.6789",
            "-0.000001",
            "+1.5",
            "NaN",
            "Infinity",
            "-Infinity",
            "123456789012345678901234567890.000000000000000000001",
        ] {
            assert_eq!(
                parse_text(oid::NUMERIC, good.as_bytes()),
                Ok(Value::Numeric(good))
            );
        }
        for bad in [
            "",
            "-",
            ".5",
            "5.",
            "1e10",
            "nan",
            "+Infinity",
            "1.2.3",
            " 1",
            "1,5",
            "--1",
        ] {
            assert_eq!(
                parse_text(oid::NUMERIC, bad.as_bytes()),
                Err(ValueError::InvalidNumeric),
                "{bad}"
            );
        }
    }

    #[test]
    fn text_json_other() {
        assert_eq!(parse_text(oid::TEXT, b"h\xc3\xa9"), Ok(Value::Text("hé")));
        assert_eq!(parse_text(oid::VARCHAR, b""), Ok(Value::Text("")));
        assert_eq!(parse_text(oid::BPCHAR, b"ab  "), Ok(Value::Text("ab  ")));
        assert_eq!(parse_text(oid::NAME, b"pg"), Ok(Value::Text("pg")));
        assert_eq!(
            parse_text(oid::JSON, b"{\"a\": 1}"),
            Ok(Value::Json("{\"a\": 1}"))
        );
        assert_eq!(
            parse_text(oid::JSONB, b"not json"),
            Ok(Value::Json("not json"))
        );
        assert_eq!(parse_text(16390, b"happy"), Ok(Value::Other("happy")));
        assert_eq!(
            parse_text(oid::JSONB, b"\xff"),
            Err(ValueError::InvalidUtf8 { type_oid: 3802 })
        );
        assert_eq!(
            parse_text(1, b"\xc3"),
            Err(ValueError::InvalidUtf8 { type_oid: 1 })
        );
    }

    #[test]
    fn uuids() {
        let expected = [
            0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38,
            0x0a, 0x11,
        ];
        assert_eq!(
            parse_text(oid::UUID, b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
            Ok(Value::Uuid(expected))
        );
        assert_eq!(
            parse_text(oid::UUID, b"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"),
            Ok(Value::Uuid(expected))
        );
        for bad in [
            "",
            "a0eebc999c0b4ef8bb6d6bb9bd380a11",
            "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a111",
            "a0eebc99-9c0b-4ef8-bb6d06bb9bd380a11",
            "g0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "a0eebc9-99c0b-4ef8-bb6d-6bb9bd380a11",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1\u{e9}",
        ] {
            assert_eq!(
                parse_text(oid::UUID, bad.as_bytes()),
                Err(ValueError::InvalidUuid),
                "{bad}"
            );
        }
    }

    #[test]
    fn error_messages_are_lowercase_without_period() {
        let errors = [
            ValueError::InvalidUtf8 { type_oid: 1 },
            ValueError::InvalidBool,
            ValueError::InvalidInt,
            ValueError::IntOutOfRange { type_oid: 21 },
            ValueError::InvalidNumeric,
            ValueError::InvalidUuid,
            ValueError::InvalidTimestamptz,
            ValueError::BcTimestamptz,
            ValueError::TimestamptzOutOfRange,
        ];
        for e in errors {
            let text = e.to_string();
            assert!(!text.ends_with('.'), "{text}");
            assert!(
                text.chars().next().is_some_and(|c| !c.is_uppercase()),
                "{text}"
            );
        }
    }
}

//! Expressions end to end: parse, then evaluate over a row of typed text values.

use walfold_pgoutput::oid;

use crate::{parse, Input, Row, Value};

struct Cols(Vec<(&'static str, u32, Option<&'static str>)>);

impl Row for Cols {
    fn column(&self, name: &str) -> Option<Input<'_>> {
        self.0.iter().find(|c| c.0 == name).map(|c| Input {
            type_oid: c.1,
            text: c.2.map(str::as_bytes),
        })
    }
}

fn row() -> Cols {
    Cols(vec![
        ("stream_name", oid::TEXT, Some("account-123-x")),
        ("plain", oid::TEXT, Some("nodash")),
        (
            "Body",
            oid::TEXT,
            Some(r#"{"message": {"orderId": "o-1", "n": 2}}"#),
        ),
        (
            "data",
            oid::JSONB,
            Some(r#"{"a": [1, {"b": null}], "s": "x"}"#),
        ),
        ("bin", 17, Some("\\x7b2261223a317d")),
        ("b64", oid::TEXT, Some("eyJhIjox\nfQ==")),
        (
            "id",
            oid::UUID,
            Some("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        ),
        ("n", oid::INT4, Some("7")),
        ("big", oid::INT8, Some("9000000000")),
        ("flag", oid::BOOL, Some("t")),
        ("nothing", oid::TEXT, None),
        ("code", oid::BPCHAR, Some("ab  ")),
        ("ts", oid::TIMESTAMPTZ, Some("2024-01-02 03:04:05+00")),
    ])
}

/// The value's `::text`, `None` for NULL.
fn ev(src: &str) -> Result<Option<String>, String> {
    let e = parse(src).map_err(|e| format!("parse: {e}"))?;
    e.eval(&row()).map(|v| v.to_text())
}

fn ok(src: &str, want: Option<&str>) {
    let got = ev(src);
    assert_eq!(got.as_ref().map(|o| o.as_deref()), Ok(want), "{src}");
}

fn err(src: &str, contains: &str) {
    let e = ev(src).expect_err(src);
    assert!(e.contains(contains), "{src}: {e}");
}

#[test]
fn columns_constants_and_identifier_rules() {
    ok("stream_name", Some("account-123-x"));
    ok("STREAM_NAME", Some("account-123-x"));
    ok(r#""Body"::jsonb->'message'->>'orderId'"#, Some("o-1"));
    err("Body", "column \"body\" does not exist");
    ok("'it''s'", Some("it's"));
    ok("42", Some("42"));
    ok("-42", Some("-42"));
    ok("1.50", Some("1.50"));
    ok("true", Some("true"));
    ok("NULL", None);
    let e = parse("split_part(stream_name, '-', 1) || \"Body\" || stream_name").unwrap();
    assert_eq!(e.columns(), vec!["stream_name", "Body"]);
    assert!(!e.is_constant());
    assert!(parse("'order'").unwrap().is_constant());
}

#[test]
fn json_operators() {
    ok("data->'a'", Some("[1, {\"b\": null}]"));
    ok("data->'a'->0", Some("1"));
    ok("data->'a'->-1", Some("{\"b\": null}"));
    ok("data->'a'->5", None);
    ok("data->>'s'", Some("x"));
    ok("data->'s'", Some("\"x\""));
    ok("data#>'{a,1,b}'", Some("null"));
    ok("data#>>'{a,1,b}'", None);
    ok("data#>>'{a,0}'", Some("1"));
    ok("data->'missing'->>'x'", None);
    ok(
        "data || '{\"z\": 1}'",
        Some(r#"{"a": [1, {"b": null}], "s": "x", "z": 1}"#),
    );
    err(
        "stream_name->'k'",
        "operator does not exist: text -> unknown",
    );
    err("data->big", "operator does not exist: jsonb -> bigint");
    err("'{}'->'a'", "operator is not unique");
    err("\"Body\"::jsonb->'message'->>'n'::int", "");
}

#[test]
fn casts() {
    ok("'7'::bigint", Some("7"));
    ok("' 7 '::int", Some("7"));
    ok("CAST(n AS bigint)", Some("7"));
    ok("id::text", Some("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"));
    ok(
        "'{A0EEBC999C0B4EF8BB6D6BB9BD380A11}'::uuid",
        Some("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    );
    ok("flag::text", Some("true"));
    ok("flag::int", Some("1"));
    ok("code::text || '|'", Some("ab|"));
    ok("'abcdef'::varchar(3)", Some("abc"));
    ok("ts::text", Some("2024-01-02 03:04:05+00"));
    ok("(data->'a'->0)::int", Some("1"));
    err(
        "(data->'s')::int",
        "cannot cast jsonb string to type integer",
    );
    err("bin::jsonb", "cannot cast type bytea to jsonb");
    err("stream_name::jsonb", "invalid input syntax for type json");
    err("stream_name::uuid", "invalid input syntax for type uuid");
    err("big::int", "integer out of range");
    err("'x'::uuid", "parse: invalid input syntax for type uuid");
    err(
        "'9223372036854775808'::bigint",
        "out of range for type bigint",
    );
    err("id::int", "cannot cast type uuid to integer");
    err("ts::date", "type date is not supported");
}

#[test]
fn bytes_functions() {
    ok("convert_from(bin, 'UTF8')", Some("{\"a\":1}"));
    ok("convert_from(bin, 'UTF8')::jsonb->>'a'", Some("1"));
    ok(
        "convert_from(decode(b64, 'base64'), 'utf8')",
        Some("{\"a\":1}"),
    );
    ok("encode(bin, 'base64')", Some("eyJhIjoxfQ=="));
    ok("encode('\\x00ff'::bytea, 'hex')", Some("00ff"));
    ok("decode('41 42', 'hex')", Some("\\x4142"));
    err("decode('@@@@', 'base64')", "parse: invalid symbol");
    err(
        "convert_from(stream_name, 'UTF8')",
        "function convert_from(text, unknown) does not exist",
    );
    err(
        "convert_from('\\xff'::bytea, 'UTF8')",
        "invalid byte sequence",
    );
}

#[test]
fn string_functions() {
    ok("split_part(stream_name, '-', 1)", Some("account"));
    ok("split_part(stream_name, '-', -1)", Some("x"));
    err(
        "split_part(stream_name, '-', 0)",
        "field position must not be zero",
    );
    err(
        "split_part(stream_name, '-', big)",
        "function split_part(text, unknown, bigint) does not exist",
    );
    ok("substring(stream_name from 9)", Some("123-x"));
    ok("substring(stream_name from 0 for 3)", Some("ac"));
    ok("substring(stream_name, 9, 3)", Some("123"));
    ok("substr(stream_name, 9)", Some("123-x"));
    err("substring(stream_name from 'a.')", "regular expression");
    err("substring(stream_name, 1, -1)", "negative substring length");
    ok("position('-' in stream_name)", Some("8"));
    ok("strpos(plain, '-')", Some("0"));
    ok("upper(stream_name)", Some("ACCOUNT-123-X"));
    ok("LOWER('ÄB')", Some("äb"));
    ok("trim('  a  ')", Some("a"));
    ok("trim(both 'x' from 'xxaxx')", Some("a"));
    ok("trim(leading 'x' from 'xxaxx')", Some("axx"));
    ok("trim(trailing from '  a  ')", Some("  a"));
    ok("btrim('xyax', 'xy')", Some("a"));
    ok("replace(stream_name, '-', '/')", Some("account/123/x"));
    ok("length('héllo')", Some("5"));
    ok("concat('a', NULL, 1, flag)", Some("a1t"));
    ok("concat_ws('-', 'a', NULL, 'b')", Some("a-b"));
    err("lower(n)", "function lower(integer) does not exist");
    ok("upper(nothing)", None);
}

#[test]
fn message_db_functions() {
    ok("message_store.category(stream_name)", Some("account"));
    ok("message_store.id(stream_name)", Some("123-x"));
    ok("message_store.id(plain)", None);
    ok("message_store.category(plain)", Some("nodash"));
    ok("MESSAGE_STORE.ID(nothing)", None);
    err(
        "category(stream_name)",
        "function category is not supported",
    );
}

#[test]
fn concatenation() {
    ok("'a' || 1", Some("a1"));
    ok("'x' || flag", Some("xtrue"));
    ok("stream_name || nothing", None);
    ok("code || 'x'", Some("abx"));
    ok("bin || '\\x00'", Some("\\x7b2261223a317d00"));
    err("n || n", "operator does not exist: integer || integer");
}

#[test]
fn comparisons_and_logic() {
    ok("n = 7", Some("true"));
    ok("n = '7'", Some("true"));
    ok("n < big", Some("true"));
    ok("n = 7.0", Some("true"));
    ok("stream_name = 'account-123-x'", Some("true"));
    ok("code = 'ab'", Some("true"));
    ok("'a' < 'b'", Some("true"));
    ok("'B' < 'a'", Some("true"));
    ok("nothing = 'x'", None);
    ok("nothing IS NULL", Some("true"));
    ok("nothing IS NOT NULL", Some("false"));
    ok("id = 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", Some("true"));
    err("id = 'nope'", "invalid input syntax for type uuid");
    err("stream_name = 1", "operator does not exist: text = integer");
    ok("NULL AND false", Some("false"));
    ok("NULL OR true", Some("true"));
    ok("NULL AND true", None);
    ok("NOT flag", Some("false"));
    ok("NOT nothing IS NULL", Some("false"));
    err(
        "n AND true",
        "argument of AND must be type boolean, not type integer",
    );
    err("false AND n", "argument of AND must be type boolean");
    ok("n IN (1, 7)", Some("true"));
    ok("n IN (1, NULL)", None);
    ok("n NOT IN (1, 2)", Some("true"));
    ok("stream_name LIKE 'acc%'", Some("true"));
    ok("stream_name LIKE 'acc_unt%x'", Some("true"));
    ok("stream_name NOT LIKE '%y'", Some("true"));
    ok("'a%b' LIKE 'a\\%b'", Some("true"));
    ok("'a%b' LIKE 'a!%b' ESCAPE '!'", Some("true"));
    ok("'ABC' ILIKE 'a%'", Some("true"));
    ok(
        "data = '{\"s\": \"x\", \"a\": [1.0, {\"b\": null}]}'",
        Some("true"),
    );
    ok("flag IS TRUE", Some("true"));
    ok("nothing::bool IS NOT FALSE", Some("true"));
}

#[test]
fn conditionals() {
    ok("CASE WHEN n > 5 THEN 'big' ELSE 'small' END", Some("big"));
    ok(
        "CASE n WHEN 1 THEN 'one' WHEN 7 THEN 'seven' END",
        Some("seven"),
    );
    ok("CASE WHEN n > 50 THEN 'big' END", None);
    ok("CASE WHEN false THEN decode('@', 'base64') END", None);
    err(
        "CASE WHEN n > 1 THEN n ELSE stream_name END",
        "CASE types integer and text cannot be matched",
    );
    err(
        "CASE WHEN n > 100 THEN 'x'::uuid ELSE id END",
        "parse: invalid input syntax for type uuid",
    );
    ok("coalesce(nothing, stream_name)", Some("account-123-x"));
    ok("coalesce(nothing, 'd')", Some("d"));
    err(
        "coalesce(n, stream_name)",
        "COALESCE types integer and text cannot be matched",
    );
    ok("nullif(stream_name, 'account-123-x')", None);
    ok("nullif(n, 1)", Some("7"));
}

#[test]
fn refusals_name_what_is_unsupported() {
    let refused = |src: &str, contains: &str| {
        let e = parse(src).expect_err(src);
        assert!(e.contains(contains), "{src}: {e}");
    };
    refused(
        "lo_get(payload)",
        "function lo_get is not supported (walfold evaluates expressions itself",
    );
    refused("now()", "function now is not supported");
    refused("n + 1", "arithmetic");
    refused("data @> '{}'", "operator @> is not supported");
    refused("(select 1)", "subqueries");
    refused("x IN (select 1)", "subqueries");
    refused("count(*)", "function count is not supported");
    refused("t.col", "qualified column names");
    refused("x::date", "type date is not supported in casts");
    refused("x::text[]", "array types");
    refused("$1", "parameters");
    refused("$$x$$", "dollar-quoted");
    refused("current_timestamp", "current_timestamp is not supported");
    refused("x BETWEEN 1 AND 2", "BETWEEN");
    refused("a = b = c", "comparisons do not chain");
    refused("", "empty");
    refused("'open", "unterminated");
    refused("lower(x", "syntax error");
    refused("split_part(x, '-')", "takes 3 arguments");
    refused("data[0]", "subscripts");
    refused("x IS DISTINCT FROM y", "DISTINCT");
    refused("select", "subqueries");
    refused("when", "syntax error");
}

#[test]
fn values_for_callers() {
    let e = parse("data").unwrap();
    let v = e.eval(&row()).unwrap();
    assert!(matches!(v, Value::Json(_)));
    assert_eq!(
        v.to_json_text().unwrap().unwrap(),
        r#"{"a":[1,{"b":null}],"s":"x"}"#
    );
    assert_eq!(
        parse("bin")
            .unwrap()
            .eval(&row())
            .unwrap()
            .to_json_text()
            .unwrap()
            .unwrap(),
        r#"{"a":1}"#
    );
    assert!(parse("stream_name")
        .unwrap()
        .eval(&row())
        .unwrap()
        .to_json_text()
        .is_err());
    assert_eq!(
        parse("n > 1").unwrap().eval(&row()).unwrap().as_bool(),
        Some(true)
    );
    assert_eq!(parse("n").unwrap().eval(&row()).unwrap(), Value::Int(7));
    assert_eq!(
        parse("code").unwrap().eval(&row()).unwrap(),
        Value::Text("ab  ".into())
    );
    assert!(matches!(
        parse("ts").unwrap().eval(&row()).unwrap(),
        Value::Other {
            type_oid: oid::TIMESTAMPTZ,
            ..
        }
    ));
}

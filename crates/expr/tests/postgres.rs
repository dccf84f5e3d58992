//! Differential test: every case is evaluated by a real PostgreSQL and by walfold-expr
//! over the same rows; both must give the same text, or both must fail.
//!
//! The rows are read back from the server in text form with their type OIDs, exactly
//! what logical decoding hands walfold. The server's result is its output function's
//! text (simple query protocol); walfold's is [`Value::to_text`], except booleans,
//! which the output function writes `t`/`f`.

use std::fmt::Write as _;

use rand::{Rng, SeedableRng};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};
use walfold_expr::{Input, Row, Value};
use walfold_tempdb::Cluster;

/// Columns of the test table: name (as SQL writes it), type, and the value of each of
/// the three rows (SQL constants).
const COLUMNS: &[(&str, &str, [&str; 3])] = &[
    ("s", "text", ["'account-123-x'", "null", "''"]),
    ("plain", "text", ["'nodash'", "null", "'a-'"]),
    (
        "\"Body\"",
        "text",
        [
            r#"'{"message": {"orderId": "o-1", "n": 2.50, "arr": [1, "two", null, {"k": true}]}}'"#,
            "null",
            "'not json'",
        ],
    ),
    (
        "j",
        "jsonb",
        [
            r#"'{"a": [1, {"b": null}], "s": "x", "n": 1.50, "o": {"p": {"q": "deep"}}, "e": [], "u": "é\"\\n\t"}'"#,
            "null",
            "'[10, 20, 30]'",
        ],
    ),
    (
        "js",
        "json",
        [r#"'{"s": "x", "n": 1}'"#, "null", r#"'"str"'"#],
    ),
    ("bin", "bytea", [r"'\x7b2261223a317d'", "null", r"'\xff00'"]),
    (
        "b64",
        "text",
        ["E'eyJhIjox\\nfQ=='", "null", "'eyJhIjoxfQ'"],
    ),
    (
        "id",
        "uuid",
        [
            "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
            "null",
            "'00000000-0000-0000-0000-000000000000'",
        ],
    ),
    ("n", "int4", ["7", "null", "-2147483648"]),
    ("big", "int8", ["9000000000", "null", "9223372036854775807"]),
    ("sm", "int2", ["3", "null", "-32768"]),
    ("flag", "bool", ["true", "null", "false"]),
    ("code", "char(4)", ["'ab'", "null", "''"]),
    ("vc", "varchar(20)", ["'Hello World'", "null", "'ÄÖü ß'"]),
    ("num", "numeric", ["12.50", "null", "-0.001"]),
    (
        "ts",
        "timestamptz",
        [
            "'2024-01-02 03:04:05+00'",
            "null",
            "'1999-12-31 23:59:59.5+00'",
        ],
    ),
    (
        "u",
        "text",
        [
            "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'",
            "null",
            "'not-a-uuid'",
        ],
    ),
    (
        "ntext",
        "text",
        ["' 42 '", "null", "'99999999999999999999'"],
    ),
    ("\"MixedCase\"", "text", ["'mixed'", "null", "'M'"]),
];

/// Every expression runs over each of the three rows.
const CASES: &[&str] = &[
    // Columns, constants, identifiers.
    "s",
    "\"S\"",
    "\"Body\"",
    "Body",
    "\"MixedCase\"",
    "mixedcase",
    "'it''s'",
    r"E'a\tb\x41\u00e9'",
    "42",
    "-42",
    "2147483648",
    "-2147483648",
    "1.50",
    "1e3",
    "-0.0",
    "true",
    "NULL",
    "code",
    "vc",
    "num",
    "ts",
    "sm",
    "flag",
    "bin",
    "id",
    "j",
    // JSON.
    "j->'a'",
    "j->'a'->0",
    "j->'a'->-1",
    "j->'a'->-3",
    "j->'a'->5",
    "j->0",
    "j->-1",
    "j->>'s'",
    "j->>'n'",
    "j->>'a'",
    "j->>'o'",
    "j->'a'->1->>'b'",
    "j->'a'->1->'b'",
    "j#>'{o,p,q}'",
    "j#>>'{o,p,q}'",
    "j#>>'{a,1,b}'",
    "j#>>'{a,0}'",
    "j#>>'{a,-1}'",
    "j#>>'{-1}'",
    "j#>'{}'",
    "j#>>'{}'",
    "j#>>'{a,x}'",
    r#"j#>>'{"o", "p" , q}'"#,
    "j#>>'{o,NULL}'",
    "j#>>'{a'",
    "j->>'u'",
    "j->'u'",
    "j->'e'",
    "j->>'missing'",
    "j->sm",
    "j->n",
    "j->big",
    "j->s",
    "s->'k'",
    "'{\"a\":1}'->'a'",
    "'{\"a\":1}'::jsonb->'a'",
    "'{\"a\":1}'::json->>'a'",
    "js->>'s'",
    "js->'n'",
    "js->>0",
    "\"Body\"::jsonb->'message'->>'orderId'",
    "\"Body\"::jsonb#>>'{message,arr,1}'",
    "\"Body\"::jsonb->'message'->'n'",
    "\"Body\"::json->'message'->>'orderId'",
    "j || '{\"z\": 1}'",
    "j || '[1]'",
    "j->'a' || j->'e'",
    "'[1,2]'::jsonb || '3'::jsonb",
    "j = '{\"s\": \"x\"}'",
    "j->'n' = '1.5'",
    "j->>'n' = '1.50'",
    "(j->'a'->0)::int",
    "(j->'n')::int",
    "(j->'s')::int",
    "(j->'a')::text",
    "j::text",
    "j::json",
    "js::jsonb",
    "bin::jsonb",
    "bin::text",
    // Casts.
    "s::jsonb",
    "'{\"b\":2, \"a\":1, \"a\":3}'::jsonb",
    "'[1, 1.0, 1e2, -0, 0.10, 1.5E-3]'::jsonb",
    "'\"\\u0000\"'::jsonb",
    "ntext::bigint",
    "ntext::int",
    "ntext::smallint",
    "'  -7'::int",
    "'1.5'::int",
    "'9223372036854775807'::bigint",
    "'-9223372036854775809'::bigint",
    "big::int",
    "n::bigint",
    "sm::int",
    "n::smallint",
    "num::int",
    "num::text",
    "u::uuid",
    "'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}'::uuid",
    "'a0eebc999c0b4ef8bb6d6bb9bd380a11'::uuid",
    "'a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11'::uuid",
    "'a0eebc99-9c0b4ef8-bb6d-6bb9bd380a11'::uuid",
    "'a0eebc9-99c0b-4ef8-bb6d-6bb9bd380a11'::uuid",
    "' a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid",
    "id::text",
    "id = u",
    "id = u::uuid",
    "id::bytea",
    "s::bytea",
    r"'\x4142'::bytea",
    r"'a\\b'::bytea",
    r"'a\b'::bytea",
    "flag::text",
    "flag::int",
    "n::boolean",
    "'yes'::boolean",
    "' of '::boolean",
    "'o'::boolean",
    "CAST(s AS varchar(7))",
    "s::char(3)",
    "'ab'::char(4) || '|'",
    "code || '|'",
    "code = 'ab'",
    "code::text",
    "length(code)",
    "CAST(n AS text) || 'x'",
    "ts::text",
    // Concatenation.
    "'a' || 1",
    "'x' || flag",
    "s || NULL",
    "s || plain",
    "n || 'x'",
    "n || n",
    r"bin || '\x00'",
    "bin || s",
    "id || '-suffix'",
    "j || s",
    "num || ''",
    "ts || ''",
    "'a' || j->'s'",
    "s || '-' || n",
    // Functions.
    "split_part(s, '-', 1)",
    "split_part(s, '-', 2)",
    "split_part(s, '-', -1)",
    "split_part(s, '-', -3)",
    "split_part(s, '-', -4)",
    "split_part(s, '-', 5)",
    "split_part(s, '', 1)",
    "split_part(s, '', -2)",
    "split_part(s, '-', 0)",
    "split_part(s, '-', big)",
    "split_part(s, '-', sm)",
    "split_part(s, '-', '2')",
    "split_part(NULL, '-', 1)",
    "substring(s from 9)",
    "substring(s from 0 for 3)",
    "substring(s from -2 for 4)",
    "substring(s from -5 for 3)",
    "substring(s, 3)",
    "substring(s, 9, 100)",
    "substring(s for 4)",
    "substring(s, 1, -1)",
    "substr(vc, 2, 3)",
    "substring(bin from 2 for 3)",
    "substring(s, 2147483647, 10)",
    "substring(NULL from 1)",
    "position('-' in s)",
    "position('' in s)",
    "position('ü' in vc)",
    "strpos(s, '123')",
    "strpos(plain, '-')",
    "lower(vc)",
    "upper(vc)",
    "LOWER(s)",
    "upper('straße')",
    "upper(NULL)",
    "lower(n)",
    "trim('  x  ')",
    "trim(both 'x' from 'xxaxx')",
    "trim(leading 'ab' from 'abbaXab')",
    "trim(trailing from '  x  ')",
    "trim(from '  x  ')",
    "trim(s, 'ax')",
    "btrim(s, 'ax')",
    "ltrim(s, 'ac')",
    "rtrim(s, 'x-')",
    "replace(s, '-', '/')",
    "replace(s, '', 'z')",
    "replace(s, '123', '')",
    "convert_from(bin, 'UTF8')",
    "convert_from(bin, 'utf-8')",
    "convert_from(bin, 'LATIN1')",
    "convert_from(s, 'UTF8')",
    "convert_from(bin, 'nope')",
    r"convert_from('\xc3a9'::bytea, 'UTF8')",
    r"convert_from('\xc3'::bytea, 'UTF8')",
    "convert_from(decode(b64, 'base64'), 'UTF8')",
    "convert_from(decode(b64, 'base64'), 'UTF8')::jsonb->>'a'",
    "decode('QQ==', 'base64')",
    "decode('QUI=', 'base64')",
    "decode('QUJD', 'base64')",
    "decode(' Q U J D ', 'base64')",
    "decode('QQ', 'base64')",
    "decode('QQ=', 'base64')",
    "decode('Q===', 'base64')",
    "decode('QQ==QUJD', 'base64')",
    "decode('QQ-=', 'base64')",
    "decode('4142', 'hex')",
    "decode('41 42', 'HEX')",
    "decode('414', 'hex')",
    r"decode('a\000b\\', 'escape')",
    "decode(s, 'base32')",
    "encode(bin, 'base64')",
    "encode(bin, 'hex')",
    "encode(bin, 'escape')",
    r"encode('\x00ff5c41'::bytea, 'escape')",
    "length(s)",
    "length(bin)",
    "concat('a', NULL, n, flag, code)",
    "concat_ws('-', s, NULL, n)",
    // Message DB.
    "message_store.category(s)",
    "message_store.id(s)",
    "message_store.id(plain)",
    "message_store.category(plain)",
    "MESSAGE_STORE.CATEGORY(s)",
    "message_store.id(vc)",
    "message_store.category(n)",
    // Comparisons and logic.
    "n = 7",
    "n = '7'",
    "n = 'x'",
    "n < big",
    "sm <= n",
    "num > 12",
    "num = 12.5",
    "n = 7.0",
    "s = 'account-123-x'",
    "s < plain",
    "s > 'B'",
    "'B' < 'a'",
    "vc < 'Ä'",
    "s <> plain",
    "s != plain",
    "s = n",
    "id = 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'",
    "id = 'nope'",
    "id < '00000000-0000-0000-0000-000000000001'",
    "flag = true",
    "flag < true",
    r"bin = '\x7b2261223a317d'",
    "s IS NULL",
    "s IS NOT NULL",
    "s ISNULL",
    "s NOTNULL",
    "s IS NULL = false",
    "1 = 1 IS NULL",
    "NULL = NULL",
    "NOT flag",
    "NOT s IS NULL",
    "flag AND n > 5",
    "flag OR NULL",
    "NULL AND false",
    "n > 5 AND NULL",
    "n AND true",
    "false AND n",
    "NOT n",
    "flag IS TRUE",
    "flag IS NOT FALSE",
    "flag IS UNKNOWN",
    "n IN (1, 7)",
    "n IN (1, NULL)",
    "n NOT IN (1, 2)",
    "n NOT IN (1, NULL)",
    "s IN ('a', 'account-123-x')",
    "id IN ('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', u::uuid)",
    "s IN (1, 2)",
    "s LIKE 'acc%'",
    "s LIKE 'acc_unt%x'",
    "s LIKE '%-%-%'",
    "s NOT LIKE '%y'",
    r"'a%b' LIKE 'a\%b'",
    r"'axb' LIKE 'a\%b'",
    "'a%b' LIKE 'a!%b' ESCAPE '!'",
    r"'ab' LIKE 'a\'",
    r"'a' LIKE 'a\'",
    "vc LIKE '__ü%'",
    "vc ILIKE 'hello%'",
    "n LIKE '7'",
    "'x' LIKE NULL",
    // Conditionals.
    "CASE WHEN n > 5 THEN 'big' ELSE 'small' END",
    "CASE n WHEN 1 THEN 'one' WHEN 7 THEN 'seven' END",
    "CASE WHEN n > 50 THEN 'big' END",
    "CASE WHEN s IS NULL THEN 'none' ELSE s END",
    "CASE WHEN n > 1 THEN n ELSE big END",
    "CASE WHEN n > 1 THEN n ELSE s END",
    "CASE WHEN false THEN decode('@', 'base64') END",
    "CASE WHEN n > 100 THEN 'x'::uuid ELSE id END",
    "CASE WHEN n IS NULL THEN decode('@', 'base64') ELSE '' END",
    "coalesce(s, 'd')",
    "coalesce(NULL, NULL)",
    "coalesce(n, big)",
    "coalesce(n, s)",
    "coalesce(id, u::uuid)",
    "coalesce(j->>'zz', j->>'s', 'none')",
    "nullif(s, 'account-123-x')",
    "nullif(n, 1)",
    "nullif('a', 'a')",
    // Precedence and unary minus.
    "'a' || 'b' = 'ab'",
    "'a' || 'b' LIKE 'a%'",
    "NOT 'a' = 'b'",
    "-n",
    "-sm",
    "- -n",
    "-'5'",
    "-s",
    "-2147483648::int",
    "(s)",
    "((n))",
    "j->'a'->>0 || 'x'",
    "j->>'s' || j->>'n'",
    "\"Body\"::jsonb->'message'->>'n'::int",
    "j->>'a'->0",
    "s::text::varchar",
    "cast(cast(n as text) as int)",
    "j->'a'->>1",
    // A malformed constant fails whatever the row holds.
    "coalesce(n, 'abc')",
    "CASE WHEN flag THEN n ELSE 'abc' END",
    "split_part(s, '-', 'x')",
    r"bin LIKE '\xZZ'",
    "j || 'nope'",
    "nullif(n, 'x')",
    "n IN (7, 'x')",
    // More syntax and forms.
    "s /* a comment */ || -- to the end of the line\n 'x'",
    "CAST(n AS character varying)",
    "'abc'::char",
    "'abc'::pg_catalog.text",
    "code = 'ab  '",
    "code < 'abc'",
    "vc ILIKE '%Ö%'",
    "\"Body\"::jsonb->'message'->'arr'->-1->'k'",
    "j->'o'->'p'",
    "'{\"é\": 1, \"b\": 2, \"aa\": 3}'::jsonb",
    "'{\"x\": 1e-7, \"y\": 12345678901234567890, \"z\": -1.0E+2}'::jsonb",
    "'[[[[[[1]]]]]]'::jsonb#>'{0,0,0}'",
    "'{\"a\":{\"b\":{\"c\":[\"d\"]}}}'::jsonb#>>'{a,b,c,0}'",
    "j->>'a' = '[1, {\"b\": null}]'",
    "decode('eyJhIjoxfQ==', 'base64')::text",
    "convert_from(decode(' eyJh\nIjox fQ== ', 'base64'), 'UTF8')::jsonb",
    "encode(convert_from(bin, 'UTF8')::bytea, 'base64')",
    "message_store.category('')",
    "message_store.id('-')",
    "message_store.id('a-b-c')",
    "coalesce(message_store.id(plain), plain)",
    "CASE message_store.category(s) WHEN 'account' THEN 'acct' ELSE 'other' END",
];

/// Message DB's functions, written from message-db/message-db
/// database/functions/category.sql and id.sql.
const MESSAGE_DB: &str = r"
create schema message_store;
create function message_store.category(stream_name varchar) returns varchar as $$
begin
  return split_part(category.stream_name, '-', 1);
end;
$$ language plpgsql immutable;
create function message_store.id(stream_name varchar) returns varchar as $$
declare
  _id_separator_position integer;
begin
  _id_separator_position := strpos(id.stream_name, '-');
  if _id_separator_position = 0 then
    return null;
  end if;
  return substring(id.stream_name, _id_separator_position + 1);
end;
$$ language plpgsql immutable;
";

/// A database in a UTF-8 locale (so `lower`/`upper` map non-ASCII letters, as in a
/// production database) with the test table and Message DB's functions.
async fn database(prefix: &str) -> Client {
    let cluster = Cluster::shared();
    let name = format!("{prefix}_{}", std::process::id());
    cluster
        .psql(
            "postgres",
            &format!("create database {name} template template0 encoding 'UTF8' locale 'C.UTF-8'"),
        )
        .expect("create a C.UTF-8 database");
    let (client, conn) = tokio_postgres::connect(&cluster.url(&name), NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
        .batch_execute("set timezone = 'UTC'")
        .await
        .expect("timezone");
    client
}

struct TestRow {
    cols: Vec<(String, u32, Option<String>)>,
}

impl Row for TestRow {
    fn column(&self, name: &str) -> Option<Input<'_>> {
        self.cols.iter().find(|c| c.0 == name).map(|c| Input {
            type_oid: c.1,
            text: c.2.as_deref().map(str::as_bytes),
        })
    }
}

/// The rows as logical decoding would send them: output-function text and type OIDs.
async fn read_rows(client: &Client, table: &str) -> Vec<TestRow> {
    let types = client
        .query(
            "select attname::text, atttypid::int8 from pg_attribute \
             where attrelid = $1::text::regclass and attnum > 0 and not attisdropped order by attnum",
            &[&table],
        )
        .await
        .expect("column types");
    let types: Vec<(String, u32)> = types
        .iter()
        .map(|r| (r.get(0), r.get::<_, i64>(1) as u32))
        .collect();
    let msgs = client
        .simple_query(&format!("select * from {table} order by rid"))
        .await
        .expect("rows");
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(TestRow {
                cols: types
                    .iter()
                    .enumerate()
                    .map(|(i, (name, oid))| (name.clone(), *oid, r.get(i).map(str::to_owned)))
                    .collect(),
            }),
            _ => None,
        })
        .collect()
}

/// The server's answer: its text, NULL, or its error.
async fn server(client: &Client, sql: &str) -> Result<Option<String>, String> {
    match client.simple_query(sql).await {
        Ok(msgs) => Ok(msgs
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_owned)),
                _ => None,
            })
            .expect("one row")),
        Err(e) => Err(e
            .as_db_error()
            .map_or_else(|| e.to_string(), |d| d.message().to_owned())),
    }
}

/// walfold-expr's answer in the output function's form.
fn ours(src: &str, row: &dyn Row) -> Result<Option<String>, String> {
    let expr = walfold_expr::parse(src)?;
    Ok(match expr.eval(row)? {
        Value::Bool(b) => Some(if b { "t" } else { "f" }.to_owned()),
        v => v.to_text(),
    })
}

fn agree(a: &Result<Option<String>, String>, b: &Result<Option<String>, String>) -> bool {
    match (a, b) {
        (Ok(x), Ok(y)) => x == y,
        (Err(_), Err(_)) => true,
        _ => false,
    }
}

#[tokio::test]
async fn expressions_agree_with_postgres() {
    let client = database("expr_diff").await;
    let mut ddl = String::from("create table t (rid int");
    for (name, ty, _) in COLUMNS {
        write!(ddl, ", {name} {ty}").unwrap();
    }
    ddl.push_str(");");
    for rid in 0..3 {
        let values: Vec<&str> = COLUMNS.iter().map(|c| c.2[rid]).collect();
        write!(ddl, "insert into t values ({rid}, {});", values.join(", ")).unwrap();
    }
    client.batch_execute(&ddl).await.expect("table");
    client
        .batch_execute(MESSAGE_DB)
        .await
        .expect("message db functions");
    let rows = read_rows(&client, "t").await;
    assert_eq!(rows.len(), 3);

    let long_base64 = format!("encode('\\x{}'::bytea, 'base64')", "61".repeat(60));
    let exact_line = format!("encode('\\x{}'::bytea, 'base64')", "62".repeat(57));
    let mut cases: Vec<&str> = CASES.to_vec();
    cases.push(&long_base64);
    cases.push(&exact_line);

    let mut mismatches = Vec::new();
    let mut compared = 0;
    for case in &cases {
        for (rid, row) in rows.iter().enumerate() {
            let theirs = server(
                &client,
                &format!("select ({case}) from t where rid = {rid}"),
            )
            .await;
            let mine = ours(case, row);
            compared += 1;
            if !agree(&theirs, &mine) {
                mismatches.push(format!(
                    "  {case}  [row {rid}]\n    postgres:    {theirs:?}\n    walfold-expr: {mine:?}"
                ));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {compared} comparisons ({} expressions x 3 rows) differ:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.join("\n")
    );
}

/// Random strings through `split_part`, `substring` and `position`, checked against
/// the server in one query.
#[tokio::test]
async fn string_functions_agree_on_random_input() {
    let client = database("expr_prop").await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    let alphabet = ['a', 'b', '-', 'é', ' ', '_', 'ü'];
    let word = |rng: &mut rand::rngs::StdRng, max: usize| -> String {
        let len = rng.random_range(0..=max);
        (0..len)
            .map(|_| alphabet[rng.random_range(0..alphabet.len())])
            .collect()
    };
    let mut values = Vec::new();
    let mut inputs = Vec::new();
    for i in 0..300 {
        let s = word(&mut rng, 10);
        let d = word(&mut rng, 2);
        let mut n: i32 = rng.random_range(-5..=5);
        if n == 0 {
            n = 1;
        }
        let st: i32 = rng.random_range(-4..=12);
        let c: i32 = rng.random_range(0..=8);
        let x = word(&mut rng, 2);
        let q = |v: &str| format!("'{}'", v.replace('\'', "''"));
        values.push(format!(
            "({i}, {}, {}, {n}, {st}, {c}, {})",
            q(&s),
            q(&d),
            q(&x)
        ));
        inputs.push((s, d, n, st, c, x));
    }
    let exprs = [
        "split_part(s, d, n)",
        "substring(s, st, c)",
        "substring(s from st)",
        "position(x in s)",
        "strpos(s, d)",
        "replace(s, x, d)",
        "btrim(s, d)",
    ];
    let sql = format!(
        "select {} from (values {}) as v(i, s, d, n, st, c, x) order by i",
        exprs
            .iter()
            .map(|e| format!("({e})::text"))
            .collect::<Vec<_>>()
            .join(", "),
        values.join(", ")
    );
    let msgs = client.simple_query(&sql).await.expect("batch query");
    let rows: Vec<_> = msgs
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(rows.len(), inputs.len());
    let parsed: Vec<_> = exprs
        .iter()
        .map(|e| walfold_expr::parse(e).expect(e))
        .collect();
    let mut mismatches = Vec::new();
    for ((s, d, n, st, c, x), pg) in inputs.iter().zip(rows) {
        let text = |v: &str| Some(v.to_owned());
        let int = |v: i32| Some(v.to_string());
        let row = TestRow {
            cols: vec![
                ("s".into(), 25, text(s)),
                ("d".into(), 25, text(d)),
                ("n".into(), 23, int(*n)),
                ("st".into(), 23, int(*st)),
                ("c".into(), 23, int(*c)),
                ("x".into(), 25, text(x)),
            ],
        };
        for (k, e) in parsed.iter().enumerate() {
            let mine = e.eval(&row).map(|v| v.to_text());
            let theirs = pg.get(k).map(str::to_owned);
            if mine.as_ref() != Ok(&theirs) {
                mismatches.push(format!(
                    "  {} with s={s:?} d={d:?} n={n} st={st} c={c} x={x:?}: postgres {theirs:?}, walfold-expr {mine:?}",
                    exprs[k]
                ));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} differ:\n{}",
        mismatches.len(),
        inputs.len() * exprs.len(),
        mismatches.join("\n")
    );
}

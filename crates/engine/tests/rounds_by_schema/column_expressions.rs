//! The column expressions: literals, casts that fail for some events, functions and
//! subqueries that read the table, volatile functions.

use serde_json::{json, Value};

use crate::twin::{ev, evs, twin};

/// Untyped literals into enum, int and timestamptz columns, NULLs, coalesce, jsonb
/// operators, missing payload paths, now(): the rounds are the loop's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn literals_nulls_and_operators() {
    let mut t = twin(
        "strexpr",
        "do $$ begin
           if not exists (select 1 from pg_type where typname = 'mood') then
             create type mood as enum ('happy', 'sad');
           end if; end $$;
         create table {t} (order_id text primary key, version bigint not null,
           m mood, n int, at timestamptz, c text, j text, miss text, same_txn boolean,
           num numeric, flag boolean, occ timestamptz, h text)",
        "order_id",
        &[
            ("m", "'happy'"),
            ("n", "'42'"),
            ("at", "'2024-01-01 00:00:00+00'"),
            ("c", "coalesce(:payload.missing, 'none')"),
            ("j", "(:payload)->>'status'"),
            ("miss", ":payload.a.b.c"),
            ("same_txn", "now() = transaction_timestamp()"),
            ("num", ":payload.n::numeric * 1.5"),
            ("flag", "null"),
            ("occ", ":occurred_at"),
            ("h", ":headers.x"),
        ],
    )
    .await;
    eprintln!("rounds: {}", t.fast.applies_in_rounds());
    t.same(&[
        evs(1, &[("o-1", 1, "a"), ("o-2", 1, "b"), ("o-1", 2, "c")]),
        evs(4, &[("o-1", 2, "d"), ("o-2", 0, "e"), ("o-3", 9, "f")]),
    ])
    .await;
}

/// An enum column from the payload (text → enum needs an explicit cast) and a failing cast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_casts_that_fail_for_some_events() {
    let mut t = twin(
        "strcast",
        "create table {t} (order_id text primary key, version bigint not null, n int, status text)",
        "order_id",
        &[("n", ":payload.num::int"), ("status", ":payload.status")],
    )
    .await;
    let e = |seq, id: &str, v, num: Value| ev(seq, id, v, json!({"num": num, "status": "s"}));
    t.same(&[
        vec![e(1, "o-1", 1, json!(1)), e(2, "o-2", 1, json!("2"))],
        // a stale event whose cast fails: the loop evaluates it too
        vec![e(3, "o-1", 0, json!("x")), e(4, "o-3", 1, json!(3))],
        vec![e(5, "o-1", 5, Value::Null), e(6, "o-1", 6, json!(6))],
    ])
    .await;
}

/// Which error a failing batch reports (a difference kept by design): the loop stops at
/// the first failing event in log order; rounds run round 0 (every key's first event) before round 1. Here event 2
/// (o-1's second) has a bad int, event 3 (o-2's first) breaks a check: the loop fails
/// with 22P02, rounds with 23514. (Both fail the whole batch.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn which_error_a_failing_batch_reports() {
    let mut t = twin(
        "strerr",
        "create table {t} (order_id text primary key, version bigint not null, n int,
           status text check (status <> 'bad'))",
        "order_id",
        &[("n", ":payload.num::int"), ("status", ":payload.status")],
    )
    .await;
    let e = |seq, id: &str, v, num: &str, s: &str| ev(seq, id, v, json!({"num": num, "status": s}));
    // Both fail as data, which is all a failing batch decides: the projector then applies
    // its events one by one, and each reports its own error. Which event a round meets
    // first differs from the loop, so the batch's code may too (23514 against 22P02).
    let (f, s) = t
        .both(&[
            e(1, "o-1", 1, "1", "ok"),
            e(2, "o-1", 2, "x", "ok"),
            e(3, "o-2", 1, "3", "bad"),
        ])
        .await;
    for outcome in [&f, &s] {
        assert!(
            matches!(outcome, Err(m) if m.starts_with("Data ")),
            "{outcome:?}"
        );
    }
    t.same(&[
        vec![e(4, "o-1", 1, "1", "ok")],
        vec![e(5, "o-1", 2, "x", "ok")],
    ])
    .await;
}

/// Was a bug on 0e9042d: a STABLE function that reads the table (not volatile, not a `select` in the
/// expression): each event of the loop sees the rows of the events before it; a round
/// sees only the rows before the round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stable_function_reading_the_table() {
    let mut t = twin(
        "strstable",
        "create or replace function rows_of(t regclass) returns text stable language plpgsql as $$
           declare n bigint; begin execute format('select count(*) from %s', t) into n; return n::text; end $$;
         create table {t} (order_id text primary key, version bigint not null, status text, seen text)",
        "order_id",
        &[("status", ":payload.status"), ("seen", "rows_of('{t}')")],
    )
    .await;
    eprintln!("rounds: {}", t.fast.applies_in_rounds());
    t.same(&[evs(1, &[("o-1", 1, "a"), ("o-2", 1, "b"), ("o-3", 1, "c")])])
        .await;
}

/// Was a bug on 0e9042d: a subquery without the word `select` (`exists (table …)`): the same as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_subquery_without_select() {
    let mut t = twin(
        "strtablesub",
        "create table {t} (order_id text primary key, version bigint not null, status text, first boolean)",
        "order_id",
        &[("status", ":payload.status"), ("first", "not exists (table {t})")],
    )
    .await;
    eprintln!("rounds: {}", t.fast.applies_in_rounds());
    t.same(&[evs(1, &[("o-1", 1, "a"), ("o-2", 1, "b")])]).await;
}

/// Was a bug on 0e9042d: a volatile function the expression scanner misses because a dollar-quoted string
/// holds a single quote: `nextval` is taken for a quoted word, rounds are chosen, and the
/// sequence is drawn in round order instead of log order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volatile_function_hidden_by_dollar_quotes() {
    let mut t = twin(
        "strdollar",
        "create sequence {t}_ctr;
         create table {t} (order_id text primary key, version bigint not null, note text)",
        "order_id",
        &[("note", "$$'$$ || nextval('{t}_ctr')::text || $$'$$")],
    )
    .await;
    eprintln!("rounds: {}", t.fast.applies_in_rounds());
    t.same(&[evs(1, &[("a", 1, ""), ("a", 2, ""), ("b", 1, "")])])
        .await;
}

/// A visible volatile function keeps the loop (the catalog check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visible_nextval_keeps_the_loop() {
    let t = twin(
        "strnextval",
        "create sequence {t}_ctr;
         create table {t} (order_id text primary key, version bigint not null, note text)",
        "order_id",
        &[("note", "nextval ('{t}_ctr')::text")],
    )
    .await;
    assert!(!t.fast.applies_in_rounds());
}

//! The pipeline in-process against a real PostgreSQL: flow, subscribers, duplicates,
//! conflicts, reordering, malformed rows, parking, and data that looks like SQL.

use walfold_tests::{caught_up, insert_event, status, subscribers_caught_up, InProcess, TestDb};

const A: &str = "00000000-0000-4000-8000-00000000000a";
const B: &str = "00000000-0000-4000-8000-00000000000b";
const C: &str = "00000000-0000-4000-8000-00000000000c";
const D: &str = "00000000-0000-4000-8000-00000000000d";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_flow_and_subscribers_progress_independently() {
    let db = TestDb::new("flow");
    // A fourth subscriber whose read model is missing: an error of the environment, not
    // of any event. It pauses (nothing is dead-lettered), the other three are not held
    // back, and it resumes by itself once the table exists. Its statement returns rows:
    // the function is compiled only once the server can say so, never from a guess.
    let config = db.config(
        r#"
[[projection]]
name = "broken"
subscriber = "broken.v1"
max_attempts = 2
retry_backoff_ms = 10
sql = "insert into no_such_table values (:aggregate_id) returning aggregate_id"
"#,
    );
    let (p, client) = InProcess::streaming(&db, &config).await;
    let mut sql = String::new();
    for i in 0..200 {
        let id = format!("00000000-0000-4000-8000-{:012}", i + 1);
        let order = format!("o-{}", i % 20);
        sql.push_str(&insert_event(
            &id,
            &order,
            "OrderPaid",
            i / 20 + 1,
            &format!(r#"{{"status": "s{i}", "amount": "{}.25"}}"#, i),
        ));
    }
    db.psql(&format!("begin; {sql} commit;"));
    subscribers_caught_up(
        &client,
        200,
        &["orders.state.v1", "orders.total.v1", "orders.ledger.v1"],
    )
    .await;

    assert_eq!(db.psql("select count(*) from order_state"), "20");
    assert_eq!(db.psql("select count(*) from ledger"), "200");
    // sum of i + 0.25 for i in 0..200
    assert_eq!(db.psql("select sum(total) from order_total"), "19950.00");
    assert_eq!(db.psql("select sum(amount) from ledger"), "19950.00");
    // Highest version per order wins: orders 0..19 have versions 1..10, last status s180+k.
    assert_eq!(
        db.psql("select status || ':' || version from order_state where order_id = 'o-7'"),
        "s187:10"
    );

    let s = status(&client).await.unwrap();
    let sub = |s: &walfold_store::operator::Status, name: &str| {
        s.subscribers
            .iter()
            .find(|x| x.subscriber == name)
            .unwrap()
            .clone()
    };
    assert_eq!(sub(&s, "orders.state.v1").applied, 200);
    assert_eq!(sub(&s, "orders.ledger.v1").applied, 200);
    assert_eq!(sub(&s, "orders.total.v1").partitions, 2);
    assert_eq!(s.paused, 1, "{s:?}");
    let broken = sub(&s, "broken.v1");
    assert_eq!(broken.applied, 0);
    assert_eq!(broken.dead_lettered, 0);
    assert_eq!(broken.parked_aggregates, 0);
    let pause = broken.paused.expect("the broken projection is paused");
    assert_eq!(pause.sqlstate.as_deref(), Some("42P01"));
    assert!(pause.error.contains("no_such_table"), "{}", pause.error);
    assert_eq!(
        db.psql("select count(*) from walfold.dead_letter where subscriber_id = 'broken.v1'"),
        "0"
    );

    db.psql("create table no_such_table (aggregate_id text)");
    caught_up(&client, 200, 4).await;
    assert_eq!(db.psql("select count(*) from no_such_table"), "200");
    let s = status(&client).await.unwrap();
    assert_eq!(s.paused, 0);
    assert!(sub(&s, "broken.v1").paused.is_none());
    assert_eq!(sub(&s, "broken.v1").applied, 200);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_event_id_changes_projections_once() {
    let db = TestDb::new("dupes");
    let (p, client) = InProcess::streaming(&db, &db.config("")).await;
    let paid = insert_event(
        A,
        "o-1",
        "OrderPaid",
        1,
        r#"{"status": "paid", "amount": "10"}"#,
    );
    // Insert, delete, insert again (an outbox cleaned up after publishing, then a retry).
    db.psql(&paid);
    db.psql(&format!("delete from outbox where id = '{A}'"));
    db.psql(&paid);
    // Twice in one transaction: the outbox has no unique ID, and the JSON differs only in
    // formatting.
    db.psql(&format!(
        "begin; {} {} commit;",
        insert_event(
            B,
            "o-2",
            "OrderPaid",
            1,
            r#"{"amount": "5", "status": "paid"}"#
        ),
        insert_event(
            B,
            "o-2",
            "OrderPaid",
            1,
            r#"{"status":"paid","amount":"5"}"#
        )
    ));
    db.psql("truncate outbox");
    caught_up(&client, 2, 3).await;
    assert_eq!(db.psql("select count(*) from walfold.event_log"), "2");
    assert_eq!(
        db.psql("select total from order_total where order_id = 'o-1'"),
        "10"
    );
    assert_eq!(
        db.psql("select total from order_total where order_id = 'o-2'"),
        "5"
    );
    assert_eq!(db.psql("select count(*) from ledger"), "2");
    let s = status(&client).await.unwrap();
    let ingest = s.ingest.unwrap();
    assert_eq!(ingest.duplicates, 2);
    assert_eq!(
        ingest.ignored_changes, 1,
        "the truncate is counted, not an event"
    );
    assert_eq!(s.dead_letters_open, 0);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_id_with_different_content_is_quarantined() {
    let db = TestDb::new("conflict");
    let (p, client) = InProcess::streaming(&db, &db.config("")).await;
    db.psql(&insert_event(
        A,
        "o-1",
        "OrderPaid",
        1,
        r#"{"status": "paid", "amount": "10"}"#,
    ));
    db.psql(&insert_event(
        A,
        "o-1",
        "OrderPaid",
        1,
        r#"{"status": "paid", "amount": "99"}"#,
    ));
    db.psql(&insert_event(
        B,
        "o-2",
        "OrderPaid",
        1,
        r#"{"status": "paid", "amount": "1"}"#,
    ));
    caught_up(&client, 2, 3).await;
    assert_eq!(
        db.psql("select total from order_total where order_id = 'o-1'"),
        "10"
    );
    let row = db.psql(&format!(
        "select reason || '|' || (raw->'payload'->>'amount') || '|' || (existing->'payload'->>'amount') \
         from walfold.dead_letter where event_id = '{A}'"
    ));
    assert_eq!(row, "id_conflict|99|10");
    assert_eq!(
        status(&client).await.unwrap().ingest.unwrap().id_conflicts,
        1
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_version_is_skipped_and_counted() {
    let db = TestDb::new("stale");
    let (p, client) = InProcess::streaming(&db, &db.config("")).await;
    db.psql(&insert_event(
        A,
        "o-1",
        "OrderShipped",
        3,
        r#"{"status": "shipped"}"#,
    ));
    db.psql(&insert_event(
        B,
        "o-1",
        "OrderPaid",
        2,
        r#"{"status": "paid"}"#,
    ));
    caught_up(&client, 2, 3).await;
    assert_eq!(
        db.psql("select status || ':' || version from order_state"),
        "shipped:3"
    );
    let s = status(&client).await.unwrap();
    let state = s
        .subscribers
        .iter()
        .find(|x| x.subscriber == "orders.state.v1")
        .unwrap();
    assert_eq!((state.applied, state.stale), (1, 1));
    p.stop().await;
}

/// One transaction, so one batch applied in log order with the guard: the newest
/// version wins, the first of equal versions stays, a stored newer row is kept, and
/// every event that did not change the row counts as stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_applies_its_events_in_order_behind_the_version_guard() {
    let db = TestDb::new("setbased");
    db.psql("insert into order_state (order_id, status, version) values ('o-3', 'kept', 9)");
    let (p, client) = InProcess::streaming(&db, &db.config("")).await;
    let rows = [
        ("o-1", 2, "b"),
        ("o-1", 1, "a"),
        ("o-1", 3, "c"),
        ("o-1", 3, "c-again"),
        ("o-2", 1, "x"),
        ("o-3", 4, "older"),
        ("o-1", 2, "b-late"),
    ];
    let sql: String = rows
        .iter()
        .enumerate()
        .map(|(i, (order, version, status))| {
            insert_event(
                &format!("00000000-0000-4000-8000-{:012}", i + 100),
                order,
                "OrderChanged",
                *version,
                &format!(r#"{{"status": "{status}"}}"#),
            )
        })
        .collect();
    db.psql(&format!("begin; {sql} commit;"));
    caught_up(&client, rows.len() as i64, 3).await;
    assert_eq!(
        db.psql("select string_agg(order_id || '=' || status || ':' || version, ' ' order by order_id) from order_state"),
        "o-1=c:3 o-2=x:1 o-3=kept:9"
    );
    let s = status(&client).await.unwrap();
    let state = s
        .subscribers
        .iter()
        .find(|x| x.subscriber == "orders.state.v1")
        .unwrap();
    // Changed the row: o-1 v2 then v3, o-2 v1.
    assert_eq!((state.applied, state.stale), (3, 4));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_rows_are_dead_lettered_and_later_rows_still_apply() {
    let db = TestDb::new("malformed");
    // A loosely typed outbox, where producers can write anything.
    db.psql(
        "create table loose_outbox (id text, aggregate_type text, aggregate_id text, \
         event_type text, version text, payload text)",
    );
    let config = db.config("").replace(
        "[pipeline]",
        "[[outbox]]\ntable = \"public.loose_outbox\"\n\n[pipeline]",
    );
    let (p, client) = InProcess::streaming(&db, &config).await;
    let bad = [
        (
            "null",
            "'o-1'",
            "'1'",
            r#"'{"amount": "1"}'"#,
            "column `id` is null",
        ),
        // (An ID that is no UUID is an event: its ID is derived, tests/e2e/mapping.rs.)
        (
            "'  '",
            "'o-1'",
            "'1'",
            r#"'{"amount": "1"}'"#,
            "column `id` is empty",
        ),
        (
            &format!("'{C}'"),
            "'o-1'",
            "'1.5'",
            r#"'{"amount": "1"}'"#,
            "is not an integer",
        ),
        (
            &format!("'{C}'"),
            "null",
            "'1'",
            r#"'{"amount": "1"}'"#,
            "`aggregate_id` is null",
        ),
        (&format!("'{C}'"), "'o-1'", "'1'", "'{oops'", "is not JSON"),
        (
            &format!("'{C}'"),
            "'o-1'",
            "'1'",
            "null",
            "`payload` is null",
        ),
    ];
    for (id, agg, version, payload, _) in &bad {
        db.psql(&format!(
            "insert into loose_outbox values ({id}, 'order', {agg}, 'OrderPaid', {version}, {payload})"
        ));
    }
    db.psql(&format!(
        "insert into loose_outbox values ('{D}', 'order', 'o-9', 'OrderPaid', '4', '{{\"status\": \"ok\", \"amount\": \"2\"}}')"
    ));
    caught_up(&client, 1, 3).await;
    assert_eq!(
        db.psql("select status || ':' || version from order_state where order_id = 'o-9'"),
        "ok:4"
    );
    let errors = db.psql("select string_agg(error, E'\\n' order by id) from walfold.dead_letter where reason = 'malformed'");
    for (_, _, _, _, expected) in &bad {
        assert!(
            errors.contains(expected),
            "missing {expected:?} in\n{errors}"
        );
    }
    assert_eq!(
        db.psql(
            "select raw->>'version' from walfold.dead_letter where error like '%not an integer%'"
        ),
        "1.5",
        "the raw row is kept"
    );
    assert_eq!(status(&client).await.unwrap().ingest.unwrap().malformed, 6);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_that_looks_like_sql_is_stored_as_data() {
    let db = TestDb::new("inject");
    let (p, client) = InProcess::streaming(&db, &db.config("")).await;
    let evil = r#"'); drop table order_state; --"#;
    let payload =
        serde_json::json!({"status": evil, "note": "x'; delete from ledger; --", "amount": "1"});
    client
        .execute(
            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
             values ($1, 'order', $2, 'OrderPaid', 1, $3)",
            &[
                &uuid::Uuid::parse_str(A).unwrap(),
                &"o'; drop table ledger; --",
                &payload,
            ],
        )
        .await
        .unwrap();
    caught_up(&client, 1, 3).await;
    let row = client
        .query_one("select order_id, status, note from order_state", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "o'; drop table ledger; --");
    assert_eq!(row.get::<_, String>(1), evil);
    assert_eq!(row.get::<_, String>(2), "x'; delete from ledger; --");
    assert_eq!(db.psql("select count(*) from ledger"), "1");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_event_parks_its_aggregate_and_other_aggregates_go_on() {
    let db = TestDb::new("park");
    db.psql("alter table order_state add constraint amount_not_negative check (amount >= 0)");
    let config = db.config("").replace(
        "version_column = \"version\"",
        "version_column = \"version\"\nmax_attempts = 3\nretry_backoff_ms = 10",
    );
    let (p, client) = InProcess::streaming(&db, &config).await;
    db.psql(&format!(
        "begin; {} {} {} commit;",
        insert_event(
            A,
            "o-1",
            "OrderPaid",
            1,
            r#"{"status": "bad", "amount": "-5"}"#
        ),
        insert_event(
            B,
            "o-2",
            "OrderPaid",
            1,
            r#"{"status": "fine", "amount": "3"}"#
        ),
        insert_event(
            C,
            "o-1",
            "OrderPaid",
            2,
            r#"{"status": "later", "amount": "10"}"#
        ),
    ));
    db.psql(&insert_event(
        D,
        "o-1",
        "OrderPaid",
        3,
        r#"{"status": "even later", "amount": "1"}"#,
    ));
    caught_up(&client, 4, 3).await;
    assert_eq!(
        db.psql("select string_agg(order_id || '=' || status, ',') from order_state"),
        "o-2=fine"
    );
    let letters = db.psql(
        "select string_agg(reason || ':' || aggregate_id || ':' || attempts, ',' order by id) \
         from walfold.dead_letter where subscriber_id = 'orders.state.v1'",
    );
    assert_eq!(
        letters,
        "projection_failed:o-1:3,aggregate_parked:o-1:0,aggregate_parked:o-1:0"
    );
    assert!(db
        .psql("select error from walfold.dead_letter where reason = 'projection_failed'")
        .contains("amount_not_negative"));
    // The projector's pages carry no payloads; the dead letters hold the whole event.
    assert_eq!(
        db.psql(
            "select string_agg(raw->'payload'->>'status', ',' order by id) \
             from walfold.dead_letter where subscriber_id = 'orders.state.v1'"
        ),
        "bad,later,even later"
    );
    assert_eq!(
        db.psql("select subscriber_id || ':' || aggregate_id from walfold.parked_aggregate"),
        "orders.state.v1:o-1"
    );
    // The other subscribers never saw a failure.
    assert_eq!(db.psql("select sum(total) from order_total"), "9");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_numbers_keep_every_digit() {
    let db = TestDb::new("precision");
    let (p, client) = InProcess::streaming(&db, &db.config("")).await;
    db.psql(&insert_event(
        A,
        "o-1",
        "OrderPaid",
        1,
        r#"{"status": "paid", "amount": 12345678901234567890.123456789012}"#,
    ));
    caught_up(&client, 1, 3).await;
    assert_eq!(
        db.psql("select amount from ledger"),
        "12345678901234567890.123456789012"
    );
    assert_eq!(
        db.psql("select payload->>'amount' from walfold.event_log"),
        "12345678901234567890.123456789012"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_that_return_rows_or_end_in_a_comment_apply() {
    let db = TestDb::new("shapes");
    db.psql("create table audit (event_id uuid primary key, kind text)");
    let config = db.config(
        r#"
[[projection]]
name = "audit"
subscriber = "audit.v1"
sql = """
insert into audit (event_id, kind) values (:event_id, :event_type)
on conflict do nothing
returning event_id -- the row count comes from the returned rows
"""

[[projection]]
name = "notify"
subscriber = "notify.v1"
sql = "select pg_notify('walfold_test', :event_type)"
"#,
    );
    let (p, client) = InProcess::streaming(&db, &config).await;
    db.psql(&format!(
        "begin; {} {} commit;",
        insert_event(A, "o-1", "OrderPaid", 1, r#"{"status": "paid"}"#),
        insert_event(B, "o-2", "OrderPaid", 1, r#"{"status": "paid"}"#),
    ));
    caught_up(&client, 2, 5).await;
    assert_eq!(db.psql("select count(*) from audit"), "2");
    let s = status(&client).await.unwrap();
    for name in ["audit.v1", "notify.v1"] {
        let sub = s.subscribers.iter().find(|x| x.subscriber == name).unwrap();
        assert_eq!((sub.applied, sub.dead_lettered), (2, 0), "{name}");
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_paths_resolve_to_text_or_null() {
    let db = TestDb::new("paths");
    db.psql(
        "create table paths (event_id uuid primary key, s text, n text, nested text, \
         obj text, nul text, missing text, first text, seq bigint)",
    );
    let config = db.config(
        r#"
[[projection]]
name = "paths"
subscriber = "paths.v1"
sql = """
insert into paths values (:event_id, :payload.a.s, :payload.a.n, :payload.a.arr.1.c,
  :payload.a.o, :payload.a.z, :payload.a.missing, :payload.a.arr.0, :sequence)
"""
"#,
    );
    let (p, client) = InProcess::streaming(&db, &config).await;
    db.psql(&insert_event(
        A,
        "o-1",
        "OrderPaid",
        1,
        r#"{"a": {"s": "it''s", "n": 12.50, "arr": [1, {"c": true}], "o": {"k": [1]}, "z": null}}"#,
    ));
    caught_up(&client, 1, 4).await;
    assert_eq!(
        db.psql(
            "select concat_ws('|', s, n, nested, obj, coalesce(nul, 'NULL'), \
             coalesce(missing, 'NULL'), first, seq) from paths"
        ),
        r#"it's|12.50|true|{"k":[1]}|NULL|NULL|1|1"#
    );
    p.stop().await;
}

/// A read looks at a bounded window of seqs: a projection taking 3 events out of 1000,
/// with pages of 10 (windows of 20 seqs), reads through 50 windows with nothing for it,
/// applies exactly its 3 events and ends at the head; a projection reading every
/// event in pages of 7 across two partitions gets them all once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_through_the_log_in_windows_and_miss_nothing() {
    let db = TestDb::new("windows");
    db.psql("create table rare (order_id text primary key); create table every (event_id uuid primary key)");
    let extra = r#"
[[projection]]
name = "rare"
subscriber = "orders.rare.v1"
event_types = ["Rare"]
batch_size = 10
sql = "insert into rare (order_id) values (:aggregate_id)"

[[projection]]
name = "every"
subscriber = "orders.every.v1"
parallelism = 2
batch_size = 7
sql = "insert into every (event_id) values (:event_id)"
"#;
    let (p, client) = InProcess::streaming(&db, &db.config(extra)).await;
    db.psql(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         select gen_random_uuid(), 'order', 'o-' || g, \
                case when g in (7, 500, 1000) then 'Rare' else 'OrderPaid' end, 1, \
                '{\"status\": \"paid\", \"amount\": \"1\"}' \
         from generate_series(1, 1000) g",
    );
    caught_up(&client, 1000, 5).await;
    assert_eq!(
        db.psql("select string_agg(order_id, ',' order by order_id) from rare"),
        "o-1000,o-500,o-7"
    );
    assert_eq!(db.psql("select count(*) from every"), "1000");
    assert_eq!(
        db.psql(
            "select string_agg(distinct (c.position = (select max(seq) from walfold.event_log))::text, ',') \
             from walfold.checkpoint c where subscriber_id in ('orders.rare.v1', 'orders.every.v1')"
        ),
        "true"
    );
    p.stop().await;
}

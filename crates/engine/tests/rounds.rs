//! A `table` projection applying a batch in rounds against a real PostgreSQL: the same
//! per-event outcomes and the same rows as the one-statement-per-event loop, and the loop
//! wherever the table could tell the two apart.

use std::collections::BTreeMap;

use serde_json::json;
use uuid::Uuid;
use walfold_config::{ProjectionConfig, ProjectionKind, QualifiedName, Statement};
use walfold_engine::{Applied, Event, Projection, SqlProjection};
use walfold_event::{ErrorKind, Lsn};
use walfold_tempdb::Cluster;

const TABLE: &str = "(order_id text primary key, status text, note text, version bigint not null)";

fn projection(table: &str, columns: &[(&str, &str)]) -> SqlProjection {
    let mut options = ProjectionConfig::new("state", "state.v1");
    let columns: BTreeMap<String, String> = columns
        .iter()
        .map(|(c, e)| ((*c).to_owned(), (*e).to_owned()))
        .collect();
    options.kind = ProjectionKind::Table {
        table: QualifiedName::parse(table).expect("a table name"),
        key: "order_id".to_owned(),
        version_column: "version".to_owned(),
        columns,
    };
    let statement = options.statement(0).expect("a table projection");
    assert!(matches!(statement, Statement::Table(_)));
    SqlProjection::new(&statement, &walfold_store::Schema::new("walfold")).expect("compiles")
}

fn event(seq: i64, order: &str, version: i64, status: &str, note: &str) -> Event {
    Event {
        seq,
        claim_seq: seq,
        id: Uuid::from_u128(seq as u128),
        aggregate_type: "order".into(),
        aggregate_id: order.into(),
        event_type: "OrderChanged".into(),
        version: Some(version),
        payload: json!({"status": status, "note": note}).into(),
        headers: None,
        occurred_at: None,
        source_lsn: Lsn::ZERO,
        committed_at: None,
        source: "default".into(),
    }
}

async fn database(prefix: &str) -> (String, tokio_postgres::Client) {
    let cluster = Cluster::shared();
    let db = cluster.create_database(prefix).expect("database");
    cluster
        .psql(&db, "create schema walfold")
        .expect("walfold schema");
    let client = walfold_pg::connect(&cluster.url(&db))
        .await
        .expect("connect");
    (db, client)
}

async fn apply(
    client: &mut tokio_postgres::Client,
    p: &SqlProjection,
    events: &[Event],
) -> Result<Vec<Applied>, walfold_engine::ProjectionError> {
    let refs: Vec<&Event> = events.iter().collect();
    let tx = client.transaction().await.expect("begin");
    let applied = p.apply_batch(&tx, &refs).await?;
    tx.commit().await.expect("commit");
    Ok(applied)
}

fn rows(db: &str, table: &str) -> String {
    Cluster::shared()
        .psql(
            db,
            &format!(
                "select string_agg(order_id || '=' || status || '/' || coalesce(note, '-') || ':' || version, ' ' \
                 order by order_id) from {table}"
            ),
        )
        .expect("rows")
        .trim()
        .to_owned()
}

/// 400 events over 23 keys with versions out of order, repeated and below stored rows:
/// many rounds, some keys past the set-based rounds, stale and changed mixed.
fn mixed_batch() -> Vec<Event> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (1..=400)
        .map(|seq| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = if seq % 5 == 0 {
                "hot".to_owned()
            } else {
                format!("o-{}", x % 22)
            };
            let version = ((x >> 8) % 12) as i64;
            event(
                seq,
                &key,
                version,
                &format!("s{seq}"),
                &format!("n{}", x % 3),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_give_the_loops_outcomes_and_rows() {
    let (db, mut client) = database("rounds").await;
    let cluster = Cluster::shared();
    cluster
        .psql(
            &db,
            &format!(
                "create table fast {TABLE}; create table slow {TABLE};
                 create function walfold_test_noop() returns trigger language plpgsql as
                   $$ begin return new; end $$;
                 create trigger keep_the_loop before insert or update on slow
                   for each row execute function walfold_test_noop();
                 insert into fast values ('o-3', 'kept', null, 9), ('hot', 'kept', null, 4);
                 insert into slow select * from fast;"
            ),
        )
        .expect("tables");
    let columns = [("status", ":payload.status"), ("note", ":payload.note")];
    let fast = projection("public.fast", &columns);
    let slow = projection("public.slow", &columns);
    fast.install(&mut client).await.expect("install");
    slow.install(&mut client).await.expect("install");
    assert!(fast.applies_in_rounds(), "a plain table applies in rounds");
    assert!(
        !slow.applies_in_rounds(),
        "a table with a trigger keeps the loop"
    );

    let batch = mixed_batch();
    for chunk in batch.chunks(150) {
        let by_rounds = apply(&mut client, &fast, chunk).await.expect("rounds");
        let by_loop = apply(&mut client, &slow, chunk).await.expect("loop");
        assert_eq!(by_rounds, by_loop);
    }
    assert_eq!(rows(&db, "fast"), rows(&db, "slow"));
    let count = cluster.psql(&db, "select count(*) from fast").unwrap();
    assert_eq!(count.trim(), "23");
    // A single event, and an event of a key the batch already holds 6 times.
    let one = [event(1000, "o-1", 99, "last", "z")];
    assert_eq!(
        apply(&mut client, &fast, &one).await.unwrap(),
        vec![Applied::Changed]
    );
    assert_eq!(
        apply(&mut client, &fast, &one).await.unwrap(),
        vec![Applied::Stale]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_event_fails_the_whole_batch_as_data() {
    let (db, mut client) = database("roundsfail").await;
    Cluster::shared()
        .psql(
            &db,
            &format!("create table t {TABLE}; alter table t add check (status <> 'bad');"),
        )
        .unwrap();
    let p = projection("public.t", &[("status", ":payload.status")]);
    p.install(&mut client).await.unwrap();
    assert!(p.applies_in_rounds());
    let batch = [
        event(1, "o-1", 1, "fine", ""),
        event(2, "o-2", 1, "fine", ""),
        event(3, "o-1", 2, "bad", ""),
    ];
    let e = apply(&mut client, &p, &batch).await.expect_err("fails");
    assert_eq!(e.kind(), ErrorKind::Data);
    assert_eq!(rows(&db, "t"), "", "nothing of the batch is kept");
}

/// What would let events of different keys see each other's order keeps the loop: a
/// deferrable unique note would let `o-2` take a note `o-1` gives up later in a round,
/// which one event at a time refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_could_tell_rounds_apart_keeps_the_loop() {
    let (db, mut client) = database("roundsnot").await;
    let cluster = Cluster::shared();
    let cases: [(&str, &str, &str); 7] = [
        ("trig", "", "create trigger x after insert on trig for each statement execute function walfold_test_noop()"),
        ("uniq", "", "create unique index on uniq (note)"),
        ("defer", "", "alter table defer add unique (note) deferrable initially immediate"),
        ("excl", "", "alter table excl add exclude using btree (note with =)"),
        ("selfref", "", "alter table selfref add foreign key (note) references selfref (order_id)"),
        ("vol", "random()::text", ""),
        ("sub", "(select max(status) from sub)", ""),
    ];
    cluster
        .psql(
            &db,
            "create function walfold_test_noop() returns trigger language plpgsql as \
             $$ begin return null; end $$;",
        )
        .unwrap();
    for (table, note, ddl) in cases {
        cluster
            .psql(&db, &format!("create table {table} {TABLE}; {ddl}"))
            .unwrap();
        let note = if note.is_empty() {
            ":payload.note"
        } else {
            note
        };
        let p = projection(
            &format!("public.{table}"),
            &[("status", ":payload.status"), ("note", note)],
        );
        p.install(&mut client).await.unwrap();
        assert!(!p.applies_in_rounds(), "{table} keeps the loop");
    }
    // One event at a time: o-2 cannot take note x while o-1 holds it.
    let p = projection(
        "public.defer",
        &[("status", ":payload.status"), ("note", ":payload.note")],
    );
    p.install(&mut client).await.unwrap();
    let batch = [
        event(1, "o-2", 1, "a", "q"),
        event(2, "o-1", 1, "b", "x"),
        event(3, "o-2", 2, "c", "x"),
        event(4, "o-1", 2, "d", "z"),
    ];
    let e = apply(&mut client, &p, &batch).await.expect_err("unique");
    assert_eq!(e.sqlstate(), Some("23505"));
    // A partitioned table with nothing in the way applies in rounds.
    cluster
        .psql(
            &db,
            "create table part (order_id text primary key, status text, note text, version bigint not null) \
             partition by hash (order_id); \
             create table part_0 partition of part for values with (modulus 2, remainder 0); \
             create table part_1 partition of part for values with (modulus 2, remainder 1);",
        )
        .unwrap();
    let p = projection("public.part", &[("status", ":payload.status")]);
    p.install(&mut client).await.unwrap();
    assert!(p.applies_in_rounds());
    cluster
        .psql(
            &db,
            "create trigger x before insert on part_1 for each row execute function walfold_test_noop()",
        )
        .unwrap();
    p.install(&mut client).await.unwrap();
    assert!(
        !p.applies_in_rounds(),
        "a partition's trigger keeps the loop"
    );
}

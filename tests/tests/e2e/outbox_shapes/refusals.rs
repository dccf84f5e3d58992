//! What walfold cannot follow is refused at start, or stops ingest, with the fix, instead
//! of dropping events: a table that is no outbox, a column renamed while running, a
//! slot lost before the first event.

use std::time::Duration;

use walfold_tests::{caught_up, eventually, insert_event, slot_active, Daemon, TestDb};

use super::ID;

/// Whether the slot's confirmed position is before `lsn`.
fn slot_before(db: &TestDb, lsn: &str) -> bool {
    db.psql(&format!(
        "select confirmed_flush_lsn < '{lsn}' from pg_replication_slots where slot_name = 'walfold'"
    )) == "t"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_a_table_that_is_no_outbox_stops_ingest_before_its_ack() {
    let db = TestDb::new("unmapped");
    db.psql("create table outbox2 (like outbox including defaults)");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    db.psql(&insert_event(
        ID[0],
        "o-1",
        "OrderPaid",
        1,
        r#"{"amount": "1"}"#,
    ));
    caught_up(&client, 1, 3).await;

    // An operator adds a table to the publication, not to the config. A truncate of it
    // carries no events: counted as ignored, and ingest goes on.
    db.psql("alter publication walfold_outbox add table outbox2");
    db.psql("truncate outbox2");
    db.psql(&insert_event(
        ID[1],
        "o-2",
        "OrderPaid",
        1,
        r#"{"amount": "2"}"#,
    ));
    caught_up(&client, 2, 3).await;
    assert_eq!(
        db.psql("select ignored_changes from walfold.ingest_position"),
        "1"
    );

    // The WAL position right after the commit (at or after the transaction's end).
    let after = db.psql(&format!(
        "begin; {} {} commit; select pg_current_wal_lsn();",
        insert_event(ID[2], "o-3", "OrderPaid", 1, r#"{"amount": "3"}"#),
        insert_event(ID[3], "o-4", "OrderPaid", 1, r#"{"amount": "4"}"#)
            .replace("into outbox ", "into outbox2 "),
    ));
    assert_eq!(d.wait_exit("the daemon to stop").await, Some(1));
    let log = d.log_text();
    for part in [
        "sent an insert of public.outbox2, which is no [[outbox]]",
        "publication walfold_outbox",
        "add public.outbox2 as an [[outbox]]",
        "truncate of a table that is no [[outbox]], ignored",
    ] {
        assert!(log.contains(part), "no `{part}` in:\n{log}");
    }
    assert!(
        slot_before(&db, &after),
        "the slot was acknowledged past the transaction"
    );
    assert_eq!(
        db.psql(&format!(
            "select lsn < '{after}' from walfold.ingest_position"
        )),
        "t"
    );

    // Fixed: the table is an outbox now, and the transaction's events arrive.
    let fixed = db.config("[[outbox]]\ntable = \"public.outbox2\"\n");
    let _d = Daemon::start(&fixed, &[]);
    caught_up(&client, 4, 3).await;
    assert_eq!(db.psql("select count(*) from ledger"), "4");
    assert_eq!(db.psql("select sum(amount) from ledger"), "10");
}

/// Starts `walfold run` on `config` and expects it to refuse at start, saying `parts`.
async fn refused(config: &str, parts: &[&str]) {
    let mut d = Daemon::start(config, &[]);
    assert_eq!(d.wait_exit("the daemon to refuse").await, Some(1));
    let log = d.log_text();
    for part in parts {
        assert!(log.contains(part), "no `{part}` in:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_walfold_cannot_follow_is_refused_at_start_with_the_fix() {
    let db = TestDb::new("refused");
    let config = db.config("");
    let with = |from: &str, to: &str| {
        assert!(config.contains(from));
        config.replacen(from, to, 1)
    };
    // A name outside the rule is a config error (exit 2) naming its key.
    for (from, to, key) in [
        (
            "[[outbox]]",
            "publication = \"pub-lish\"\n\n[[outbox]]",
            "source.publication",
        ),
        (
            "table = \"public.outbox\"",
            "table = \"public.out box\"",
            "outbox[0].table",
        ),
        (
            "[pipeline]",
            "[target]\nschema = \"Wal.fold\"\n\n[pipeline]",
            "target.schema",
        ),
    ] {
        let cfg = walfold_tests::write_config(&with(from, to));
        let (code, _, err) = walfold_tests::walfold(&["run", "-c", cfg.to_str().unwrap()], &[]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(key) && err.contains("1-63 ASCII letters"),
            "{err}"
        );
    }
    db.psql(
        "create table pouts (like outbox) partition by list (aggregate_type); \
         create table pouts_order partition of pouts for values in ('order');",
    );
    refused(
        &with(
            "table = \"public.outbox\"",
            "table = \"public.pouts_order\"",
        ),
        &[
            "outbox table public.pouts_order is a partition of public.pouts",
            "set outbox[0].table = \"public.pouts\"",
        ],
    )
    .await;
    refused(
        &with("table = \"public.outbox\"", "table = \"public.Outbox\""),
        &[
            "outbox table public.Outbox does not exist",
            "names are case-sensitive: set outbox[0].table = \"public.outbox\"",
        ],
    )
    .await;
    // A column the table lacks is a config error (exit 2) naming its key.
    let cfg = walfold_tests::write_config(&with(
        "table = \"public.outbox\"",
        "table = \"public.outbox\"\naggregate_id = \"Aggregate_ID\"",
    ));
    let (code, _, err) = walfold_tests::walfold(&["run", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{err}");
    for part in [
        "outbox table public.outbox has no column `Aggregate_ID` (outbox[0].aggregate_id)",
        "names are case-sensitive: set outbox[0].aggregate_id = \"aggregate_id\"",
    ] {
        assert!(err.contains(part), "no `{part}` in:\n{err}");
    }
    assert_eq!(
        db.psql("select count(*) from pg_publication"),
        "0",
        "nothing was created for a refused config"
    );

    let cases: &[(&str, &[&str])] = &[
        (
            "create publication walfold_outbox for all tables",
            &["publication walfold_outbox is FOR ALL TABLES", "create publication ... for table"],
        ),
        (
            "create publication walfold_outbox for tables in schema public",
            &["publication walfold_outbox is FOR TABLES IN SCHEMA public"],
        ),
        (
            "create publication walfold_outbox for table outbox, order_state",
            &[
                "publication walfold_outbox also publishes public.order_state, which is no [[outbox]]",
                "alter publication \"walfold_outbox\" drop table \"public\".\"order_state\"",
            ],
        ),
        (
            "create publication walfold_outbox for table outbox where (aggregate_type = 'order')",
            &["publishes public.outbox with a row filter or column list"],
        ),
        (
            "create publication walfold_outbox for table outbox with (publish = 'delete')",
            &[
                "does not publish inserts",
                "alter publication \"walfold_outbox\" set (publish = 'insert, truncate')",
            ],
        ),
    ];
    let cfg = walfold_tests::write_config(&config);
    for (publication, parts) in cases {
        db.psql(&format!(
            "drop publication if exists walfold_outbox; {publication}"
        ));
        refused(&config, parts).await;
        let (code, out, _) = walfold_tests::walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
        assert_eq!(code, 1, "{out}");
        assert!(
            out.lines()
                .any(|l| l.starts_with("FAIL") && l.contains(parts[0])),
            "{out}"
        );
    }
    // A publication without publish_via_partition_root is fine for plain tables (it
    // is PostgreSQL's default: existing deployments have such publications).
    db.psql("drop publication walfold_outbox; create publication walfold_outbox for table outbox");
    let (d, client) = Daemon::streaming(&db, &config).await;
    db.psql(&insert_event(
        ID[0],
        "o-1",
        "OrderPaid",
        1,
        r#"{"amount": "1"}"#,
    ));
    caught_up(&client, 1, 3).await;
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_lost_before_the_first_event_is_detected_like_any_lost_slot() {
    // Created by a backfill: its start is the ingest position.
    let db = TestDb::new("early_loss");
    db.psql(&insert_event(
        ID[0],
        "o-1",
        "OrderPaid",
        1,
        r#"{"amount": "1"}"#,
    ));
    let config = db.config("");
    let cfg = walfold_tests::write_config(&config);
    let (code, out, err) = walfold_tests::walfold(
        &[
            "backfill",
            "--outbox",
            "public.outbox",
            "-c",
            cfg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        db.psql(
            "select i.lsn = s.confirmed_flush_lsn and i.lsn > '0/0' from walfold.ingest_position i \
             join pg_replication_slots s on s.slot_name = i.slot"
        ),
        "t"
    );
    let start = db.psql("select lsn from walfold.ingest_position");
    db.psql("select pg_drop_replication_slot('walfold')");
    db.psql(&insert_event(
        ID[1],
        "o-2",
        "OrderPaid",
        1,
        r#"{"amount": "2"}"#,
    ));
    refused(
        &config,
        &["is missing, but walfold had ingested through it up to"],
    )
    .await;
    assert_eq!(
        db.psql("select count(*) from pg_replication_slots where slot_name = 'walfold'"),
        "0"
    );
    // Opted in: recreated, with the skipped range on record from the recorded start.
    let mut d = Daemon::start(&config, &[("WALFOLD_SOURCE__ON_SLOT_LOST", "recreate")]);
    let client = db.client().await;
    slot_active(&client).await;
    // A slot is active already while pg_create_logical_replication_slot builds it, before
    // walfold closes the gap with its start.
    let gap = format!(
        "select reason || ' ' || (from_lsn = '{start}') || ' ' || (to_lsn > from_lsn) from walfold.slot_gap"
    );
    eventually(Duration::from_secs(30), "the gap closed", || async {
        db.psql(&gap) == "missing true true"
    })
    .await;
    db.psql(&insert_event(
        ID[2],
        "o-3",
        "OrderPaid",
        1,
        r#"{"amount": "3"}"#,
    ));
    caught_up(&client, 2, 3).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));

    // Created by the daemon, stopped before any event: the same.
    let db = TestDb::new("early_loss_run");
    let config = db
        .config("")
        .replace("[source]", "[source]\nslot = \"early_run\"");
    let mut d = Daemon::start(&config, &[]);
    let active =
        "select count(*) from pg_replication_slots where slot_name = 'early_run' and active";
    eventually(Duration::from_secs(30), "the slot to be active", || async {
        db.psql(active) == "1"
    })
    .await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    assert_eq!(
        db.psql("select lsn > '0/0' from walfold.ingest_position where slot = 'early_run'"),
        "t"
    );
    db.psql("select pg_drop_replication_slot('early_run')");
    refused(
        &config,
        &["replication slot early_run is missing, but walfold had ingested"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_column_renamed_while_running_stops_ingest_instead_of_dead_lettering() {
    let db = TestDb::new("renamed");
    let config = db.config("");
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    db.psql(&insert_event(
        ID[0],
        "o-1",
        "OrderPaid",
        1,
        r#"{"amount": "1"}"#,
    ));
    caught_up(&client, 1, 3).await;
    db.psql("alter table outbox rename column event_type to kind");
    db.psql(
        &insert_event(ID[1], "o-2", "OrderPaid", 1, r#"{"amount": "2"}"#)
            .replace("event_type", "kind"),
    );
    let after = db.psql("select pg_current_wal_lsn()");
    eventually(
        Duration::from_secs(30),
        "ingest stops naming the column",
        || {
            let log = d.log_text();
            async move { log.contains("wrote rows without column `event_type` (outbox.event_type); its rows have the columns (id, aggregate_type, aggregate_id, kind,") }
        },
    )
    .await;
    assert!(
        d.exited().is_none(),
        "an environment error: the daemon stays and retries"
    );
    assert!(
        !d.log_text().contains('\u{1b}'),
        "a log file gets no terminal colours"
    );
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "0");
    assert!(
        slot_before(&db, &after),
        "its transaction is not acknowledged"
    );
    assert_eq!(db.psql("select count(*) from walfold.event_log"), "1");

    // The fix the message names: map the new column name and restart.
    d.kill();
    let fixed = config.replace(
        "table = \"public.outbox\"\n",
        "table = \"public.outbox\"\nevent_type = \"kind\"\n",
    );
    let mut d = Daemon::start(&fixed, &[]);
    caught_up(&client, 2, 3).await;
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "0");
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));

    // Renamed while walfold is stopped, with rows of both shapes in the slot: the old
    // name until ingest passes the old rows, then the new one.
    db.psql(
        &insert_event(ID[2], "o-3", "OrderPaid", 1, r#"{"amount": "3"}"#)
            .replace("event_type", "kind"),
    );
    db.psql("alter table outbox rename column kind to type");
    db.psql(
        &insert_event(ID[3], "o-4", "OrderPaid", 1, r#"{"amount": "4"}"#)
            .replace("event_type", "type"),
    );
    let new_name = config.replace(
        "table = \"public.outbox\"\n",
        "table = \"public.outbox\"\nevent_type = \"type\"\n",
    );
    let mut d = Daemon::start(&new_name, &[]);
    eventually(Duration::from_secs(30), "the old rows to stop it", || {
        let log = d.log_text();
        async move { log.contains("wrote rows without column `type`") }
    })
    .await;
    d.kill();
    let mut d = Daemon::start(&fixed, &[]);
    caught_up(&client, 3, 3).await;
    eventually(Duration::from_secs(30), "the new rows to stop it", || {
        let log = d.log_text();
        async move { log.contains("wrote rows without column `kind`") }
    })
    .await;
    d.kill();
    let mut d = Daemon::start(&new_name, &[]);
    caught_up(&client, 4, 3).await;
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "0");
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

/// An event store's table (Emmett's shape) whose version column is `stream_position`.
const STREAM_TABLE: &str =
    "create table events (message_id uuid primary key, stream_id text not null, \
     stream_position bigint not null, global_position bigserial, message_type text not null, \
     message_data jsonb not null, created timestamptz not null default now())";

/// Its `[[outbox]]`, with `version` as given; the aggregate type an expression over a
/// column it has.
fn stream_outbox(version: &str) -> String {
    format!(
        "[[outbox]]\ntable = \"public.events\"\nid = \"message_id\"\n\
         aggregate_type = \"split_part(stream_id, '-', 1)\"\naggregate_id = \"stream_id\"\n\
         event_type = \"message_type\"\npayload = \"message_data\"\noccurred_at = \"created\"\n\
         version = \"{version}\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_column_in_an_optional_field_is_refused_naming_the_key_and_the_columns() {
    let db = TestDb::new("misspelt");
    db.psql(STREAM_TABLE);
    let config = |version: &str| {
        walfold_config::builder::ConfigBuilder::new(&db.url())
            .text(&stream_outbox(version))
            .to_toml()
    };
    let cfg = walfold_tests::write_config(&config("stream_pos"));
    let cfg = cfg.to_str().unwrap();
    let wanted = [
        "outbox table public.events has no column `stream_pos` (outbox[0].version)",
        "its columns, closest first: stream_position, ",
        "(the closest: `stream_position`)",
    ];
    // At start: a config error, before anything is created.
    let (code, out, err) = walfold_tests::walfold(&["run", "-c", cfg], &[]);
    assert_eq!(code, 2, "{out}\n{err}");
    for part in wanted {
        assert!(err.contains(part), "no `{part}` in:\n{err}");
    }
    assert_eq!(
        db.psql("select count(*) from pg_replication_slots"),
        "0",
        "nothing was created for a refused config"
    );
    // In doctor: a FAIL saying the same.
    let (code, out, _) = walfold_tests::walfold(&["doctor", "-c", cfg], &[]);
    assert_ne!(code, 0, "{out}");
    for part in wanted {
        assert!(out.contains(part), "no `{part}` in:\n{out}");
    }
    // Spelt right, the same config (its expression included) passes that check and runs.
    let right = walfold_tests::write_config(&config("stream_position"));
    let right = right.to_str().unwrap();
    let (_, out, _) = walfold_tests::walfold(&["doctor", "-c", right], &[]);
    assert!(!out.contains("has no column"), "{out}");
    let mut d = walfold_tests::Daemon::start(&config("stream_position"), &[]);
    eventually(Duration::from_secs(60), "the slot to be active", || async {
        db.psql("select count(*) from pg_replication_slots where active") == "1"
    })
    .await;
    assert_eq!(
        d.terminate(Duration::from_secs(30)),
        Some(0),
        "{}",
        d.log_text()
    );
}

//! The operator's tools, through the real binary: `walfold init` on the outbox
//! conventions of Debezium, Prisma, Rails and the README; `walfold events` (filters,
//! `--follow`, `--subscriber` outcomes); progress lines of `backfill`, `rebuild --wait`
//! and `status --watch` when not on a terminal; completions and the man page.

use std::time::{Duration, Instant};

use walfold_tests::{
    caught_up, eventually, free_port, insert_event, lines_of, spawn_walfold, walfold, write_config,
    Daemon, TestDb,
};

/// One convention's outbox (and read model), what `init` must map, and a row to stream.
struct Convention {
    name: &'static str,
    ddl: &'static str,
    /// `--read-model` to pass, if any.
    read_model: Option<&'static str>,
    /// Lines the generated file must contain.
    expect: &'static [&'static str],
    insert: &'static str,
    /// A query on the read model after the row streamed, and its answer.
    check: Option<(&'static str, &'static str)>,
}

const CONVENTIONS: &[Convention] = &[
    Convention {
        name: "readme",
        ddl: "create table outbox (id uuid not null, aggregate_type text not null, aggregate_id text not null,
                event_type text not null, version bigint, payload jsonb not null, headers jsonb,
                occurred_at timestamptz not null default now());
              create table order_totals (order_id text primary key, total numeric, currency text, version bigint not null)",
        read_model: Some("public.order_totals"),
        expect: &[
            "table = \"public.outbox\"",
            "version = \"version\"",
            "headers = \"headers\"",
            "occurred_at = \"occurred_at\"",
            "table = \"public.order_totals\"",
            "key = \"order_id\"",
            "version_column = \"version\"",
            "total = \":payload.total::numeric\"",
        ],
        insert: r#"insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload)
                   values ('00000000-0000-4000-8000-000000000001', 'order', 'o-1', 'OrderPlaced', 1, '{"total": "30.00", "currency": "EUR"}')"#,
        check: Some((
            "select order_id || ' ' || total || ' ' || currency || ' ' || version from order_totals",
            "o-1 30.00 EUR 1",
        )),
    },
    Convention {
        name: "debezium",
        ddl: "create table outboxevent (id uuid not null primary key, aggregatetype varchar(255) not null,
                aggregateid varchar(255) not null, type varchar(255) not null, payload jsonb)",
        read_model: None,
        expect: &[
            "table = \"public.outboxevent\"",
            "aggregate_type = \"aggregatetype\"",
            "aggregate_id = \"aggregateid\"",
            "event_type = \"type\"",
            "# [[projection]]",
        ],
        insert: r#"insert into outboxevent values ('00000000-0000-4000-8000-000000000001', 'order', 'o-1', 'OrderPlaced', '{"amount": "1"}')"#,
        check: None,
    },
    Convention {
        name: "prisma",
        ddl: r#"create table "OutboxEvent" ("id" text not null primary key, "aggregateType" text not null,
                 "aggregateId" text not null, "eventType" text not null, "payload" jsonb not null,
                 "version" integer not null, "createdAt" timestamp(3) not null default current_timestamp);
                create table "OrderSummary" ("orderId" text primary key, "lastVersion" bigint not null, "totalAmount" numeric)"#,
        read_model: Some("public.OrderSummary"),
        expect: &[
            "table = \"public.OutboxEvent\"",
            "aggregate_type = \"aggregateType\"",
            "aggregate_id = \"aggregateId\"",
            "event_type = \"eventType\"",
            "version = \"version\"",
            "key = \"orderId\"",
            "version_column = \"lastVersion\"",
            "totalAmount = \":payload.totalAmount::numeric\"",
        ],
        insert: r#"insert into "OutboxEvent" ("id", "aggregateType", "aggregateId", "eventType", "payload", "version")
                   values ('00000000-0000-4000-8000-000000000001', 'order', 'o-1', 'OrderPaid', '{"totalAmount": "12.5"}', 3)"#,
        check: Some((
            r#"select "orderId" || ' ' || "totalAmount" || ' ' || "lastVersion" from "OrderSummary""#,
            "o-1 12.5 3",
        )),
    },
    Convention {
        name: "rails",
        ddl: "create table app_outboxevent (id bigserial primary key, event_id uuid not null unique,
                aggregate_type varchar(255) not null, aggregate_id varchar(255) not null,
                event_type varchar(255) not null, payload jsonb not null, created_at timestamptz not null default now())",
        read_model: None,
        expect: &[
            "table = \"public.app_outboxevent\"",
            "id = \"event_id\"",
            "occurred_at = \"created_at\"",
        ],
        insert: r#"insert into app_outboxevent (event_id, aggregate_type, aggregate_id, event_type, payload)
                   values ('00000000-0000-4000-8000-000000000001', 'order', 'o-1', 'OrderPlaced', '{"amount": "1"}')"#,
        check: None,
    },
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_writes_a_config_that_streams_for_every_convention() {
    let cluster = walfold_tempdb::Cluster::shared();
    let runs = CONVENTIONS.iter().map(|c| async move {
        let name = cluster.create_database(c.name).expect("create database");
        let db = TestDb { cluster, name };
        db.psql(c.ddl);
        let dir =
            std::env::temp_dir().join(format!("walfold-init-{}-{}", std::process::id(), c.name));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("walfold.toml");
        let _ = std::fs::remove_file(&path);
        let path_s = path.to_str().unwrap();
        let url = db.url();
        let mut args = vec!["init", "--url", url.as_str(), "-o", path_s];
        if let Some(rm) = c.read_model {
            args.extend(["--read-model", rm]);
        }
        let (code, out, err) = walfold(&args, &[]);
        assert_eq!(code, 0, "{}: init\n{out}\n{err}", c.name);
        assert!(out.contains("wrote"), "{}: {out}", c.name);
        assert!(
            out.contains("ok    wal_level = logical"),
            "{}: doctor's checks run\n{out}",
            c.name
        );
        let text = std::fs::read_to_string(&path).unwrap();
        for line in c.expect {
            assert!(
                text.contains(line),
                "{}: `{line}` missing from\n{text}",
                c.name
            );
        }
        // Never overwrites.
        let (code, _, err) = walfold(&args, &[]);
        assert_eq!(code, 2, "{}", c.name);
        assert!(err.contains("never overwrites"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        // `walfold doctor` and `walfold run` accept it; a row streams end to end. Slots
        // are per cluster and the metrics port is the file's default: both overridden.
        let slot = format!("init_{}", c.name);
        let listen = format!("127.0.0.1:{}", free_port());
        let envs = [
            ("WALFOLD_SOURCE__SLOT", slot.as_str()),
            ("WALFOLD_METRICS__LISTEN", listen.as_str()),
        ];
        let (code, out, _) = walfold(&["doctor", "-c", path_s], &envs);
        assert_eq!(code, 0, "{}: doctor\n{out}", c.name);
        let mut d = Daemon::start(&text, &envs);
        let active = format!(
            "select count(*) from pg_replication_slots where slot_name = '{slot}' and active"
        );
        eventually(
            Duration::from_secs(60),
            &format!("{}: streaming", c.name),
            || async { db.psql(&active) == "1" },
        )
        .await;
        db.psql(c.insert);
        eventually(
            Duration::from_secs(60),
            &format!("{}: the event in the log", c.name),
            || async { db.psql("select count(*) from walfold.event_log") == "1" },
        )
        .await;
        if let Some((query, expected)) = c.check {
            eventually(
                Duration::from_secs(60),
                &format!("{}: the read model", c.name),
                || async { db.psql(query) == expected },
            )
            .await;
        }
        assert_eq!(
            d.terminate(Duration::from_secs(30)),
            Some(0),
            "{}\n{}",
            c.name,
            d.log_text()
        );
    });
    futures::future::join_all(runs).await;
}

#[test]
fn init_refuses_ambiguity_and_explains_what_is_missing() {
    let db = TestDb::new("init_refusals");
    // The standard schema has one outbox; a second one makes the choice ambiguous.
    db.psql("create table outbox_two (like outbox)");
    let path = std::env::temp_dir().join(format!("walfold-init-amb-{}.toml", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let p = path.to_str().unwrap();
    let url = db.url();
    let (code, _, err) = walfold(&["init", "--url", &url, "-o", p], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("several tables look like outboxes: public.outbox, public.outbox_two"),
        "{err}"
    );
    assert!(!path.exists(), "nothing written on a refusal");
    let (code, _, err) = walfold(
        &["init", "--url", &url, "--table", "public.ledger", "-o", p],
        &[],
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("does not look like an outbox: no column for aggregate_type"),
        "{err}"
    );
    // Both tables chosen: two [[outbox]] sections, written to standard output.
    let (code, out, err) = walfold(
        &[
            "init",
            "--url",
            &url,
            "--table",
            "outbox",
            "--table",
            "outbox_two",
            "-o",
            "-",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches("[[outbox]]").count(), 2, "{out}");
    assert!(
        err.contains("checks (as `walfold doctor` runs them)"),
        "{err}"
    );

    // An outbox without a version: no `table` projection (its guard needs one; a
    // stranger's generated one dead-lettered every event), and an example without a guard.
    db.psql("alter table outbox_two drop column version");
    let args = ["init", "--url", &url, "--table", "outbox_two"];
    let with_model = [&args[..], &["--read-model", "public.order_state", "-o", p]].concat();
    let (code, _, err) = walfold(&with_model, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("public.outbox_two has no version column") && err.contains("dead-lettered"),
        "{err}"
    );
    assert!(!path.exists(), "nothing written on a refusal");
    let (code, out, err) = walfold(&[&args[..], &["-o", "-"]].concat(), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no version guard"), "{out}");
    assert!(!out.contains(":version"), "{out}");
    // And doctor fails a config whose table projection would meet only such events.
    db.psql("alter table outbox drop column version");
    let cfg = walfold_tests::write_config(&db.config(""));
    let (code, out, err) = walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.lines().any(|l| l.starts_with("FAIL")
            && l.contains("order_state")
            && l.contains(
                "public.outbox (no column version) give none: every event is dead-lettered"
            )),
        "{out}"
    );
}

/// `walfold events` lines, parsed.
fn events_json(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_filters_follows_and_tells_what_a_subscriber_did() {
    let db = TestDb::new("events");
    let config = db.config("");
    let (d, client) = Daemon::streaming(&db, &config).await;
    let id = |n: u32| format!("00000000-0000-4000-8000-{n:012}");
    // v2 before v1: the late v1 is stale for the guarded `order_state`.
    db.psql(
        &[
            insert_event(
                &id(1),
                "o-1",
                "OrderPaid",
                2,
                r#"{"status": "paid", "amount": "10"}"#,
            ),
            insert_event(
                &id(2),
                "o-1",
                "OrderPlaced",
                1,
                r#"{"status": "placed", "amount": "10"}"#,
            ),
            insert_event(
                &id(3),
                "o-2",
                "OrderPlaced",
                1,
                r#"{"status": "placed", "amount": "5"}"#,
            ),
            insert_event(
                &id(4),
                "o-bad",
                "OrderPlaced",
                1,
                r#"{"status": "placed", "amount": "x"}"#,
            ),
        ]
        .concat(),
    );
    caught_up(&client, 4, 3).await;
    let cfg = d.config_path();

    let (code, out, err) = walfold(&["events", "-c", cfg], &[]);
    assert_eq!(code, 0, "{err}");
    let all = events_json(&out);
    assert_eq!(all.len(), 4);
    assert_eq!(all[0]["event_id"], id(1));
    assert_eq!(all[0]["payload"]["status"], "paid");
    assert!(all[0]["seq"].as_i64().unwrap() < all[1]["seq"].as_i64().unwrap());

    let seq2 = all[1]["seq"].as_i64().unwrap().to_string();
    let (_, out, _) = walfold(
        &[
            "events",
            "-c",
            cfg,
            "--aggregate",
            "o-1",
            "--type",
            "OrderPlaced",
        ],
        &[],
    );
    assert_eq!(events_json(&out).len(), 1);
    let (_, out, _) = walfold(
        &["events", "-c", cfg, "--after", &seq2, "--limit", "1"],
        &[],
    );
    assert_eq!(events_json(&out)[0]["event_id"], id(3));
    let (_, out, _) = walfold(&["events", "-c", cfg, "--since", "1h"], &[]);
    assert_eq!(events_json(&out).len(), 4);
    let (_, out, _) = walfold(
        &["events", "-c", cfg, "--since", "2999-01-01T00:00:00Z"],
        &[],
    );
    assert!(out.is_empty());
    let (code, _, err) = walfold(&["events", "-c", cfg, "--since", "yesterday-ish"], &[]);
    assert_eq!(code, 2, "{err}");

    // What the guarded table projection did with each of o-1's events: the late v1 was
    // skipped as stale; the sql projection can only say claimed.
    let outcome = |out: &str| -> Vec<String> {
        events_json(out)
            .iter()
            .map(|e| e["subscriber"]["outcome"].as_str().unwrap().to_owned())
            .collect()
    };
    let (code, out, err) = walfold(
        &["events", "-c", cfg, "--subscriber", "orders.state.v1"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        outcome(&out),
        ["applied", "stale", "applied", "dead_lettered"],
        "{out}"
    );
    assert_eq!(events_json(&out)[1]["subscriber"]["id"], "orders.state.v1");
    // Only the stale one, found with a filter that starts after the event that made it
    // stale: the history is still read from the start.
    let (_, out, _) = walfold(
        &[
            "events",
            "-c",
            cfg,
            "--subscriber",
            "orders.state.v1",
            "--aggregate",
            "o-1",
            "--after",
            &all[0]["seq"].to_string(),
        ],
        &[],
    );
    assert_eq!(outcome(&out), ["stale"], "{out}");
    let (_, out, _) = walfold(
        &[
            "events",
            "-c",
            cfg,
            "--subscriber",
            "orders.total.v1",
            "--aggregate",
            "o-1",
        ],
        &[],
    );
    assert_eq!(outcome(&out), ["claimed", "claimed"], "{out}");
    let dl = &events_json(
        &walfold(
            &[
                "events",
                "-c",
                cfg,
                "--subscriber",
                "orders.ledger.v1",
                "--aggregate",
                "o-bad",
            ],
            &[],
        )
        .1,
    )[0];
    assert_eq!(dl["subscriber"]["outcome"], "dead_lettered", "{dl}");
    assert_eq!(
        dl["subscriber"]["dead_letter"]["reason"],
        "projection_failed"
    );
    assert_eq!(dl["subscriber"]["dead_letter"]["status"], "open");

    // --follow prints what is appended after it started.
    let mut follow = spawn_walfold(
        &[
            "events",
            "-c",
            cfg,
            "--follow",
            "--subscriber",
            "orders.state.v1",
        ],
        &[],
    );
    let lines = lines_of(follow.stdout.take().unwrap());
    eventually(Duration::from_secs(20), "the existing events", || async {
        lines.lock().unwrap().len() == 4
    })
    .await;
    db.psql(&insert_event(
        &id(5),
        "o-3",
        "OrderPlaced",
        1,
        r#"{"status": "placed", "amount": "1"}"#,
    ));
    eventually(Duration::from_secs(30), "the new event", || async {
        lines.lock().unwrap().len() == 5
    })
    .await;
    let new: serde_json::Value = serde_json::from_str(&lines.lock().unwrap()[4]).unwrap();
    assert_eq!(new["event_id"], id(5));
    // Held back until the subscriber reached it, so the line says what it did.
    assert_eq!(new["subscriber"]["outcome"], "applied", "{new}");
    let _ = follow.kill();
    let _ = follow.wait();

    // The inference agrees with the projector's own counts on a workload of producer
    // retries and versions written out of order.
    let expected =
        walfold_tests::write_events(db.url(), 40, 15, 6, Duration::from_millis(2), 11).await;
    caught_up(&client, expected.distinct() + 5, 3).await;
    let (code, out, err) = walfold(
        &["events", "-c", cfg, "--subscriber", "orders.state.v1"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let mut counts = std::collections::HashMap::<String, i64>::new();
    for o in outcome(&out) {
        *counts.entry(o).or_default() += 1;
    }
    let row = client
        .query_one(
            "select sum(applied)::int8, sum(stale)::int8 from walfold.checkpoint where subscriber_id = 'orders.state.v1'",
            &[],
        )
        .await
        .unwrap();
    let (applied, stale): (i64, i64) = (row.get(0), row.get(1));
    assert!(stale > 1, "the workload has stale events: {stale}");
    assert_eq!(
        counts.get("applied").copied().unwrap_or(0),
        applied,
        "{counts:?}"
    );
    assert_eq!(
        counts.get("stale").copied().unwrap_or(0),
        stale,
        "{counts:?}"
    );

    // A filter that names none of the log's event types applies nothing, silently:
    // doctor warns, naming what the log holds (a stranger's `order.paid` matched nothing).
    let filtered = |types: &str| {
        write_config(&config.replace(
            "name = \"order_state\"\n",
            &format!("name = \"order_state\"\nevent_types = {types}\n"),
        ))
    };
    let cfg = filtered(r#"["order.paid", "orderplaced"]"#);
    let (_, out, _) = walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
    assert!(
        out.lines().any(|l| l.starts_with("warn")
            && l.contains(
                "projection order_state: none of its event_types (order.paid, orderplaced)"
            )
            && l.contains("OrderPaid, OrderPlaced")),
        "{out}"
    );
    let cfg = filtered(r#"["order.paid", "OrderPaid"]"#);
    let (_, out, _) = walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
    assert!(!out.contains("none of its event_types"), "{out}");
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_work_prints_progress_lines_when_not_on_a_terminal() {
    let db = TestDb::new("progress");
    db.psql(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         select gen_random_uuid(), 'order', 'o-' || (i % 500), 'OrderChanged', i, \
                json_build_object('status', 's' || i, 'amount', (i % 100)::text)::jsonb \
         from generate_series(1, 20000) i; analyze outbox",
    );
    let config = db.config("");
    let path = write_config(&config);
    let cfg = path.to_str().unwrap();
    let (code, out, err) = walfold(
        &[
            "backfill",
            "-c",
            cfg,
            "--outbox",
            "public.outbox",
            "--batch",
            "500",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("backfill of public.outbox: "))
        .collect();
    assert!(
        lines.len() >= 2,
        "a line at the start and one at the end:\n{err}"
    );
    // The planner's estimate (the table was analyzed) gives what remains from the start.
    assert!(lines[0].contains(", 20000 remaining ("), "{}", lines[0]);
    let last = lines.last().unwrap();
    assert!(
        last.starts_with("backfill of public.outbox: 20000 rows, 0 remaining (100%)"),
        "{last}"
    );
    assert!(
        last.contains("rows/s") && last.contains("eta 0s") && last.ends_with("done"),
        "{last}"
    );
    assert!(out.contains("20000 rows"), "{out}");

    // A slow replay (50 events per transaction), so there is something to follow.
    let envs = [("WALFOLD_PROJECTION__0__REBUILD_BATCH_SIZE", "50")];
    let d = Daemon::start(&config, &envs);
    let client = db.client().await;
    caught_up(&client, 20000, 3).await;

    // `status --watch` redraws every second.
    let mut watch = spawn_walfold(&["status", "-c", cfg, "--watch"], &[]);
    let watched = lines_of(watch.stdout.take().unwrap());
    let started = Instant::now();
    eventually(Duration::from_secs(20), "three status blocks", || async {
        watched
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("walfold status at "))
            .count()
            >= 3
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "one block a second"
    );
    assert!(watched
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.starts_with("orders.state.v1")));
    let _ = watch.kill();
    let _ = watch.wait();

    // Ctrl-C stops following, not the rebuild.
    let mut wait = spawn_walfold(
        &[
            "rebuild",
            "order_state",
            "--subscriber",
            "orders.state.v2",
            "--wait",
            "-c",
            cfg,
        ],
        &[],
    );
    let progress = lines_of(wait.stderr.take().unwrap());
    eventually(Duration::from_secs(30), "a progress line", || async {
        progress
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("rebuild of order_state → orders.state.v2: "))
    })
    .await;
    let _ = std::process::Command::new("kill")
        .args(["-INT", &wait.id().to_string()])
        .status();
    let status = wait.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{:?}", progress.lock().unwrap());
    eventually(Duration::from_secs(5), "the goodbye", || async {
        progress
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("stopped following; the rebuild of order_state goes on"))
    })
    .await;
    let state =
        || db.psql("select state from walfold.rebuild where subscriber_id = 'orders.state.v2'");
    let s = state();
    assert!(s == "running" || s == "switched", "{s}");

    // Following the running one (no --subscriber) to its switch-over.
    let (code, out, err) = walfold(&["rebuild", "order_state", "--wait", "-c", cfg], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("rebuild of order_state switched over: orders.state.v2 serves it"),
        "{out}"
    );
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("rebuild of order_state → orders.state.v2: "))
        .collect();
    assert!(!lines.is_empty(), "{err}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains(" events") && l.contains("remaining") && l.contains("events/s")),
        "{err}"
    );
    assert!(lines.last().unwrap().ends_with("switched"), "{err}");
    assert_eq!(state(), "switched");
    drop(d);
}

#[test]
fn completions_and_the_man_page_come_from_the_cli() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = walfold(&["completions", shell], &[]);
        assert_eq!(code, 0, "{err}");
        for command in ["init", "events", "rebuild", "dead-letters"] {
            assert!(out.contains(command), "{shell} completion lacks {command}");
        }
    }
    let (code, out, _) = walfold(&["man"], &[]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with(".ie") || out.contains(".TH walfold"),
        "{}",
        &out[..200.min(out.len())]
    );
    assert!(out.contains("init") && out.contains("events"));
}

#[test]
fn the_demo_folds_every_kind_of_outbox_and_projection_and_cleans_up() {
    let (code, out, err) = walfold(&["demo"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    for line in [
        "  o-1   paid        30.00  v2",
        "  o-2   cancelled   12.50  v3",
        "  EUR  42.50",
        "  acc-1  90.00  v3",
        "event log: 9 events appended, 1 duplicate IDs skipped, 1 malformed rows dead-lettered",
        "dead letter: malformed — column `id` is null",
        "throwaway PostgreSQL stopped and removed",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
    assert_eq!(
        out.matches("dead letter:").count(),
        1,
        "only the malformed row: {out}"
    );
}

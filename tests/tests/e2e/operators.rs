//! What operators do to a running deployment, with the real `walfold` binary against a
//! throwaway PostgreSQL: change parallelism under a short claim retention, revoke a
//! grant, drop a column, lose a leader mid-rebuild; and the data that breaks indexes or
//! resources. Each ends with the read models equal to a fold computed without walfold.

use std::time::Duration;

use walfold_config::builder::ConfigBuilder;
use walfold_tests::{
    caught_up, count, difference, eventually, free_port, http_get, slot_active, status, walfold,
    write_events, Daemon, TestDb,
};

const TOTALS_FROM_OUTBOX: &str = "select aggregate_id, sum((payload->>'amount')::numeric) \
     from (select distinct on (id) * from outbox) o group by aggregate_id";

/// A running sum (not idempotent by itself: only claims keep it right) with
/// `parallelism` appliers, its claims kept 1 s and pruned every second.
fn sum_config(url: &str, parallelism: u32) -> String {
    ConfigBuilder::new(url)
        .outbox_table("public.outbox")
        .set("pipeline", "max_backoff_ms", 500)
        .set("retention", "prune_interval_s", 1)
        .text(&format!(
            r#"
[[projection]]
name = "order_total"
subscriber = "orders.total.v1"
parallelism = {parallelism}
batch_size = 20
dedup_retention = "1s"
sql = """
insert into order_total (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))
on conflict (order_id) do update set total = order_total.total + excluded.total
"""
"#
        ))
        .to_toml()
}

/// `n` events per order of `orders`, one transaction, amounts 1..n.
fn insert_orders(db: &TestDb, orders: &[&str], n: i64, first_version: i64) {
    let list = orders
        .iter()
        .map(|o| format!("'{o}'"))
        .collect::<Vec<_>>()
        .join(", ");
    db.psql(&format!(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         select gen_random_uuid(), 'order', o, 'OrderPaid', {first_version} + i, \
                jsonb_build_object('amount', i::text) \
         from unnest(array[{list}]) as o, generate_series(0, {n} - 1) as i"
    ));
}

async fn totals_match(client: &tokio_postgres::Client) {
    eventually(
        Duration::from_secs(90),
        "the running sums to equal the fold",
        || async {
            count(client, "select count(*) from outbox").await
                == count(client, "select count(*) from walfold.event_log").await
                && difference(
                    client,
                    "select order_id, total from order_total",
                    TOTALS_FROM_OUTBOX,
                )
                .await
                    == 0
        },
    )
    .await;
    // And it stays equal: nothing is applied again later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        difference(
            client,
            "select order_id, total from order_total",
            TOTALS_FROM_OUTBOX
        )
        .await,
        0
    );
}

/// parallelism 1 → 3 → 2 across restarts, with claims kept only 1 s and pruned every
/// second. One aggregate is slow (a trigger sleeps on it), so when the daemon is killed
/// under parallelism 3 its partition is far behind the others, whose claims are older
/// than the retention: with 2 partitions every aggregate resumes at the slow one's
/// position, and the events the fast ones applied must still meet their claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_parallelism_under_a_short_claim_retention_never_applies_twice() {
    let db = TestDb::new("parallel");
    db.psql(
        "create function slow() returns trigger language plpgsql as \
         $$ begin perform pg_sleep(0.02); return new; end $$; \
         create trigger slow before insert or update on order_total for each row \
         when (new.order_id = 'o-slow') execute function slow();",
    );
    let fast = ["o-1", "o-2", "o-3", "o-4", "o-5", "o-6", "o-7", "o-8"];
    let (mut d, client) = Daemon::streaming(&db, &sum_config(&db.url(), 1)).await;
    insert_orders(&db, &fast, 20, 1);
    insert_orders(&db, &["o-slow"], 20, 1);
    totals_match(&client).await;

    // 1 → 3: every partition starts where the single one stopped, none at 0.
    d.kill();
    std::fs::write(d.config_path(), sum_config(&db.url(), 3)).unwrap();
    d.kill_and_restart(None);
    slot_active(&client).await;
    // The slow aggregate's events first, so the others' come after its partition's
    // position while it works through them.
    insert_orders(&db, &["o-slow"], 200, 21);
    insert_orders(&db, &fast, 20, 21);
    eventually(
        Duration::from_secs(30),
        "the fast partitions to finish while the slow one lags",
        || async {
            count(
                &client,
                "select count(*) from walfold.checkpoint where subscriber_id = 'orders.total.v1' \
                 and position = (select max(seq) from walfold.event_log)",
            )
            .await
                >= 1
        },
    )
    .await;
    // Their claims are now older than the retention, and prune passes have run.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let spread = client
        .query_one(
            "select min(position), max(position) from walfold.checkpoint \
             where subscriber_id = 'orders.total.v1'",
            &[],
        )
        .await
        .unwrap();
    let (low, high): (i64, i64) = (spread.get(0), spread.get(1));
    assert!(low < high, "the slow partition must lag ({low} vs {high})");
    let kept = count(
        &client,
        &format!(
            "select count(*) from walfold.processed_message m join walfold.event_log e \
             on e.event_id = m.message_id where e.seq > {low}"
        ),
    )
    .await;
    let applied_after_low = count(
        &client,
        &format!(
            "select count(*) from walfold.event_log e where e.seq > {low} and exists \
             (select 1 from walfold.processed_message m where m.message_id = e.event_id)"
        ),
    )
    .await;
    assert_eq!(kept, applied_after_low);
    assert!(
        kept > 0,
        "the fast partitions applied events past the slow one"
    );

    // 3 → 2 after a crash: aggregates move, everything resumes at the lowest position.
    d.kill();
    std::fs::write(d.config_path(), sum_config(&db.url(), 2)).unwrap();
    d.kill_and_restart(None);
    totals_match(&client).await;
    assert!(
        d.log_text().contains("partition count changed"),
        "{}",
        d.log_text()
    );
    assert_eq!(
        count(
            &client,
            "select count(*) from walfold.checkpoint where subscriber_id = 'orders.total.v1' and partitions = 2"
        )
        .await,
        2
    );
}

async fn paused(client: &tokio_postgres::Client, subscriber: &str) -> Option<String> {
    status(client)
        .await?
        .subscribers
        .into_iter()
        .find(|s| s.subscriber == subscriber)?
        .paused
        .map(|p| format!("{} {}", p.sqlstate.unwrap_or_default(), p.error))
}

/// The target role loses a grant, then a read model loses a column, while events stream.
/// Neither is any event's fault: the projection pauses (loudly: status, metrics,
/// `/readyz`, the log once per cause), nothing is dead-lettered, the other projections go
/// on, and it catches up by itself once the operator puts things back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_grant_or_a_dropped_column_pauses_and_resumes_by_itself() {
    let db = TestDb::new("environment");
    let role = format!("writer_{}", db.name);
    db.psql(&format!(
        "create role {role} login; grant create on database {db} to {role}; \
         grant usage on schema public to {role}; \
         grant select, insert, update on order_state, order_total, ledger to {role};",
        db = db.name
    ));
    let target = format!(
        "postgresql://{role}@127.0.0.1:{}/{}",
        db.cluster.port(),
        db.name
    );
    let port = free_port();
    let config = db.config(&format!(
        "\n[target]\nurl = \"{target}\"\n\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"
    ));
    // Writable is enough to project; a rebuild needs more, which doctor says up front
    // (a stranger's rebuild failed late for want of ownership).
    let cfg = walfold_tests::write_config(&config);
    let (code, out, _) = walfold_tests::walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "warn  projection order_state: the target role may rebuild public.order_state"
        ) && out.contains(&format!(
            r#"alter table "public"."order_state" owner to "{role}""#
        )),
        "{out}"
    );
    // And `walfold rebuild` refuses up front, not at the switch-over after the replay.
    db.psql(&format!("grant create on schema public to {role}"));
    let (code, _, err) = walfold_tests::walfold(
        &[
            "rebuild",
            "order_state",
            "--subscriber",
            "orders.state.v2",
            "-c",
            cfg.to_str().unwrap(),
        ],
        &[],
    );
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(&format!("{role} does not own public.order_state")),
        "{err}"
    );
    assert_eq!(
        db.psql("select to_regclass('order_state__rebuild') is null"),
        "t"
    );
    let (d, client) = Daemon::streaming(&db, &config).await;
    let writer = tokio::spawn(write_events(
        db.url(),
        400,
        5,
        10,
        Duration::from_millis(25),
        41,
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;

    db.psql(&format!("revoke insert, update on order_total from {role}"));
    eventually(Duration::from_secs(30), "order_total to pause", || async {
        paused(&client, "orders.total.v1")
            .await
            .is_some_and(|p| p.starts_with("42501") && p.contains("walfold doctor"))
    })
    .await;
    eventually(Duration::from_secs(10), "the metrics to say so", || async {
        let (_, body) = http_get(port, "/metrics");
        body.contains("walfold_projection_paused{subscriber=\"orders.total.v1\"} 2")
    })
    .await;
    let (code, why) = http_get(port, "/readyz");
    assert_eq!(code, 503, "{why}");
    assert!(why.contains("paused"), "{why}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    db.psql(&format!("grant insert, update on order_total to {role}"));

    eventually(Duration::from_secs(60), "order_total to resume", || async {
        paused(&client, "orders.total.v1").await.is_none()
    })
    .await;
    db.psql("alter table order_state drop column note");
    eventually(Duration::from_secs(30), "order_state to pause", || async {
        paused(&client, "orders.state.v1")
            .await
            .is_some_and(|p| p.starts_with("42703") && p.contains("note"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    db.psql("alter table order_state add column note text");

    let expected = writer.await.unwrap();
    caught_up(&client, expected.distinct(), 3).await;
    expected.check(&client).await;
    assert_eq!(
        count(&client, "select count(*) from walfold.dead_letter").await,
        0
    );
    let s = status(&client).await.unwrap();
    assert_eq!(s.paused, 0, "{s:?}");
    eventually(Duration::from_secs(10), "/readyz to be ready", || async {
        http_get(port, "/readyz").0 == 200
    })
    .await;
    let log = d.log_text();
    let pauses = log.matches("projection paused").count();
    // Once per partition and cause (order_total has 2 partitions, order_state 1).
    assert!((2..=3).contains(&pauses), "{pauses} pause messages:\n{log}");
    assert!(log.contains("projection resumed"), "{log}");
}

/// An aggregate ID of 10 kB cannot enter a read model's key index. That is the event's
/// data: it is dead-lettered and its aggregate parked (by a hash, so parking works), the
/// other events flow, and the daemon stays up across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_10kb_aggregate_id_is_dead_lettered_and_the_rest_flows() {
    let db = TestDb::new("longid");
    let envs = [
        ("WALFOLD_PROJECTION__0__MAX_ATTEMPTS", "2"),
        ("WALFOLD_PROJECTION__0__RETRY_BACKOFF_MS", "10"),
        ("WALFOLD_PROJECTION__1__MAX_ATTEMPTS", "2"),
        ("WALFOLD_PROJECTION__1__RETRY_BACKOFF_MS", "10"),
    ];
    let mut d = Daemon::start(&db.config(""), &envs);
    let client = db.client().await;
    slot_active(&client).await;
    let insert = |version: i64, aggregate: &str| {
        format!(
            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
             values (gen_random_uuid(), 'order', {aggregate}, 'OrderPaid', {version}, \
                     '{{\"status\": \"paid\", \"amount\": \"1\"}}');"
        )
    };
    // Hex of md5s compresses too little to fit a B-tree entry.
    let long = "(select string_agg(md5(i::text), '') from generate_series(1, 320) i)";
    db.psql(&format!(
        "begin; {} {} {} {} commit;",
        insert(1, "'o-a'"),
        insert(1, long),
        insert(2, long),
        insert(1, "'o-b'")
    ));
    caught_up(&client, 4, 3).await;
    let s = status(&client).await.unwrap();
    for sub in ["orders.state.v1", "orders.total.v1"] {
        let x = s.subscribers.iter().find(|x| x.subscriber == sub).unwrap();
        assert_eq!((x.applied, x.parked_aggregates), (2, 1), "{sub}: {x:?}");
    }
    assert_eq!(
        count(
            &client,
            "select count(*) from walfold.dead_letter where reason = 'projection_failed' \
             and length(aggregate_id) = 10240 and error like '%54000%'"
        )
        .await,
        2
    );
    assert_eq!(count(&client, "select count(*) from ledger").await, 4);
    assert_eq!(count(&client, "select count(*) from order_state").await, 2);
    assert!(d.exited().is_none(), "{}", d.log_text());
    d.kill_and_restart(None);
    slot_active(&client).await;
    db.psql(&insert(2, "'o-a'"));
    caught_up(&client, 5, 3).await;
    assert_eq!(
        db.psql("select version from order_state where order_id = 'o-a'"),
        "2"
    );
    assert!(d.exited().is_none(), "{}", d.log_text());
}

/// A batch that makes the server run out of a resource (simulated: a trigger raises
/// 53200 after 10 rows in one transaction) is tried again smaller, not dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_runs_out_of_a_resource_is_retried_smaller() {
    let db = TestDb::new("resource");
    db.psql(
        "create function guard() returns trigger language plpgsql as $$ \
         declare n int := coalesce(nullif(current_setting('walfold_test.rows', true), ''), '0')::int + 1; \
         begin perform set_config('walfold_test.rows', n::text, true); \
         if n > 10 then raise exception 'out of memory (simulated)' using errcode = '53200'; end if; \
         return new; end $$; \
         create trigger guard before insert on ledger for each row execute function guard();",
    );
    let (d, client) = Daemon::streaming(&db, &db.config("")).await;
    let expected = write_events(db.url(), 1, 100, 10, Duration::ZERO, 7).await;
    caught_up(&client, expected.distinct(), 3).await;
    expected.check(&client).await;
    assert_eq!(
        count(&client, "select count(*) from walfold.dead_letter").await,
        0
    );
    assert!(
        d.log_text().contains("trying a smaller batch"),
        "{}",
        d.log_text()
    );
}

/// Leader A stalls mid-stream: its heartbeats stop for 8 s (a failpoint) while its work
/// goes on, so B finds it dead after its 3 s lease, takes over and switches a rebuild of
/// a running sum. Every commit A's projectors attempt must fail (the fence): none lands
/// in the table B has made live, and A's rebuild projector, writing a shadow table that
/// no longer exists, dead-letters nothing under what is now the live subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_cannot_write_after_a_new_one_switched_a_rebuild() {
    let db = TestDb::new("deposed");
    let config = |name: &str| {
        ConfigBuilder::new(&db.url())
            .outbox_table("public.outbox")
            .set("target", "url", format!("{}?application_name={name}", db.url()))
            .set("pipeline", "max_backoff_ms", 500)
            .set("retention", "prune_interval_s", 0)
            .set("cluster", "lease_s", 3)
            .text(
                r#"
[[projection]]
name = "order_total"
subscriber = "orders.total.v1"
target = "public.order_total"
batch_size = 10
sql = """
insert into {table} as t (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))
on conflict (order_id) do update set total = t.total + excluded.total
"""
"#,
            )
            .to_toml()
    };
    let a = Daemon::start(
        &config("walfold-a"),
        &[("WALFOLD_FAILPOINTS", "leader_heartbeat=sleep:8000")],
    );
    let client = db.client().await;
    slot_active(&client).await;
    insert_orders(&db, &["o-1", "o-2", "o-3", "o-4", "o-5"], 60, 1);
    totals_match(&client).await;
    let b = Daemon::start(&config("walfold-b"), &[]);
    eventually(Duration::from_secs(30), "B to join", || {
        let joined = b.log_text().contains("instance started");
        async move { joined }
    })
    .await;
    let writer = {
        let url = db.url();
        tokio::spawn(async move {
            let c = walfold_pg::connect(&url).await.unwrap();
            for i in 0..120 {
                c.batch_execute(&format!(
                    "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
                     values (gen_random_uuid(), 'order', 'o-{}', 'OrderPaid', {}, '{{\"amount\": \"{i}\"}}')",
                    i % 5 + 1,
                    1000 + i
                ))
                .await
                .unwrap();
                tokio::time::sleep(Duration::from_millis(80)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A's heartbeats stall (the failpoint) while its work goes on: B finds it dead after
    // its lease, ends its sessions and leads.
    eventually(Duration::from_secs(15), "B to lead", || {
        let leads = b.log_text().contains("leading: this instance");
        async move { leads }
    })
    .await;
    let (code, _, err) = walfold(
        &[
            "rebuild",
            "order_total",
            "--subscriber",
            "orders.total.v2",
            "-c",
            b.config_path(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    eventually(Duration::from_secs(60), "B's switch-over", || async {
        count(
            &client,
            "select count(*) from walfold.rebuild where subscriber_id = 'orders.total.v2' \
             and state = 'switched'",
        )
        .await
            == 1
    })
    .await;
    writer.await.unwrap();
    totals_match(&client).await;
    assert_eq!(
        count(
            &client,
            "select count(*) from walfold.dead_letter where subscriber_id = 'orders.total.v2'"
        )
        .await,
        0
    );
    // A learnt that it had lost its work: a fence refused one of its writes, or it found
    // itself silent past its lease when it woke.
    let a_log = a.log_text();
    assert!(
        a_log.contains("a write transaction was refused")
            || a_log.contains("silent for longer than its lease"),
        "A never noticed it had lost its work:\n{a_log}"
    );
    assert!(
        b.log_text().contains("rebuild switched over"),
        "{}",
        b.log_text()
    );
}

/// A rebuild keeps what `like … including all` leaves out: the read model's foreign
/// keys and row-level security policies; and `--finish` works when the read model has a
/// `serial` column, whose sequence the retired table owned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_keeps_foreign_keys_policies_and_serial_columns() {
    let db = TestDb::new("rebuildddl");
    db.psql(
        "create table known_order (order_id text primary key); \
         insert into known_order select 'o-' || i from generate_series(1, 5) i; \
         alter table order_total add column id serial; \
         alter table order_total add constraint order_known foreign key (order_id) \
           references known_order (order_id); \
         alter table order_total enable row level security; \
         create policy everyone on order_total using (true) with check (total >= 0);",
    );
    let config = sum_config(&db.url(), 1)
        .replace(
            "name = \"order_total\"",
            "name = \"order_total\"\ntarget = \"public.order_total\"",
        )
        .replace("into order_total (", "into {table} as order_total (");
    let (d, client) = Daemon::streaming(&db, &config).await;
    insert_orders(&db, &["o-1", "o-2", "o-3"], 30, 1);
    totals_match(&client).await;
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["-c", d.config_path()]);
        walfold(&all, &[])
    };
    let (code, _, err) = run(&["rebuild", "order_total", "--subscriber", "orders.total.v2"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        db.psql(
            "select count(*) from pg_constraint where conrelid = 'order_total__rebuild'::regclass \
             and contype = 'f'"
        ),
        "1"
    );
    eventually(Duration::from_secs(60), "the switch-over", || async {
        count(
            &client,
            "select count(*) from walfold.rebuild where state = 'switched'",
        )
        .await
            == 1
    })
    .await;
    let (code, _, err) = run(&["rebuild", "order_total", "--finish"]);
    assert_eq!(code, 0, "--finish must work with a serial column: {err}");
    assert_eq!(
        db.psql("select to_regclass('order_total__retired') is null"),
        "t"
    );
    insert_orders(&db, &["o-4"], 3, 1);
    totals_match(&client).await;
    assert_eq!(
        db.psql(
            "select conname from pg_constraint where conrelid = 'order_total'::regclass \
             and contype = 'f'"
        ),
        "order_known"
    );
    assert_eq!(
        db.psql(
            "select relrowsecurity::text || ' ' || (select with_check from pg_policies \
             where tablename = 'order_total' and policyname = 'everyone') \
             from pg_class where oid = 'order_total'::regclass"
        ),
        "true (total >= (0)::numeric)"
    );
    // The serial column still draws from its sequence.
    assert_eq!(
        db.psql("select count(distinct id) = count(*) from order_total"),
        "t"
    );
    let r = client
        .query_one(
            "select pg_get_serial_sequence('order_total', 'id') is not null",
            &[],
        )
        .await
        .unwrap();
    assert!(r.get::<_, bool>(0));
}

/// A parked aggregate with a chain longer than one retry page (1 failed event and 450
/// waiting behind it) is applied in order, a page at a time, once the cause is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_retry_chain_applies_in_order_in_pages() {
    let db = TestDb::new("chain");
    db.psql("alter table order_state add constraint not_bad check (status <> 'bad')");
    let envs = [
        ("WALFOLD_PROJECTION__0__MAX_ATTEMPTS", "1"),
        ("WALFOLD_PROJECTION__0__BATCH_SIZE", "50"),
    ];
    let d = Daemon::start(&db.config(""), &envs);
    let client = db.client().await;
    slot_active(&client).await;
    db.psql(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         select gen_random_uuid(), 'order', 'o-long', 'OrderChanged', v, \
                jsonb_build_object('status', case when v = 1 then 'bad' else 's' || v end, \
                                   'amount', '1') \
         from generate_series(1, 451) v",
    );
    caught_up(&client, 451, 3).await;
    assert_eq!(
        count(
            &client,
            "select count(*) from walfold.dead_letter where subscriber_id = 'orders.state.v1' \
             and status = 'open'"
        )
        .await,
        451
    );
    db.psql("alter table order_state drop constraint not_bad");
    let (code, out, err) = walfold(
        &["dead-letters", "retry", "--all", "-c", d.config_path()],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    eventually(
        Duration::from_secs(60),
        "the chain to be applied",
        || async {
            count(
            &client,
            "select count(*) from walfold.parked_aggregate where subscriber_id = 'orders.state.v1'",
        )
        .await
            == 0
        },
    )
    .await;
    assert_eq!(
        db.psql("select status || ':' || version from order_state where order_id = 'o-long'"),
        "s451:451"
    );
    assert_eq!(
        count(
            &client,
            "select count(*) from walfold.dead_letter where subscriber_id = 'orders.state.v1' \
             and status = 'retried' and resolution = 'retried: applied'"
        )
        .await,
        451,
        "each event applied in order: none was stale"
    );
}

/// A prune that deletes an old event between an append's insert (where its repeated ID
/// conflicted) and its comparison: the redelivered event is appended anew, as it would
/// have been a moment later, never neither appended nor counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_pruned_during_an_append_is_appended_not_lost() {
    let db = TestDb::new("prunerace");
    walfold_store::migrate(&db.url(), &walfold_store::Schema::new("walfold"))
        .await
        .unwrap();
    let order = walfold_store::LogOrder::acquire(&db.url(), &walfold_store::Schema::new("walfold"))
        .await
        .unwrap();
    let mut log = walfold_store::EventLog::open(
        db.client().await,
        &walfold_store::Schema::new("walfold"),
        "walfold",
        "default",
        order.into(),
    )
    .await
    .unwrap();
    let event = walfold_event::NewEvent {
        id: uuid::Uuid::new_v4(),
        producer_id: None,
        aggregate_type: "order".into(),
        aggregate_id: "o-1".into(),
        event_type: "OrderPaid".into(),
        version: Some(1),
        payload: serde_json::json!({"amount": "1"}).into(),
        headers: None,
        occurred_at: None,
        source_lsn: walfold_event::Lsn(1),
        origin: None,
        committed_at: None,
    };
    let counts = walfold_store::IngestCounts::default();
    let first = log
        .append(std::slice::from_ref(&event), &[], None, counts)
        .await
        .unwrap();
    assert_eq!(first.appended, 1);
    // Only this test runs in this process (nextest), so the variable is ours.
    std::env::set_var("WALFOLD_FAILPOINTS", "append_before_compare=sleep:1500");
    let pruner = {
        let client = db.client().await;
        let id = event.id;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            client
                .execute("delete from walfold.event_log where event_id = $1", &[&id])
                .await
                .unwrap()
        })
    };
    let again = log
        .append(std::slice::from_ref(&event), &[], None, counts)
        .await
        .unwrap();
    std::env::remove_var("WALFOLD_FAILPOINTS");
    assert_eq!(pruner.await.unwrap(), 1, "the prune deleted the old copy");
    assert_eq!((again.appended, again.duplicates), (1, 0));
    assert_eq!(
        db.psql(&format!(
            "select count(*) from walfold.event_log where event_id = '{}'",
            event.id
        )),
        "1"
    );
}

/// Guarantee 9 for the operator's handle: a write of the leader's work (ending a
/// rebuild, pruning) made through a handle bound to a leader that has since been
/// deposed is refused inside its transaction, and nothing of it lands; the new
/// leader's handle then does the same work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_handle_of_a_deposed_leader_cannot_write() {
    use walfold_config::QualifiedName;
    use walfold_store::operator::PrunePolicy;
    use walfold_store::{Leadership, Operator, RebuildState, Schema, StoreError};
    let db = TestDb::new("opfence");
    let schema = Schema::new("walfold");
    walfold_store::migrate(&db.url(), &schema).await.unwrap();
    let control_a = db.client().await;
    let a = Leadership::take_over(&control_a, &schema, uuid::Uuid::new_v4())
        .await
        .unwrap();
    let mut op_a = Operator::connect(&db.url(), &schema)
        .await
        .unwrap()
        .leading(a.fence());
    let live = QualifiedName::parse("public.order_total").unwrap();
    op_a.start_rebuild(
        "order_total",
        &live,
        "orders.total.v1",
        "orders.total.v2",
        &|_| None,
        Default::default(),
    )
    .await
    .unwrap();
    let r = op_a.request_abort("order_total").await.unwrap();
    // A claim past its retention, whose event is gone from the log: prunable.
    db.psql(
        "insert into walfold.processed_message (subscriber_id, seq, message_id, processed_at) \
         values ('orders.total.v1', 1, gen_random_uuid(), now() - interval '1 hour')",
    );
    let policy = PrunePolicy {
        event_log: None,
        claims: vec![("orders.total.v1".into(), Duration::from_secs(1))],
        identities: None,
        batch: 100,
        held_elsewhere: None,
    };
    // A is gone; B leads.
    drop(a);
    let control_b = db.client().await;
    let b = Leadership::take_over(&control_b, &schema, uuid::Uuid::new_v4())
        .await
        .unwrap();

    let e = op_a.abort_rebuild(&r).await.expect_err("A no longer leads");
    assert!(matches!(e, StoreError::Fenced), "{e:?}");
    let e = op_a.prune(&policy).await.expect_err("A no longer leads");
    assert!(matches!(e, StoreError::Fenced), "{e:?}");
    // Nothing of A's landed: the rebuild still waits to be ended, its shadow table and
    // the claim are still there.
    let client = db.client().await;
    assert_eq!(
        op_a.rebuild_state("orders.total.v2").await.unwrap(),
        Some(RebuildState::Aborting)
    );
    assert_eq!(
        count(
            &client,
            "select count(*) from pg_class where relname = 'order_total__rebuild'"
        )
        .await,
        1
    );
    let claims = "select count(*) from walfold.processed_message";
    assert_eq!(count(&client, claims).await, 1);
    // Without a fence the leader's work is refused outright.
    let mut unbound = Operator::connect(&db.url(), &schema).await.unwrap();
    let e = unbound.abort_rebuild(&r).await.expect_err("no fence bound");
    assert!(matches!(e, StoreError::Refused(_)), "{e:?}");

    let mut op_b = Operator::connect(&db.url(), &schema)
        .await
        .unwrap()
        .leading(b.fence());
    op_b.abort_rebuild(&r).await.unwrap();
    assert_eq!(op_b.prune(&policy).await.unwrap().claims, 1);
    assert_eq!(
        op_b.rebuild_state("orders.total.v2").await.unwrap(),
        Some(RebuildState::Aborted)
    );
    assert_eq!(count(&client, claims).await, 0);
    drop(b);
}

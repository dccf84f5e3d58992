//! A projection edited under the same subscriber (issue 42), with the real `walfold`
//! binary: its `sql` changes across a restart, and by default nothing is folded with
//! the new definition onto the rows the old one built (the daemon stops, saying what
//! differs and what to do); `accept` goes on with it; `rebuild` rebuilds the read model
//! blue/green by itself, the old definition serving until the switch-over; tuning
//! (`batch_size`, `parallelism`) is no change of definition. Expected read models are
//! folded in SQL straight from the event log.

use std::time::Duration;

use walfold_tests::{
    config_builder, count, difference, eventually, free_port, http_get, insert_event,
    subscribers_caught_up, walfold, Daemon, TestDb,
};

/// The running total as first written: every amount counts.
const SUM_ALL: &str = "insert into {table} as t (order_id, total) \
     values (:aggregate_id, coalesce(:payload.amount::numeric, 0)) \
     on conflict (order_id) do update set total = t.total + excluded.total";

/// The running total edited: refunds no longer count (and laid out otherwise).
const SUM_PAID: &str = "
-- refunds are booked elsewhere now
insert into {table} as t (order_id, total)
values (:aggregate_id,
        case when :event_type = 'OrderRefunded' then 0 else coalesce(:payload.amount::numeric, 0) end)
on conflict (order_id) do update set total = t.total + excluded.total";

/// The same as [`SUM_ALL`], in other whitespace and with a comment: no change.
const SUM_ALL_REFORMATTED: &str = "
/* the running total */
insert into {table} as t(order_id,total)
  values ( :aggregate_id , coalesce( :payload.amount::numeric , 0 ) )
  on conflict (order_id) do update set total = t.total + excluded.total ;";

/// The edited fold, done in SQL over the whole log.
const PAID_FROM_LOG: &str = "select aggregate_id, sum(case when event_type = 'OrderRefunded' \
     then 0 else (payload->>'amount')::numeric end) from walfold.event_log group by aggregate_id";

/// The first fold, done in SQL over the whole log.
const ALL_FROM_LOG: &str = "select aggregate_id, sum((payload->>'amount')::numeric) \
     from walfold.event_log group by aggregate_id";

const SUBSCRIBER: &str = "orders.total.v1";

fn config(db: &TestDb, sql: &str, extra: &str) -> String {
    config_builder(&db.url())
        .set("retention", "prune_interval_s", 0)
        .text(&format!(
            "[[projection]]\nname = \"order_total\"\nsubscriber = \"{SUBSCRIBER}\"\n\
             target = \"public.order_total\"\nsql = '''{sql}'''\n{extra}\n"
        ))
        .to_toml()
}

/// `n` events from `from` on: orders o-0..o-9, one in four a refund, amounts 1..7.
fn write(db: &TestDb, from: i64, n: i64) {
    let mut sql = String::new();
    for i in from..from + n {
        let kind = if i % 4 == 3 {
            "OrderRefunded"
        } else {
            "OrderPaid"
        };
        sql.push_str(&insert_event(
            &uuid::Uuid::new_v4().to_string(),
            &format!("o-{}", i % 10),
            kind,
            i + 1,
            &format!(r#"{{"amount": "{}"}}"#, i % 7 + 1),
        ));
    }
    db.psql(&sql);
}

/// The read model, as `order_id=total` pairs in order.
fn totals(db: &TestDb) -> String {
    db.psql("select coalesce(string_agg(order_id || '=' || total, ',' order by order_id), '') from order_total")
}

/// Starts the daemon on `text`, writes `events` and waits until `subscriber` has read
/// them.
async fn run_until(
    db: &TestDb,
    text: &str,
    events: i64,
    subscriber: &str,
) -> (Daemon, tokio_postgres::Client) {
    let (d, client) = Daemon::streaming(db, text).await;
    write(db, 0, events);
    subscribers_caught_up(&client, events, &[subscriber]).await;
    (d, client)
}

/// Stops `d`, writes `text` as its config and starts it again.
fn restart_with(d: &mut Daemon, text: &str) {
    assert_eq!(
        d.terminate(Duration::from_secs(25)),
        Some(0),
        "a clean stop"
    );
    std::fs::write(d.config_path(), text).unwrap();
    d.kill_and_restart(None);
}

/// Edited `sql`, default `on_definition_change`: the daemon stops at once with exit
/// code 2, naming the projection, the difference and the fixes; nothing lands in the
/// read model meanwhile; `doctor` says the same. Put back as it was, it goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_sql_is_refused_with_what_differs_and_the_fix() {
    let db = TestDb::new("defrefuse");
    let (mut d, client) = run_until(&db, &config(&db, SUM_ALL, ""), 40, SUBSCRIBER).await;
    let before = totals(&db);
    assert_eq!(
        difference(&client, "select * from order_total", ALL_FROM_LOG).await,
        0
    );
    let recorded = db.psql(
        "select origin || ' ' || length(digest) from walfold.projection_definition where subscriber_id = 'orders.total.v1'",
    );
    assert_eq!(recorded, "first 64", "recorded on its first start");

    let edited = config(&db, SUM_PAID, "");
    restart_with(&mut d, &edited);
    write(&db, 40, 20);
    let code = d.wait_exit("the refusal").await;
    let log = d.log_text();
    assert_eq!(code, Some(2), "a usage error: {log}");
    for said in [
        "projection order_total: its definition changed since subscriber orders.total.v1",
        "- sql = insert into",
        "+ sql = insert into",
        "on_definition_change = \"rebuild\"",
        "on_definition_change = \"accept\"",
    ] {
        assert!(log.contains(said), "the log says {said:?}: {log}");
    }
    assert_eq!(
        totals(&db),
        before,
        "nothing folded with the new definition"
    );

    let (code, out, err) = walfold(&["doctor", "-c", d.config_path()], &[]);
    assert_ne!(code, 0, "doctor fails on it: {out}{err}");
    assert!(
        out.contains("order_total") && out.contains("+ sql = insert into"),
        "doctor names the change: {out}{err}"
    );

    // Put back: the events written meanwhile are folded by the definition that built
    // the rows.
    std::fs::write(d.config_path(), config(&db, SUM_ALL_REFORMATTED, "")).unwrap();
    d.kill_and_restart(None);
    subscribers_caught_up(&client, 60, &[SUBSCRIBER]).await;
    assert_eq!(
        difference(&client, "select * from order_total", ALL_FROM_LOG).await,
        0
    );
    assert_eq!(d.terminate(Duration::from_secs(25)), Some(0));
}

/// `on_definition_change = "accept"`: the fold goes on with the new definition from
/// where it was, and the acceptance is recorded with who and when.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_change_goes_on_and_is_recorded() {
    let db = TestDb::new("defaccept");
    let (mut d, client) = run_until(&db, &config(&db, SUM_ALL, ""), 40, SUBSCRIBER).await;
    db.psql("create table first_fold as select * from order_total");

    restart_with(
        &mut d,
        &config(&db, SUM_PAID, "on_definition_change = \"accept\""),
    );
    write(&db, 40, 40);
    subscribers_caught_up(&client, 80, &[SUBSCRIBER]).await;
    // The first 40 events by the old fold, the next 40 by the new one.
    let expected = "select order_id, sum(total) from ( \
         select order_id, total from first_fold \
         union all \
         select aggregate_id, case when event_type = 'OrderRefunded' then 0 \
           else (payload->>'amount')::numeric end from walfold.event_log where seq > \
           (select max(seq) from (select seq from walfold.event_log order by seq limit 40) f) \
         ) x group by order_id";
    assert_eq!(
        difference(&client, "select * from order_total", expected).await,
        0,
        "the fold went on with the accepted definition"
    );
    let row = db.psql(
        "select origin || '|' || (accepted_by like '%@% (walfold instance %)')::text \
         from walfold.projection_definition where subscriber_id = 'orders.total.v1'",
    );
    assert_eq!(row, "accepted|true");
    let trail = db.psql(
        "select action || '|' || (diff like '%- sql = %+ sql = %')::text from walfold.definition_change \
         where subscriber_id = 'orders.total.v1'",
    );
    assert_eq!(trail, "accepted|true");
    let (code, out, err) = walfold(&["status", "-c", d.config_path()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("accepted by"),
        "status shows the acceptance: {out}"
    );
    assert_eq!(d.terminate(Duration::from_secs(25)), Some(0));
}

/// `batch_size` and `parallelism` changed, the statement only reformatted: no change
/// of definition; the daemon goes on and the recorded definition stays the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tuning_and_whitespace_are_no_change_of_definition() {
    let db = TestDb::new("deftuning");
    let (mut d, client) = run_until(&db, &config(&db, SUM_ALL, ""), 30, SUBSCRIBER).await;
    let digest = || {
        db.psql("select origin || digest from walfold.projection_definition where subscriber_id = 'orders.total.v1'")
    };
    let first = digest();
    restart_with(
        &mut d,
        &config(
            &db,
            SUM_ALL_REFORMATTED,
            "batch_size = 7\nparallelism = 3\nmax_attempts = 2",
        ),
    );
    write(&db, 30, 30);
    subscribers_caught_up(&client, 60, &[SUBSCRIBER]).await;
    assert!(d.exited().is_none(), "still running: {}", d.log_text());
    assert_eq!(digest(), first);
    assert_eq!(
        difference(&client, "select * from order_total", ALL_FROM_LOG).await,
        0
    );
    assert_eq!(d.terminate(Duration::from_secs(25)), Some(0));
}

/// `on_definition_change = "rebuild"`: a rebuild under `orders.total.v1~DIGEST` starts
/// by itself; until its switch-over the live table is still the old definition's fold
/// (events written meanwhile included); after it, the read model equals the new
/// definition folded over the whole log, and goes on with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_definition_rebuilds_itself_blue_green() {
    let db = TestDb::new("defrebuild");
    let port = free_port();
    let listen = format!("\n[metrics]\nlisten = \"127.0.0.1:{port}\"");
    let (mut d, client) = run_until(&db, &config(&db, SUM_ALL, ""), 6000, SUBSCRIBER).await;

    // A slow replay (10 events a transaction), so the old definition is seen serving.
    restart_with(
        &mut d,
        &config(
            &db,
            SUM_PAID,
            &format!("on_definition_change = \"rebuild\"\nrebuild_batch_size = 10{listen}"),
        ),
    );
    let definitions = || async move {
        let text = tokio::task::spawn_blocking(move || http_get(port, "/metrics").1)
            .await
            .unwrap();
        let mut lines: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("walfold_projection_definition_"))
            .map(|l| {
                // The digest is the test's noise, once it is a short one.
                let mut l = l.to_owned();
                if let Some(at) = l.find("digest=\"") {
                    let end = l[at + 8..].find('"').unwrap() + at + 8;
                    if end - at - 8 == walfold_config::SHORT_DIGEST {
                        l.replace_range(at + 8..end, "DIGEST");
                    }
                }
                l
            })
            .collect();
        lines.sort();
        lines
    };
    let rebuild = || {
        db.psql("select coalesce((select subscriber_id || ' ' || state from walfold.rebuild), '')")
    };
    eventually(Duration::from_secs(30), "the rebuild to start", || async {
        !rebuild().is_empty()
    })
    .await;
    let started = rebuild();
    let new_subscriber = started.split(' ').next().unwrap().to_owned();
    assert!(
        new_subscriber.starts_with("orders.total.v1~") && new_subscriber.len() == 24,
        "{started}"
    );
    write(&db, 6000, 10);
    subscribers_caught_up(&client, 6010, &[SUBSCRIBER]).await;
    assert!(rebuild().ends_with("running"), "{}", rebuild());
    assert_eq!(
        difference(&client, "select * from order_total", ALL_FROM_LOG).await,
        0,
        "until the switch-over the old definition serves, new events included"
    );
    let (code, out, _) = walfold(&["status", "-c", d.config_path()], &[]);
    assert_eq!(code, 0);
    assert!(
        out.contains("definition") && out.contains(&new_subscriber),
        "status shows the definition and its rebuild: {out}"
    );
    let info = |subscriber: &str| {
        format!(
            r#"walfold_projection_definition_info{{projection="order_total",subscriber="{subscriber}",digest="DIGEST",version=""}} 1"#
        )
    };
    let rebuilding = |on| {
        format!(r#"walfold_projection_definition_rebuilding{{projection="order_total"}} {on}"#)
    };
    eventually(
        Duration::from_secs(15),
        "the metrics of the rebuild",
        || async {
            definitions().await == [info(SUBSCRIBER), info(&new_subscriber), rebuilding(1)]
        },
    )
    .await;
    eventually(Duration::from_secs(60), "the switch-over", || async {
        rebuild().ends_with("switched")
    })
    .await;
    eventually(Duration::from_secs(15), "the metrics after it", || async {
        definitions().await == [info(&new_subscriber), rebuilding(0)]
    })
    .await;
    assert_eq!(
        difference(&client, "select * from order_total", PAID_FROM_LOG).await,
        0,
        "the new read model is the new definition's fold of the whole log"
    );
    assert_eq!(
        count(&client, "select count(*) from order_total__retired").await,
        10,
        "the old one is retired beside it"
    );
    write(&db, 6010, 20);
    subscribers_caught_up(&client, 6030, &[&new_subscriber]).await;
    assert_eq!(
        difference(&client, "select * from order_total", PAID_FROM_LOG).await,
        0,
        "and goes on with the new definition"
    );
    // Once is enough: started again, nothing more is rebuilt.
    restart_with(
        &mut d,
        &config(&db, SUM_PAID, "on_definition_change = \"rebuild\""),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        db.psql("select count(*) from walfold.rebuild"),
        "1",
        "{}",
        d.log_text()
    );
    assert_eq!(d.terminate(Duration::from_secs(25)), Some(0));
}

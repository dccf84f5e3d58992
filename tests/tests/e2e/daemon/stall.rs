//! Work that stops moving: a projector whose commit waits behind a lock on its read
//! model, and an ingest whose append waits behind a lock on the event log. `/readyz`
//! answers 503 naming the stalled unit, what it was doing and the lock's holder, and
//! `walfold_projection_stalled` / `walfold_ingest_stalled` say so; both are back once the
//! lock goes. A quiet daemon, longer than the threshold with nothing to do, stays ready.

use std::time::Duration;

use walfold_tests::{caught_up, eventually, free_port, http_get, Daemon, TestDb};

use super::paid;

/// The standard config with `/readyz` on `port` and a 3 s stall threshold.
fn config(db: &TestDb, port: u16) -> String {
    db.config(&format!(
        "\n[metrics]\nlisten = \"127.0.0.1:{port}\"\nready_max_stall_s = 3\n"
    ))
}

/// A session holding `lock` (an SQL `lock table …`) in an open transaction.
async fn holding(db: &TestDb, lock: &str) -> tokio_postgres::Client {
    let client = db.client().await;
    client
        .batch_execute(&format!("begin; {lock}"))
        .await
        .expect("take the lock");
    client
}

/// Waits until `/readyz` answers `code`, and returns its body.
async fn readyz(port: u16, code: u16, within: Duration) -> String {
    let mut last = (0, String::new());
    eventually(within, &format!("/readyz to answer {code}"), || {
        last = http_get(port, "/readyz");
        let done = last.0 == code;
        async move { done }
    })
    .await;
    last.1
}

fn metric(port: u16, line: &str) -> bool {
    http_get(port, "/metrics").1.lines().any(|l| l == line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_projection_stalled_behind_a_lock_until_it_moves() {
    let db = TestDb::new("stallproj");
    let port = free_port();
    let (_d, client) = Daemon::streaming(&db, &config(&db, port)).await;
    db.psql(&(1..=3).map(|n| paid(n, "o-1", "1.00")).collect::<String>());
    caught_up(&client, 3, 3).await;
    readyz(port, 200, Duration::from_secs(10)).await;
    // Quiet for longer than the threshold: nothing is held, so nothing stalls.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (code, body) = http_get(port, "/readyz");
    assert_eq!(code, 200, "a quiet daemon is ready: {body}");
    assert!(metric(
        port,
        "walfold_projection_stalled{subscriber=\"orders.ledger.v1\"} 0"
    ));

    let lock = holding(&db, "lock table ledger in share mode").await;
    db.psql(&paid(4, "o-2", "2.00"));
    let why = readyz(port, 503, Duration::from_secs(20)).await;
    eprintln!("stall: /readyz said {why}");
    assert!(
        why.contains("subscriber orders.ledger.v1 partition 0 has not moved for")
            && why.contains("applying 1 event (seq"),
        "{why}"
    );
    assert!(
        why.contains("lock table ledger in share mode") && why.contains("idle in transaction"),
        "the lock's holder is named: {why}"
    );
    assert!(!why.contains("orders.state.v1"), "{why}");
    assert!(metric(
        port,
        "walfold_projection_stalled{subscriber=\"orders.ledger.v1\"} 1"
    ));
    // The other projections went on.
    assert_eq!(
        db.psql("select status from order_state where order_id = 'o-2'"),
        "paid"
    );

    lock.batch_execute("commit").await.unwrap();
    readyz(port, 200, Duration::from_secs(10)).await;
    caught_up(&client, 4, 3).await;
    assert_eq!(db.psql("select count(*) from ledger"), "4");
    assert!(metric(
        port,
        "walfold_projection_stalled{subscriber=\"orders.ledger.v1\"} 0"
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_an_ingest_stalled_behind_a_lock_until_it_moves() {
    let db = TestDb::new("stallingest");
    let port = free_port();
    let (_d, client) = Daemon::streaming(&db, &config(&db, port)).await;
    db.psql(&paid(1, "o-1", "1.00"));
    caught_up(&client, 1, 3).await;
    readyz(port, 200, Duration::from_secs(10)).await;

    let lock = holding(&db, "lock table walfold.event_log in share mode").await;
    db.psql(&(2..=4).map(|n| paid(n, "o-1", "1.00")).collect::<String>());
    let why = readyz(port, 503, Duration::from_secs(20)).await;
    eprintln!("stall: /readyz said {why}");
    assert!(
        why.contains("ingest of source default has not moved for")
            && why.contains("items the source sent"),
        "{why}"
    );
    assert!(
        why.contains("lock table walfold.event_log in share mode"),
        "the lock's holder is named: {why}"
    );
    assert!(metric(port, "walfold_ingest_stalled{source=\"default\"} 1"));

    lock.batch_execute("commit").await.unwrap();
    readyz(port, 200, Duration::from_secs(10)).await;
    caught_up(&client, 4, 3).await;
    assert!(metric(port, "walfold_ingest_stalled{source=\"default\"} 0"));
}

/// A long transaction that moves is not a stall: one of 3,000 rows appended 200 at a
/// time, each append 1.5 s late (a slow target), takes about 20 s during which the
/// ingest position cannot move (it is one source transaction), yet every append moves
/// it, so `/readyz` stays 200 throughout with a 3 s threshold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_transaction_that_moves_stays_ready() {
    let db = TestDb::new("stallmoving");
    let port = free_port();
    let text = walfold_tests::config_builder(&db.url())
        .set("pipeline", "append_batch_size", 200)
        .text(walfold_tests::PROJECTIONS)
        .text(&format!(
            "\n[metrics]\nlisten = \"127.0.0.1:{port}\"\nready_max_stall_s = 3\n"
        ))
        .to_toml();
    let d = Daemon::start(&text, &[("WALFOLD_FAILPOINTS", "append=sleep:1500")]);
    let client = db.client().await;
    walfold_tests::slot_active(&client).await;
    readyz(port, 200, Duration::from_secs(30)).await;
    db.psql(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         select gen_random_uuid(), 'order', 'o-' || i, 'OrderPaid', 1, \
                jsonb_build_object('status', 'paid', 'amount', '1') \
         from generate_series(1, 3000) as i",
    );
    let started = std::time::Instant::now();
    let mut answers = 0;
    loop {
        let (code, body) = http_get(port, "/readyz");
        assert_eq!(code, 200, "after {:?}: {body}", started.elapsed());
        answers += 1;
        if walfold_tests::count(&client, "select count(*) from walfold.event_log").await == 3000 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "ingest too slow"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!(
        "stall: 3000 rows in one transaction appended in {:?}, /readyz 200 all {answers} times",
        started.elapsed()
    );
    assert!(
        started.elapsed() > Duration::from_secs(6),
        "the appends were slow"
    );
    drop(d);
}

/// Readiness is per holder of work: with two instances sharing the units, a lock on the
/// ledger stalls only the instance that holds its partition; the other stays ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_instance_holding_a_stalled_partition_is_not_ready() {
    let db = TestDb::new("stallshared");
    let (port_a, port_b) = (free_port(), free_port());
    let (a, client) = Daemon::streaming(&db, &config(&db, port_a)).await;
    let b = Daemon::start(&config(&db, port_b), &[]);
    let owners = "select count(distinct u.owner) from walfold.work_unit u \
                  join walfold.instance i on i.id = u.owner \
                  where not u.held and i.heartbeat_at > now() - interval '5 s'";
    eventually(Duration::from_secs(60), "the units to spread", || async {
        walfold_tests::count(&client, owners).await == 2
    })
    .await;
    let holder: i32 = db
        .psql(
            "select i.pid from walfold.work_unit u join walfold.instance i on i.id = u.owner \
             where u.subscriber_id = 'orders.ledger.v1'",
        )
        .parse()
        .unwrap();
    let (stalled, other) = if holder == a.child.id() as i32 {
        (port_a, port_b)
    } else {
        assert_eq!(holder, b.child.id() as i32);
        (port_b, port_a)
    };
    readyz(stalled, 200, Duration::from_secs(20)).await;
    readyz(other, 200, Duration::from_secs(20)).await;

    let lock = holding(&db, "lock table ledger in share mode").await;
    db.psql(&paid(1, "o-1", "1.00"));
    let why = readyz(stalled, 503, Duration::from_secs(20)).await;
    assert!(
        why.contains("subscriber orders.ledger.v1 partition 0 has not moved for"),
        "{why}"
    );
    let (code, body) = http_get(other, "/readyz");
    assert_eq!(
        code, 200,
        "the other instance holds nothing stalled: {body}"
    );
    assert!(metric(
        stalled,
        "walfold_projection_stalled{subscriber=\"orders.ledger.v1\"} 1"
    ));
    assert!(!metric(
        other,
        "walfold_projection_stalled{subscriber=\"orders.ledger.v1\"} 1"
    ));

    lock.batch_execute("commit").await.unwrap();
    readyz(stalled, 200, Duration::from_secs(10)).await;
    caught_up(&client, 1, 3).await;
}

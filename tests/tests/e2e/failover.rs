//! The source fails over: a primary with an async physical standby (`pg_basebackup -R`)
//! under a steady producer, the standby cut off so it falls behind, the primary stopped
//! immediately and the standby promoted. Two daemons follow the same source through a
//! multi-host URL, one with `on_slot_lost = "recreate"`, one with `"stop"`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use walfold_tempdb::{Cluster, Options};
use walfold_tests::{
    caught_up, config_builder, eventually, insert_event, walfold, write_config, Daemon, TestDb,
    PROJECTIONS,
};

/// Writes one-event transactions to `url` until `stop`, reconnecting to `url` when the
/// server goes away (a new primary behind the same multi-host URL).
fn producer(url: String, stop: Arc<AtomicBool>, n: Arc<AtomicU64>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut client = None;
        while !stop.load(Ordering::Relaxed) {
            if client
                .as_ref()
                .is_none_or(tokio_postgres::Client::is_closed)
            {
                client = walfold_pg::connect(&url).await.ok();
                if client.is_none() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
            let c = client.as_ref().unwrap();
            let i = n.load(Ordering::Relaxed) as i64 + 1;
            let r = c
                .execute(
                    "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
                     values (gen_random_uuid(), 'order', 'o-' || ($1::int8 % 7), 'OrderChanged', $1, \
                     jsonb_build_object('status', 's' || $1, 'amount', ($1 % 100)::text))",
                    &[&i],
                )
                .await;
            if r.is_ok() {
                n.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(4)).await;
        }
    })
}

/// What a daemon folded against what the new primary holds.
#[derive(Debug)]
struct Tally {
    committed: i64,
    folded: i64,
    missing: i64,
    doubled: i64,
    phantom: i64,
}

async fn tally(new_primary: &tokio_postgres::Client, target: &TestDb) -> Tally {
    let ids: Vec<uuid::Uuid> = new_primary
        .query("select id from outbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let t = target.client().await;
    let one = |sql: &'static str| {
        let (t, ids) = (&t, &ids);
        async move { t.query_one(sql, &[ids]).await.unwrap().get::<_, i64>(0) }
    };
    Tally {
        committed: ids.len() as i64,
        folded: one("select count(*) from ledger where event_id = any($1::uuid[])").await,
        missing: one("select count(*) from unnest($1::uuid[]) i where not exists (select from ledger l where l.event_id = i)").await,
        // The running sum is right only through its claims: an event applied twice shows.
        doubled: one("select (coalesce((select sum(total) from order_total), 0) - coalesce((select sum(amount) from ledger), 0))::int8 + 0 * cardinality($1::uuid[])").await,
        phantom: one("select count(*) from ledger where not (event_id = any($1::uuid[]))").await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_followed_with_the_gap_from_the_fork_filled_and_nothing_doubled() {
    let primary = Cluster::start(Options::default()).expect("primary");
    let db = primary.create_database("failover").unwrap();
    primary.psql(&db, walfold_tests::SCHEMA).unwrap();
    let standby = primary.standby().expect("standby");
    let url = format!(
        "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    // The stop daemon reads libpq's key=value form, the standby listed first: its SQL
    // and replication sessions alike must pick the primary (setup on the standby would
    // fail, and a standby cannot decode), and its target is key=value too.
    let conninfo = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname={db} \
         target_session_attrs=read-write",
        standby.port(),
        primary.port()
    );
    let (recreate_target, stop_target) = (TestDb::new("fo_recreate"), TestDb::new("fo_stop"));
    let stop_target_conninfo = format!(
        "host=127.0.0.1 port={} user=postgres dbname={}",
        stop_target.cluster.port(),
        stop_target.name
    );
    let config = |url: &str, target: &str, slot: &str, mode: &str| {
        config_builder(url)
            .source("slot", slot)
            .source("on_slot_lost", mode)
            // The slot's horizon (which bounds a gap's backfill) is recorded each period.
            .source("heartbeat_interval_s", 1)
            .set("target", "url", target)
            .set("log", "level", "info")
            .text(PROJECTIONS)
            .to_toml()
    };
    let recreate_cfg = config(&url, &recreate_target.url(), "walfold_recreate", "recreate");
    let stop_cfg = config(&conninfo, &stop_target_conninfo, "walfold_stop", "stop");
    let mut recreate = Daemon::start(&recreate_cfg, &[]);
    let mut stop = Daemon::start(&stop_cfg, &[]);
    let source = walfold_pg::connect(&primary.url(&db)).await.unwrap();
    eventually(Duration::from_secs(30), "both slots streaming", || async {
        source
            .query_one(
                "select count(*) from pg_replication_slots where active",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 2
    })
    .await;

    // Doctor asks each host of the key=value conninfo what it is.
    let (_, out, _) = walfold(
        &["doctor", "-c", write_config(&stop_cfg).to_str().unwrap()],
        &[],
    );
    assert!(
        out.contains(&format!("source host 127.0.0.1:{} is a standby; PostgreSQL 15 keeps no copy of slot walfold_stop", standby.port()))
            && out.contains(&format!("source host 127.0.0.1:{} is the primary", primary.port())),
        "{out}"
    );
    let (halt, written) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let writer = producer(url.clone(), halt.clone(), written.clone());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A checkpoint logs the running transactions: the slots' catalog_xmin moves past
    // the rows written so far, and walfold records it as the horizon a gap's backfill
    // starts from (without it the bound is the slot's creation, and it reads them all).
    primary.psql(&db, "checkpoint").unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    // The standby falls behind; walfold keeps reading the primary.
    standby.detach().unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    primary.stop("immediate").unwrap();
    standby.promote().unwrap();
    // The producer goes on against the new primary: what it writes before the new slot
    // exists is the gap.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    halt.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let new_primary = walfold_pg::connect(&standby.url(&db)).await.unwrap();
    let history = std::fs::read_to_string(standby.data_dir().join("pg_wal/00000002.history"))
        .expect("the promoted standby's timeline history");
    let fork = history.split_whitespace().nth(1).unwrap().to_owned();

    // recreate: follows the new primary by itself, the gap starts at the fork and is
    // backfilled.
    let rt = recreate_target.client().await;
    eventually(
        Duration::from_secs(40),
        "the recreate daemon folds the new primary",
        || async {
            // Every projection caught up: the running sum may lag the ledger (negative);
            // an event applied twice stays positive.
            let t = tally(&new_primary, &recreate_target).await;
            t.missing == 0 && t.doubled >= 0
        },
    )
    .await;
    let r = tally(&new_primary, &recreate_target).await;
    println!("recreate: {r:?}");
    assert_eq!((r.missing, r.doubled), (0, 0), "{r:?}");
    assert_eq!(r.folded, r.committed);
    let gap = rt
        .query_one(
            "select reason, from_lsn::text, to_lsn is not null and to_lsn >= from_lsn, filled_at is not null \
             from walfold.slot_gap",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(gap.get::<_, String>(0), "failover");
    assert_eq!(gap.get::<_, String>(1), fork, "the gap starts at the fork");
    assert!(
        gap.get::<_, bool>(2) && gap.get::<_, bool>(3),
        "closed and filled"
    );
    // The backfill read only rows of transactions that may have committed in the gap:
    // fewer than the table holds, and no fewer than it appended.
    let scan = rt
        .query_one(
            "select scanned, backfilled, since_xid is not null from walfold.slot_gap",
            &[],
        )
        .await
        .unwrap();
    let (scanned, backfilled): (i64, i64) = (scan.get(0), scan.get(1));
    println!(
        "recreate: gap {fork} scanned {scanned} of {} rows, backfilled {backfilled} events",
        r.committed
    );
    assert!(scan.get::<_, bool>(2), "bounded by a recorded horizon");
    assert!(
        backfilled <= scanned && scanned < r.committed,
        "scanned {scanned}, backfilled {backfilled}, {} rows",
        r.committed
    );
    assert!(
        recreate
            .log_text()
            .contains("reading outbox rows of transactions from xid"),
        "{}",
        recreate.log_text()
    );
    let seen = rt
        .query_one(
            "select fork_lsn::text, ingested_lsn > fork_lsn, from_timeline, to_timeline \
             from walfold.source_failover",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(seen.get::<_, String>(0), fork);
    assert_eq!((seen.get::<_, i64>(2), seen.get::<_, i64>(3)), (1, 2));
    assert!(seen.get::<_, bool>(1), "walfold had read past the fork");
    assert!(recreate.exited().is_none(), "{}", recreate.log_text());
    let flagged =
        |t: &TestDb| t.psql("select count(*) from walfold.phantom_event where accepted_at is null");
    assert_eq!(
        flagged(&recreate_target),
        r.phantom.to_string(),
        "every phantom is flagged"
    );
    let path = write_config(&recreate_cfg);
    let (code, out, _) = walfold(&["status", "-c", path.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("phantoms: {}", r.phantom)), "{out}");
    assert!(
        out.contains("slot gaps: 1 ") && out.contains("), 0 open"),
        "{out}"
    );
    let (code, out, _) = walfold(
        &[
            "events",
            "-c",
            path.to_str().unwrap(),
            "--subscriber",
            "orders.ledger.v1",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}");
    let phantoms: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("\"phantom\":true"))
        .collect();
    assert_eq!(
        phantoms.len() as i64,
        r.phantom,
        "events marks each phantom: {}",
        out.lines().last().unwrap_or_default()
    );
    assert!(
        phantoms.iter().all(|l| ["applied", "claimed", "stale"]
            .iter()
            .any(|o| l.contains(&format!("\"outcome\":\"{o}\"")))),
        "and shows the read model it reached: {:?}",
        phantoms.first()
    );
    let (_, out, _) = walfold(&["doctor", "-c", path.to_str().unwrap()], &[]);
    assert!(
        out.contains(&format!("{} phantoms from seq", r.phantom)),
        "{out}"
    );

    // A fold of the log from its start (a new subscriber, as a rebuild reads) skips the
    // phantoms: it equals what the new primary holds.
    recreate.kill();
    recreate_target.psql("create table ledger_after (event_id uuid primary key)");
    let replay = format!(
        "{recreate_cfg}\n[[projection]]\nname = \"ledger_after\"\nsubscriber = \"orders.ledger_after.v1\"\n\
         sql = \"insert into ledger_after (event_id) values (:event_id)\"\n"
    );
    let mut recreate = Daemon::start(&replay, &[]);
    let ids: Vec<uuid::Uuid> = new_primary
        .query("select id from outbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    eventually(Duration::from_secs(30), "the new subscriber folds the log", || async {
        rt.query_one("select count(*) = cardinality($1::uuid[]) and bool_and(event_id = any($1::uuid[])) from ledger_after", &[&ids])
            .await
            .unwrap()
            .get::<_, Option<bool>>(0)
            == Some(true)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        recreate_target.psql("select count(*) from ledger_after"),
        ids.len().to_string(),
        "no phantom reached the new subscriber"
    );

    // `walfold phantoms list` shows each open phantom with the read models it reached;
    // one accepted (with its reason) is no longer counted.
    let (code, out, err) = walfold(
        &["phantoms", "list", "-c", path.to_str().unwrap(), "--json"],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let listed: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.len() as i64, r.phantom);
    assert!(
        listed.iter().all(|p| p["reached"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s == "orders.ledger.v1"))),
        "every phantom shows the ledger it reached: {:?}",
        listed.first()
    );
    let accepted = listed[0]["event_id"].as_str().unwrap().to_owned();
    let (code, out, err) = walfold(
        &[
            "phantoms",
            "accept",
            "-c",
            path.to_str().unwrap(),
            &accepted,
            "--reason",
            "the application deleted its row",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 phantom(s) accepted"), "{out}");
    assert_eq!(flagged(&recreate_target), (r.phantom - 1).to_string());
    // walfold events says which phantom was accepted, and why.
    let (code, out, _) = walfold(&["events", "-c", path.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}");
    let marked: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(r#""accepted_phantom":"the application deleted its row""#))
        .collect();
    assert_eq!(marked.len(), 1, "{marked:?}");
    assert!(marked[0].contains(&accepted) && marked[0].contains(r#""phantom":false"#));
    let (_, out, _) = walfold(&["status", "-c", path.to_str().unwrap()], &[]);
    assert!(
        out.contains(&format!("phantoms: {}", r.phantom - 1)),
        "{out}"
    );
    let (code, out, _) = walfold(
        &["phantoms", "list", "-c", path.to_str().unwrap(), "--all"],
        &[],
    );
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.contains(&accepted) && l.contains("accepted")),
        "{out}"
    );
    // Accepting it again, or an ID that is no phantom, is refused (exit 2).
    let (code, _, err) = walfold(
        &[
            "phantoms",
            "accept",
            "-c",
            path.to_str().unwrap(),
            &accepted,
            "--reason",
            "again",
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");

    // Found by a stranger: a producer whose commit the failover cut off retries it on
    // the new primary, after the check. The same event again confirms its phantom: left
    // open, it would keep that event out of every rebuild.
    let retried = listed[1]["event_id"]
        .as_str()
        .unwrap()
        .parse::<uuid::Uuid>()
        .unwrap();
    let row = rt
        .query_one(
            "select aggregate_type, aggregate_id, event_type, version, payload \
             from walfold.event_log where event_id = $1",
            &[&retried],
        )
        .await
        .unwrap();
    new_primary
        .execute(
            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
             values ($1, $2, $3, $4, $5, $6)",
            &[
                &retried,
                &row.get::<_, String>(0),
                &row.get::<_, String>(1),
                &row.get::<_, String>(2),
                &row.get::<_, Option<i64>>(3),
                &row.get::<_, serde_json::Value>(4),
            ],
        )
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "the retried phantom to be accepted",
        || async {
            rt.query_one(
                "select coalesce(accept_reason, '') from walfold.phantom_event where event_id = $1",
                &[&retried],
            )
            .await
            .unwrap()
            .get::<_, String>(0)
            .starts_with("delivered again by its source after the failover")
        },
    )
    .await;
    assert_eq!(flagged(&recreate_target), (r.phantom - 2).to_string());
    assert!(
        recreate
            .log_text()
            .contains("phantoms delivered again by the new primary"),
        "{}",
        recreate.log_text()
    );

    // stop: refuses, naming the fork; its fix (create the slot, backfill, restart)
    // misses nothing.
    stop.wait_exit("the stop daemon to refuse").await;
    let log = stop.log_text();
    assert!(log.contains(&format!("forking at {fork}")), "{log}");
    new_primary
        .execute(
            "select pg_create_logical_replication_slot('walfold_stop', 'pgoutput')",
            &[],
        )
        .await
        .unwrap();
    let path = write_config(&stop_cfg);
    let (code, out, err) = walfold(
        &[
            "backfill",
            "-c",
            path.to_str().unwrap(),
            "--outbox",
            "public.outbox",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let _stop = Daemon::start(&stop_cfg, &[]);
    eventually(
        Duration::from_secs(30),
        "the stop daemon folds the new primary",
        || async {
            // Every projection caught up: the running sum may lag the ledger (negative);
            // an event applied twice stays positive.
            let t = tally(&new_primary, &stop_target).await;
            t.missing == 0 && t.doubled >= 0
        },
    )
    .await;
    let s = tally(&new_primary, &stop_target).await;
    println!("stop: {s:?}");
    assert_eq!((s.missing, s.doubled), (0, 0), "{s:?}");
    assert_eq!(s.folded, s.committed);
    // The check runs once the gap is filled, beside folding: wait for it.
    eventually(Duration::from_secs(30), "every phantom flagged", || async {
        flagged(&stop_target) == s.phantom.to_string()
    })
    .await;
    // The slot made by hand on the new primary starts past the fork (as one a manager
    // such as Patroni creates after a promotion would): walfold records the range
    // between as a gap from the fork and backfills it.
    assert_eq!(
        stop_target.psql(
            "select reason || ' ' || from_lsn::text || ' ' || (filled_at is not null)::text \
             from walfold.slot_gap"
        ),
        format!("failover {fork} true")
    );
    recreate.kill();

    // Another database under the same slot (its URL pointed at another cluster) is no
    // failover: refused, naming both system identifiers.
    let elsewhere = config_builder(&recreate_target.url())
        .source("slot", "walfold_recreate")
        .source("on_slot_lost", "recreate")
        .set("target", "url", recreate_target.url())
        .text(PROJECTIONS)
        .to_toml();
    let mut wrong = Daemon::start(&elsewhere, &[]);
    wrong
        .wait_exit("the daemon to refuse another database")
        .await;
    assert_eq!(wrong.exited().unwrap().code(), Some(1));
    assert!(
        wrong
            .log_text()
            .contains("another database, not a failover"),
        "{}",
        wrong.log_text()
    );
}

/// A slot that survived at an older position, as Patroni's permanent slots do (a copy
/// on each standby, advanced only as far as it replayed): made for real by copying a
/// slot created early over walfold's own once walfold has read past it. walfold streams
/// from the old position again: what it has is recognised as duplicates, the rest is
/// folded once; doctor notes the slot behind the ingest position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_behind_the_ingest_position_streams_again_without_doubling() {
    let db = TestDb::new("slot_behind");
    let config = db.config("");
    let (mut daemon, client) = Daemon::streaming(&db, &config).await;
    db.psql("select 1 from pg_create_logical_replication_slot('walfold_older', 'pgoutput')");
    let insert = |from: i64, to: i64| {
        (from..=to)
            .map(|i| {
                insert_event(
                    &uuid::Uuid::new_v4().to_string(),
                    &format!("o-{}", i % 5),
                    "OrderChanged",
                    i,
                    &format!("{{\"status\": \"s{i}\", \"amount\": {i}}}"),
                )
            })
            .collect::<String>()
    };
    db.psql(&insert(1, 40));
    caught_up(&client, 40, 3).await;
    daemon.kill();
    eventually(
        Duration::from_secs(20),
        "the slot to be released",
        || async {
            client
                .execute("select pg_drop_replication_slot('walfold')", &[])
                .await
                .is_ok()
        },
    )
    .await;
    db.psql(
        "select 1 from pg_copy_logical_replication_slot('walfold_older', 'walfold'); \
         select pg_drop_replication_slot('walfold_older')",
    );
    let path = write_config(&config);
    let (_, out, _) = walfold(&["doctor", "-c", path.to_str().unwrap()], &[]);
    assert!(out.contains("behind walfold's ingest position"), "{out}");
    assert!(out.contains("is no failover slot (PostgreSQL 15"), "{out}");

    db.psql(&insert(41, 60));
    let _daemon = Daemon::start(&config, &[]);
    caught_up(&client, 60, 3).await;
    let one = |sql: &'static str| {
        let client = &client;
        async move { client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    eventually(
        Duration::from_secs(20),
        "the replay counted as duplicates",
        || async { one("select duplicates from walfold.ingest_position").await >= 40 },
    )
    .await;
    assert_eq!(one("select count(*) from walfold.event_log").await, 60);
    assert_eq!(one("select count(*) from ledger").await, 60);
    assert_eq!(
        one("select (select sum(total) from order_total)::int8 - (select sum(amount) from ledger)::int8").await,
        0,
        "nothing applied twice"
    );
    println!(
        "slot behind: {} duplicates streamed again, 60 events folded once",
        one("select duplicates from walfold.ingest_position").await
    );
}

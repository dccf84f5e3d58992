//! What walfold takes from a server is a budget: however many projections run, the
//! connections it holds stay bounded and the application keeps connecting.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use walfold_tempdb::{Cluster, Options};
use walfold_tests::{config_builder, eventually, insert_event, Daemon, TestDb};

const PROJECTIONS: usize = 60;
const EVENTS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_projections_of_two_partitions_fold_on_a_default_server_beside_the_application() {
    // The server's defaults: 100 connections, 3 of them reserved for superusers.
    let cluster: &'static Cluster = Box::leak(Box::new(
        Cluster::start(Options {
            extra_settings: vec![("max_connections".into(), "100".into())],
            ..Options::default()
        })
        .expect("start a cluster"),
    ));
    let db = TestDb::on(cluster, "budget");
    db.psql(
        "create table folded (projection text, event_id uuid, primary key (projection, event_id))",
    );
    let mut config = config_builder(&db.url()).set("log", "level", "info");
    for p in 0..PROJECTIONS {
        config = config.text(&format!(
            r#"
[[projection]]
name = "p{p}"
subscriber = "budget.p{p}.v1"
parallelism = 2
sql = "insert into folded (projection, event_id) values ('p{p}', :event_id)"
"#
        ));
    }
    let (mut d, _client) = Daemon::streaming(&db, &config.to_toml()).await;

    // The application: connects again and again while walfold starts and folds.
    let stop = tokio_util::sync::CancellationToken::new();
    let refused = Arc::new(AtomicU64::new(0));
    let most_walfold = Arc::new(AtomicI64::new(0));
    let app = {
        let (stop, refused, most) = (stop.clone(), refused.clone(), most_walfold.clone());
        let url = db.url();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
                    Ok((client, conn)) => {
                        let task = tokio::spawn(conn);
                        if let Ok(row) = client
                            .query_one(
                                "select count(*) from pg_stat_activity \
                                 where application_name like 'walfold%' \
                                   and backend_type = 'client backend'",
                                &[],
                            )
                            .await
                        {
                            most.fetch_max(row.get::<_, i64>(0), Ordering::Relaxed);
                        }
                        drop(client);
                        let _ = task.await;
                    }
                    Err(e) => {
                        eprintln!("the application could not connect: {e}");
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    let writes: String = (0..EVENTS)
        .map(|i| {
            insert_event(
                &format!("00000000-0000-4000-8000-{i:012}"),
                &format!("o-{}", i % 17),
                "OrderStatus",
                1,
                "{}",
            )
        })
        .collect();
    db.psql(&writes);
    eventually(
        Duration::from_secs(120),
        "every projection to fold every event",
        || async { db.psql("select count(*) from folded") == (PROJECTIONS * EVENTS).to_string() },
    )
    .await;
    stop.cancel();
    app.await.unwrap();
    assert_eq!(
        db.psql("select count(distinct projection) from folded"),
        PROJECTIONS.to_string()
    );
    assert_eq!(
        refused.load(Ordering::Relaxed),
        0,
        "the application was refused connections"
    );
    let most = most_walfold.load(Ordering::Relaxed);
    // The budget doctor states (the pool of 8, then the instance's control and lease
    // sessions and the one it notifies on, and as the leader the appender lock, the
    // appender and the WAL position's recorder, the planner's and the prune task's) and,
    // the source being this same database, ingest's connections to the source.
    let (code, out, err) = walfold_tests::walfold(&["doctor", "-c", d.config_path()], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            "ok    walfold takes at most 16 connections (target.pool_size + 8 of its own) per instance; \
             the server allows 97 (100 - 3 reserved)"
        ),
        "{out}"
    );
    eprintln!("walfold held {most} connections at most");
    // Two of walfold's sessions on the source are here too: ingest's and the WAL
    // position's.
    assert!(
        (1..=16 + 2).contains(&most),
        "walfold held {most} connections at most"
    );
    assert!(!d.log_text().contains("53300"), "{}", d.log_text());
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

/// `walfold doctor` states what the target's WAL settings cost (full-page images,
/// compression, checkpoints against the event rate) and warns, without failing, when
/// requested checkpoints outnumber the timed ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_the_wal_settings_and_checkpoints_against_the_event_rate() {
    let cluster: &'static Cluster = Box::leak(Box::new(
        Cluster::start(Options {
            extra_settings: vec![("max_wal_size".into(), "32MB".into())],
            ..Options::default()
        })
        .expect("start a cluster"),
    ));
    let db = TestDb::on(cluster, "walcost");
    let config = config_builder(&db.url()).to_toml();
    let (mut d, _client) = Daemon::streaming(&db, &config).await;
    for i in 1..=3 {
        db.psql(&insert_event(
            &format!("00000000-0000-4000-8000-{i:012}"),
            "o-1",
            "OrderPaid",
            i,
            "{}",
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eventually(
        Duration::from_secs(60),
        "three events in the log",
        || async { db.psql("select count(*) from walfold.event_log") == "3" },
    )
    .await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));

    let doctor = || walfold_tests::walfold(&["doctor", "-c", d.config_path()], &[]);
    let (code, out, err) = doctor();
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            "ok    target WAL: full_page_writes = on, wal_compression = off, \
             max_wal_size = 32MB, checkpoint_timeout = 5min; the first change of a page"
        ),
        "{out}"
    );
    let line = out
        .lines()
        .find(|l| l.contains("target checkpoints in the"))
        .unwrap_or_else(|| panic!("no checkpoint line in:\n{out}"));
    assert!(line.starts_with("ok "), "{out}");
    assert!(line.contains("events/s on average"), "{out}");

    // Requested checkpoints (CHECKPOINT here; WAL reaching max_wal_size in a deployment)
    // outnumber the timed ones: a warning with the fix, still no failure.
    for _ in 0..3 {
        db.psql("checkpoint");
    }
    let (code, out, err) = doctor();
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("requested checkpoints dominate") && out.contains("fix: raise max_wal_size"),
        "{out}"
    );
    let warn = out
        .lines()
        .find(|l| l.contains("target checkpoints in the"))
        .unwrap();
    assert!(warn.starts_with("warn"), "{out}");
}

//! What the operator's tools say when a server does not answer or ingest waits.
//!
//! A silent partition (a proxy that accepts and then forwards nothing, as a dropped
//! route or a stuck middlebox does): every operator command answers within seconds,
//! names the server that did not answer and exits non-zero, and the metrics say the
//! source is unreachable instead of repeating its last good values.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use walfold_tests::{
    config_builder, eventually, free_port, http_get, insert_event, slot_active, spawn_walfold,
    Daemon, TestDb, PROJECTIONS,
};

/// A TCP proxy to `127.0.0.1:upstream` that can go silent: while it is, it accepts
/// connections but opens none upstream, and forwards nothing either way.
struct Proxy {
    port: u16,
    silent: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let silent = Arc::new(AtomicBool::new(false));
        let quiet = silent.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let quiet = quiet.clone();
                tokio::spawn(async move {
                    wait_out(&quiet).await;
                    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pump(cr, sw, quiet.clone()), pump(sr, cw, quiet));
                });
            }
        });
        Proxy { port, silent, task }
    }

    fn silence(&self, on: bool) {
        self.silent.store(on, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn wait_out(silent: &AtomicBool) {
    while silent.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    silent: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        wait_out(&silent).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        wait_out(&silent).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Runs `walfold args`; fails the test if it has not exited within 25 s.
async fn answers(args: &[&str]) -> (i32, String) {
    let started = Instant::now();
    let mut child = spawn_walfold(args, &[]);
    let out = walfold_tests::lines_of(child.stdout.take().unwrap());
    let err = walfold_tests::lines_of(child.stderr.take().unwrap());
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code().unwrap_or(-1);
        }
        if started.elapsed() > Duration::from_secs(25) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`walfold {}` hung for 25 s under the partition:\n{}\n{}",
                args.join(" "),
                out.lock().unwrap().join("\n"),
                err.lock().unwrap().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The pipes' last lines.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = format!(
        "{}\n{}",
        out.lock().unwrap().join("\n"),
        err.lock().unwrap().join("\n")
    );
    eprintln!(
        "walfold {} -> {code} in {:.1}s:\n{text}",
        args.join(" "),
        started.elapsed().as_secs_f64()
    );
    (code, text)
}

fn sample(body: &str, series: &str) -> Option<String> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_silent_partition_every_command_names_the_server_that_did_not_answer() {
    let db = TestDb::new("partition");
    let source = Proxy::start(db.cluster.port()).await;
    let target = Proxy::start(db.cluster.port()).await;
    let direct = db.url();
    assert!(direct.contains("postgres@"), "{direct}");
    let via = |p: &Proxy| {
        direct.replace("postgres@", "postgres:hunter2@").replace(
            &format!(":{}/", db.cluster.port()),
            &format!(":{}/", p.port),
        )
    };
    let metrics = free_port();
    let config = config_builder(&via(&source))
        .set("target", "url", via(&target))
        .set("metrics", "listen", format!("127.0.0.1:{metrics}"))
        .text(PROJECTIONS)
        .to_toml();
    let d = Daemon::start(&config, &[]);
    let cfg = d.config_path().to_owned();
    let client = db.client().await;
    slot_active(&client).await;
    db.psql(&insert_event(
        "00000000-0000-4000-8000-000000000001",
        "o-1",
        "OrderPlaced",
        1,
        r#"{"status":"placed","amount":1}"#,
    ));
    eventually(Duration::from_secs(30), "the event to fold", || async {
        db.psql("select count(*) from ledger") == "1"
    })
    .await;
    let reachable = r#"walfold_source_reachable{source="default"}"#;
    eventually(Duration::from_secs(10), "the source reachable", || async {
        sample(&http_get(metrics, "/metrics").1, reachable).as_deref() == Some("1")
    })
    .await;

    // The source goes silent.
    source.silence(true);
    let source_url = format!("postgresql://postgres:***@127.0.0.1:{}/", source.port);
    let (code, text) = answers(&["status", "-c", &cfg]).await;
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("did not answer within") && text.contains(&source_url),
        "{text}"
    );
    assert!(text.contains("unreachable: source default"), "{text}");
    // What the target holds is still shown.
    assert!(text.contains("orders.ledger.v1"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    let (code, text) = answers(&["doctor", "-c", &cfg]).await;
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("source default: did not answer within 5 s") && text.contains(&source_url),
        "{text}"
    );
    // The commands that need only the target do not wait for the source.
    let (code, text) = answers(&["dead-letters", "list", "-c", &cfg]).await;
    assert_eq!(code, 0, "{text}");
    let (code, text) = answers(&["events", "-c", &cfg]).await;
    assert_eq!(code, 0, "{text}");
    // The scrape says the source is unreachable: no slot streams from here, and the
    // time since feedback counts from when the source last answered (the reader's
    // writes into the partition reach nobody).
    eventually(
        Duration::from_secs(20),
        "the scrape to report the source unreachable",
        || async {
            let body = http_get(metrics, "/metrics").1;
            sample(&body, reachable).as_deref() == Some("0")
                && sample(&body, r#"walfold_slot_active{source="default"}"#).as_deref() == Some("0")
                && sample(&body, r#"walfold_seconds_since_feedback{source="default"}"#)
                    .and_then(|s| s.parse::<f64>().ok())
                    .is_some_and(|s| s >= 8.0)
                && sample(&body, "walfold_database_up").as_deref() == Some("1")
        },
    )
    .await;

    // The source answers again; the target goes silent.
    source.silence(false);
    target.silence(true);
    let target_url = format!("postgresql://postgres:***@127.0.0.1:{}/", target.port);
    for args in [
        &["status", "-c", &cfg][..],
        &["doctor", "-c", &cfg],
        &["dead-letters", "list", "-c", &cfg],
        &["events", "-c", &cfg],
    ] {
        let (code, text) = answers(args).await;
        assert_ne!(code, 0, "{text}");
        assert!(
            text.contains("target main: did not answer within 5 s") && text.contains(&target_url),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
    }

    // Healed: the daemon folds again and the source is reachable.
    target.silence(false);
    db.psql(&insert_event(
        "00000000-0000-4000-8000-000000000002",
        "o-1",
        "OrderPaid",
        2,
        r#"{"status":"paid","amount":1}"#,
    ));
    eventually(
        Duration::from_secs(90),
        "folding after the partition",
        || async { db.psql("select count(*) from ledger") == "2" },
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "the source reachable again",
        || async { sample(&http_get(metrics, "/metrics").1, reachable).as_deref() == Some("1") },
    )
    .await;
}

/// `walfold status` says that ingest is paused and why (before, only /readyz and a
/// gauge did), and stops saying it once the cause is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_an_ingest_pause_and_its_cause() {
    let db = TestDb::new("ingestpause");
    let (d, _client) = Daemon::streaming(&db, &db.config("")).await;
    let cfg = d.config_path().to_owned();
    // The target refuses the log's inserts as a revoked grant would (tests run as a
    // superuser, whom no grant binds).
    db.psql(
        "create function walfold.refuse() returns trigger language plpgsql as $$ \
         begin raise exception 'permission denied for table event_log' using errcode = '42501'; end $$; \
         create trigger refuse before insert on walfold.event_log \
         for each row execute function walfold.refuse();",
    );
    db.psql(&insert_event(
        "00000000-0000-4000-8000-000000000001",
        "o-1",
        "OrderPlaced",
        1,
        r#"{"status":"placed","amount":1}"#,
    ));
    eventually(
        Duration::from_secs(30),
        "status to show the pause",
        || async {
            let (_, out, _) = walfold_tests::walfold(&["status", "-c", &cfg], &[]);
            out.contains("INGEST PAUSED since")
                && out.contains("permission denied for table event_log")
        },
    )
    .await;
    let (code, out, err) = walfold_tests::walfold(&["status", "--json", "-c", &cfg], &[]);
    assert_eq!(code, 0, "{out}{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        json["sources"][0]["ingest"]["paused"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("42501")),
        "{out}"
    );
    db.psql("drop trigger refuse on walfold.event_log");
    eventually(Duration::from_secs(30), "the event to fold", || async {
        db.psql("select count(*) from ledger") == "1"
    })
    .await;
    eventually(
        Duration::from_secs(10),
        "status to drop the pause",
        || async {
            let (code, out, _) = walfold_tests::walfold(&["status", "-c", &cfg], &[]);
            code == 0 && !out.contains("INGEST PAUSED")
        },
    )
    .await;
}

//! The daemon keeps its own file descriptors: it raises its soft open-file limit to the
//! hard one, and a flood of connections on the metrics port never starves replication.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use walfold_tests::{eventually, free_port, insert_event, slot_active, Daemon, TestDb};

/// `Max open files` of process `pid`: (soft, hard).
fn open_file_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("read limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("an open-files line");
    let mut fields = line["Max open files".len()..].split_whitespace();
    (
        fields.next().unwrap().to_owned(),
        fields.next().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_open_file_limit_is_raised_to_the_hard_one() {
    let db = TestDb::new("nofile");
    let config = db.config("");
    let d = Daemon::start_under(&["prlimit", "--nofile=256:4096"], &config, &[]);
    slot_active(&db.client().await).await;
    assert_eq!(
        open_file_limits(d.child.id()),
        ("4096".to_owned(), "4096".to_owned()),
        "{}",
        d.log_text()
    );
    let log = d.log_text();
    assert!(
        log.contains("raised the soft limit to the hard limit")
            && log.contains("soft=4096")
            && log.contains("was=256"),
        "{log}"
    );
}

/// Connections a client holds on the metrics port (each reopened a second after the
/// daemon closes it, as a misbehaving agent or a scanner would): enough that a daemon
/// accepting them all at a limit of 1024 runs out while replication reconnects.
const FLOOD: usize = 2000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_on_the_metrics_port_does_not_stop_replication_at_1024_descriptors() {
    // This process holds the flood's sockets itself.
    rlimit::increase_nofile_limit(8192).expect("raise the test's own limit");
    let db = TestDb::new("flood");
    let port = free_port();
    let config = db.config(&format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    let mut d = Daemon::start_under(&["prlimit", "--nofile=1024:1024"], &config, &[]);
    let client = db.client().await;
    slot_active(&client).await;
    db.psql(&insert_event(
        "00000000-0000-4000-8000-000000000001",
        "o-1",
        "OrderPlaced",
        1,
        r#"{"status":"placed","amount":1}"#,
    ));
    eventually(
        Duration::from_secs(30),
        "the first event to fold",
        || async { db.psql("select count(*) from ledger") == "1" },
    )
    .await;

    let stop = tokio_util::sync::CancellationToken::new();
    let open = Arc::new(AtomicUsize::new(0));
    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        let (stop, open) = (stop.clone(), open.clone());
        flood.push(tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            while !stop.is_cancelled() {
                if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                    open.fetch_add(1, Ordering::Relaxed);
                    let mut buf = [0u8; 64];
                    // Held until the daemon closes it (or the test ends).
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = s.read(&mut buf) => {}
                    }
                    open.fetch_sub(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }));
    }
    // Let the flood reach the daemon, then make the reader reconnect in the middle of it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let fds = std::fs::read_dir(format!("/proc/{}/fd", d.child.id())).map_or(0, |d| d.count());
    eprintln!(
        "flood: {} connections open, the daemon has {fds} descriptors",
        open.load(Ordering::Relaxed)
    );
    let pid_before = db.psql(
        "select active_pid from pg_replication_slots where slot_name = 'walfold' \
         and database = current_database()",
    );
    db.psql(&format!("select pg_terminate_backend({pid_before})"));
    let writes: String = (2..=50)
        .map(|i| {
            insert_event(
                &format!("00000000-0000-4000-8000-{i:012}"),
                &format!("o-{}", i % 7),
                "OrderPlaced",
                1,
                r#"{"status":"placed","amount":1}"#,
            )
        })
        .collect();
    db.psql(&writes);
    eventually(
        Duration::from_secs(15),
        "events to fold through a source reconnect under the flood",
        || async { db.psql("select count(*) from ledger") == "50" },
    )
    .await;
    let pid_after = db.psql(
        "select coalesce(active_pid, 0) from pg_replication_slots where slot_name = 'walfold' \
         and database = current_database()",
    );
    assert_ne!(pid_after, pid_before, "the reader reconnected");
    assert_ne!(pid_after, "0", "the reader streams again");
    stop.cancel();
    for f in flood {
        let _ = f.await;
    }
    assert_eq!(walfold_tests::http_get(port, "/healthz").0, 200);
    let log = d.log_text();
    assert!(!log.contains("Too many open files"), "{log}");
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0), "{log}");
}

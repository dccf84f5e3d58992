//! walfold behind PgBouncer (the Debian package), started by each test in front of the
//! throwaway cluster: a pool that shares server sessions (transaction or statement
//! mode) is refused with the fix by `run`, `migrate` and `doctor`; through a session
//! pool walfold migrates and folds end to end; a pooler in front of the source's
//! replication connection stops ingest with the fix; an extra target behind a
//! transaction pool pauses only its projections.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use walfold_tests::{
    caught_up, config_builder, free_port, walfold, write_config, write_events, Daemon, TestDb,
    PROJECTIONS,
};

/// A PgBouncer process in front of the test cluster, stopped on drop.
struct Bouncer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Bouncer {
    /// Starts PgBouncer with `pool_mode = mode` for every database of `db`'s cluster.
    /// Nothing in `ignore_startup_parameters`: walfold must send none it refuses.
    /// `None` when PgBouncer is not installed (see [`pgbouncer`]).
    fn start(db: &TestDb, mode: &str) -> Option<Bouncer> {
        Bouncer::start_on(db, mode, free_port())
    }

    /// [`Bouncer::start`] on `port` (a pooler put back in another mode keeps its URL).
    fn start_on(db: &TestDb, mode: &str, port: u16) -> Option<Bouncer> {
        let bin = pgbouncer()?;
        let dir = std::env::temp_dir().join(format!(
            "walfold-pgbouncer-{}-{port}-{mode}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        let config = dir.join("pgbouncer.ini");
        std::fs::write(
            &config,
            format!(
                "[databases]\n* = host=127.0.0.1 port={}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {users}\npool_mode = {mode}\n\
                 max_client_conn = 500\ndefault_pool_size = 60\n\
                 logfile = {log}\n",
                db.cluster.port(),
                users = dir.join("users.txt").display(),
                log = dir.join("pgbouncer.log").display(),
            ),
        )
        .unwrap();
        let mut cmd = Command::new(bin);
        cmd.arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // PgBouncer refuses to run as root: as root, run it as the postgres OS user (as
        // the cluster itself runs).
        if is_root() {
            let (uid, gid) = (id(&["-u", "postgres"]), id(&["-g", "postgres"]));
            for entry in std::fs::read_dir(&dir).unwrap() {
                std::os::unix::fs::chown(entry.unwrap().path(), Some(uid), Some(gid)).unwrap();
            }
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
            cmd.uid(uid).gid(gid);
        }
        let mut child = cmd.spawn().expect("start pgbouncer");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "pgbouncer exited ({status}): {}",
                    std::fs::read_to_string(dir.join("pgbouncer.log")).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "pgbouncer did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Bouncer { child, port, dir })
    }

    /// `db` through this pooler.
    fn url(&self, db: &TestDb) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/{}", self.port, db.name)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Debian's `pgbouncer`. Missing: the test is skipped with a message, except in CI
/// (`CI=true`), where `.ci/run` installs it and a missing one fails.
fn pgbouncer() -> Option<PathBuf> {
    let found = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "pgbouncer not found in CI: .ci/run installs Debian's `pgbouncer` package"
        );
        eprintln!(
            "SKIPPED: pgbouncer is not installed (apt-get install pgbouncer); in CI this test \
             fails instead"
        );
    }
    found
}

fn is_root() -> bool {
    id(&["-u"]) == 0
}

/// What `id ARGS` prints, as a number.
fn id(args: &[&str]) -> u32 {
    let out = Command::new("id").args(args).output().expect("id");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a numeric id")
}

/// The standard projections with the source at `source` and the target at `target`.
fn config(source: &str, target: &str) -> String {
    config_builder(source)
        .set("target", "url", target)
        .set("log", "level", "info")
        .text(PROJECTIONS)
        .to_toml()
}

/// What every refusal says: what is wrong and the fix.
fn says_pooling_and_fix(text: &str) {
    assert!(
        text.contains("shares server sessions") && text.contains("pool_mode = session"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_pool_is_refused_with_the_fix_by_run_migrate_and_doctor() {
    let db = TestDb::new("txpool");
    let Some(pool) = Bouncer::start(&db, "transaction") else {
        return;
    };
    let text = config(&db.url(), &pool.url(&db));

    // `run` stops at once, as a configuration error, instead of retrying forever.
    let mut d = Daemon::start(&text, &[]);
    let code = d.wait_exit("the daemon to refuse the pooled target").await;
    let log = d.log_text();
    assert_eq!(code, Some(2), "{log}");
    says_pooling_and_fix(&log);
    assert!(!log.contains(":@"), "a password leaked: {log}");
    // Nothing was created through the pool.
    assert_eq!(
        db.psql("select count(*) from pg_namespace where nspname = 'walfold'"),
        "0"
    );

    let path = write_config(&text);
    let (code, out, err) = walfold(&["migrate", "-c", path.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{out}{err}");
    says_pooling_and_fix(&err);

    let (code, out, err) = walfold(&["doctor", "-c", path.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("FAIL  target is behind a pooler that shares server sessions"),
        "{out}"
    );
    assert!(
        out.contains("fix: point target.url at PostgreSQL directly"),
        "{out}"
    );
    assert!(
        out.contains("ok    source keeps a session of its own"),
        "{out}"
    );

    // The source's ordinary connection through the same pool: ingest stops with the fix.
    let mut d = Daemon::start(&config(&pool.url(&db), &db.url()), &[]);
    let code = d.wait_exit("the daemon to refuse the pooled source").await;
    let log = d.log_text();
    assert_eq!(code, Some(2), "{log}\n{}", pool.log());
    says_pooling_and_fix(&log);
    assert!(log.contains("the url of source"), "{log}");
}

/// Issue 44 (3): an extra target behind a transaction pool is wrong for that target
/// only: its projection pauses, loudly (an ERROR with the fix, the paused gauge,
/// `/readyz` naming the target and why), while the main target's projections and ingest
/// go on; once the pooler runs in session mode (same URL, no restart) it folds
/// everything. Before, the daemon stopped with exit code 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_extra_target_pauses_only_its_projections() {
    let db = TestDb::new("xpool");
    let rep = TestDb::new("xpoolrep");
    let Some(pool) = Bouncer::start(&rep, "transaction") else {
        return;
    };
    let port = free_port();
    let text = config_builder(&db.url())
        .set("log", "level", "info")
        .set("metrics", "listen", format!("127.0.0.1:{port}"))
        .text(PROJECTIONS)
        .text(&format!(
            r#"
[targets.reporting]
url = "{}"

[[projection]]
name = "rep_ledger"
subscriber = "rep.ledger.v1"
database = "reporting"
sql = "insert into ledger (event_id, order_id, amount) values (:event_id, :aggregate_id, 0)"
"#,
            pool.url(&rep)
        ))
        .to_toml();
    let mut d = Daemon::start(&text, &[]);
    let client = db.client().await;
    walfold_tests::slot_active(&client).await;
    let expected = write_events(db.url(), 20, 5, 4, Duration::from_millis(5), 44).await;
    caught_up(&client, expected.distinct(), 3).await;
    expected.check(&client).await;
    assert!(
        d.exited().is_none(),
        "the daemon stopped:\n{}",
        d.log_text()
    );
    walfold_tests::eventually(
        Duration::from_secs(30),
        "/readyz to name the target",
        || async {
            let (code, body) = walfold_tests::http_get(port, "/readyz");
            code == 503
                && body.contains("target reporting")
                && body.contains("shares server sessions")
        },
    )
    .await;
    let (_, metrics) = walfold_tests::http_get(port, "/metrics");
    assert!(
        metrics.contains("walfold_projection_paused{subscriber=\"rep.ledger.v1\"} 1"),
        "{metrics}"
    );
    let log = d.log_text();
    assert!(
        log.contains("ERROR") && log.contains("its projections are paused"),
        "{log}"
    );
    says_pooling_and_fix(&log);
    assert_eq!(
        rep.psql("select count(*) from pg_namespace where nspname = 'walfold'"),
        "0",
        "nothing was created through the transaction pool"
    );

    // The pooler in session mode on the same port: the projection resumes by itself.
    let pool_port = pool.port;
    drop(pool);
    let _pool = Bouncer::start_on(&rep, "session", pool_port).expect("pgbouncer");
    let r = rep.client().await;
    let folded = walfold_tests::count(&client, "select count(*) from ledger").await;
    walfold_tests::eventually(
        Duration::from_secs(60),
        "the extra target to fold",
        || async {
            r.query_one("select count(*) from ledger", &[])
                .await
                .is_ok_and(|row| row.get::<_, i64>(0) == folded)
        },
    )
    .await;
    walfold_tests::eventually(Duration::from_secs(30), "/readyz", || async {
        walfold_tests::http_get(port, "/readyz").0 == 200
    })
    .await;
    assert!(d.exited().is_none(), "{}", d.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_pool_is_refused_by_migrate_and_doctor() {
    let db = TestDb::new("stmtpool");
    let Some(pool) = Bouncer::start(&db, "statement") else {
        return;
    };
    let path = write_config(&config(&db.url(), &pool.url(&db)));
    let (code, out, err) = walfold(&["migrate", "-c", path.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{out}{err}");
    says_pooling_and_fix(&err);
    let (code, out, err) = walfold(&["doctor", "-c", path.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("FAIL  target is behind a pooler that shares server sessions"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_session_pool_walfold_migrates_and_folds() {
    let db = TestDb::new("sesspool");
    let Some(pool) = Bouncer::start(&db, "session") else {
        return;
    };
    let text = config(&db.url(), &pool.url(&db));
    let path = write_config(&text);
    let (code, out, err) = walfold(&["doctor", "-c", path.to_str().unwrap()], &[]);
    assert!(
        out.contains("ok    target keeps a session of its own"),
        "{out}{err}"
    );
    assert!(!out.contains("shares server sessions"), "{out}");
    let _ = code;

    // A fresh database: the schema is created through the pool.
    let d = Daemon::start(&text, &[]);
    let client = db.client().await;
    walfold_tests::slot_active(&client).await;
    let expected = write_events(db.url(), 20, 5, 4, Duration::from_millis(5), 24).await;
    caught_up(&client, expected.distinct(), 3).await;
    expected.check(&client).await;
    drop(d);
    // Its target connections did go through the pool.
    assert!(
        pool.log()
            .contains(&format!("login attempt: db={} user=postgres", db.name)),
        "{}",
        pool.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_in_front_of_the_replication_connection_stops_ingest_with_the_fix() {
    let db = TestDb::new("replpool");
    let Some(pool) = Bouncer::start(&db, "session") else {
        return;
    };
    let mut d = Daemon::start(&config(&pool.url(&db), &db.url()), &[]);
    let code = d
        .wait_exit("the daemon to stop on the pooled replication connection")
        .await;
    let log = d.log_text();
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("refused the replication connection")
            && log.contains("point source.url at the server directly"),
        "{log}"
    );
}

/// Found on call: the pooler check connected without a timeout, and ran again on every
/// ingest reconnect (two connections each time). A server that accepts TCP and never
/// answers is given up on within seconds; a URL found to keep its sessions is not
/// checked again by the same process (here: not even once its database refuses new
/// connections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pooler_check_answers_within_seconds_and_runs_once_per_url() {
    // Accepts connections (the kernel's backlog) and never says a word.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "postgresql://postgres@127.0.0.1:{}/x",
        silent.local_addr().unwrap().port()
    );
    let started = Instant::now();
    let checked = tokio::time::timeout(
        Duration::from_secs(20),
        walfold_pg::refuse_pooling(&url, "source.url"),
    )
    .await
    .expect("the pooler check hung on a server that does not answer");
    assert!(checked.is_err(), "{checked:?}");
    assert!(started.elapsed() < Duration::from_secs(12));

    let db = TestDb::new("pooler_once");
    walfold_pg::refuse_pooling(&db.url(), "source.url")
        .await
        .expect("a direct URL keeps its sessions");
    db.cluster
        .psql(
            "postgres",
            &format!("alter database {} allow_connections false", db.name),
        )
        .unwrap();
    let again = walfold_pg::refuse_pooling(&db.url(), "source.url").await;
    db.cluster
        .psql(
            "postgres",
            &format!("alter database {} allow_connections true", db.name),
        )
        .unwrap();
    again.expect("checked again: it connected");
}

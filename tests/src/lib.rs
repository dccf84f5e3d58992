//! Test support for the end-to-end suites: a fresh database per test on the process's
//! throwaway cluster, the standard outbox, configs, and the real `walfold` binary as a
//! child process that tests can SIGTERM or SIGKILL.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use walfold_config::builder::ConfigBuilder;
use walfold_tempdb::Cluster;

/// The outbox the tests write to, and the read models they project into.
pub const SCHEMA: &str = "
create table outbox (
    id uuid, aggregate_type text, aggregate_id text, event_type text,
    version bigint, payload jsonb, headers jsonb, occurred_at timestamptz default now());
create table order_state (order_id text primary key, status text, amount numeric, note text, version bigint not null);
create table order_total (order_id text primary key, total numeric not null default 0);
create table ledger (event_id uuid primary key, order_id text not null, amount numeric not null);
";

/// Takes `pg_logical_emit_message` (every overload) from PUBLIC, so only superusers and
/// roles granted it write message outboxes' events: what walfold needs before it follows
/// a message outbox (docs/SECURITY.md).
pub const REVOKE_PUBLIC_EMIT: &str = "do $$ declare f regprocedure; begin \
     for f in select p.oid::regprocedure from pg_proc p where p.proname = 'pg_logical_emit_message' \
       and p.pronamespace = 'pg_catalog'::regnamespace loop \
       execute format('revoke execute on function %s from public', f); \
     end loop; end $$;";

/// A fresh database on a cluster.
pub struct TestDb {
    pub cluster: &'static Cluster,
    pub name: String,
}

impl TestDb {
    /// A new database with [`SCHEMA`] on the process's shared cluster.
    pub fn new(prefix: &str) -> TestDb {
        Self::on(Cluster::shared(), prefix)
    }

    pub fn on(cluster: &'static Cluster, prefix: &str) -> TestDb {
        let name = cluster.create_database(prefix).expect("create database");
        cluster.psql(&name, SCHEMA).expect("create schema");
        TestDb { cluster, name }
    }

    pub fn url(&self) -> String {
        self.cluster.url(&self.name)
    }

    pub fn psql(&self, sql: &str) -> String {
        self.cluster
            .psql(&self.name, sql)
            .unwrap_or_else(|e| panic!("psql failed: {e}\n{sql}"))
            .trim()
            .to_owned()
    }

    pub async fn client(&self) -> tokio_postgres::Client {
        walfold_pg::connect(&self.url()).await.expect("connect")
    }

    /// A config with three projections: a guarded state upsert (`table`), a running sum
    /// (`sql`, not idempotent on its own: only claims keep it right) and a ledger.
    pub fn config(&self, extra: &str) -> String {
        config_for(&self.url(), extra)
    }
}

/// The three projections of [`SCHEMA`]'s read models: a guarded state upsert (`table`),
/// a running sum (`sql`, right only through its claims) and a ledger.
pub const PROJECTIONS: &str = r#"
[[projection]]
name = "order_state"
subscriber = "orders.state.v1"
table = "public.order_state"
key = "order_id"
version_column = "version"
columns = { status = ":payload.status", amount = ":payload.amount::numeric", note = ":payload.note" }

[[projection]]
name = "order_total"
subscriber = "orders.total.v1"
parallelism = 2
sql = """
insert into order_total (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))
on conflict (order_id) do update set total = order_total.total + excluded.total
"""

[[projection]]
name = "ledger"
subscriber = "orders.ledger.v1"
sql = "insert into ledger (event_id, order_id, amount) values (:event_id, :aggregate_id, coalesce(:payload.amount::numeric, 0))"
"#;

/// The start of every suite's config: `url` as the source, [`SCHEMA`]'s outbox, a short
/// backoff and shutdown.
pub fn config_builder(url: &str) -> ConfigBuilder {
    ConfigBuilder::new(url)
        .outbox_table("public.outbox")
        .set("pipeline", "max_backoff_ms", 1000)
        .set("pipeline", "shutdown_timeout_s", 20)
}

/// The standard config on `url`: [`config_builder`], [`PROJECTIONS`], then `extra`.
pub fn config_for(url: &str, extra: &str) -> String {
    config_builder(url)
        .set("log", "level", "info")
        .text(PROJECTIONS)
        .text(extra)
        .to_toml()
}

/// An outbox insert statement for one event.
pub fn insert_event(
    id: &str,
    aggregate_id: &str,
    event_type: &str,
    version: i64,
    payload: &str,
) -> String {
    format!(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         values ('{id}', 'order', '{aggregate_id}', '{event_type}', {version}, '{payload}');"
    )
}

/// `pg_logical_emit_message(transactional, prefix, content)` as an SQL statement;
/// `content` is an SQL expression (a quoted literal, or `'\x00'::bytea`).
pub fn emit_message(transactional: bool, prefix: &str, content: &str) -> String {
    format!("select 'x' from pg_logical_emit_message({transactional}, '{prefix}', {content});")
}

/// Polls `check` until it is true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out waiting for {what}{}",
            daemon_log_tails()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The walfold binary under test: this package's `walfold-failpoints`, the same source
/// as `walfold` with failpoints compiled in. Cargo builds it before this package's tests.
pub fn walfold_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("walfold-failpoints");
    assert!(
        bin.exists(),
        "{} not found: run the tests through cargo (`cargo nextest run --workspace`)",
        bin.display()
    );
    bin
}

/// A `walfold run` child process.
pub struct Daemon {
    pub child: Child,
    pub log: PathBuf,
    config: PathBuf,
    envs: Vec<(String, String)>,
    /// A command the binary runs under (`prlimit --nofile=1024:1024`), if any.
    wrapper: Vec<String>,
}

/// The logs of the daemons this test process started (nextest runs one test per
/// process): what a timed-out wait prints, so a flake says what the daemon did.
fn started_logs() -> &'static std::sync::Mutex<Vec<PathBuf>> {
    static LOGS: std::sync::OnceLock<std::sync::Mutex<Vec<PathBuf>>> = std::sync::OnceLock::new();
    LOGS.get_or_init(Default::default)
}

/// The last lines of every daemon log this process started, for a failure message.
pub fn daemon_log_tails() -> String {
    let logs = started_logs()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let mut out = String::new();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(40)..];
        out.push_str(&format!(
            "\n--- last lines of {}:\n{}",
            log.display(),
            tail.join("\n")
        ));
    }
    out
}

impl Daemon {
    /// Writes `config` to a temp file and starts `walfold run` on it.
    pub fn start(config: &str, envs: &[(&str, &str)]) -> Daemon {
        Self::start_under(&[], config, envs)
    }

    /// [`Daemon::start`] with the binary run by `wrapper` (which must exec it, as
    /// `prlimit` does, so the child's pid is walfold's).
    pub fn start_under(wrapper: &[&str], config: &str, envs: &[(&str, &str)]) -> Daemon {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("walfold-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("walfold.toml");
        std::fs::write(&path, config).unwrap();
        let wrapper: Vec<String> = wrapper.iter().map(|w| w.to_string()).collect();
        let mut d = Daemon {
            child: spawn(&wrapper, &path, &dir.join("daemon.log"), envs),
            log: dir.join("daemon.log"),
            config: path,
            envs: envs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            wrapper,
        };
        d.log = dir.join("daemon.log");
        started_logs()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(d.log.clone());
        d
    }

    /// Starts `walfold run` on `config` and waits until it streams from the slot.
    pub async fn streaming(db: &TestDb, config: &str) -> (Daemon, tokio_postgres::Client) {
        let d = Daemon::start(config, &[]);
        let client = db.client().await;
        slot_active(&client).await;
        (d, client)
    }

    /// The config file it runs on (for CLI commands beside it).
    pub fn config_path(&self) -> &str {
        self.config.to_str().expect("utf-8 path")
    }

    /// SIGKILL, then start again on the same config (and environment).
    pub fn kill_and_restart(&mut self, envs: Option<&[(&str, &str)]>) {
        self.kill();
        if let Some(e) = envs {
            self.envs = e
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        }
        let envs: Vec<(&str, &str)> = self
            .envs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        self.child = spawn(&self.wrapper, &self.config, &self.log, &envs);
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits for the exit code.
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// The process exited (crashed or stopped) by itself.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits (up to 30 s) for the process to exit by itself; its exit code.
    pub async fn wait_exit(&mut self, what: &str) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                return status.code();
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails the test at once when the binary was built without failpoints.
    pub fn assert_failpoints_compiled(&self) {
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !self.log_text().contains("this build has no failpoints"),
            "the walfold binary lacks failpoints: run the suite with `cargo nextest run --workspace` \
             (the tests package enables the feature for the whole workspace build)"
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(wrapper: &[String], config: &Path, log: &Path, envs: &[(&str, &str)]) -> Child {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(walfold_bin());
            c
        }
        None => Command::new(walfold_bin()),
    };
    cmd.arg("run")
        .arg("-c")
        .arg(config)
        .env_remove("WALFOLD_FAILPOINTS")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn walfold")
}

/// Writes a config to a fresh temp file.
pub fn write_config(text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "walfold-cfg-{}-{}",
        std::process::id(),
        Rng::from_time().next_u64()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("walfold.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `walfold` with `args`, returning (exit code, stdout, stderr).
pub fn walfold(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(walfold_bin());
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run walfold");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Starts `walfold` with `args` as a child with piped standard output and error (for
/// commands that keep running: `--follow`, `--watch`, `--wait`).
pub fn spawn_walfold(args: &[&str], envs: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(walfold_bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn walfold")
}

/// Collects a child's output lines in the background (a pipe read on its own thread).
pub fn lines_of(
    pipe: impl std::io::Read + Send + 'static,
) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

/// walfold's status, read in the test database (schema `walfold`, slot `walfold`).
pub async fn status(client: &tokio_postgres::Client) -> Option<walfold_store::operator::Status> {
    walfold_store::Operator::new(client, &walfold_store::Schema::new("walfold"))
        .status_of_slot(client, "walfold")
        .await
        .ok()
}

/// What a wait that timed out needs to say where the pipeline stands: the outbox and the
/// log, the checkpoints, the ingest position, the slot and its walsender.
pub async fn pipeline_state(client: &tokio_postgres::Client) -> String {
    let queries = [
        ("outbox rows", "select count(*)::text from outbox"),
        (
            "event log",
            "select count(*) || ' events, head ' || coalesce(max(seq), 0) from walfold.event_log",
        ),
        (
            "checkpoints",
            "select coalesce(string_agg(subscriber_id || '[' || partition || ']=' || position, ', ' \
             order by subscriber_id, partition), 'none') from walfold.checkpoint",
        ),
        (
            "ingest",
            "select coalesce(string_agg(source || ' ' || lsn, ', '), 'none') from walfold.ingest_position",
        ),
        (
            "slots",
            "select coalesce(string_agg(slot_name || ' active=' || active || ' confirmed=' \
             || coalesce(confirmed_flush_lsn::text, '-'), ', '), 'none') \
             from pg_replication_slots where database = current_database()",
        ),
        (
            "walsenders",
            "select coalesce(string_agg(state || ' sent=' || coalesce(sent_lsn::text, '-') \
             || ' flushed=' || coalesce(flush_lsn::text, '-'), ', '), 'none') \
             from pg_stat_replication",
        ),
        ("server WAL", "select pg_current_wal_lsn()::text"),
    ];
    let mut out = String::new();
    for (what, sql) in queries {
        let value = match client.query_one(sql, &[]).await {
            Ok(row) => row.get::<_, Option<String>>(0).unwrap_or_default(),
            Err(e) => format!("({e})"),
        };
        out.push_str(&format!("\n  {what}: {value}"));
    }
    out
}

/// Waits until `events` events are in the log (sequence numbers may have gaps) and
/// every subscriber has read all of it.
pub async fn caught_up(client: &tokio_postgres::Client, events: i64, subscribers: usize) {
    log_read_by(client, events, "projections to catch up", |s| {
        s.subscribers.len() >= subscribers && s.subscribers.iter().all(|sub| sub.lag_events == 0)
    })
    .await;
}

/// Waits until `events` events are in the log and each of `subscribers` has read all of
/// it (others may be paused or behind).
pub async fn subscribers_caught_up(
    client: &tokio_postgres::Client,
    events: i64,
    subscribers: &[&str],
) {
    log_read_by(client, events, "these subscribers to catch up", |s| {
        subscribers.iter().all(|name| {
            s.subscribers
                .iter()
                .any(|sub| sub.subscriber == *name && sub.lag_events == 0)
        })
    })
    .await;
}

async fn log_read_by(
    client: &tokio_postgres::Client,
    events: i64,
    what: &str,
    done: impl Fn(&walfold_store::operator::Status) -> bool,
) {
    let in_log = || async {
        client
            .query_one("select count(*) from walfold.event_log", &[])
            .await
            .map_or(0, |r| r.get::<_, i64>(0))
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if in_log().await >= events && status(client).await.is_some_and(|s| done(&s)) {
            return;
        }
        if Instant::now() > deadline {
            // Say which it was: events missing from the log, or projectors behind.
            let lags: Vec<(String, i64)> = status(client)
                .await
                .map(|s| {
                    s.subscribers
                        .into_iter()
                        .map(|sub| (sub.subscriber, sub.lag_events))
                        .collect()
                })
                .unwrap_or_default();
            panic!(
                "timed out waiting for {what}: {} of {events} events in the log; lag per \
                 subscriber {lags:?}{}",
                in_log().await,
                daemon_log_tails()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A count from `sql` (-1 when it fails).
pub async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client
        .query_one(sql, &[])
        .await
        .map_or(-1, |r| r.get::<_, i64>(0))
}

/// Rows of `a` not in `b` plus rows of `b` not in `a`.
pub async fn difference(client: &tokio_postgres::Client, a: &str, b: &str) -> i64 {
    count(
        client,
        &format!("select count(*) from ((({a}) except ({b})) union all (({b}) except ({a}))) d"),
    )
    .await
}

/// A loopback port free now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A plain HTTP/1.1 GET on loopback: (status, body); (0, "") when nothing listens.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    if write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return (0, String::new());
    }
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// A pipeline running in this process.
pub struct InProcess {
    pub cancel: tokio_util::sync::CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), walfold_engine::EngineError>>,
}

impl InProcess {
    pub fn start(config: &str) -> InProcess {
        let config = walfold_config::Config::from_toml(config, Vec::<(String, String)>::new())
            .expect("valid config");
        let cancel = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(walfold_engine::Pipeline::new(config).run(cancel.clone()));
        InProcess { cancel, task }
    }

    /// Starts the pipeline on `config` and waits until it streams from the slot.
    pub async fn streaming(db: &TestDb, config: &str) -> (InProcess, tokio_postgres::Client) {
        let p = InProcess::start(config);
        let client = db.client().await;
        slot_active(&client).await;
        (p, client)
    }

    pub async fn stop(self) {
        self.cancel.cancel();
        self.task
            .await
            .expect("join")
            .expect("pipeline ran cleanly");
    }
}

/// Waits until the pipeline's slot is streaming.
pub async fn slot_active(client: &tokio_postgres::Client) {
    eventually(Duration::from_secs(30), "the slot to be active", || async {
        client
            .query_opt(
                "select 1 from pg_replication_slots where slot_name = 'walfold' and active \
                 and database = current_database()",
                &[],
            )
            .await
            .ok()
            .flatten()
            .is_some()
    })
    .await;
}

/// Events a crash test writes, and what the read models must hold afterwards, computed
/// independently of walfold: a fold over the distinct event IDs.
#[derive(Debug, Default)]
pub struct Expected {
    /// event ID → (order, version, amount in cents)
    pub events: std::collections::BTreeMap<uuid::Uuid, (String, i64, i64)>,
    pub rows_written: u64,
}

impl Expected {
    pub fn distinct(&self) -> i64 {
        self.events.len() as i64
    }

    pub fn total_cents(&self) -> i64 {
        self.events.values().map(|e| e.2).sum()
    }

    /// Checks every read model against the fold.
    pub async fn check(&self, client: &tokio_postgres::Client) {
        let cents = |sql: &str| {
            let sql = sql.to_owned();
            async move {
                let row = client.query_one(&sql, &[]).await.unwrap();
                row.get::<_, Option<i64>>(0).unwrap_or(0)
            }
        };
        assert_eq!(
            cents("select count(*) from walfold.event_log").await,
            self.distinct(),
            "every distinct event is in the log once"
        );
        assert_eq!(cents("select count(*) from ledger").await, self.distinct());
        assert_eq!(
            cents("select (sum(amount) * 100)::int8 from ledger").await,
            self.total_cents(),
            "ledger sum"
        );
        assert_eq!(
            cents("select (sum(total) * 100)::int8 from order_total").await,
            self.total_cents(),
            "sum of amounts over distinct event IDs"
        );
        let mut latest: std::collections::BTreeMap<&str, i64> = Default::default();
        for (order, version, _) in self.events.values() {
            let v = latest.entry(order).or_insert(0);
            *v = (*v).max(*version);
        }
        for row in client
            .query("select order_id, version from order_state", &[])
            .await
            .unwrap()
        {
            let order: String = row.get(0);
            assert_eq!(
                Some(&row.get::<_, i64>(1)),
                latest.get(order.as_str()),
                "{order}"
            );
        }
        assert_eq!(
            cents("select count(*) from order_state").await,
            latest.len() as i64
        );
    }
}

/// A small deterministic PRNG (xorshift64*), so a failing run can be replayed by seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn from_time() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        eprintln!("rng seed {seed}");
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Writes `txns` transactions of `per_txn` outbox rows over `orders` aggregates; about
/// one row in ten repeats an earlier event exactly (a producer retry) and versions run
/// ahead per order, sometimes written out of order within a transaction.
pub async fn write_events(
    url: String,
    txns: usize,
    per_txn: usize,
    orders: u64,
    pause: Duration,
    seed: u64,
) -> Expected {
    let mut client = walfold_pg::connect(&url).await.expect("writer connect");
    let mut rng = Rng(seed | 1);
    let mut expected = Expected::default();
    let mut history: Vec<(uuid::Uuid, String, i64, i64)> = Vec::new();
    let mut versions: std::collections::HashMap<String, i64> = Default::default();
    for _ in 0..txns {
        let mut rows = Vec::new();
        for _ in 0..per_txn {
            if !history.is_empty() && rng.below(10) == 0 {
                let i = rng.below(history.len() as u64) as usize;
                rows.push(history[i].clone());
                continue;
            }
            let order = format!("o-{}", rng.below(orders));
            let v = versions.entry(order.clone()).or_insert(0);
            *v += 1;
            let id = uuid::Uuid::from_u64_pair(rng.next_u64(), rng.next_u64());
            let cents = rng.below(100_000) as i64;
            rows.push((id, order, *v, cents));
        }
        if rows.len() > 1 && rng.below(4) == 0 {
            rows.swap(0, 1);
        }
        let ids: Vec<uuid::Uuid> = rows.iter().map(|r| r.0).collect();
        let orders_col: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
        let versions_col: Vec<i64> = rows.iter().map(|r| r.2).collect();
        let payloads: Vec<serde_json::Value> = rows
            .iter()
            .map(|(_, _, version, cents)| {
                serde_json::json!({
                    "status": format!("v{version}"),
                    "amount": format!("{}.{:02}", cents / 100, cents % 100),
                })
            })
            .collect();
        // One statement is one transaction. If the connection breaks, whether it
        // committed is read back from the outbox (rows are never deleted here).
        let committed = match client
            .execute(
                "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
                 select id, 'order', agg, 'OrderChanged', v, p \
                 from unnest($1::uuid[], $2::text[], $3::int8[], $4::jsonb[]) as r(id, agg, v, p)",
                &[&ids, &orders_col, &versions_col, &payloads],
            )
            .await
        {
            Ok(_) => true,
            Err(_) => loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let Ok(c) = walfold_pg::connect(&url).await else {
                    continue;
                };
                client = c;
                let fresh = rows
                    .iter()
                    .find(|r| !expected.events.contains_key(&r.0))
                    .map(|r| r.0);
                let Some(probe) = fresh else { break true };
                if let Ok(row) = client
                    .query_one("select count(*) from outbox where id = $1", &[&probe])
                    .await
                {
                    break row.get::<_, i64>(0) > 0;
                }
            },
        };
        if committed {
            for row in rows {
                expected.rows_written += 1;
                expected.events.insert(row.0, (row.1.clone(), row.2, row.3));
                history.push(row);
            }
        }
        tokio::time::sleep(pause).await;
    }
    expected
}

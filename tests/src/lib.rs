//! Test support for the end-to-end suites: a fresh database per test on the process's
//! throwaway cluster, the standard outbox, configs, and the real `walfold` binary as a
//! child process that tests can SIGTERM or SIGKILL.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
        walfold_store::connect(&self.url()).await.expect("connect")
    }

    /// A config with three projections: a guarded state upsert (`table`), a running sum
    /// (`sql`, not idempotent on its own: only claims keep it right) and a ledger.
    pub fn config(&self, extra: &str) -> String {
        config_for(&self.url(), extra)
    }
}

pub fn config_for(url: &str, extra: &str) -> String {
    format!(
        r#"
[source]
url = "{url}"

[[outbox]]
table = "public.outbox"

[pipeline]
max_backoff_ms = 1000
shutdown_timeout_s = 20

[log]
level = "info"

[[projection]]
name = "order_state"
subscriber = "orders.state.v1"
table = "public.order_state"
key = "order_id"
version_column = "version"
columns = {{ status = ":payload.status", amount = ":payload.amount::numeric", note = ":payload.note" }}

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
{extra}
"#
    )
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
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `walfold` binary of this workspace build.
pub fn walfold_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("walfold");
    assert!(
        bin.exists(),
        "{} not found: build it with `cargo build -p walfold` (cargo nextest run --workspace does)",
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
}

impl Daemon {
    /// Writes `config` to a temp file and starts `walfold run` on it.
    pub fn start(config: &str, envs: &[(&str, &str)]) -> Daemon {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("walfold-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("walfold.toml");
        std::fs::write(&path, config).unwrap();
        let mut d = Daemon {
            child: spawn(&path, &dir.join("daemon.log"), envs),
            log: dir.join("daemon.log"),
            config: path,
            envs: envs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        d.log = dir.join("daemon.log");
        d
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
        self.child = spawn(&self.config, &self.log, &envs);
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

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(config: &Path, log: &Path, envs: &[(&str, &str)]) -> Child {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut cmd = Command::new(walfold_bin());
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

/// walfold's status, read in the test database (schema `walfold`, slot `walfold`).
pub async fn status(client: &tokio_postgres::Client) -> Option<walfold_store::Status> {
    walfold_store::status(client, client, "walfold", "walfold")
        .await
        .ok()
}

/// Waits until `events` events are in the log and every subscriber has read all of it.
pub async fn caught_up(client: &tokio_postgres::Client, events: i64, subscribers: usize) {
    eventually(
        Duration::from_secs(90),
        "projections to catch up",
        || async {
            match status(client).await {
                Some(s) => {
                    s.event_log_head >= events
                        && s.subscribers.len() >= subscribers
                        && s.subscribers.iter().all(|sub| sub.lag_events == 0)
                }
                None => false,
            }
        },
    )
    .await;
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

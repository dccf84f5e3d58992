//! The benchmark's database: a throwaway cluster tuned for throughput, the outbox, and
//! the external tools (pgbench, pg_recvlogical) that measure the limits.

use std::process::Command;

use walfold_config::Config;
use walfold_event::Lsn;
use walfold_tempdb::{Cluster, Options};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub fn start_cluster(fsync: &str) -> Result<Cluster, BoxError> {
    let settings = [
        ("fsync", fsync),
        ("shared_buffers", "512MB"),
        ("max_wal_size", "8GB"),
        ("checkpoint_timeout", "30min"),
        ("track_commit_timestamp", "on"),
        ("logical_decoding_work_mem", "256MB"),
        ("synchronous_commit", "on"),
    ];
    let mut extra: Vec<(String, String)> = settings
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if statements_enabled() {
        extra.push((
            "shared_preload_libraries".into(),
            "pg_stat_statements".into(),
        ));
        extra.push(("pg_stat_statements.track".into(), "all".into()));
    }
    Ok(Cluster::start(Options {
        tls: false,
        extra_settings: extra,
        ..Options::default()
    })?)
}

/// The history scenario's cluster: `default` is the server's defaults with fsync on
/// (shared_buffers 128MB, max_wal_size 1GB, checkpoint_timeout 5min, full_page_writes
/// on), as a deployment that was never tuned runs; `tuned` is [`start_cluster`]'s.
/// `extra` (`name=value`) is added last, so it wins.
pub fn start_history_cluster(kind: &str, extra: &[String]) -> Result<Cluster, BoxError> {
    let mut settings: Vec<(String, String)> = match kind {
        "tuned" => vec![
            ("shared_buffers", "512MB"),
            ("max_wal_size", "8GB"),
            ("checkpoint_timeout", "30min"),
        ],
        _ => vec![],
    }
    .into_iter()
    .chain([("fsync", "on"), ("synchronous_commit", "on")])
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if statements_enabled() {
        settings.push((
            "shared_preload_libraries".into(),
            "pg_stat_statements".into(),
        ));
        settings.push(("pg_stat_statements.track".into(), "all".into()));
    }
    for kv in extra {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--set {kv}: expected name=value"))?;
        settings.push((k.trim().to_string(), v.trim().to_string()));
    }
    Ok(Cluster::start(Options {
        tls: false,
        extra_settings: settings,
        ..Options::default()
    })?)
}

/// `WALFOLD_BENCH_STATEMENTS=1`: load `pg_stat_statements` and print the busiest
/// statements after the drain (a profiling aid; it slows every scenario a little).
pub fn statements_enabled() -> bool {
    std::env::var_os("WALFOLD_BENCH_STATEMENTS").is_some_and(|v| v == "1")
}

/// The statements that took the most execution time in `db` so far, as a table.
pub fn top_statements(cluster: &Cluster, db: &str) -> Result<String, BoxError> {
    cluster.psql(db, "create extension if not exists pg_stat_statements")?;
    Ok(cluster.psql(
        db,
        "select round(total_exec_time::numeric / 1000, 1) as total_s, calls, \
           round((total_exec_time / calls)::numeric, 2) as ms_per_call, rows, \
           left(regexp_replace(query, '\\s+', ' ', 'g'), 110) as query \
         from pg_stat_statements where dbid = (select oid from pg_database where datname = current_database()) \
         order by total_exec_time desc limit 15",
    )?)
}

pub const OUTBOX: &str = "
create table outbox (
    id uuid not null, aggregate_type text not null, aggregate_id text not null,
    event_type text not null, version bigint, payload jsonb not null,
    occurred_at timestamptz not null default clock_timestamp());
create table order_state (order_id text primary key, status text, amount numeric, version bigint not null);
create table order_sum (order_id text primary key, total numeric not null);
create table applied (event_id uuid primary key);
create publication walfold_outbox for table outbox with (publish = 'insert, truncate');
";

/// A ~200-byte JSON payload built by the server, for row `i`.
pub const PAYLOAD_SQL: &str = "jsonb_build_object('status', 'paid', 'amount', (i % 1000)::text || '.25', \
    'currency', 'EUR', 'customer', md5(i::text), 'sku', md5((i * 7)::text), 'note', repeat('x', 40))";

pub fn create_db(cluster: &Cluster, name: &str) -> Result<(), BoxError> {
    cluster.psql("postgres", &format!("create database {name}"))?;
    cluster.psql(name, OUTBOX)?;
    Ok(())
}

pub fn create_slot(cluster: &Cluster, db: &str, slot: &str) -> Result<(), BoxError> {
    cluster.psql(
        db,
        &format!("select pg_create_logical_replication_slot('{slot}', 'pgoutput')"),
    )?;
    Ok(())
}

/// Writes `rows` outbox rows in 100-row transactions (server-side, no walfold code),
/// over 10 000 aggregates with rising versions.
pub fn write_backlog(cluster: &Cluster, db: &str, rows: u64) -> Result<(), BoxError> {
    write_backlog_from(cluster, db, 0, rows)
}

/// [`write_backlog`] for rows `first..first + rows`: a later backlog whose versions
/// continue the earlier one's, so a guarded upsert applies every event again.
pub fn write_backlog_from(
    cluster: &Cluster,
    db: &str,
    first: u64,
    rows: u64,
) -> Result<(), BoxError> {
    let batches = rows.div_ceil(100);
    cluster.psql(
        db,
        &format!(
            "do $$ begin for b in 0..{last} loop \
               insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
               select gen_random_uuid(), 'order', 'o-' || (i % 10000), 'OrderPaid', i / 10000 + 1, {PAYLOAD_SQL} \
               from generate_series({first} + b * 100, {first} + b * 100 + 99) as i; \
               commit; end loop; end $$;",
            last = batches - 1
        ),
    )?;
    Ok(())
}

/// Seeds `events` earlier events after the log's head, each claimed by both drain
/// projections' subscribers, and moves their checkpoints past them: a deployment's
/// history, written set-based by the server (random event IDs in random order, as the
/// appender's inserts arrive). The one place the bench writes walfold's log and claim
/// layout; a new layout changes this function.
pub fn seed_history(cluster: &Cluster, db: &str, events: u64) -> Result<(), BoxError> {
    cluster.psql(
        db,
        &format!(
            "create temp table seed_head as select coalesce(max(seq), 0) as head from walfold.event_log; \
             insert into walfold.event_log (seq, event_id, aggregate_type, aggregate_id, event_type, \
               version, payload, partition_hash, source_lsn, committed_at, bytes) \
             select head + i, gen_random_uuid(), 'order', 'old-' || (i % 100000), 'OrderPaid', \
               i / 100000 + 1, p.payload, hashtext('old-' || (i % 100000)) & 2147483647, '0/0', \
               now(), length(p.payload::text) \
             from seed_head, generate_series(1, {events}) as i, \
               lateral (select {PAYLOAD_SQL} as payload) as p; \
             insert into walfold.processed_message (subscriber_id, seq, message_id) \
             select s, e.seq, e.event_id from walfold.event_log e, seed_head, \
               unnest(array['bench.state', 'bench.sum']) as s where e.seq > head; \
             update walfold.checkpoint set position = (select max(seq) from walfold.event_log) \
             where subscriber_id in ('bench.state', 'bench.sum'); \
             vacuum analyze walfold.event_log; vacuum analyze walfold.processed_message;"
        ),
    )?;
    Ok(())
}

/// A marker transaction after everything written so far: streams stop there.
pub fn end_marker(cluster: &Cluster, db: &str) -> Result<Lsn, BoxError> {
    let lsn = cluster.psql(
        db,
        "select pg_logical_emit_message(true, 'walfold-bench', 'end')",
    )?;
    Ok(lsn.trim().parse()?)
}

pub fn config(
    cluster: &Cluster,
    db: &str,
    slot: &str,
    projections: &str,
) -> Result<Config, BoxError> {
    let text = format!(
        r#"
[source]
url = "{url}?sslmode=disable"
slot = "{slot}"

[[outbox]]
table = "public.outbox"

[log]
level = "warn"
{projections}
"#,
        url = cluster.url(db)
    );
    // WALFOLD_* overrides apply as for the daemon (e.g. a projection's synchronous_commit).
    let vars: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("WALFOLD_PROJECTION__") && !projections.is_empty())
        .collect();
    Ok(Config::from_toml(&text, vars)?)
}

/// The two projections of the drain scenario: a guarded state upsert and a running sum.
pub const DRAIN_PROJECTIONS: &str = r#"
[[projection]]
name = "state"
subscriber = "bench.state"
table = "public.order_state"
key = "order_id"
version_column = "version"
columns = { status = ":payload.status", amount = ":payload.amount::numeric" }
batch_size = 1000

[[projection]]
name = "sum"
subscriber = "bench.sum"
batch_size = 1000
sql = """
insert into order_sum (order_id, total) values (:aggregate_id, :payload.amount::numeric)
on conflict (order_id) do update set total = order_sum.total + excluded.total
"""
"#;

/// The projection of the latency scenario: one marker row per event.
pub const LATENCY_PROJECTION: &str = r#"
[[projection]]
name = "applied"
subscriber = "bench.applied"
sql = "insert into applied (event_id) values (:event_id)"
"#;

pub fn tool(cluster: &Cluster, name: &str) -> Command {
    Command::new(cluster.bin_dir().join(name))
}

/// Runs pgbench with a script; returns its stdout.
pub fn pgbench(
    cluster: &Cluster,
    db: &str,
    script: &str,
    args: &[&str],
) -> Result<String, BoxError> {
    let dir = std::env::temp_dir().join(format!("walfold-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("script.sql");
    std::fs::write(&path, script)?;
    let out = tool(cluster, "pgbench")
        .args([
            "-n",
            "-h",
            "127.0.0.1",
            "-p",
            &cluster.port().to_string(),
            "-U",
            "postgres",
        ])
        .args(args)
        .arg("-f")
        .arg(&path)
        .arg(db)
        .output()?;
    if !out.status.success() {
        return Err(format!("pgbench failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// pg_recvlogical draining `slot` up to `end` into /dev/null.
pub fn recvlogical(cluster: &Cluster, db: &str, slot: &str, end: Lsn) -> Result<(), BoxError> {
    let status = tool(cluster, "pg_recvlogical")
        .args([
            "-d",
            &format!(
                "host=127.0.0.1 port={} user=postgres dbname={db}",
                cluster.port()
            ),
            "--slot",
            slot,
            "--start",
            "-o",
            "proto_version=1",
            "-o",
            "publication_names=walfold_outbox",
            "-E",
            &end.to_string(),
            "-f",
            "/dev/null",
            "--no-loop",
        ])
        .status()?;
    if !status.success() {
        return Err("pg_recvlogical failed".into());
    }
    Ok(())
}

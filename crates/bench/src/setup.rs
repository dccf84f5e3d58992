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

/// `WALFOLD_BENCH_TIMELINE=1`: print when the rebuild's replay starts, reaches the head
/// and switches over (a profiling aid: it polls on a connection of its own).
pub fn timeline_enabled() -> bool {
    std::env::var_os("WALFOLD_BENCH_TIMELINE").is_some_and(|v| v == "1")
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

/// Records, full-page images and WAL bytes per relation between WAL positions `start`
/// and `end` (from `pg_waldump`; a record counts for the relation of its first block),
/// the most WAL first, as a table. `start` must still be in `pg_wal` (hold it with a
/// physical slot).
pub fn wal_by_relation(
    cluster: &Cluster,
    db: &str,
    start: &str,
    end: &str,
) -> Result<String, BoxError> {
    let out = tool(cluster, "pg_waldump")
        .arg("-p")
        .arg(cluster.data_dir().join("pg_wal"))
        .args(["-s", start, "-e", end])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // relfilenode -> (records, FPI, bytes)
    let mut by_rel: std::collections::HashMap<String, (u64, u64, u64)> = Default::default();
    for line in text.lines() {
        let tot = line
            .split_once("len (rec/tot):")
            .and_then(|(_, r)| r.split(',').next())
            .and_then(|r| r.split('/').nth(1))
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let mut first = true;
        for blk in line.split("blkref #").skip(1) {
            let rel = blk
                .split_once("rel ")
                .and_then(|(_, r)| r.split([' ', ',']).next())
                .and_then(|r| r.rsplit('/').next())
                .unwrap_or("?")
                .to_owned();
            let e = by_rel.entry(rel).or_default();
            if first {
                e.0 += 1;
                e.2 += tot;
                first = false;
            }
            if blk.contains("FPW") {
                e.1 += 1;
            }
        }
        if first && tot > 0 {
            let e = by_rel.entry("(no block)".into()).or_default();
            e.0 += 1;
            e.2 += tot;
        }
    }
    let names = cluster.psql(
        db,
        "select relfilenode || ' ' || relname from pg_class where relfilenode <> 0",
    )?;
    let names: std::collections::HashMap<&str, &str> = names
        .lines()
        .filter_map(|l| l.trim().split_once(' '))
        .collect();
    let mut rows: Vec<_> = by_rel.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1 .2));
    let mut table = format!(
        "{:<40} {:>10} {:>10} {:>14}\n",
        "relation", "records", "FPI", "WAL bytes"
    );
    for (rel, (records, fpi, bytes)) in rows.into_iter().take(15) {
        let name = names.get(rel.as_str()).copied().unwrap_or(rel.as_str());
        table.push_str(&format!("{name:<40} {records:>10} {fpi:>10} {bytes:>14}\n"));
    }
    Ok(table)
}

/// Buffer reads and hits per relation and index of `db` since the last
/// `pg_stat_reset()`, the most blocks first, as a table.
pub fn relation_io(cluster: &Cluster, db: &str) -> Result<String, BoxError> {
    Ok(cluster.psql(
        db,
        "select relname, heap_blks_read, heap_blks_hit, idx_blks_read, idx_blks_hit \
         from pg_statio_user_tables where coalesce(heap_blks_read, 0) + coalesce(heap_blks_hit, 0) \
           + coalesce(idx_blks_read, 0) + coalesce(idx_blks_hit, 0) > 0 \
         union all select indexrelname, null, null, idx_blks_read, idx_blks_hit \
         from pg_statio_user_indexes where idx_blks_read + idx_blks_hit > 0 \
         order by 2 desc nulls last, 4 desc",
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
    write_backlog_from(cluster, db, 0, rows, Ids::Random)
}

/// How producers make their event IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ids {
    /// UUIDv4: random (`gen_random_uuid()`).
    Random,
    /// UUIDv7: a millisecond timestamp, then random bits, as time-ordered IDs
    /// (MassTransit's NewId, Marten, Eventuate and others make IDs in time order too).
    TimeOrdered,
}

impl Ids {
    pub fn parse(s: &str) -> Result<Self, BoxError> {
        match s {
            "v4" => Ok(Ids::Random),
            "v7" => Ok(Ids::TimeOrdered),
            other => Err(format!("unknown ID kind {other}: v4 or v7").into()),
        }
    }

    /// An SQL expression of an event ID made at millisecond `ms` (an SQL `int8`
    /// expression; ignored by random IDs).
    fn sql(self, ms: &str) -> String {
        match self {
            Ids::Random => "gen_random_uuid()".into(),
            Ids::TimeOrdered => format!("bench_uuid_v7({ms})"),
        }
    }
}

/// `bench_uuid_v7(ms)`: a UUIDv7 of Unix millisecond `ms` (48 bits of time, version 7,
/// the rest random). PostgreSQL 15 has no `uuidv7()`.
const UUID_V7: &str = "create or replace function bench_uuid_v7(ms int8) returns uuid \
     language sql volatile as $f$ \
     select encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) \
       placing substring(int8send(ms) from 3) from 1 for 6), 52, 1), 53, 1), 'hex')::uuid $f$";

/// The current time in Unix milliseconds, as SQL.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::int8";

/// [`write_backlog`] for rows `first..first + rows`: a later backlog whose versions
/// continue the earlier one's, so a guarded upsert applies every event again.
pub fn write_backlog_from(
    cluster: &Cluster,
    db: &str,
    first: u64,
    rows: u64,
    ids: Ids,
) -> Result<(), BoxError> {
    let batches = rows.div_ceil(100);
    let id = ids.sql(NOW_MS);
    cluster.psql(
        db,
        &format!(
            "{UUID_V7}; do $$ begin for b in 0..{last} loop \
               insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
               select {id}, 'order', 'o-' || (i % 10000), 'OrderPaid', i / 10000 + 1, {PAYLOAD_SQL} \
               from generate_series({first} + b * 100, {first} + b * 100 + 99) as i; \
               commit; end loop; end $$;",
            last = batches - 1
        ),
    )?;
    Ok(())
}

/// Seeds `events` earlier events after the log's head, each claimed by both drain
/// projections' subscribers, and moves their checkpoints past them: a deployment's
/// history, written set-based by the server (event IDs of kind `ids`, in the order the
/// appender's inserts arrive). The one place the bench writes walfold's log and claim
/// layout; a new layout changes this function.
pub fn seed_history(cluster: &Cluster, db: &str, events: u64, ids: Ids) -> Result<(), BoxError> {
    // Time-ordered IDs: one event per millisecond, the last one now.
    let id = ids.sql(&format!("{NOW_MS} - {events} + i"));
    cluster.psql(
        db,
        &format!(
            "{UUID_V7}; create temp table seed_head as select coalesce(max(seq), 0) as head from walfold.event_log; \
             insert into walfold.event_log (seq, event_id, aggregate_type, aggregate_id, event_type, \
               version, payload, partition_hash, source_lsn, committed_at, bytes) \
             select head + i, {id}, 'order', 'old-' || (i % 100000), 'OrderPaid', \
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

/// Moves `slot`, and walfold's recorded position in it, past everything written so far,
/// as a deployment's slot passed its
/// history long ago: otherwise the next drain's walsender would first decode (and
/// spill) the gigabytes of seeded rows, only to filter them out.
///
/// `pg_replication_slot_advance` moves `confirmed_flush_lsn` at once, but `restart_lsn`
/// (where a walsender starts decoding) only to the restart point the previous decoding
/// had found: one step behind, and while a seeding transaction was running that point
/// is its start. So advance again after a checkpoint (which logs the running
/// transactions: none) until `restart_lsn` has passed the seeding.
pub fn pass_history(cluster: &Cluster, db: &str, slot: &str) -> Result<(), BoxError> {
    let end = cluster.psql(db, "select pg_current_wal_lsn()")?;
    let end = end.trim();
    for _ in 0..5 {
        cluster.psql(db, "checkpoint")?;
        cluster.psql(
            db,
            &format!("select pg_replication_slot_advance('{slot}', pg_current_wal_lsn())"),
        )?;
        let passed = cluster.psql(
            db,
            &format!(
                "select restart_lsn >= '{end}' from pg_replication_slots where slot_name = '{slot}'"
            ),
        )?;
        if passed.trim() == "t" {
            // As walfold would have recorded it, streaming through the history: a slot
            // found past the recorded position is a gap it backfills (setup::advanced).
            cluster.psql(
                db,
                &format!(
                    "update walfold.ingest_position set lsn = s.confirmed_flush_lsn \
                     from pg_replication_slots s where s.slot_name = '{slot}' \
                     and ingest_position.slot = '{slot}'"
                ),
            )?;
            return Ok(());
        }
    }
    Err(format!("slot {slot}'s restart_lsn did not pass the seeding's end {end}").into())
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
    let out = pgbench_command(cluster, db, script, args)?.output()?;
    if !out.status.success() {
        return Err(format!("pgbench failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// pgbench running a script in the background until killed (or its `-T`).
pub fn pgbench_child(
    cluster: &Cluster,
    db: &str,
    script: &str,
    args: &[&str],
) -> Result<std::process::Child, BoxError> {
    Ok(pgbench_command(cluster, db, script, args)?
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?)
}

fn pgbench_command(
    cluster: &Cluster,
    db: &str,
    script: &str,
    args: &[&str],
) -> Result<Command, BoxError> {
    let dir = std::env::temp_dir().join(format!("walfold-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // One file per script: a background run keeps reading its own.
    let path = dir.join(format!("script-{:016x}.sql", hash(script)));
    std::fs::write(&path, script)?;
    let mut cmd = tool(cluster, "pgbench");
    cmd.args([
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
    .arg(db);
    Ok(cmd)
}

fn hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
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

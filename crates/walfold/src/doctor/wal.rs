//! Doctor's report of what the target server's WAL settings cost walfold: every event
//! appends to the log and claims once per subscriber, each a random place in a large
//! index; after each checkpoint the first change of a page writes its full 8 kB image
//! to WAL. Informational: a warning at most, never a failure (docs/BENCHMARKS.md has the
//! measured effect).

use tokio_postgres::Client;
use walfold_pg::RowExt;

use super::{setting, CheckError, Level, Report};

/// Reports `target`'s WAL settings and its checkpoints against the event rate of the
/// log in `schema` (quoted).
pub(super) async fn wal_checks(
    r: &mut Report,
    target: &Client,
    schema: &str,
) -> Result<(), CheckError> {
    let fpw = setting(target, "full_page_writes").await?;
    let compression = setting(target, "wal_compression").await?;
    let max_wal = setting(target, "max_wal_size").await?;
    let timeout = setting(target, "checkpoint_timeout").await?;
    let note = match (fpw.as_str(), compression.as_str()) {
        ("on", "off") => {
            "; the first change of a page after each checkpoint writes its whole \
             image to WAL, uncompressed (wal_compression = lz4 or pglz shrinks them; \
             docs/BENCHMARKS.md has the measured effect)"
        }
        ("off", _) => "; full-page writes off is safe only on storage that never tears a page",
        _ => "",
    };
    r.check(
        Level::Ok,
        format!(
            "target WAL: full_page_writes = {fpw}, wal_compression = {compression}, \
             max_wal_size = {max_wal}, checkpoint_timeout = {timeout}{note}"
        ),
        "",
    );

    let Some(c) = checkpoints(target).await else {
        return Ok(());
    };
    let hours = c.seconds / 3600.0;
    let total = c.timed + c.requested;
    let every = if total > 0 {
        format!(", one every {:.1} min", c.seconds / 60.0 / total as f64)
    } else {
        String::new()
    };
    let rate = event_rate(target, schema).await.ok().flatten();
    let events = match rate {
        Some(rate) => format!("; the event log grew by {rate:.1} events/s on average"),
        None => String::new(),
    };
    let wal = match c.wal_bytes {
        Some(w) if c.seconds > 0.0 => format!(", the server's WAL {:.2} MB/s", w / c.seconds / 1e6),
        _ => String::new(),
    };
    let what = format!(
        "target checkpoints in the {hours:.1} h since the statistics were reset: {} timed, \
         {} requested{every}{events}{wal}",
        c.timed, c.requested
    );
    if c.requested > c.timed && c.requested >= 3 {
        let timeout_s: f64 = numeric_setting(target, "checkpoint_timeout").await?;
        let suggest = c
            .wal_bytes
            .filter(|_| c.seconds > 0.0)
            .map(|w| {
                // A checkpoint starts when the WAL since the last one reaches about
                // max_wal_size / (1 + checkpoint_completion_target): room for twice a
                // timeout's WAL keeps the timed ones in charge.
                let mb = (2.0 * w / c.seconds * timeout_s / 1e6).ceil();
                format!(
                    " to about {} MB (twice a checkpoint_timeout's WAL at this rate)",
                    mb.max(1.0)
                )
            })
            .unwrap_or_default();
        r.check(
            Level::Warn,
            format!(
                "{what}: requested checkpoints dominate, so WAL reaches max_wal_size \
                 ({max_wal}) before checkpoint_timeout ({timeout}) ends, or CHECKPOINT \
                 commands or base backups request them"
            ),
            format!(
                "raise max_wal_size{suggest}: each checkpoint makes the next change of \
                 every page write its full image, so fewer checkpoints write less WAL \
                 per event (a reload, no restart)"
            ),
        );
    } else {
        r.check(Level::Ok, what, "");
    }
    Ok(())
}

struct Checkpoints {
    timed: i64,
    requested: i64,
    /// Since the statistics were reset.
    seconds: f64,
    /// WAL written since pg_stat_wal was reset (PostgreSQL 14+), scaled to `seconds`.
    wal_bytes: Option<f64>,
}

/// Checkpoint counts since their reset: `pg_stat_checkpointer` (PostgreSQL 17+) or
/// `pg_stat_bgwriter`. `None` when neither answers.
async fn checkpoints(c: &Client) -> Option<Checkpoints> {
    let row = match c
        .query_one(
            "select num_timed, num_requested, \
             extract(epoch from now() - stats_reset)::float8 from pg_stat_checkpointer",
            &[],
        )
        .await
    {
        Ok(row) => row,
        Err(_) => c
            .query_one(
                "select checkpoints_timed, checkpoints_req, \
                 extract(epoch from now() - stats_reset)::float8 from pg_stat_bgwriter",
                &[],
            )
            .await
            .ok()?,
    };
    let row = row.of("pg_stat_bgwriter");
    let seconds: f64 = row.col::<Option<f64>>(2).ok()??;
    // The WAL rate over pg_stat_wal's own period, applied to the checkpoints' period.
    let wal_bytes = c
        .query_one(
            "select wal_bytes::float8 / nullif(extract(epoch from now() - stats_reset)::float8, 0) \
             from pg_stat_wal",
            &[],
        )
        .await
        .ok()
        .and_then(|r| r.of("pg_stat_wal").col::<Option<f64>>(0).ok().flatten())
        .map(|per_s| per_s * seconds);
    Some(Checkpoints {
        timed: row.col(0).ok()?,
        requested: row.col(1).ok()?,
        seconds,
        wal_bytes,
    })
}

/// Events per second the log in `schema` grew by, between its oldest kept event and its
/// newest (two index lookups); `None` without a log or with fewer than two events.
async fn event_rate(c: &Client, schema: &str) -> Result<Option<f64>, CheckError> {
    let exists = c
        .query_one(
            "select to_regclass($1) is not null",
            &[&format!("{schema}.event_log")],
        )
        .await?
        .of("pg_class")
        .col::<bool>(0)?;
    if !exists {
        return Ok(None);
    }
    let row = c
        .query_one(
            &format!(
                "with b as (select min(seq) as lo, max(seq) as hi from {schema}.event_log) \
                 select (hi - lo)::float8 / nullif(extract(epoch from \
                   (select appended_at from {schema}.event_log where seq = hi) - \
                   (select appended_at from {schema}.event_log where seq = lo))::float8, 0) \
                 from b"
            ),
            &[],
        )
        .await?;
    Ok(row.of("event_log").col::<Option<f64>>(0)?)
}

/// A setting in its base unit (seconds, kB, …) as `pg_settings` states it.
async fn numeric_setting(c: &Client, name: &str) -> Result<f64, CheckError> {
    let v: String = c
        .query_one("select setting from pg_settings where name = $1", &[&name])
        .await?
        .of("pg_settings")
        .col(0)?;
    Ok(v.parse()?)
}

//! walfold's sessions on a server that wait for a lock, and who holds it: the cause
//! `/readyz` names beside a stalled ingest or partition.

use tokio_postgres::Client;

use crate::error::StoreError;
use walfold_pg::RowExt;

/// Every walfold session (other than this one) waiting for a lock, with each session
/// blocking it, as an operator would look them up.
const LOCK_WAITS: &str = "select w.pid as waiting, \
       coalesce(extract(epoch from now() - w.state_change)::int8, 0) as waited_s, \
       b.pid, coalesce(b.usename::text, '?') as usename, \
       coalesce(b.application_name, '') as application_name, coalesce(b.state, '') as state, \
       coalesce(extract(epoch from now() - b.xact_start)::int8, 0) as xact_age_s, \
       left(coalesce(b.query, ''), 120) as query \
     from pg_stat_activity w \
     cross join lateral unnest(pg_blocking_pids(w.pid)) as blocker(pid) \
     join pg_stat_activity b on b.pid = blocker.pid \
     where w.application_name like 'walfold%' and w.wait_event_type = 'Lock' \
       and w.pid <> pg_backend_pid() \
     order by w.pid, b.pid limit 5";

/// The walfold sessions waiting for a lock on `client`'s server, each with who holds it
/// (`pid 1 waits 12 s for pid 2 (user …, application …, idle in transaction, in a
/// transaction for 40 s: "…")`); empty when none waits.
pub async fn lock_waits(client: &Client) -> Result<Vec<String>, StoreError> {
    let rows = client
        .query(LOCK_WAITS, &[])
        .await
        .map_err(StoreError::db("reading the sessions that wait for a lock"))?;
    rows.iter()
        .map(|row| {
            let columns = row.of("pg_stat_activity");
            Ok(format!(
                "pid {} waits {} s for {}",
                columns.col::<i32>("waiting")?,
                columns.col::<i64>("waited_s")?,
                session(row)?,
            ))
        })
        .collect()
}

/// One session of a `pg_stat_activity` row with the columns `pid`, `usename`,
/// `application_name`, `state`, `xact_age_s` and `query`, as operators look it up: `pid 2
/// (user …, application …, idle in transaction, in a transaction for 40 s: "…")`.
pub(crate) fn session(row: &tokio_postgres::Row) -> Result<String, StoreError> {
    let row = row.of("pg_stat_activity");
    Ok(format!(
        "pid {} (user {}, application {:?}, {}, in a transaction for {} s: {:?})",
        row.col::<i32>("pid")?,
        row.col::<String>("usename")?,
        row.col::<String>("application_name")?,
        row.col::<String>("state")?,
        row.col::<i64>("xact_age_s")?,
        row.col::<String>("query")?,
    ))
}

//! The `instance` table (main target): who runs. Each `walfold run` registers a row,
//! heartbeats it every second, and deletes it when it stops cleanly. Every session its
//! process opens holds the process's tag, an advisory key, shared
//! ([`walfold_pg::tag_sessions`]), so the server can list and end exactly the
//! sessions of one instance.
//!
//! Whether an instance is alive is decided in one place, [`Seen::alive`]: it is dead
//! when silent for longer than the lease, or, sooner, when silent for a moment and none
//! of its sessions is left (it was killed: the server ended its sessions at once). A
//! frozen process, a paused VM or a cut network keeps its sessions open on the server
//! but stops heartbeating: the lease decides. Whoever takes a dead instance's work ends
//! its sessions first ([`end_sessions`]), so none of its open transactions, row locks or
//! advisory locks outlives its lease.

use std::time::Duration;

use tokio_postgres::{Client, GenericClient};
use uuid::Uuid;

use crate::error::StoreError;
use crate::schema::Schema;
use walfold_pg::RowExt;

/// Advisory-lock class of an instance's tag (`'walI'`); the key is the tag.
pub const TAG_CLASS: i32 = walfold_pg::SESSION_TAG_CLASS;

/// How long an instance must have been silent before a missing set of sessions counts
/// as its death: a heartbeat missed, not a reconnect in progress.
const SILENT_AND_GONE: Duration = Duration::from_secs(2);

/// This process as it registers.
#[derive(Debug, Clone)]
pub struct Registration {
    pub id: Uuid,
    pub host: String,
    pub pid: u32,
    pub version: String,
    /// The projections it may run; `None`: every one it knows.
    pub runs: Option<Vec<String>>,
    /// The projections its config defines.
    pub knows: Vec<String>,
    /// Whether it may lead.
    pub leads: bool,
    /// The advisory key every session of its process holds shared.
    pub tag: i32,
}

impl Registration {
    /// Whether this instance runs `projection`.
    pub fn runs(&self, projection: &str) -> bool {
        runs(self.runs.as_deref(), &self.knows, projection)
    }
}

fn runs(filter: Option<&[String]>, knows: &[String], projection: &str) -> bool {
    knows.iter().any(|k| k == projection)
        && filter.is_none_or(|f| f.iter().any(|p| p == projection))
}

/// An instance as the table shows it now.
#[derive(Debug, Clone)]
pub struct Seen {
    pub id: Uuid,
    pub host: String,
    pub pid: i32,
    pub version: String,
    pub runs: Option<Vec<String>>,
    pub knows: Vec<String>,
    pub leads: bool,
    pub tag: i32,
    /// Unix seconds.
    pub started_at: f64,
    /// How long since its last heartbeat.
    pub silence: Duration,
    /// Whether any session of it is connected to the main target.
    pub connected: bool,
}

impl Seen {
    /// Whether this instance counts as alive (see the module docs). `settled`: the
    /// observer has itself been connected for a lease at least, so a missing set of
    /// sessions is not a server restart that everyone is still reconnecting from.
    pub fn alive(&self, lease: Duration, settled: bool) -> bool {
        if self.silence > lease {
            return false;
        }
        !(settled && !self.connected && self.silence > SILENT_AND_GONE)
    }

    /// Whether it may run `projection`.
    pub fn runs(&self, projection: &str) -> bool {
        runs(self.runs.as_deref(), &self.knows, projection)
    }
}

const REGISTER: &str = "insert into {schema}.instance as i \
       (id, host, pid, version, runs, knows, leads, tag) values ($1, $2, $3, $4, $5, $6, $7, $8) \
     on conflict (id) do update set host = excluded.host, pid = excluded.pid, \
       version = excluded.version, runs = excluded.runs, knows = excluded.knows, \
       leads = excluded.leads, tag = excluded.tag, heartbeat_at = now()";

/// A heartbeat; the leader as the row says, so a deposed leader learns it within one.
const HEARTBEAT: &str = "update {schema}.instance set heartbeat_at = now() where id = $1 \
     returning (select owner from {schema}.leader) as leader, \
       (select epoch from {schema}.leader) as epoch";

const SEEN: &str = "select i.id, i.host, i.pid, i.version, i.runs, i.knows, i.leads, i.tag, \
       extract(epoch from i.started_at)::float8 as started_at, \
       greatest(extract(epoch from now() - i.heartbeat_at), 0)::float8 as silence, \
       exists (select 1 from pg_locks l where l.locktype = 'advisory' \
         and l.classid = $1::int4::oid and l.objid = i.tag::oid and l.objsubid = 2 and l.granted) \
         as connected \
     from {schema}.instance i order by i.started_at, i.id";

const LEAVE: &str = "delete from {schema}.instance where id = $1";

/// Rows of instances silent for a day: gone for good.
const FORGET: &str = "delete from {schema}.instance where heartbeat_at < now() - interval '1 day'";

const END_SESSIONS: &str = "select ended, refused from {schema}.end_sessions($1, $2)";

/// Registers (or registers again, after a restart of the server) `me`.
pub async fn register(
    client: &Client,
    schema: &Schema,
    me: &Registration,
) -> Result<(), StoreError> {
    client
        .execute(
            &schema.sql(REGISTER),
            &[
                &me.id,
                &me.host,
                &(me.pid as i32),
                &me.version,
                &me.runs,
                &me.knows,
                &me.leads,
                &me.tag,
            ],
        )
        .await
        .map_err(StoreError::db("registering this instance"))?;
    Ok(())
}

/// What a heartbeat learnt: who leads, at which epoch; `None`: this instance's row was
/// gone (forgotten while it was silent), and it must register again.
pub async fn heartbeat(
    client: &Client,
    schema: &Schema,
    id: &Uuid,
) -> Result<Option<(Option<Uuid>, i64)>, StoreError> {
    let row = client
        .query_opt(&schema.sql(HEARTBEAT), &[id])
        .await
        .map_err(StoreError::db("heartbeating"))?;
    row.map(|r| {
        let r = r.of("leader");
        Ok((r.col("leader")?, r.col("epoch")?))
    })
    .transpose()
}

/// Every registered instance.
pub async fn seen(client: &impl GenericClient, schema: &Schema) -> Result<Vec<Seen>, StoreError> {
    let rows = client
        .query(&schema.sql(SEEN), &[&TAG_CLASS])
        .await
        .map_err(StoreError::db("reading the instances"))?;
    rows.iter()
        .map(|r| {
            let r = r.of("instance");
            Ok(Seen {
                id: r.col("id")?,
                host: r.col("host")?,
                pid: r.col("pid")?,
                version: r.col("version")?,
                runs: r.col("runs")?,
                knows: r.col("knows")?,
                leads: r.col("leads")?,
                tag: r.col("tag")?,
                started_at: r.col("started_at")?,
                silence: Duration::from_secs_f64(r.col::<f64>("silence")?.max(0.0)),
                connected: r.col("connected")?,
            })
        })
        .collect()
}

/// Deletes this instance's row (a clean stop), and rows silent for a day.
pub async fn leave(client: &Client, schema: &Schema, id: &Uuid) -> Result<(), StoreError> {
    client
        .execute(&schema.sql(LEAVE), &[id])
        .await
        .map_err(StoreError::db("deregistering this instance"))?;
    client
        .execute(&schema.sql(FORGET), &[])
        .await
        .map_err(StoreError::db("forgetting long-gone instances"))?;
    Ok(())
}

/// What ending a dead instance's sessions did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ended {
    pub ended: i32,
    /// Sessions this role may not end (another role's, a superuser's).
    pub refused: i32,
}

/// Ends every session of the instance tagged `tag` on the server `client` is connected
/// to (see the module docs). Call it only for an instance found dead.
pub async fn end_sessions(
    client: &impl GenericClient,
    schema: &Schema,
    tag: i32,
) -> Result<Ended, StoreError> {
    let row = client
        .query_one(&schema.sql(END_SESSIONS), &[&TAG_CLASS, &tag])
        .await
        .map_err(StoreError::db("ending a dead instance's sessions"))?;
    let row = row.of("end_sessions");
    Ok(Ended {
        ended: row.col("ended")?,
        refused: row.col("refused")?,
    })
}

/// This machine's name, for `walfold status`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(silence: u64, connected: bool) -> Seen {
        Seen {
            id: Uuid::nil(),
            host: "h".into(),
            pid: 1,
            version: "v".into(),
            runs: None,
            knows: vec!["a".into()],
            leads: true,
            tag: 0,
            started_at: 0.0,
            silence: Duration::from_secs(silence),
            connected,
        }
    }

    #[test]
    fn an_instance_is_dead_when_silent_past_its_lease_or_silent_and_gone() {
        let lease = Duration::from_secs(10);
        assert!(seen(1, true).alive(lease, true));
        assert!(
            seen(9, true).alive(lease, true),
            "frozen but within its lease"
        );
        assert!(!seen(11, true).alive(lease, true), "frozen past its lease");
        assert!(seen(1, false).alive(lease, true), "a reconnect in progress");
        assert!(
            !seen(3, false).alive(lease, true),
            "killed: its sessions are gone"
        );
        assert!(
            seen(3, false).alive(lease, false),
            "everyone reconnecting after a server restart"
        );
    }

    #[test]
    fn what_an_instance_runs_is_what_it_knows_narrowed_by_its_filter() {
        let knows = vec!["a".to_owned(), "b".to_owned()];
        assert!(runs(None, &knows, "a"));
        assert!(!runs(None, &knows, "c"), "not in its config");
        assert!(runs(Some(&["b".to_owned()]), &knows, "b"));
        assert!(
            !runs(Some(&["b".to_owned()]), &knows, "a"),
            "pinned elsewhere"
        );
        assert!(!runs(Some(&[]), &knows, "a"), "runs no projection");
    }
}

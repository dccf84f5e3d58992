//! Leadership: any number of `walfold run` with the same target may run, and all of
//! them work (`work_unit.rs`); one of them also leads: it reads the slot, appends, prunes
//! and plans the units. Leadership is a lease of an instance (`leader.owner`), alive as
//! long as that instance is (`instance.rs`: it heartbeats, and a killed or frozen one is
//! found dead within its lease). An instance takes it over from a dead or departed leader
//! ([`Leadership::try_take`]) by advancing the epoch, compare-and-set on the epoch it saw.
//!
//! A deposed leader may not have noticed yet: its ingest and prune run on other
//! connections. So every write transaction of a leader passes through [`Fence::check`],
//! the one place that proves an owner's right inside a transaction: it takes a shared
//! transaction-level advisory lock on its epoch's key (held until it commits) and reads
//! that `leader.epoch` is still its own. A new leader advances the epoch, then takes the
//! previous epoch's key exclusively on its control session and keeps it while it leads:
//! that waits for every transaction of the old leader holding it (a dead leader's are
//! ended with its sessions), and every later attempt fails at once (a shared request
//! conflicts with the holder and with a queued exclusive request). A leader deposed
//! earlier still finds another epoch in the row. So whatever the old leader commits lands
//! before the new leader starts, and nothing after. All in memory: no row lock, no WAL on
//! the hot path. Work units are fenced the same way, with their token for the epoch.
//!
//! Releases before the lease hold a session-level advisory lock instead (`LEADER_LOCK`):
//! one found holding it leads by the old rules, so this release leads nothing beside it
//! ([`Attempt::Older`]); one that tries to lead a migrated schema is refused by the
//! `leader_refuse_older` trigger with the fix.

use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::error::StoreError;
use crate::schema::Schema;
use walfold_pg::RowExt;

/// Advisory-lock class of the session lock releases before the lease took (`'walL'`);
/// the key is the schema's hash.
const LEADER_LOCK: i32 = 0x7761_6c4c;

/// What a fence proves is held, for the log.
#[derive(Debug, Clone)]
pub(crate) enum Holds {
    Leadership,
    /// A work unit, by name (`subscriber[partition]`).
    Unit(String),
}

/// An owner's fencing token (the leader's, or a work unit owner's), for every write
/// transaction it makes.
#[derive(Debug, Clone)]
pub struct Fence {
    check: std::sync::Arc<str>,
    key: EpochKey,
    lost: CancellationToken,
    /// Where the check runs, for the log: `main target`, or an extra target's URL
    /// (password masked) and schema.
    place: std::sync::Arc<str>,
    holds: Holds,
}

/// An epoch and its advisory-lock key: (hashtext(schema), epoch as int4; epochs wrap
/// after 2^32 takeovers, which only the row comparison has to tell apart).
#[derive(Debug, Clone, Copy)]
pub(crate) struct EpochKey {
    pub(crate) epoch: i64,
    pub(crate) class: i32,
}

impl EpochKey {
    pub(crate) fn objid(self) -> i32 {
        self.epoch as i32
    }
}

impl Fence {
    pub(crate) fn new(
        check: String,
        key: EpochKey,
        lost: CancellationToken,
        place: String,
        holds: Holds,
    ) -> Fence {
        Fence {
            check: check.into(),
            key,
            lost,
            place: place.into(),
            holds,
        }
    }

    /// Fails the transaction `tx` unless this owner still holds what it holds (see the
    /// module docs). Call it in every write transaction, before its commit. A failed
    /// check also marks what it holds lost, so everything under it stops at once.
    pub async fn check(&self, tx: &impl GenericClient) -> Result<(), StoreError> {
        let row = tx
            .query_typed_one(
                &self.check,
                &[
                    (&self.key.class, Type::INT4),
                    (&self.key.objid(), Type::INT4),
                    (&self.key.epoch, Type::INT8),
                ],
            )
            .await
            .map_err(StoreError::db("checking leadership"))?;
        self.verdict(row.of("leader").col("leads")?)
    }

    /// The check prepared on `client`, for a connection's hot path (no parse per call).
    pub async fn prepare(&self, client: &Client) -> Result<PreparedFence, StoreError> {
        let statement = client
            .prepare_typed(&self.check, &[Type::INT4, Type::INT4, Type::INT8])
            .await
            .map_err(StoreError::db("preparing the leadership check"))?;
        Ok(PreparedFence {
            fence: self.clone(),
            statement,
        })
    }

    fn verdict(&self, leads: bool) -> Result<(), StoreError> {
        if !leads {
            match &self.holds {
                Holds::Leadership => {
                    tracing::warn!(fence = %self.place, epoch = self.key.epoch, "a write transaction was refused: another instance leads; standing down")
                }
                Holds::Unit(unit) => {
                    tracing::info!(fence = %self.place, unit = %unit, token = self.key.epoch, "a write transaction was refused: another instance owns this work unit now; stopping it")
                }
            }
            self.lost.cancel();
            return Err(StoreError::Fenced);
        }
        Ok(())
    }

    /// Whether `other` checks exactly what this fence checks (same schema, key and
    /// epoch): a check prepared for one may stand in for the other.
    pub fn same_as(&self, other: &Fence) -> bool {
        self.key.epoch == other.key.epoch
            && self.key.class == other.key.class
            && self.check == other.check
    }

    /// The epoch (or token) this fence proves.
    pub fn epoch(&self) -> i64 {
        self.key.epoch
    }

    /// Fires when what this fence proves is lost.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Marks leadership lost: a newer leader has been seen (the caller says where).
    pub(crate) fn deposed(&self) -> StoreError {
        self.lost.cancel();
        StoreError::Fenced
    }

    /// This leader's fence on another walfold schema (an extra target's, taken over by
    /// [`Fence::extend_to`]): the same epoch, under that schema's key class, checked
    /// against that schema's `leader` row.
    pub(crate) fn on_schema(&self, schema: &Schema, class: i32, place: String) -> Fence {
        Fence {
            check: fence_sql(schema).into(),
            key: EpochKey {
                epoch: self.key.epoch,
                class,
            },
            lost: self.lost.clone(),
            place: place.into(),
            holds: self.holds.clone(),
        }
    }
}

/// The one statement that proves leadership inside a transaction (see the module docs):
/// the shared lock on key (`$1`, `$2`) and epoch `$3` still recorded.
const FENCE: &str = "select pg_try_advisory_xact_lock_shared($1, $2) \
     and exists (select 1 from {schema}.leader where epoch = $3) as leads";

/// Advances the leader epoch from `$3` for instance `$2`; returns it with the schema's
/// key class (`hashtext($1)`).
const ADVANCE: &str = "update {schema}.leader set epoch = epoch + 1, owner = $2, \
       lead_token = gen_random_uuid(), pid = pg_backend_pid(), acquired_at = now() \
     where epoch = $3 returning epoch, hashtext($1) as class";

/// The leader as the row shows it.
const LEADER: &str = "select epoch, owner from {schema}.leader";

/// A session of a release before the lease that holds the leader lock: it leads.
const OLDER: &str = "select l.pid from pg_locks l where l.locktype = 'advisory' \
       and l.classid = $1::int4::oid and l.objid = hashtext($2)::oid and l.objsubid = 2 \
       and l.granted limit 1";

/// Gives leadership up (a clean stop): the next leader takes it without waiting.
const RELEASE: &str = "update {schema}.leader set owner = null where owner = $1 and epoch = $2";

/// The backend pid of an older release's leader (one holding the session-level leader
/// lock releases before the lease took), while one leads `schema`: status and doctor
/// say so, since such an instance appends but applies nothing on a migrated schema.
pub async fn older_release_leader(
    client: &Client,
    schema: &Schema,
) -> Result<Option<i32>, StoreError> {
    match client
        .query_opt(&schema.sql(OLDER), &[&LEADER_LOCK, &schema.name()])
        .await
        .map_err(StoreError::db("looking for an older release's leader lock"))?
    {
        Some(row) => Ok(Some(row.of("pg_locks").col("pid")?)),
        None => Ok(None),
    }
}

/// [`FENCE`] for `schema`.
fn fence_sql(schema: &Schema) -> String {
    schema.sql(FENCE)
}

/// [`Fence::check`] prepared on one connection.
#[derive(Debug, Clone)]
pub struct PreparedFence {
    fence: Fence,
    statement: tokio_postgres::Statement,
}

impl PreparedFence {
    /// Whether this check was prepared for `fence`.
    pub fn is_for(&self, fence: &Fence) -> bool {
        self.fence.same_as(fence)
    }

    /// [`Fence::check`], on the connection it was prepared on.
    pub async fn check(&self, tx: &impl GenericClient) -> Result<(), StoreError> {
        let key = &self.fence.key;
        let row = tx
            .query_one(&self.statement, &[&key.class, &key.objid(), &key.epoch])
            .await
            .map_err(StoreError::db("checking leadership"))?;
        self.fence.verdict(row.of("leader").col("leads")?)
    }
}

/// The `leader` row: who leads, at which epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderRow {
    pub epoch: i64,
    /// The instance that leads; `None`: nobody (released, or never taken).
    pub owner: Option<Uuid>,
}

/// Reads the `leader` row.
pub async fn leader_row(
    client: &impl GenericClient,
    schema: &Schema,
) -> Result<LeaderRow, StoreError> {
    let row = client
        .query_one(&schema.sql(LEADER), &[])
        .await
        .map_err(StoreError::db("reading the leader"))?;
    let row = row.of("leader");
    Ok(LeaderRow {
        epoch: row.col("epoch")?,
        owner: row.col("owner")?,
    })
}

/// Held leadership: its fence, and the previous epoch's key that the control session
/// holds while this instance leads.
pub struct Leadership {
    fence: Fence,
    previous: EpochKey,
}

/// How an attempt to lead ended.
pub enum Attempt {
    Leads(Leadership),
    /// Another instance changed the leader first.
    Lost,
    /// A release before the lease leads (the backend `pid` on the target holds its lock):
    /// this release leads nothing beside it.
    Older {
        pid: i32,
    },
}

impl Leadership {
    /// One attempt by instance `me`, on its control session `control` (tagged, on the
    /// main target), to lead after `seen`, whose owner is gone: dead (its sessions,
    /// tagged `dead`, are ended if they keep the previous epoch's key), departed, or
    /// nobody. Waits for the previous leader's transactions in flight.
    pub async fn try_take(
        control: &Client,
        schema: &Schema,
        me: Uuid,
        seen: LeaderRow,
        dead: Option<i32>,
    ) -> Result<Attempt, StoreError> {
        if let Some(pid) = older_release_leader(control, schema).await? {
            return Ok(Attempt::Older { pid });
        }
        let Some(row) = control
            .query_opt(&schema.sql(ADVANCE), &[&schema.name(), &me, &seen.epoch])
            .await
            .map_err(StoreError::db("advancing the leader epoch"))?
        else {
            return Ok(Attempt::Lost);
        };
        let row = row.of("leader");
        let key = EpochKey {
            epoch: row.col("epoch")?,
            class: row.col("class")?,
        };
        let previous = EpochKey {
            epoch: seen.epoch,
            ..key
        };
        // Waits until the previous leader's in-flight write transactions have ended; held
        // while this instance leads, so none of its transactions can pass again.
        while !crate::work_unit::lock_exclusively(control, schema, previous, dead, "main target")
            .await?
        {
            tracing::warn!(
                schema = schema.name(),
                "waiting for the previous leader's transactions to end before taking over"
            );
        }
        tracing::info!(
            schema = schema.name(),
            epoch = key.epoch,
            "leading: this instance reads the slot, prunes and plans the work units"
        );
        Ok(Attempt::Leads(Leadership {
            fence: Fence::new(
                fence_sql(schema),
                key,
                CancellationToken::new(),
                "main target".into(),
                Holds::Leadership,
            ),
            previous,
        }))
    }

    /// Leads for instance `me` on `control` whoever led before: for tests and tools that
    /// know the previous leader is gone (its transactions in flight are waited for).
    pub async fn take_over(
        control: &Client,
        schema: &Schema,
        me: Uuid,
    ) -> Result<Leadership, StoreError> {
        loop {
            let row = leader_row(control, schema).await?;
            match Self::try_take(control, schema, me, row, None).await? {
                Attempt::Leads(l) => return Ok(l),
                Attempt::Lost => continue,
                Attempt::Older { pid } => {
                    return Err(StoreError::Busy(format!(
                        "an older walfold release leads (backend pid {pid})"
                    )))
                }
            }
        }
    }

    /// The fence every write transaction of this leader passes.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Fires when leadership is lost.
    pub fn lost(&self) -> CancellationToken {
        self.fence.lost.clone()
    }

    /// The epoch this instance leads at.
    pub fn epoch(&self) -> i64 {
        self.fence.key.epoch
    }

    /// Ends this term: marks it lost, gives the row up when `release` (a clean stop: the
    /// next leader takes over at once) and lets the previous epoch's key go.
    pub async fn end(self, control: &Client, schema: &Schema, me: Uuid, release: bool) {
        self.fence.lost.cancel();
        if release {
            if let Err(e) = control
                .execute(&schema.sql(RELEASE), &[&me, &self.fence.key.epoch])
                .await
            {
                tracing::debug!(error = %walfold_pg::describe(&e), "could not give leadership up; the next leader finds this instance gone");
            }
        }
        let _ = control
            .execute(
                "select pg_advisory_unlock($1, $2)",
                &[&self.previous.class, &self.previous.objid()],
            )
            .await;
    }
}

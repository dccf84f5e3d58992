//! Leadership: several `walfold run` with the same target may run; one leads (reads the
//! slot, appends, projects), the others stand by. The leader holds a session-level
//! advisory lock on a dedicated connection: when that session ends, for whatever
//! reason, the server releases the lock and a standby takes it within a second.
//!
//! The lock alone does not stop a deposed leader that has not noticed yet: its
//! projectors run on other connections. So every write transaction of a leader passes
//! through [`Fence::check`], the one place that proves leadership inside a transaction:
//! it takes a shared transaction-level advisory lock on its epoch's key (held until it
//! commits) and reads that `leader.epoch` is still its own. A new leader advances the
//! epoch, then takes the previous epoch's key exclusively for its whole session: that
//! waits for every transaction of the old leader holding it, and every later attempt
//! fails at once (a shared request conflicts with the holder and with a queued
//! exclusive request). A leader deposed earlier still finds another epoch in the row.
//! So whatever the old leader commits lands before the new leader starts, and nothing
//! after. All in memory: no row lock, no WAL on the hot path.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient};
use tokio_util::sync::CancellationToken;

use crate::connect::connect;
use crate::error::StoreError;
use crate::row::RowExt;
use crate::schema::Schema;

/// Advisory-lock class of the leader lock (`'walL'`); the key is the schema's hash.
const LEADER_LOCK: i32 = 0x7761_6c4c;
/// How often the leader checks its session, and a standby retries the lock.
const PERIOD: Duration = Duration::from_secs(1);
/// A check that takes longer than this counts as a lost session.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a new leader waits at once for the previous leader's transactions to end
/// before it says so and waits again.
pub(crate) const TAKEOVER_WAIT: &str = "10s";

/// Held leadership. Dropping it ends the session, which releases the lock.
pub struct Leadership {
    watch: JoinHandle<()>,
    lost: CancellationToken,
    fence: Fence,
}

/// This leader's fencing token, for every write transaction it makes.
#[derive(Debug, Clone)]
pub struct Fence {
    check: std::sync::Arc<str>,
    key: EpochKey,
    lost: CancellationToken,
    /// Where the check runs, for the log: `main target`, or an extra target's URL
    /// (password masked) and schema.
    place: std::sync::Arc<str>,
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
    /// Fails the transaction `tx` unless this instance still leads (see the module
    /// docs). Call it in every write transaction, before its commit. A failed check
    /// also marks leadership lost, so the whole instance stands down at once.
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
            tracing::warn!(fence = %self.place, epoch = self.key.epoch, "a write transaction was refused: another instance leads; standing down");
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

    /// The epoch this leader holds.
    pub fn epoch(&self) -> i64 {
        self.key.epoch
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
        }
    }
}

/// The one statement that proves leadership inside a transaction (see the module docs):
/// the shared lock on key (`$1`, `$2`) and epoch `$3` still recorded.
const FENCE: &str = "select pg_try_advisory_xact_lock_shared($1, $2) \
     and exists (select 1 from {schema}.leader where epoch = $3) as leads";

/// Advances the leader epoch; returns it with the schema's key class (`hashtext($1)`).
const ADVANCE: &str = "update {schema}.leader set epoch = epoch + 1, pid = pg_backend_pid(), \
     acquired_at = now() returning epoch, hashtext($1) as class";

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

impl Leadership {
    /// Waits until this process leads `schema` on the target at `url`; `None` when
    /// `cancel` fires first.
    pub async fn acquire(
        url: &str,
        schema: &Schema,
        cancel: &CancellationToken,
    ) -> Result<Option<Leadership>, StoreError> {
        let mut announced = false;
        loop {
            match Self::try_once(url, schema).await {
                Ok(Some((client, key))) => {
                    tracing::info!(
                        schema = schema.name(),
                        epoch = key.epoch,
                        "leading: this instance reads the slot and projects"
                    );
                    return Ok(Some(Self::watch(client, schema, key)));
                }
                Ok(None) if !announced => {
                    tracing::info!(schema = schema.name(), "another walfold leads; standing by");
                    announced = true;
                }
                Ok(None) => {}
                // The target is unreachable (restarting, failing over): keep trying.
                Err(e) if e.kind().retries() => {
                    tracing::warn!(error = %e, "cannot reach the target to take the leader lock; retrying");
                }
                Err(e) => return Err(e),
            }
            tokio::select! {
                _ = cancel.cancelled() => return Ok(None),
                _ = tokio::time::sleep(PERIOD) => {}
            }
        }
    }

    /// Leads now if no other instance does (for one-shot commands that change what the
    /// leader runs, e.g. aborting a rebuild while no daemon is up).
    pub async fn try_acquire(url: &str, schema: &Schema) -> Result<Option<Leadership>, StoreError> {
        Ok(Self::try_once(url, schema)
            .await?
            .map(|(client, key)| Self::watch(client, schema, key)))
    }

    /// One attempt: a new session that holds the lock, has advanced the epoch and has
    /// fenced off the previous one, or `None` if another session holds the lock.
    async fn try_once(
        url: &str,
        schema: &Schema,
    ) -> Result<Option<(Client, EpochKey)>, StoreError> {
        let client = connect(url).await?;
        client
            .batch_execute(crate::connect::SERVER_KEEPALIVES)
            .await
            .map_err(StoreError::db("configuring the leader session"))?;
        let locked: bool = client
            .query_one(
                "select pg_try_advisory_lock($1::int4, hashtext($2))",
                &[&LEADER_LOCK, &schema.name()],
            )
            .await
            .map_err(StoreError::db("taking the leader lock"))?
            .of("the leader lock")
            .col(0)?;
        if !locked {
            return Ok(None);
        }
        let row = client
            .query_one(&schema.sql(ADVANCE), &[&schema.name()])
            .await
            .map_err(StoreError::db("advancing the leader epoch"))?;
        let row = row.of("leader");
        let key = EpochKey {
            epoch: row.col("epoch")?,
            class: row.col("class")?,
        };
        let previous = EpochKey {
            epoch: key.epoch - 1,
            ..key
        };
        client
            .batch_execute(&format!("set lock_timeout = '{TAKEOVER_WAIT}'"))
            .await
            .map_err(StoreError::db("configuring the leader session"))?;
        // Waits until the previous leader's in-flight write transactions have ended;
        // held for this session's life, so none of its transactions can pass again.
        loop {
            match client
                .execute(
                    "select pg_advisory_lock($1, $2)",
                    &[&previous.class, &previous.objid()],
                )
                .await
            {
                Ok(_) => break,
                Err(e) if walfold_event::is_lock_not_available(crate::error::sqlstate(&e)) => {
                    tracing::warn!(
                        schema = schema.name(),
                        "waiting for the previous leader's transactions to end before taking over"
                    );
                }
                Err(e) => return Err(StoreError::db("fencing the previous leader")(e)),
            }
        }
        client
            .batch_execute("set lock_timeout = 0")
            .await
            .map_err(StoreError::db("configuring the leader session"))?;
        Ok(Some((client, key)))
    }

    /// Checks the session every second; a failed or slow check means the lock may be
    /// gone, so leadership counts as lost at once.
    fn watch(client: Client, schema: &Schema, key: EpochKey) -> Leadership {
        let lost = CancellationToken::new();
        let signal = lost.clone();
        let fence = Fence {
            check: fence_sql(schema).into(),
            key,
            lost: lost.clone(),
            place: "main target".into(),
        };
        let watch = tokio::spawn(async move {
            loop {
                tokio::time::sleep(PERIOD).await;
                // Tests: a leader slow to notice that its session is gone.
                walfold_telemetry::failpoint::delay("leader_watch").await;
                let check = tokio::time::timeout(CHECK_TIMEOUT, client.simple_query("select 1"));
                match check.await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %crate::describe(&e), "leader session lost");
                        break;
                    }
                    Err(_) => {
                        tracing::warn!("leader session did not answer in time");
                        break;
                    }
                }
            }
            signal.cancel();
        });
        Leadership { watch, lost, fence }
    }

    /// The fence every write transaction of this leader passes.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Fires when leadership is lost.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        // Ends the watch task and with it the session and the lock.
        self.watch.abort();
    }
}

//! Leadership: several `walfold run` with the same target may run; one leads (reads the
//! slot, appends, projects), the others stand by. The leader holds a session-level
//! advisory lock on a dedicated connection: when that session ends, for whatever
//! reason, the server releases the lock and a standby takes it within a second.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::connect::connect;
use crate::error::StoreError;

/// Advisory-lock class of the leader lock (`'walL'`); the key is the schema's hash.
const LEADER_LOCK: i32 = 0x7761_6c4c;
/// How often the leader checks its session, and a standby retries the lock.
const PERIOD: Duration = Duration::from_secs(1);
/// A check that takes longer than this counts as a lost session.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Held leadership. Dropping it ends the session, which releases the lock.
pub struct Leadership {
    watch: JoinHandle<()>,
    lost: CancellationToken,
    pid: i32,
}

impl Leadership {
    /// Waits until this process leads `schema` on the target at `url`; `None` when
    /// `cancel` fires first.
    pub async fn acquire(
        url: &str,
        schema: &str,
        cancel: &CancellationToken,
    ) -> Result<Option<Leadership>, StoreError> {
        let mut announced = false;
        loop {
            match Self::try_once(url, schema).await {
                Ok(Some((client, pid))) => {
                    tracing::info!(schema, "leading: this instance reads the slot and projects");
                    return Ok(Some(Self::watch(client, pid)));
                }
                Ok(None) if !announced => {
                    tracing::info!(schema, "another walfold leads; standing by");
                    announced = true;
                }
                Ok(None) => {}
                // The target is unreachable (restarting, failing over): keep trying.
                Err(e) if e.directive() == crate::Directive::Retry => {
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
    pub async fn try_acquire(url: &str, schema: &str) -> Result<Option<Leadership>, StoreError> {
        Ok(Self::try_once(url, schema)
            .await?
            .map(|(client, pid)| Self::watch(client, pid)))
    }

    /// One attempt: a new session that holds the lock, or `None` if another does.
    async fn try_once(url: &str, schema: &str) -> Result<Option<(Client, i32)>, StoreError> {
        let client = connect(url).await?;
        client
            .batch_execute(crate::event_log::SERVER_KEEPALIVES)
            .await
            .map_err(StoreError::db("configuring the leader session"))?;
        let row = client
            .query_one(
                "select pg_try_advisory_lock($1::int4, hashtext($2)), pg_backend_pid()",
                &[&LEADER_LOCK, &schema],
            )
            .await
            .map_err(StoreError::db("taking the leader lock"))?;
        let (locked, pid): (bool, i32) = (row.get(0), row.get(1));
        Ok(locked.then_some((client, pid)))
    }

    /// Checks the session every second; a failed or slow check means the lock may be
    /// gone, so leadership counts as lost at once.
    fn watch(client: Client, pid: i32) -> Leadership {
        let lost = CancellationToken::new();
        let signal = lost.clone();
        let watch = tokio::spawn(async move {
            loop {
                tokio::time::sleep(PERIOD).await;
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
        Leadership { watch, lost, pid }
    }

    /// The backend PID of the session holding the lock: a fence for changes only the
    /// leader may make (see [`still_leads`]).
    pub fn pid(&self) -> i32 {
        self.pid
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

/// Whether the session `pid` still holds the leader lock of `schema`. Checked inside a
/// transaction that changes what the leader runs (a rebuild's switch-over or abort), so
/// an instance that lost its session without noticing yet cannot make that change
/// under a new leader.
pub async fn still_leads(
    tx: &impl tokio_postgres::GenericClient,
    pid: i32,
    schema: &str,
) -> Result<bool, StoreError> {
    Ok(tx
        .query_one(
            "select exists (select 1 from pg_locks where locktype = 'advisory' and granted \
             and pid = $1 and classid = $2::int4::oid and objid = hashtext($3)::oid \
             and objsubid = 2)",
            &[&pid, &LEADER_LOCK, &schema],
        )
        .await
        .map_err(StoreError::db("checking leadership"))?
        .get(0))
}

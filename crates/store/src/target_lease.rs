//! A leader's lease on an extra target (`[targets.NAME]`): the fence of guarantee 9 on
//! a database that is not the one holding the leader lock.
//!
//! Leadership stays single: the leader lock and its epoch live in the main target.
//! Every extra target's walfold schema has its own `leader` row, and every write
//! transaction there checks it exactly as on the main target ([`Fence::check`]: a
//! shared transaction-level advisory lock of the leader's epoch, under the extra
//! schema's hash, and `leader.epoch` equal to that epoch). Before any of its projectors
//! writes on an extra target, the leader takes it over ([`Fence::extend_to`]), in one
//! transaction there:
//!
//! 1. it locks the `leader` row and reads the epoch recorded there, `P` (the last
//!    leader that wrote there). `P` above its own epoch `E` means a newer leader has
//!    already written there: this one is deposed, and stands down. `P = E` means it
//!    took over before (a reconnect): nothing more to do.
//! 2. it takes `P`'s key exclusively, session-level, on a session it keeps while it
//!    leads. That waits for every in-flight transaction of `P`'s leader that has passed
//!    its check (each holds the shared lock until it ends), and from then on every
//!    attempt of that leader to take the shared key fails at once.
//! 3. it writes `E` into the row and commits.
//!
//! So a transaction of the previous leader either passed its check before step 2 and
//! has ended before this leader's first write there, or it fails: it cannot take the
//! key while the lease session lives, and it finds another epoch in the row once step
//! 3 committed (a leader deposed earlier finds another epoch too). Step 3 comes last,
//! so a takeover cut short (the target went down) leaves `P` in the row and is redone
//! in full. Epochs only grow (the main target's row advances them), so comparing them
//! tells the newer leader.
//!
//! The lease session lives as long as the leader's projectors there do; it is taken
//! again after the target could not be reached, and then (the epoch there already its
//! own) it takes no key: the row alone refuses every older leader. What the key adds,
//! as on the main target, is only for a check statement that read the row before step 3
//! committed and asks for the key after the lease session ended: a statement stalled
//! across a takeover and an outage. A main target and its extra targets must form one
//! deployment: a schema on an extra target shared by two deployments (two unrelated
//! epoch counters) makes the one with the lower epoch stand down, loudly, each time.

use tokio_postgres::Client;

use crate::error::StoreError;
use crate::leader::{EpochKey, Fence};
use crate::schema::Schema;
use walfold_pg::connect;
use walfold_pg::RowExt;

/// The target's recorded leader epoch and its schema's key class (`hashtext($1)`), locked.
const LOCK_EPOCH: &str = "select epoch, hashtext($1) as class from {schema}.leader for update";

/// Records this leader's epoch `$1` on the target.
const RECORD_EPOCH: &str =
    "update {schema}.leader set epoch = $1, lead_token = gen_random_uuid(), \
     pid = pg_backend_pid(), acquired_at = now()";

/// The session that holds a takeover of an extra target, and the fence for writes there.
pub struct TargetLease {
    /// Holds the previous epoch's key exclusively while it lives.
    _session: Client,
    fence: Fence,
}

impl TargetLease {
    /// The fence every write transaction on this target passes.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }
}

impl Fence {
    /// Takes over the extra target at `url` (walfold's schema `schema`, migrated) for
    /// this leader; see the module docs. Fails with [`StoreError::Fenced`] (and marks
    /// leadership lost) when a newer leader has written there. `dead`: the tag of the
    /// previous leader when it died, whose sessions there are ended if they keep its key.
    pub async fn extend_to(
        &self,
        url: &str,
        schema: &Schema,
        dead: Option<i32>,
    ) -> Result<TargetLease, StoreError> {
        loop {
            match self.take_over(url, schema, dead).await? {
                Some(lease) => return Ok(lease),
                None => {
                    tracing::warn!(target = %walfold_config::redact_url(url), schema = schema.name(), "waiting for the previous leader's transactions on this target to end before taking it over");
                }
            }
        }
    }

    /// One attempt at [`Fence::extend_to`]; `None`: the previous leader still has a
    /// transaction open there.
    async fn take_over(
        &self,
        url: &str,
        schema: &Schema,
        dead: Option<i32>,
    ) -> Result<Option<TargetLease>, StoreError> {
        let mut client = connect(url).await?;
        client
            .batch_execute(walfold_pg::SERVER_KEEPALIVES)
            .await
            .map_err(StoreError::db("configuring the lease session"))?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::db("taking over a target"))?;
        let row = tx
            .query_one(&schema.sql(LOCK_EPOCH), &[&schema.name()])
            .await
            .map_err(StoreError::db("reading the target's leader epoch"))?;
        let row = row.of("leader");
        let (recorded, class): (i64, i32) = (row.col("epoch")?, row.col("class")?);
        let epoch = self.epoch();
        if recorded > epoch {
            tracing::warn!(target = %walfold_config::redact_url(url), schema = schema.name(), epoch, recorded, "a newer leader has written on this target (or another walfold deployment uses its schema): standing down");
            return Err(self.deposed());
        }
        if recorded < epoch {
            let previous = EpochKey {
                epoch: recorded,
                class,
            };
            let place = walfold_config::redact_url(url);
            if !crate::work_unit::lock_exclusively(&tx, schema, previous, dead, &place).await? {
                return Ok(None);
            }
            tx.execute(&schema.sql(RECORD_EPOCH), &[&epoch])
                .await
                .map_err(StoreError::db("recording the leader epoch on a target"))?;
        }
        tx.commit()
            .await
            .map_err(StoreError::db("taking over a target"))?;
        tracing::info!(
            schema = schema.name(),
            epoch,
            previous = recorded,
            "leading on an extra target"
        );
        Ok(Some(TargetLease {
            _session: client,
            fence: self.on_schema(
                schema,
                class,
                format!(
                    "{} schema {}",
                    walfold_config::redact_url(url),
                    schema.name()
                ),
            ),
        }))
    }
}

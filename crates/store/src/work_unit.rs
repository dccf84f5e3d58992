//! The `work_unit` table: projection work as units that instances own, one per partition
//! of each subscriber the leader plans (live, or a rebuild's replay), on the target that
//! holds the subscriber's state.
//!
//! Ownership is fenced exactly as leadership is ([`Fence`], `leader.rs`), with the unit's
//! `token` for the epoch:
//!
//! 1. A taker changes the row's token (compare-and-set on the token it saw: of two
//!    takers one wins), and commits.
//! 2. It takes the previous token's key exclusively, session-level, on its lease session
//!    ([`UnitLeases`]) and keeps it while it owns the unit. That waits for every
//!    transaction of the previous owner that passed its check (each holds the key shared
//!    until it ends); a dead owner's are ended with its sessions first
//!    (`instance::end_sessions`), so a frozen process cannot hold a unit past its lease.
//! 3. Only then does it run the unit. Every write transaction of the unit's projector
//!    checks, inside itself, the key shared and the token still in the row.
//!
//! So whatever the previous owner commits lands before the new owner starts, and nothing
//! after. A release ([`UnitLeases::release`]) changes the token too, so nothing of the
//! releasing owner passes again. The leader takes units back for a change of plan by
//! holding them ([`hold`]): the same steps, with nobody allowed to take them until it lets
//! go ([`let_go`]).

use std::collections::HashMap;

use tokio_postgres::{Client, GenericClient, Transaction};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::error::StoreError;
use crate::leader::{EpochKey, Fence};
use crate::schema::Schema;
use walfold_pg::connect;
use walfold_pg::RowExt;

/// How long one wait for a previous owner's transactions lasts before it is said (and,
/// for a dead owner, its sessions are ended).
const LOCK_WAIT: &str = "1s";
/// How many such waits a take makes before it gives up until the next round.
const LOCK_TRIES: u32 = 5;

/// A unit's name: its subscriber and partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnitKey {
    pub subscriber: String,
    pub partition: u32,
}

impl std::fmt::Display for UnitKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.subscriber, self.partition)
    }
}

/// A unit as its row shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub key: UnitKey,
    pub partitions: u32,
    pub projection: String,
    /// A rebuild's replay into its shadow table.
    pub rebuild: bool,
    pub owner: Option<Uuid>,
    pub held: bool,
    pub token: i64,
}

/// A unit the leader plans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub subscriber: String,
    pub partitions: u32,
    pub projection: String,
    pub rebuild: bool,
}

const UNITS: &str = "select subscriber_id, partition, partitions, projection, rebuild, owner, \
       held, token from {schema}.work_unit order by subscriber_id, partition";

/// The key class of units of schema `$1`.
const CLASS: &str = "select hashtext('walfold work unit ' || $1) as class";

/// Takes a unit at the token `$4` it was seen with; the pause its previous owner recorded
/// goes (the new owner records its own).
const TAKE: &str = "with taken as (update {schema}.work_unit set owner = $3, token = default, \
       taken_at = now() \
     where subscriber_id = $1 and partition = $2 and token = $4 and not held returning token), \
     cleared as (delete from {schema}.projection_pause where subscriber_id = $1 \
       and partition = $2 and exists (select 1 from taken)) \
     select token from taken";

const RELEASE: &str =
    "update {schema}.work_unit set owner = null, token = default, taken_at = null \
     where subscriber_id = $1 and partition = $2 and token = $3";

const HOLD: &str = "update {schema}.work_unit w set owner = null, held = true, token = default, \
       taken_at = null \
     from (select partition, token, owner from {schema}.work_unit \
           where subscriber_id = $1 for update) old \
     where w.subscriber_id = $1 and w.partition = old.partition \
     returning w.partition, old.token as previous, old.owner as previous_owner";

const LET_GO: &str = "update {schema}.work_unit set held = false where subscriber_id = $1";

const INSERT: &str =
    "insert into {schema}.work_unit (subscriber_id, partition, partitions, projection, rebuild) \
     select $1, p, $2, $3, $4 from generate_series(0, $2 - 1) p";

const DELETE: &str = "with gone as (delete from {schema}.work_unit where subscriber_id = $1) \
     delete from {schema}.projection_pause where subscriber_id = $1";

const GO_LIVE: &str = "update {schema}.work_unit set rebuild = false where subscriber_id = $1";

/// The check of a unit's fence (see [`Fence::check`]): the shared key and the token.
const UNIT_FENCE: &str = "select pg_try_advisory_xact_lock_shared($1, $2) \
     and exists (select 1 from {schema}.work_unit where token = $3) as leads";

/// Every unit of `schema`.
pub async fn units(client: &impl GenericClient, schema: &Schema) -> Result<Vec<Unit>, StoreError> {
    let rows = client
        .query(&schema.sql(UNITS), &[])
        .await
        .map_err(StoreError::db("reading the work units"))?;
    rows.iter()
        .map(|r| {
            let r = r.of("work_unit");
            Ok(Unit {
                key: UnitKey {
                    subscriber: r.col("subscriber_id")?,
                    partition: r.col::<i32>("partition")? as u32,
                },
                partitions: r.col::<i32>("partitions")? as u32,
                projection: r.col("projection")?,
                rebuild: r.col("rebuild")?,
                owner: r.col("owner")?,
                held: r.col("held")?,
                token: r.col("token")?,
            })
        })
        .collect()
}

async fn class_of(client: &impl GenericClient, schema: &Schema) -> Result<i32, StoreError> {
    Ok(client
        .query_one(CLASS, &[&schema.name()])
        .await
        .map_err(StoreError::db("reading the work units' key class"))?
        .of("work_unit")
        .col("class")?)
}

/// One instance's session for the units of one target: it holds, for each unit the
/// instance owns, the previous token's key (step 2 of the module docs).
pub struct UnitLeases {
    client: Client,
    schema: Schema,
    class: i32,
    me: Uuid,
    /// For each unit taken: the previous token, whose key this session holds (or waits
    /// for), and its own.
    keys: HashMap<UnitKey, (i64, i64)>,
    /// Where, for the log: `main target`, or an extra target's name.
    place: String,
}

/// How a take ended.
pub enum Taken {
    /// Owned: run it under this fence.
    Owned(Fence),
    /// Someone else changed the unit first.
    Lost,
    /// Owned, but the previous owner's transactions have not ended yet: try again.
    Waiting,
}

impl UnitLeases {
    /// Opens the lease session of instance `me` on the target at `url`.
    pub async fn open(
        url: &str,
        schema: &Schema,
        me: Uuid,
        place: &str,
    ) -> Result<UnitLeases, StoreError> {
        let client = connect(url).await?;
        client
            .batch_execute(walfold_pg::SERVER_KEEPALIVES)
            .await
            .map_err(StoreError::db("configuring the lease session"))?;
        let class = class_of(&client, schema).await?;
        Ok(UnitLeases {
            client,
            schema: schema.clone(),
            class,
            me,
            keys: HashMap::new(),
            place: place.to_owned(),
        })
    }

    /// Whether the session has ended (the server restarted, the network failed): the
    /// keys it held are gone, and a new one is opened.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// The client, for reading units and instances.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Takes `unit` (as read) for this instance. `dead`: the tag of its previous owner
    /// when that owner is dead, whose sessions are ended if they keep the previous
    /// token's key. `lost` fires when the unit's fence refuses a write.
    pub async fn take(
        &mut self,
        unit: &Unit,
        dead: Option<i32>,
        lost: CancellationToken,
    ) -> Result<Taken, StoreError> {
        let (previous, token) = match self.keys.get(&unit.key) {
            // Taken before, and still waiting for the previous owner.
            Some(&taken) if unit.owner == Some(self.me) && unit.token == taken.1 => taken,
            _ => {
                let row = self
                    .client
                    .query_opt(
                        &self.schema.sql(TAKE),
                        &[
                            &unit.key.subscriber,
                            &(unit.key.partition as i32),
                            &self.me,
                            &unit.token,
                        ],
                    )
                    .await
                    .map_err(StoreError::db("taking a work unit"))?;
                let Some(row) = row else {
                    return Ok(Taken::Lost);
                };
                let token: i64 = row.of("work_unit").col("token")?;
                self.keys.insert(unit.key.clone(), (unit.token, token));
                (unit.token, token)
            }
        };
        if !self.lock(previous, dead).await? {
            return Ok(Taken::Waiting);
        }
        tracing::info!(unit = %unit.key, place = %self.place, token, "took a work unit");
        Ok(Taken::Owned(self.fence(&unit.key, token, lost)))
    }

    /// Takes the key of `previous` exclusively: `false` if its holders did not end in
    /// time. A dead previous owner's sessions (tag `dead`) are ended when they hold it.
    async fn lock(&mut self, previous: i64, dead: Option<i32>) -> Result<bool, StoreError> {
        let key = EpochKey {
            epoch: previous,
            class: self.class,
        };
        lock_exclusively(&self.client, &self.schema, key, dead, &self.place).await
    }

    /// The fence of a unit this instance owns at `token`.
    pub fn fence(&self, unit: &UnitKey, token: i64, lost: CancellationToken) -> Fence {
        Fence::new(
            self.schema.sql(UNIT_FENCE),
            EpochKey {
                epoch: token,
                class: self.class,
            },
            lost,
            self.place.clone(),
            crate::leader::Holds::Unit(unit.to_string()),
        )
    }

    /// Gives `unit` (owned at `token`) back: its projector has stopped. The key of the
    /// previous owner's token is let go too.
    pub async fn release(&mut self, unit: &UnitKey, token: i64) -> Result<(), StoreError> {
        self.client
            .execute(
                &self.schema.sql(RELEASE),
                &[&unit.subscriber, &(unit.partition as i32), &token],
            )
            .await
            .map_err(StoreError::db("releasing a work unit"))?;
        self.forget(unit).await
    }

    /// Lets go of the previous owner's key of `unit`: this instance no longer owns it.
    pub async fn forget(&mut self, unit: &UnitKey) -> Result<(), StoreError> {
        if let Some((previous, _)) = self.keys.remove(unit) {
            self.client
                .execute(
                    "select pg_advisory_unlock($1, $2)",
                    &[&self.class, &(previous as i32)],
                )
                .await
                .map_err(StoreError::db("letting go of a work unit's key"))?;
        }
        Ok(())
    }

    /// The units whose previous owner's key this session waits for or holds.
    pub fn taken(&self) -> impl Iterator<Item = &UnitKey> {
        self.keys.keys()
    }
}

/// Takes `key` exclusively on `client`, session-level, waiting in rounds of
/// [`LOCK_WAIT`]; between rounds, the sessions of the dead instance tagged `dead` are
/// ended. `false` after [`LOCK_TRIES`] rounds.
pub(crate) async fn lock_exclusively(
    client: &impl GenericClient,
    schema: &Schema,
    key: EpochKey,
    dead: Option<i32>,
    place: &str,
) -> Result<bool, StoreError> {
    client
        .batch_execute(&format!("set lock_timeout = '{LOCK_WAIT}'"))
        .await
        .map_err(StoreError::db("configuring the lease session"))?;
    let mut locked = false;
    for round in 0..LOCK_TRIES {
        match client
            .execute(
                "select pg_advisory_lock($1, $2)",
                &[&key.class, &key.objid()],
            )
            .await
        {
            Ok(_) => {
                locked = true;
                break;
            }
            Err(e) if walfold_event::is_lock_not_available(walfold_pg::sqlstate(&e)) => {
                match dead {
                    Some(tag) => {
                        let ended = crate::instance::end_sessions(client, schema, tag).await?;
                        if ended.refused > 0 {
                            tracing::warn!(place, refused = ended.refused, "a dead instance's sessions keep what this instance takes, and this role may not end them: they end by idle_in_transaction_session_timeout; grant pg_signal_backend to walfold's role, or run every instance as one role");
                        } else {
                            tracing::info!(
                                place,
                                ended = ended.ended,
                                "ended a dead instance's sessions"
                            );
                        }
                    }
                    None if round > 0 => {
                        tracing::info!(
                            place,
                            "waiting for the previous owner's transactions to end"
                        )
                    }
                    None => {}
                }
            }
            Err(e) => return Err(StoreError::db("fencing the previous owner")(e)),
        }
    }
    client
        .batch_execute("set lock_timeout = 0")
        .await
        .map_err(StoreError::db("configuring the lease session"))?;
    Ok(locked)
}

/// What the leader held: for each partition of the subscriber, the token before the hold
/// and its owner then.
#[derive(Debug, Clone)]
pub struct HeldUnit {
    pub partition: u32,
    pub previous: i64,
    pub previous_owner: Option<Uuid>,
}

/// Holds every unit of `subscriber` for the leader (in its fenced transaction `tx`): no
/// one may take them until [`let_go`]. Its owners' projectors fail at their fence from
/// the commit on; [`wait_for_holders`] waits for their transactions in flight.
pub async fn hold(
    tx: &Transaction<'_>,
    schema: &Schema,
    subscriber: &str,
) -> Result<Vec<HeldUnit>, StoreError> {
    let rows = tx
        .query(&schema.sql(HOLD), &[&subscriber])
        .await
        .map_err(StoreError::db("holding work units"))?;
    rows.iter()
        .map(|r| {
            let r = r.of("work_unit");
            Ok(HeldUnit {
                partition: r.col::<i32>("partition")? as u32,
                previous: r.col("previous")?,
                previous_owner: r.col("previous_owner")?,
            })
        })
        .collect()
}

/// After [`hold`] committed: takes each previous token's key exclusively on `client`
/// (waits for its owner's transactions in flight; ends a dead owner's sessions, `dead`
/// gives its tag), then lets the keys go again (the row refuses the owners from now on).
pub async fn wait_for_holders(
    client: &Client,
    schema: &Schema,
    held: &[HeldUnit],
    dead: impl Fn(&Uuid) -> Option<i32>,
) -> Result<(), StoreError> {
    let class = class_of(client, schema).await?;
    for h in held {
        let key = EpochKey {
            epoch: h.previous,
            class,
        };
        let tag = h.previous_owner.as_ref().and_then(&dead);
        while !lock_exclusively(client, schema, key, tag, "the leader's hold").await? {
            tracing::warn!(partition = h.partition, "waiting for a work unit's owner to finish its transaction before changing the plan");
        }
        client
            .execute(
                "select pg_advisory_unlock($1, $2)",
                &[&key.class, &key.objid()],
            )
            .await
            .map_err(StoreError::db("letting go of a work unit's key"))?;
    }
    Ok(())
}

/// Lets the held units of `subscriber` be taken again.
pub async fn let_go(
    tx: &Transaction<'_>,
    schema: &Schema,
    subscriber: &str,
) -> Result<(), StoreError> {
    tx.execute(&schema.sql(LET_GO), &[&subscriber])
        .await
        .map_err(StoreError::db("letting work units go"))?;
    Ok(())
}

/// Plans `unit`'s partitions (none of its subscriber may exist).
pub async fn plan(tx: &Transaction<'_>, schema: &Schema, unit: &Planned) -> Result<(), StoreError> {
    tx.execute(
        &schema.sql(INSERT),
        &[
            &unit.subscriber,
            &(unit.partitions as i32),
            &unit.projection,
            &unit.rebuild,
        ],
    )
    .await
    .map_err(StoreError::db("planning work units"))?;
    Ok(())
}

/// Removes the (held) units of `subscriber` from the plan.
pub async fn unplan(
    tx: &Transaction<'_>,
    schema: &Schema,
    subscriber: &str,
) -> Result<(), StoreError> {
    tx.execute(&schema.sql(DELETE), &[&subscriber])
        .await
        .map_err(StoreError::db("removing work units"))?;
    Ok(())
}

/// A switched-over rebuild's units now write the live table.
pub async fn go_live(
    tx: &Transaction<'_>,
    schema: &Schema,
    subscriber: &str,
) -> Result<(), StoreError> {
    tx.execute(&schema.sql(GO_LIVE), &[&subscriber])
        .await
        .map_err(StoreError::db("switching work units to the live table"))?;
    Ok(())
}

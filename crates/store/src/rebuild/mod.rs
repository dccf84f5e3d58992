//! Rebuilds: a new subscriber ID replays the event log into a shadow table beside the
//! live one; when it has caught up, one transaction swaps the tables and makes the new
//! subscriber the projection's active one. The old table stays, retired, until
//! `finish`. Every change of state is one transaction, so a crash leaves either the old
//! state or the new one. The statements here are on walfold's tables; what they do to
//! the read model's tables (named by the config, so built at run time) is in `ddl`.

mod ddl;

use std::time::Duration;

use tokio_postgres::{Client, GenericClient, Row};
use walfold_config::QualifiedName;
use walfold_event::{DeadLetterStatus, ErrorKind};

use crate::dead_letter::DeadLetters;
use crate::error::StoreError;
use crate::leader::Fence;
use crate::refusal::{OpenState, Refusal};
use crate::schema::Schema;
use walfold_pg::{FromRow, RowExt};

walfold_event::stored_enum! {
    /// Where a rebuild is: the `rebuild.state` column, whose check constraint allows
    /// exactly these.
    pub enum RebuildState {
        /// Replaying the log into the shadow table.
        Running = "running",
        /// An abort was requested; the leader stops its projectors, then ends it.
        Aborting = "aborting",
        /// Switched over; the retired table stays until `finish`.
        Switched = "switched",
        /// Switched, and the retired table dropped.
        Finished = "finished",
        /// Ended without switching; the shadow table dropped.
        Aborted = "aborted",
    }
}

impl RebuildState {
    /// Not ended yet: what [`open`] reads (one per projection at most).
    pub const OPEN: &'static [RebuildState] = &[
        RebuildState::Running,
        RebuildState::Aborting,
        RebuildState::Switched,
    ];
    /// Not switched and not ended: its subscriber replays, or is being stopped.
    pub const REPLAYING: &'static [RebuildState] = &[RebuildState::Running, RebuildState::Aborting];
}

/// The columns a [`Rebuild`] is read from, by name (a literal, for `concat!`).
macro_rules! rebuild_columns {
    () => {
        "subscriber_id, projection, previous_subscriber, live_table, shadow_table, \
         retired_table, state, extract(epoch from requested_at)::float8 as requested_at_unix, \
         extract(epoch from switched_at)::float8 as switched_at_unix, switch_error, \
         extract(epoch from switch_failed_at)::float8 as switch_failed_at_unix"
    };
}

/// The rebuilds with a state in `$1`, oldest first.
const OPEN: &str = concat!(
    "select ",
    rebuild_columns!(),
    " from {schema}.rebuild where state = any($1) order by requested_at"
);

/// [`OPEN`], waiting for a transaction that changes one of them to end.
const OPEN_SETTLED: &str = concat!(
    "select ",
    rebuild_columns!(),
    " from {schema}.rebuild where state = any($1) order by requested_at for share"
);

/// Whether subscriber ID `$1` has left any trace: a rebuild's `--finish` deletes a
/// replaced subscriber's checkpoints and claims, but its rebuild row and dead letters
/// still name it.
const USED: &str = "select exists (select 1 from {schema}.checkpoint where subscriber_id = $1) \
     or exists (select 1 from {schema}.processed_message where subscriber_id = $1) \
     or exists (select 1 from {schema}.rebuild \
                where subscriber_id = $1 or previous_subscriber = $1) \
     or exists (select 1 from {schema}.projection where subscriber_id = $1) \
     or exists (select 1 from {schema}.dead_letter where subscriber_id = $1) as used";

/// Records a rebuild (`$1`…`$7`).
const INSERT: &str = concat!(
    "insert into {schema}.rebuild (subscriber_id, projection, previous_subscriber, \
     live_table, shadow_table, retired_table, state) \
     values ($1, $2, $3, $4, $5, $6, $7) returning ",
    rebuild_columns!()
);

/// Subscriber `$1`'s checkpoints.
const POSITIONS: &str =
    "select partition, partitions, position from {schema}.checkpoint where subscriber_id = $1";

/// Rebuild `$1` in state `$3` moves to `$2` (switched), now, forgetting a failed attempt.
const SWITCHED: &str = "update {schema}.rebuild set state = $2, switched_at = now(), \
     switch_error = null, switch_failed_at = null \
     where subscriber_id = $1 and state = $3";

/// Rebuild `$1`, still in state `$3` (running), failed to switch over with error `$2`.
const SWITCH_FAILED: &str = "update {schema}.rebuild set switch_error = $2, \
     switch_failed_at = now() where subscriber_id = $1 and state = $3";

/// Releases every aggregate parked for subscriber `$1`.
const UNPARK_ALL: &str = "delete from {schema}.parked_aggregate where subscriber_id = $1";

/// Projection `$1`'s active subscriber becomes `$2`.
const SET_ACTIVE: &str =
    "update {schema}.projection set subscriber_id = $2, updated_at = now() where name = $1";

/// Projection `$1`'s rebuild in a state in `$3` moves to `$2` (aborting).
const REQUEST_ABORT: &str = concat!(
    "update {schema}.rebuild set state = $2 \
     where projection = $1 and state = any($3) returning ",
    rebuild_columns!()
);

/// Rebuild `$1` in a state in `$3` ends in `$2` (aborted).
const ABORTED: &str = "update {schema}.rebuild set state = $2, ended_at = now() \
     where subscriber_id = $1 and state = any($3)";

/// Projection `$1`'s rebuild in state `$3` ends in `$2` (finished).
const FINISHED: &str = concat!(
    "update {schema}.rebuild set state = $2, ended_at = now() \
     where projection = $1 and state = $3 returning ",
    rebuild_columns!()
);

/// Deletes a retired subscriber `$1`'s rows (`$2`, the reason, is bound so that every
/// statement of [`retire_subscriber`] takes the same parameters).
const RETIRE: [&str; 3] = [
    "delete from {schema}.checkpoint where subscriber_id = $1 and $2::text is not null",
    "delete from {schema}.parked_aggregate where subscriber_id = $1 and $2::text is not null",
    "delete from {schema}.aggregate_version where subscriber_id = $1 and $2::text is not null",
];

/// Subscriber `$1`'s dead letters with a status in `$4` are set to `$3` (discarded),
/// with resolution `$2`.
const DISCARD_UNRESOLVED: &str = "update {schema}.dead_letter set status = $3, resolution = $2, \
     resolved_at = now() where subscriber_id = $1 and status = any($4)";

/// Deletes at most `$2` of subscriber `$1`'s claims.
const FORGET_CLAIMS: &str = "delete from {schema}.processed_message where ctid = any(array( \
     select ctid from {schema}.processed_message where subscriber_id = $1 limit $2))";

/// The state of the rebuild under subscriber ID `$1`.
const STATE: &str = "select state from {schema}.rebuild where subscriber_id = $1";

/// A rebuild as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Rebuild {
    /// The new subscriber ID (the rebuild's identity).
    pub subscriber: String,
    pub projection: String,
    /// The subscriber that served the live table when the rebuild started.
    pub previous: String,
    pub live: String,
    pub shadow: String,
    pub retired: String,
    pub state: RebuildState,
    pub requested_at_unix: f64,
    pub switched_at_unix: Option<f64>,
    /// Why its last switch-over failed, while it is still running (tried again later),
    /// and when.
    pub switch_error: Option<String>,
    pub switch_failed_at_unix: Option<f64>,
}

impl Rebuild {
    pub fn live_table(&self) -> QualifiedName {
        parse(&self.live)
    }
    pub fn shadow_table(&self) -> QualifiedName {
        parse(&self.shadow)
    }
    pub fn retired_table(&self) -> QualifiedName {
        parse(&self.retired)
    }
    /// Switched over, with the retired table kept longer than `after`.
    pub fn retired_longer_than(&self, after: Duration, now_unix: f64) -> bool {
        self.state == RebuildState::Switched
            && self
                .switched_at_unix
                .is_some_and(|t| now_unix - t >= after.as_secs_f64())
    }
}

impl FromRow for Rebuild {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("rebuild");
        Ok(Rebuild {
            subscriber: r.col("subscriber_id")?,
            projection: r.col("projection")?,
            previous: r.col("previous_subscriber")?,
            live: r.col("live_table")?,
            shadow: r.col("shadow_table")?,
            retired: r.col("retired_table")?,
            state: r.col("state")?,
            requested_at_unix: r.col("requested_at_unix")?,
            switched_at_unix: r.col("switched_at_unix")?,
            switch_error: r.col("switch_error")?,
            switch_failed_at_unix: r.col("switch_failed_at_unix")?,
        })
    }
}

fn parse(s: &str) -> QualifiedName {
    QualifiedName::parse(s).unwrap_or_else(|_| QualifiedName {
        schema: "public".into(),
        name: s.to_owned(),
    })
}

/// Rebuilds not ended yet (running, aborting, or switched with a retired table kept).
pub async fn open(
    client: &impl GenericClient,
    schema: &Schema,
) -> Result<Vec<Rebuild>, StoreError> {
    read_open(client, schema, OPEN).await
}

/// [`open`], waiting for a switch-over or abort in progress to commit: what a new leader
/// plans from, so it never starts projectors on tables about to be renamed or dropped.
pub async fn open_settled(
    client: &impl GenericClient,
    schema: &Schema,
) -> Result<Vec<Rebuild>, StoreError> {
    read_open(client, schema, OPEN_SETTLED).await
}

async fn read_open(
    client: &impl GenericClient,
    schema: &Schema,
    statement: &str,
) -> Result<Vec<Rebuild>, StoreError> {
    let rows = client
        .query(&schema.sql(statement), &[&RebuildState::OPEN])
        .await
        .map_err(StoreError::db("reading rebuilds"))?;
    Ok(Rebuild::from_rows(&rows)?)
}

/// The state of the rebuild under subscriber ID `subscriber` (`None`: no such rebuild).
pub(crate) async fn state_of(
    client: &impl GenericClient,
    schema: &Schema,
    subscriber: &str,
) -> Result<Option<RebuildState>, StoreError> {
    Ok(client
        .query_opt(&schema.sql(STATE), &[&subscriber])
        .await
        .map_err(StoreError::db("reading a rebuild's state"))?
        .map(|r| r.of("rebuild").col("state"))
        .transpose()?)
}

/// Whether subscriber ID `subscriber` has left any trace in `schema` (a rebuild needs a
/// new one: its claims must start empty).
pub(crate) async fn subscriber_used(
    client: &impl GenericClient,
    schema: &Schema,
    subscriber: &str,
) -> Result<bool, StoreError> {
    Ok(client
        .query_one(&schema.sql(USED), &[&subscriber])
        .await
        .map_err(StoreError::db("checking the subscriber ID"))?
        .of("checkpoint")
        .col("used")?)
}

/// A projection's statement written for a table, with its parameters' types: prepared
/// against a rebuild's shadow table before the rebuild is recorded.
pub type Probe = (String, Vec<tokio_postgres::types::Type>);

/// What a rebuild's start records beside the rebuild, in its transaction.
#[derive(Default, Clone, Copy)]
pub struct StartWith<'a> {
    /// The definition the new subscriber folds with.
    pub definition: Option<&'a walfold_config::FoldDefinition>,
    /// The leader's fence, when the leader starts it (a changed definition).
    pub fence: Option<&'a Fence>,
    /// Started for a changed definition: what the live subscriber folds with, and who.
    pub changed_from: Option<(&'a crate::definition::RecordedDefinition, &'a str)>,
}

/// Starts a rebuild of `projection` (whose live table is `live`, served by `previous`)
/// under the unused subscriber ID `subscriber`: creates the shadow table from the live
/// table's definition, checks that the statement `probe` gives for it runs there, and
/// records the rebuild (and what `with` holds), in one transaction.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn start(
    client: &mut Client,
    schema: &Schema,
    projection: &str,
    live: &QualifiedName,
    previous: &str,
    subscriber: &str,
    probe: &(dyn Fn(&QualifiedName) -> Option<Probe> + Sync),
    with: StartWith<'_>,
) -> Result<Rebuild, StoreError> {
    let shadow = ddl::sibling(live, "__rebuild")?;
    let retired = ddl::sibling(live, "__retired")?;
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("starting a rebuild"))?;
    if let Some(fence) = with.fence {
        fence.check(&tx).await?;
    }
    if let Some(open) = open(&tx, schema)
        .await?
        .into_iter()
        .find(|r| r.projection == projection)
    {
        return Err(Refusal::RebuildOpen {
            projection: projection.to_owned(),
            subscriber: open.subscriber,
            state: open.state.to_string(),
            switched: open.state == RebuildState::Switched,
        }
        .into());
    }
    if subscriber_used(&tx, schema, subscriber).await? {
        return Err(Refusal::SubscriberUsed {
            subscriber: subscriber.to_owned(),
        }
        .into());
    }
    ddl::create_shadow(&tx, live, &shadow, &retired).await?;
    if let Some((sql, types)) = probe(&shadow) {
        // Parsed and planned against the new table: a statement that names the live table
        // besides `{table}` fails here instead of at every batch of the replay.
        if let Err(e) = tx.prepare_typed(&sql, &types).await {
            if e.as_db_error().is_none() || walfold_pg::kind_of(&e) == ErrorKind::Transient {
                return Err(StoreError::db("checking the statement on the shadow table")(e));
            }
            return Err(Refusal::StatementOnShadow {
                shadow,
                live: live.clone(),
                error: walfold_pg::describe(&e),
                undefined_table: walfold_event::is_undefined_table(walfold_pg::sqlstate(&e)),
            }
            .into());
        }
    }
    let row = tx
        .query_one(
            &schema.sql(INSERT),
            &[
                &subscriber,
                &projection,
                &previous,
                &live.to_string(),
                &shadow.to_string(),
                &retired.to_string(),
                &RebuildState::Running,
            ],
        )
        .await
        .map_err(StoreError::db("recording the rebuild"))?;
    let rebuild = Rebuild::from_row(&row)?;
    if let Some(definition) = with.definition {
        crate::definition::record_rebuild(&tx, schema, subscriber, projection, definition).await?;
        if let Some((from, by)) = with.changed_from {
            crate::definition::changed(
                &tx,
                schema,
                projection,
                subscriber,
                crate::definition::ChangeAction::Rebuild,
                from,
                definition,
                by,
            )
            .await?;
        }
    }
    tx.commit()
        .await
        .map_err(StoreError::db("starting a rebuild"))?;
    Ok(rebuild)
}

/// Whether a rebuild may switch over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Still replaying.
    Behind,
    /// Every partition is within the slack of the live subscriber's.
    Ready,
    /// Caught up, but this many of its dead letters are open: the rebuilt table would
    /// lack those events. Retry or discard them first.
    Blocked(i64),
}

/// Whether the rebuild may switch over: every partition of its subscriber has a
/// checkpoint and is within `slack` events of the live subscriber's (see [`Layouts`]),
/// and it has no open dead letter. The leader then stops the projectors, lets the
/// rebuild's catch up with the live ones ([`catch_up_to`]) and switches.
pub async fn readiness(
    client: &Client,
    schema: &Schema,
    rebuild: &Rebuild,
    partitions: u32,
    slack: i64,
) -> Result<Readiness, StoreError> {
    let layouts = Layouts::read(client, schema, rebuild).await?;
    if (layouts.new.len() as i64) < i64::from(partitions) {
        return Ok(Readiness::Behind);
    }
    // Behind first: open dead letters only hold back a rebuild that has caught up (the
    // planner logs "has caught up but waits" for them).
    if !layouts.reached(slack) {
        return Ok(Readiness::Behind);
    }
    let dead = DeadLetters::open_count(client, schema, &rebuild.subscriber).await?;
    Ok(if dead > 0 {
        Readiness::Blocked(dead)
    } else {
        Readiness::Ready
    })
}

/// Where each partition of the rebuild's subscriber that has not read as far yet must
/// read for the rebuilt table to hold everything the live one does (see
/// [`Layouts::targets`]), as (partition, position); empty when every one has.
pub async fn catch_up_to(
    client: &impl GenericClient,
    schema: &Schema,
    rebuild: &Rebuild,
) -> Result<Vec<(i32, i64)>, StoreError> {
    Ok(Layouts::read(client, schema, rebuild).await?.behind(0))
}

/// The checkpoints of a rebuild's subscriber (`new`) and of the live one it replaces
/// (`old`): (partition, partitions, position), by partition.
struct Layouts {
    new: Vec<(i32, i32, i64)>,
    old: Vec<(i32, i32, i64)>,
}

impl Layouts {
    async fn read(
        client: &impl GenericClient,
        schema: &Schema,
        rebuild: &Rebuild,
    ) -> Result<Layouts, StoreError> {
        let positions = |subscriber: &str| {
            let subscriber = subscriber.to_owned();
            async move {
                let mut found: Vec<(i32, i32, i64)> = client
                    .query(&schema.sql(POSITIONS), &[&subscriber])
                    .await
                    .map_err(StoreError::db("reading checkpoints"))?
                    .iter()
                    .map(|r| {
                        let r = r.of("checkpoint");
                        Ok((
                            r.col("partition")?,
                            r.col("partitions")?,
                            r.col("position")?,
                        ))
                    })
                    .collect::<Result<_, StoreError>>()?;
                found.sort_unstable();
                Ok::<_, StoreError>(found)
            }
        };
        Ok(Layouts {
            new: positions(&rebuild.subscriber).await?,
            old: positions(&rebuild.previous).await?,
        })
    }

    /// Where each new partition must have read: the live subscriber's position in the
    /// same partition (the same aggregates) when both layouts are alike, else the live
    /// subscriber's furthest.
    fn targets(&self) -> Vec<(i32, i64)> {
        let alike = self.new.len() == self.old.len()
            && self
                .new
                .iter()
                .zip(&self.old)
                .all(|(n, o)| n.0 == o.0 && n.1 == o.1);
        let furthest = self.old.iter().map(|o| o.2).max().unwrap_or(0);
        self.new
            .iter()
            .enumerate()
            .map(|(i, n)| (n.0, if alike { self.old[i].2 } else { furthest }))
            .collect()
    }

    /// Whether every new partition is within `slack` events of its [`Layouts::targets`].
    /// With `slack` 0 the rebuilt table holds everything the live one does, so the
    /// switch-over never steps readers back (nor swaps in a table that the last events,
    /// or their dead letters, have not reached yet).
    fn reached(&self, slack: i64) -> bool {
        self.behind(slack).is_empty()
    }

    /// The new partitions more than `slack` events short of their [`Layouts::targets`],
    /// with their targets.
    fn behind(&self, slack: i64) -> Vec<(i32, i64)> {
        self.new
            .iter()
            .zip(self.targets())
            .filter(|(n, (_, target))| n.2 + slack < *target)
            .map(|(_, target)| target)
            .collect()
    }
}

/// What a switch-over attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Switch {
    /// The rebuilt table is live.
    Done,
    /// The rebuild is no longer running (aborted meanwhile).
    Gone,
    /// Not yet, with why: with the projectors stopped, the rebuild's subscriber is
    /// behind the live one, or has open dead letters. Nothing changed.
    NotYet(String),
}

/// The switch-over, in one transaction: the live table is retired, the shadow table takes
/// its name, and the rebuild's subscriber becomes the projection's active one (the old
/// one's open dead letters are discarded and its aggregates released: nothing runs it
/// any more). The caller leads (its `fence` is checked inside the transaction) and has
/// stopped every projector writing either table, so their checkpoints stand still: the
/// transaction checks that the rebuild's subscriber has reached the live one and
/// has no open dead letter, and changes nothing otherwise.
pub async fn switch(
    client: &mut Client,
    schema: &Schema,
    rebuild: &Rebuild,
    fence: &Fence,
) -> Result<Switch, StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("switching over"))?;
    let moved = tx
        .execute(
            &schema.sql(SWITCHED),
            &[
                &rebuild.subscriber,
                &RebuildState::Switched,
                &RebuildState::Running,
            ],
        )
        .await
        .map_err(StoreError::db("switching over"))?;
    if moved == 0 {
        return Ok(Switch::Gone);
    }
    if !Layouts::read(&tx, schema, rebuild).await?.reached(0) {
        return Ok(Switch::NotYet(format!(
            "{} has not read as far as {} yet",
            rebuild.subscriber, rebuild.previous
        )));
    }
    let letters = DeadLetters::open_count(&tx, schema, &rebuild.subscriber).await?;
    if letters > 0 {
        return Ok(Switch::NotYet(format!(
            "{} has {letters} open dead letters",
            rebuild.subscriber
        )));
    }
    let (live, shadow) = (rebuild.live_table(), rebuild.shadow_table());
    ddl::lock_for_swap(&tx, &live, &shadow).await?;
    fence.check(&tx).await?;
    ddl::swap(&tx, &live, &shadow, &rebuild.retired_table()).await?;
    tx.execute(&schema.sql(UNPARK_ALL), &[&rebuild.previous])
        .await
        .map_err(StoreError::db("retiring the previous subscriber"))?;
    discard_unresolved(
        &tx,
        schema,
        &rebuild.previous,
        "subscriber replaced by a rebuild",
    )
    .await
    .map_err(StoreError::db("retiring the previous subscriber"))?;
    tx.execute(
        &schema.sql(SET_ACTIVE),
        &[&rebuild.projection, &rebuild.subscriber],
    )
    .await
    .map_err(StoreError::db("recording the new active subscriber"))?;
    tx.commit()
        .await
        .map_err(StoreError::db("switching over"))?;
    Ok(Switch::Done)
}

/// Records why `rebuild`'s switch-over failed, for `walfold status` (the daemon tries
/// again). The caller leads; its `fence` is checked in the transaction.
pub async fn switch_failed(
    client: &mut Client,
    schema: &Schema,
    rebuild: &Rebuild,
    error: &str,
    fence: &Fence,
) -> Result<(), StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("recording a failed switch-over"))?;
    tx.execute(
        &schema.sql(SWITCH_FAILED),
        &[&rebuild.subscriber, &error, &RebuildState::Running],
    )
    .await
    .map_err(StoreError::db("recording a failed switch-over"))?;
    fence.check(&tx).await?;
    tx.commit()
        .await
        .map_err(StoreError::db("recording a failed switch-over"))
}

/// Asks the leader to abort the running rebuild of `projection` (it stops the rebuild's
/// projectors first, then calls [`abort`]).
pub(crate) async fn request_abort(
    client: &Client,
    schema: &Schema,
    projection: &str,
) -> Result<Rebuild, StoreError> {
    let row = client
        .query_opt(
            &schema.sql(REQUEST_ABORT),
            &[
                &projection,
                &RebuildState::Aborting,
                &RebuildState::REPLAYING,
            ],
        )
        .await
        .map_err(StoreError::db("aborting a rebuild"))?;
    match row {
        Some(r) => Ok(Rebuild::from_row(&r)?),
        None => Err(not_open(client, schema, projection, "abort").await?.into()),
    }
}

async fn not_open(
    client: &Client,
    schema: &Schema,
    projection: &str,
    action: &'static str,
) -> Result<Refusal, StoreError> {
    let open = open(client, schema).await?;
    let state = open
        .iter()
        .find(|r| r.projection == projection)
        .map(|r| match r.state {
            RebuildState::Switched => OpenState::Switched,
            other => OpenState::Replaying(other.to_string()),
        });
    Ok(Refusal::NoRebuildTo {
        projection: projection.to_owned(),
        action,
        state,
    })
}

/// Ends an aborting or running rebuild: drops the shadow table and the new subscriber's
/// checkpoints and parked aggregates, in one transaction; nothing live is touched. The
/// caller leads (its `fence` is checked inside the transaction) and runs no projector of
/// this rebuild. Claims are removed afterwards by [`forget_claims`] (or `prune`).
pub async fn abort(
    client: &mut Client,
    schema: &Schema,
    rebuild: &Rebuild,
    fence: &Fence,
) -> Result<(), StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("aborting a rebuild"))?;
    let n = tx
        .execute(
            &schema.sql(ABORTED),
            &[
                &rebuild.subscriber,
                &RebuildState::Aborted,
                &RebuildState::REPLAYING,
            ],
        )
        .await
        .map_err(StoreError::db("aborting a rebuild"))?;
    if n == 1 {
        fence.check(&tx).await?;
        ddl::drop_table(&tx, &rebuild.shadow_table())
            .await
            .map_err(StoreError::db("dropping the shadow table"))?;
        retire_subscriber(&tx, schema, &rebuild.subscriber, "rebuild aborted").await?;
    }
    tx.commit()
        .await
        .map_err(StoreError::db("aborting a rebuild"))?;
    Ok(())
}

/// Ends a switched rebuild: drops the retired table and the previous subscriber's
/// checkpoints and parked aggregates, in one transaction. Sequences the retired table
/// owns (a `serial` column, whose sequence the live table's default shares) pass to the
/// live table first. The daemon passes its `fence`; the CLI may finish without one
/// (nothing runs on a retired table). Returns the rebuild.
pub async fn finish(
    client: &mut Client,
    schema: &Schema,
    projection: &str,
    fence: Option<&Fence>,
) -> Result<Rebuild, StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("finishing a rebuild"))?;
    let row = tx
        .query_opt(
            &schema.sql(FINISHED),
            &[
                &projection,
                &RebuildState::Finished,
                &RebuildState::Switched,
            ],
        )
        .await
        .map_err(StoreError::db("finishing a rebuild"))?;
    let Some(row) = row else {
        drop(tx);
        return Err(not_open(client, schema, projection, "finish").await?.into());
    };
    let rebuild = Rebuild::from_row(&row)?;
    if let Some(fence) = fence {
        fence.check(&tx).await?;
    }
    ddl::hand_over_sequences(&tx, &rebuild.retired_table(), &rebuild.live_table()).await?;
    ddl::drop_table(&tx, &rebuild.retired_table())
        .await
        .map_err(StoreError::db("dropping the retired table"))?;
    retire_subscriber(
        &tx,
        schema,
        &rebuild.previous,
        "subscriber retired by a rebuild",
    )
    .await?;
    tx.commit()
        .await
        .map_err(StoreError::db("finishing a rebuild"))?;
    Ok(rebuild)
}

async fn retire_subscriber(
    tx: &impl GenericClient,
    schema: &Schema,
    subscriber: &str,
    why: &str,
) -> Result<(), StoreError> {
    for statement in RETIRE {
        tx.execute(&schema.sql(statement), &[&subscriber, &why])
            .await
            .map_err(StoreError::db("retiring a subscriber"))?;
    }
    discard_unresolved(tx, schema, subscriber, why)
        .await
        .map_err(StoreError::db("retiring a subscriber"))?;
    Ok(())
}

/// Discards the dead letters of a subscriber nothing runs any more, with `why` as the
/// resolution.
async fn discard_unresolved(
    tx: &impl GenericClient,
    schema: &Schema,
    subscriber: &str,
    why: &str,
) -> Result<u64, tokio_postgres::Error> {
    tx.execute(
        &schema.sql(DISCARD_UNRESOLVED),
        &[
            &subscriber,
            &why,
            &DeadLetterStatus::Discarded,
            &DeadLetterStatus::UNRESOLVED,
        ],
    )
    .await
}

/// Deletes a retired subscriber's claims in batches of `batch` rows (short transactions,
/// no long locks); returns how many.
pub(crate) async fn forget_claims(
    client: &Client,
    schema: &Schema,
    subscriber: &str,
    batch: i64,
) -> Result<u64, StoreError> {
    let sql = schema.sql(FORGET_CLAIMS);
    let mut total = 0;
    loop {
        let n = client
            .execute(&sql, &[&subscriber, &batch])
            .await
            .map_err(StoreError::db("deleting a retired subscriber's claims"))?;
        total += n;
        if n < batch as u64 {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RebuildState;
    use walfold_event::assert_round_trips;

    use crate::migrate::tests::checked_values;

    #[test]
    fn every_state_round_trips() {
        assert_round_trips(RebuildState::ALL, RebuildState::as_str);
    }

    #[test]
    fn the_check_constraint_allows_exactly_the_states() {
        let mut ours: Vec<&str> = RebuildState::ALL.iter().map(|s| s.as_str()).collect();
        ours.sort();
        assert_eq!(checked_values("state"), ours);
    }
}

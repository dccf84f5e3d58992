//! Retention as replay policy: claims older than a subscriber's `dedup_retention` and
//! events older than the log's retention are deleted in small batches. An event is
//! never deleted before every projection's active subscriber and every rebuild in
//! progress has passed it, nor the log's head (the appender continues numbering from
//! it), nor while an open dead letter still needs it. A claim is never deleted before
//! every partition of its subscriber has passed its event: whatever walfold re-reads by
//! itself (a restart, a changed `parallelism`) still meets its claim. Retention bounds
//! only redeliveries from outside (a backfill, a retry).
//!
//! With extra targets (`[targets.NAME]`), the event log is the main target's but the
//! subscribers, rebuilds and dead letters of some projections live elsewhere: each
//! extra target says how far it lets go of the log ([`hold`]), and the log is pruned
//! only below the lowest of those ([`PrunePolicy::held_elsewhere`]); a target that
//! cannot be read holds everything for that pass. Claims on an extra target are pruned
//! there ([`prune_claims_elsewhere`]), with the events their subscriber has not passed
//! read from the main log.

use std::time::Duration;

use tokio_postgres::Client;

use crate::error::StoreError;
use crate::leader::Fence;
use crate::rebuild::RebuildState;
use crate::schema::Schema;
use walfold_event::DeadLetterStatus;
use walfold_pg::RowExt;

/// A batch (`$3`) of subscriber `$1`'s claims older than `$2` seconds whose events are
/// gone or at most seq `$4` (passed by every partition).
const PRUNE_CLAIMS: &str = "delete from {schema}.processed_message where ctid = any(array( \
     select m.ctid from {schema}.processed_message m \
     where m.subscriber_id = $1 and m.processed_at < now() - make_interval(secs => $2) \
       and not exists (select 1 from {schema}.event_log e \
                       where e.event_id = m.message_id and e.seq > $4) \
     limit $3))";

/// Deletes a batch (`$3`) of events up to seq `$1` older than `$2` seconds that no
/// unresolved (`$4`) dead letter needs, retires their identities (see `claim`) and
/// raises the recorded pruning horizon to the highest seq deleted, in the same
/// statement; returns how many it deleted.
const PRUNE_EVENTS: &str = "with gone as (delete from {schema}.event_log where seq = any(array( \
     select e.seq from {schema}.event_log e \
     where e.seq <= $1 and e.appended_at < now() - make_interval(secs => $2) \
       and not exists (select 1 from {schema}.dead_letter d where d.seq = e.seq \
                       and d.subscriber_id is not null and d.status = any($4)) \
     order by e.seq limit $3)) returning seq, event_id, claim_seq, \
       {schema}.identity_digest(event_type, aggregate_type, aggregate_id, version, payload) \
       as digest), \
     retired as (insert into {schema}.retired_identity (event_id, claim_seq, retired_at, digest) \
       select event_id, coalesce(claim_seq, seq), now(), digest from gone \
       on conflict (event_id) do update set claim_seq = excluded.claim_seq, \
       retired_at = excluded.retired_at, digest = excluded.digest), \
     noted as (insert into {schema}.event_log_pruned (through, pruned_at) \
       select max(seq), now() from gone having count(*) > 0 \
       on conflict (one) do update set \
       through = greatest({schema}.event_log_pruned.through, excluded.through), \
       pruned_at = excluded.pruned_at) \
     select count(*) as deleted from gone";

/// A batch (`$2`) of retired identities older than `$1` seconds: no claim on them is kept.
const PRUNE_IDENTITIES: &str = "delete from {schema}.retired_identity where ctid = any(array( \
     select ctid from {schema}.retired_identity \
     where retired_at < now() - make_interval(secs => $1) limit $2))";

/// How far pruning has deleted the event log, if it has.
const PRUNED_THROUGH: &str =
    "select through, extract(epoch from pruned_at)::float8 as pruned_at_unix \
     from {schema}.event_log_pruned";

/// Every projection's active subscriber and every rebuild's in progress (states `$1`).
const HOLDERS: &str = "select subscriber_id from {schema}.projection union \
     select subscriber_id from {schema}.rebuild where state = any($1)";

/// The first seq an unresolved (`$1`) dead letter still needs.
const FIRST_NEEDED: &str =
    "select min(seq) as seq from {schema}.dead_letter where subscriber_id is not null \
     and seq is not null and status = any($1)";

/// Registers target `$1` as holding the whole log, unless registered.
const REGISTER_TARGET: &str =
    "insert into {schema}.target_hold (target, bound) values ($1, 0) on conflict do nothing";

/// Records that target `$1` lets go of the log up to `$2`.
const RECORD_HOLD: &str = "insert into {schema}.target_hold (target, bound) values ($1, $2) \
     on conflict (target) do update set bound = excluded.bound, updated_at = now()";

/// Forgets target `$1`'s hold.
const FORGET_HOLD: &str = "delete from {schema}.target_hold where target = $1";

/// Every recorded target hold.
const HOLDS: &str = "select target, bound from {schema}.target_hold";

/// A batch (`$3`) of subscriber `$1`'s claims older than `$2` seconds, except on `$4`.
const PRUNE_CLAIMS_ELSEWHERE: &str =
    "delete from {schema}.processed_message where ctid = any(array( \
     select m.ctid from {schema}.processed_message m \
     where m.subscriber_id = $1 and m.processed_at < now() - make_interval(secs => $2) \
       and m.message_id <> all($4::uuid[]) \
     limit $3))";

/// How far the furthest partition of subscriber `$1` has read.
const REACHED: &str = "select coalesce(max(position), 0) as reached from {schema}.checkpoint where subscriber_id = $1";

/// The IDs of the events after seq `$1` up to `$2`.
const EVENT_IDS: &str = "select event_id from {schema}.event_log where seq > $1 and seq <= $2";

/// A batch (`$1`) of the claims of subscribers a rebuild retired (aborted `$2`, or
/// replaced and finished `$3`), unless one serves or rebuilds (`$4`) again.
const PRUNE_RETIRED_CLAIMS: &str =
    "delete from {schema}.processed_message where ctid = any(array( \
     select ctid from {schema}.processed_message where subscriber_id = any(array( \
       select subscriber_id from {schema}.rebuild where state = $2 union \
       select previous_subscriber from {schema}.rebuild where state = $3 \
       except select subscriber_id from {schema}.projection \
       except select subscriber_id from {schema}.rebuild where state = any($4))) \
     limit $1))";

/// Subscriber `$1`'s checkpoint count, partition count and lowest position.
const PASSED: &str =
    "select count(*) as checkpoints, coalesce(max(partitions), 0)::int8 as partitions, \
     coalesce(min(position), 0) as position \
     from {schema}.checkpoint where subscriber_id = $1";

/// What to prune.
#[derive(Debug, Clone)]
pub struct PrunePolicy {
    /// The event log's retention; `None` keeps events forever.
    pub event_log: Option<Duration>,
    /// Subscribers whose claims expire, with their retention.
    pub claims: Vec<(String, Duration)>,
    /// How long a pruned event's identity is kept (see `claim`): at least the longest
    /// claim retention of any subscriber on any target; `None` keeps it forever.
    pub identities: Option<Duration>,
    /// Rows per delete.
    pub batch: i64,
    /// The highest seq the extra targets let go of (see [`hold`]); `None`: no extra
    /// target holds anything.
    pub held_elsewhere: Option<i64>,
}

/// What one prune pass deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    pub claims: u64,
    pub events: u64,
    /// Extra targets that could not be read, with why: the event log kept every event
    /// for them in this pass.
    pub held_by: Vec<(String, String)>,
}

/// Advisory-lock class serializing prune passes with rebuild starts (`'walP'`), keyed by
/// the schema's `hashtext`.
const PRUNE_LOCK: i32 = 0x7761_6c50;

/// Waits for the prune lock and holds it for this session (until it ends): what a prune
/// pass does first, so that a rebuild starting meanwhile is either seen by the pass
/// as holding the log, or sees what the pass pruned.
pub async fn lock_pruning(client: &Client, schema: &Schema) -> Result<(), StoreError> {
    client
        .execute(
            "select pg_advisory_lock($1::int4, hashtext($2))",
            &[&PRUNE_LOCK, &schema.name()],
        )
        .await
        .map_err(StoreError::db("waiting for the prune lock"))?;
    Ok(())
}

/// Takes the prune lock shared for this session (until it ends), if no prune pass holds
/// it: what a rebuild start does, so that starts do not wait for one another.
pub async fn try_hold_off_pruning(client: &Client, schema: &Schema) -> Result<bool, StoreError> {
    Ok(client
        .query_one(
            "select pg_try_advisory_lock_shared($1::int4, hashtext($2)) as locked",
            &[&PRUNE_LOCK, &schema.name()],
        )
        .await
        .map_err(StoreError::db("taking the prune lock"))?
        .of("the prune lock")
        .col("locked")?)
}

/// How far retention has pruned the event log: a rebuild replays only what it holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogPruned {
    /// The highest seq pruning may have deleted.
    pub through: i64,
    /// When it last deleted events (`None`: before walfold recorded it).
    pub at_unix: Option<f64>,
}

/// Whether retention has pruned the event log, and how far.
pub async fn log_pruned(
    client: &impl tokio_postgres::GenericClient,
    schema: &Schema,
) -> Result<Option<LogPruned>, StoreError> {
    client
        .query_opt(&schema.sql(PRUNED_THROUGH), &[])
        .await
        .map_err(StoreError::db("reading how far the event log was pruned"))?
        .map(|r| {
            let r = r.of("event_log_pruned");
            Ok(LogPruned {
                through: r.col("through")?,
                at_unix: r.col("pruned_at_unix")?,
            })
        })
        .transpose()
}

/// One prune pass. With a `fence` (the leader's), every delete proves in its
/// transaction that this instance still leads.
pub async fn prune(
    client: &mut Client,
    schema: &Schema,
    policy: &PrunePolicy,
    fence: Option<&Fence>,
) -> Result<Pruned, StoreError> {
    let mut pruned = Pruned::default();
    let claims = schema.sql(PRUNE_CLAIMS);
    for (subscriber, retention) in &policy.claims {
        let passed = passed(client, schema, subscriber).await?;
        pruned.claims += delete_batches(
            client,
            fence,
            &claims,
            &[subscriber, &retention.as_secs_f64(), &policy.batch, &passed],
            policy.batch,
            Count::Affected,
        )
        .await?;
    }
    pruned.claims += delete_retired_claims(client, fence, schema, policy.batch).await?;
    if let Some(keep) = policy.identities {
        let sql = schema.sql(PRUNE_IDENTITIES);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] =
            [&keep.as_secs_f64(), &policy.batch];
        delete_batches(client, fence, &sql, &params, policy.batch, Count::Affected).await?;
    }
    let Some(retention) = policy.event_log else {
        return Ok(pruned);
    };
    // Every projection's active subscriber and every rebuild in progress must have
    // passed an event; the head stays.
    let holders = holders(client, schema).await?;
    let mut bound = crate::log_order::head(&*client, schema).await? - 1;
    for subscriber in &holders {
        bound = bound.min(passed(client, schema, subscriber).await?);
    }
    if let Some(held) = policy.held_elsewhere {
        bound = bound.min(held);
    }
    if bound <= 0 {
        return Ok(pruned);
    }
    let events = schema.sql(PRUNE_EVENTS);
    pruned.events = delete_batches(
        client,
        fence,
        &events,
        &[
            &bound,
            &retention.as_secs_f64(),
            &policy.batch,
            &DeadLetterStatus::UNRESOLVED,
        ],
        policy.batch,
        Count::Returned,
    )
    .await?;
    Ok(pruned)
}

/// The subscribers that hold events in the log: every projection's active one, and
/// every rebuild's in progress.
async fn holders(client: &Client, schema: &Schema) -> Result<Vec<String>, StoreError> {
    client
        .query(&schema.sql(HOLDERS), &[&RebuildState::REPLAYING])
        .await
        .map_err(StoreError::db("reading subscribers for pruning"))?
        .iter()
        .map(|r| Ok(r.of("checkpoint").col("subscriber_id")?))
        .collect()
}

/// On an extra target: the highest seq of the main log it lets go of. Every projection's
/// active subscriber and every rebuild in progress there has passed it, and it is below
/// the first event an open dead letter there still needs (a coarser rule than the main
/// target's per-event one, which a join across databases cannot express). `None` when
/// nothing there holds events.
pub async fn hold(client: &Client, schema: &Schema) -> Result<Option<i64>, StoreError> {
    let holders = holders(client, schema).await?;
    let mut bound: Option<i64> = None;
    for subscriber in &holders {
        let p = passed(client, schema, subscriber).await?;
        bound = Some(bound.map_or(p, |b| b.min(p)));
    }
    let needed: Option<i64> = client
        .query_one(&schema.sql(FIRST_NEEDED), &[&DeadLetterStatus::UNRESOLVED])
        .await
        .map_err(StoreError::db("reading dead letters for pruning"))?
        .of("dead_letter")
        .col("seq")?;
    if let Some(first) = needed {
        bound = Some(bound.map_or(first - 1, |b| b.min(first - 1)));
    }
    Ok(bound)
}

/// Registers an extra target in the main target's schema as holding the whole log,
/// until a prune pass records how far it really lets go: from the moment its
/// projections run, taking it out of the config never frees what they have not read.
pub async fn register_target(
    client: &mut Client,
    schema: &Schema,
    target: &str,
    fence: &Fence,
) -> Result<(), StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("registering a target"))?;
    tx.execute(&schema.sql(REGISTER_TARGET), &[&target])
        .await
        .map_err(StoreError::db("registering a target"))?;
    fence.check(&tx).await?;
    tx.commit()
        .await
        .map_err(StoreError::db("registering a target"))
}

/// Records, in the main target's schema, how far each configured extra target lets go
/// of the log (`None`: nothing there holds events), and returns the lowest bound over
/// every recorded target, with the names of those no longer configured: their last
/// bound holds the log until the row is deleted.
pub async fn record_holds(
    client: &mut Client,
    schema: &Schema,
    holds: &[(String, Option<i64>)],
    configured: &[String],
    fence: Option<&Fence>,
) -> Result<(Option<i64>, Vec<(String, i64)>), StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("recording target holds"))?;
    for (target, bound) in holds {
        match bound {
            Some(b) => tx
                .execute(&schema.sql(RECORD_HOLD), &[target, b])
                .await
                .map_err(StoreError::db("recording a target hold"))?,
            None => tx
                .execute(&schema.sql(FORGET_HOLD), &[target])
                .await
                .map_err(StoreError::db("recording a target hold"))?,
        };
    }
    let rows = tx
        .query(&schema.sql(HOLDS), &[])
        .await
        .map_err(StoreError::db("reading target holds"))?;
    if let Some(fence) = fence {
        fence.check(&tx).await?;
    }
    tx.commit()
        .await
        .map_err(StoreError::db("recording target holds"))?;
    let mut lowest: Option<i64> = None;
    let mut removed = Vec::new();
    for r in &rows {
        let r = r.of("target_hold");
        let (target, bound): (String, i64) = (r.col("target")?, r.col("bound")?);
        lowest = Some(lowest.map_or(bound, |l| l.min(bound)));
        if !configured.contains(&target) {
            removed.push((target, bound));
        }
    }
    Ok((lowest, removed))
}

/// Most events a subscriber's partitions may be apart for its claims on an extra target
/// to be pruned in a pass: the IDs of the events its slowest partition has not passed
/// are read from the main log and kept.
const AHEAD_LIMIT: i64 = 100_000;

/// Claim pruning on an extra target: as in [`prune`], a claim goes only once its
/// retention has passed and every partition of its subscriber has passed its event.
/// `log` is a connection to the main target (schema `log_schema`), where the events are.
pub async fn prune_claims_elsewhere(
    client: &mut Client,
    schema: &Schema,
    log: &Client,
    log_schema: &Schema,
    policy: &PrunePolicy,
    fence: Option<&Fence>,
) -> Result<Pruned, StoreError> {
    let mut pruned = Pruned::default();
    let claims = schema.sql(PRUNE_CLAIMS_ELSEWHERE);
    for (subscriber, retention) in &policy.claims {
        let passed = passed(client, schema, subscriber).await?;
        let reached: i64 = client
            .query_one(&schema.sql(REACHED), &[subscriber])
            .await
            .map_err(StoreError::db("reading checkpoints for pruning"))?
            .of("checkpoint")
            .col("reached")?;
        if reached - passed > AHEAD_LIMIT {
            tracing::debug!(
                subscriber,
                passed,
                reached,
                "partitions too far apart; its claims wait for the next prune"
            );
            continue;
        }
        let ahead: Vec<uuid::Uuid> = log
            .query(&log_schema.sql(EVENT_IDS), &[&passed, &reached])
            .await
            .map_err(StoreError::db("reading the event log for pruning"))?
            .iter()
            .map(|r| r.of("event_log").col("event_id"))
            .collect::<Result<_, _>>()?;
        pruned.claims += delete_batches(
            client,
            fence,
            &claims,
            &[subscriber, &retention.as_secs_f64(), &policy.batch, &ahead],
            policy.batch,
            Count::Affected,
        )
        .await?;
    }
    pruned.claims += delete_retired_claims(client, fence, schema, policy.batch).await?;
    Ok(pruned)
}

/// Deletes the claims of subscribers a rebuild retired (aborted, or replaced and
/// finished).
async fn delete_retired_claims(
    client: &mut Client,
    fence: Option<&Fence>,
    schema: &Schema,
    batch: i64,
) -> Result<u64, StoreError> {
    let sql = schema.sql(PRUNE_RETIRED_CLAIMS);
    delete_batches(
        client,
        fence,
        &sql,
        &[
            &batch,
            &RebuildState::Aborted,
            &RebuildState::Finished,
            &RebuildState::REPLAYING,
        ],
        batch,
        Count::Affected,
    )
    .await
}

/// The seq every partition of `subscriber` has passed (0 when one has not started).
async fn passed(client: &Client, schema: &Schema, subscriber: &str) -> Result<i64, StoreError> {
    let row = client
        .query_one(&schema.sql(PASSED), &[&subscriber])
        .await
        .map_err(StoreError::db("reading checkpoints for pruning"))?;
    let row = row.of("checkpoint");
    let (n, partitions, min): (i64, i64, i64) = (
        row.col("checkpoints")?,
        row.col("partitions")?,
        row.col("position")?,
    );
    Ok(if n == 0 || n < partitions { 0 } else { min })
}

/// Where a batch's delete count comes from: the rows the statement affected, or its
/// `deleted` column (a delete inside a `with`, whose rows are not the statement's).
#[derive(Clone, Copy)]
enum Count {
    Affected,
    Returned,
}

/// Runs `sql` (a delete of at most `batch` rows) in fenced transactions until it deletes
/// fewer than `batch`; returns how many it deleted.
async fn delete_batches(
    client: &mut Client,
    fence: Option<&Fence>,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    batch: i64,
    count: Count,
) -> Result<u64, StoreError> {
    let statement = client
        .prepare(sql)
        .await
        .map_err(StoreError::db("preparing a prune"))?;
    let mut total = 0;
    loop {
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::db("pruning"))?;
        let n = match count {
            Count::Affected => tx
                .execute(&statement, params)
                .await
                .map_err(StoreError::db("pruning"))?,
            Count::Returned => tx
                .query_one(&statement, params)
                .await
                .map_err(StoreError::db("pruning"))?
                .of("event_log")
                .col::<i64>("deleted")? as u64,
        };
        if let Some(fence) = fence {
            fence.check(&tx).await?;
        }
        tx.commit().await.map_err(StoreError::db("pruning"))?;
        total += n;
        if n < batch as u64 {
            return Ok(total);
        }
    }
}

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

use crate::dead_letter::DeadLetterStatus;
use crate::error::StoreError;
use crate::leader::Fence;
use crate::rebuild::RebuildState;
use walfold_config::quote_ident;

/// What to prune.
#[derive(Debug, Clone)]
pub struct PrunePolicy {
    /// The event log's retention; `None` keeps events forever.
    pub event_log: Option<Duration>,
    /// Subscribers whose claims expire, with their retention.
    pub claims: Vec<(String, Duration)>,
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

/// One prune pass. With a `fence` (the leader's), every delete proves in its
/// transaction that this instance still leads.
pub async fn prune(
    client: &mut Client,
    schema: &str,
    policy: &PrunePolicy,
    fence: Option<&Fence>,
) -> Result<Pruned, StoreError> {
    let s = quote_ident(schema);
    let mut pruned = Pruned::default();
    let claims = format!(
        "delete from {s}.processed_message where ctid = any(array( \
         select m.ctid from {s}.processed_message m \
         where m.subscriber_id = $1 and m.processed_at < now() - make_interval(secs => $2) \
           and not exists (select 1 from {s}.event_log e \
                           where e.event_id = m.message_id and e.seq > $4) \
         limit $3))"
    );
    for (subscriber, retention) in &policy.claims {
        let passed = passed(client, schema, subscriber).await?;
        pruned.claims += delete_batches(
            client,
            fence,
            &claims,
            &[subscriber, &retention.as_secs_f64(), &policy.batch, &passed],
            policy.batch,
        )
        .await?;
    }
    pruned.claims += delete_retired_claims(client, fence, &s, policy.batch).await?;
    let Some(retention) = policy.event_log else {
        return Ok(pruned);
    };
    // Every projection's active subscriber and every rebuild in progress must have
    // passed an event; the head stays.
    let holders = holders(client, schema).await?;
    let mut bound = crate::event_log::head(&*client, &crate::Schema::new(schema)).await? - 1;
    for subscriber in &holders {
        bound = bound.min(passed(client, schema, subscriber).await?);
    }
    if let Some(held) = policy.held_elsewhere {
        bound = bound.min(held);
    }
    if bound <= 0 {
        return Ok(pruned);
    }
    let events = format!(
        "delete from {s}.event_log where seq = any(array( \
         select e.seq from {s}.event_log e \
         where e.seq <= $1 and e.appended_at < now() - make_interval(secs => $2) \
           and not exists (select 1 from {s}.dead_letter d where d.seq = e.seq \
                           and d.subscriber_id is not null and d.status = any($4)) \
         order by e.seq limit $3))"
    );
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
    )
    .await?;
    Ok(pruned)
}

/// The subscribers that hold events in the log: every projection's active one, and
/// every rebuild's in progress.
async fn holders(client: &Client, schema: &str) -> Result<Vec<String>, StoreError> {
    let s = quote_ident(schema);
    Ok(client
        .query(
            &format!(
                "select subscriber_id from {s}.projection union \
                 select subscriber_id from {s}.rebuild where state = any($1)"
            ),
            &[&RebuildState::REPLAYING],
        )
        .await
        .map_err(StoreError::db("reading subscribers for pruning"))?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// On an extra target: the highest seq of the main log it lets go of. Every projection's
/// active subscriber and every rebuild in progress there has passed it, and it is below
/// the first event an open dead letter there still needs (a coarser rule than the main
/// target's per-event one, which a join across databases cannot express). `None` when
/// nothing there holds events.
pub async fn hold(client: &Client, schema: &str) -> Result<Option<i64>, StoreError> {
    let s = quote_ident(schema);
    let holders = holders(client, schema).await?;
    let mut bound: Option<i64> = None;
    for subscriber in &holders {
        let p = passed(client, schema, subscriber).await?;
        bound = Some(bound.map_or(p, |b| b.min(p)));
    }
    let needed: Option<i64> = client
        .query_one(
            &format!(
                "select min(seq) from {s}.dead_letter where subscriber_id is not null \
                 and seq is not null and status = any($1)"
            ),
            &[&DeadLetterStatus::UNRESOLVED],
        )
        .await
        .map_err(StoreError::db("reading dead letters for pruning"))?
        .get(0);
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
    schema: &str,
    target: &str,
    fence: &Fence,
) -> Result<(), StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("registering a target"))?;
    tx.execute(
        &format!(
            "insert into {}.target_hold (target, bound) values ($1, 0) on conflict do nothing",
            quote_ident(schema)
        ),
        &[&target],
    )
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
    schema: &str,
    holds: &[(String, Option<i64>)],
    configured: &[String],
    fence: Option<&Fence>,
) -> Result<(Option<i64>, Vec<(String, i64)>), StoreError> {
    let s = quote_ident(schema);
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("recording target holds"))?;
    for (target, bound) in holds {
        match bound {
            Some(b) => tx
                .execute(
                    &format!(
                        "insert into {s}.target_hold (target, bound) values ($1, $2) \
                         on conflict (target) do update set bound = excluded.bound, updated_at = now()"
                    ),
                    &[target, b],
                )
                .await
                .map_err(StoreError::db("recording a target hold"))?,
            None => tx
                .execute(
                    &format!("delete from {s}.target_hold where target = $1"),
                    &[target],
                )
                .await
                .map_err(StoreError::db("recording a target hold"))?,
        };
    }
    let rows = tx
        .query(&format!("select target, bound from {s}.target_hold"), &[])
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
        let (target, bound): (String, i64) = (r.get(0), r.get(1));
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
    schema: &str,
    log: &Client,
    log_schema: &str,
    policy: &PrunePolicy,
    fence: Option<&Fence>,
) -> Result<Pruned, StoreError> {
    let s = quote_ident(schema);
    let mut pruned = Pruned::default();
    let claims = format!(
        "delete from {s}.processed_message where ctid = any(array( \
         select m.ctid from {s}.processed_message m \
         where m.subscriber_id = $1 and m.processed_at < now() - make_interval(secs => $2) \
           and m.message_id <> all($4::uuid[]) \
         limit $3))"
    );
    for (subscriber, retention) in &policy.claims {
        let passed = passed(client, schema, subscriber).await?;
        let reached: i64 = client
            .query_one(
                &format!(
                    "select coalesce(max(position), 0) from {s}.checkpoint where subscriber_id = $1"
                ),
                &[subscriber],
            )
            .await
            .map_err(StoreError::db("reading checkpoints for pruning"))?
            .get(0);
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
            .query(
                &format!(
                    "select event_id from {}.event_log where seq > $1 and seq <= $2",
                    quote_ident(log_schema)
                ),
                &[&passed, &reached],
            )
            .await
            .map_err(StoreError::db("reading the event log for pruning"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        pruned.claims += delete_batches(
            client,
            fence,
            &claims,
            &[subscriber, &retention.as_secs_f64(), &policy.batch, &ahead],
            policy.batch,
        )
        .await?;
    }
    pruned.claims += delete_retired_claims(client, fence, &s, policy.batch).await?;
    Ok(pruned)
}

/// Deletes the claims of subscribers a rebuild retired (aborted, or replaced and
/// finished); `s` is the quoted schema.
async fn delete_retired_claims(
    client: &mut Client,
    fence: Option<&Fence>,
    s: &str,
    batch: i64,
) -> Result<u64, StoreError> {
    let sql = format!(
        "delete from {s}.processed_message where ctid = any(array( \
         select ctid from {s}.processed_message where subscriber_id = any(array( \
           select subscriber_id from {s}.rebuild where state = $2 union \
           select previous_subscriber from {s}.rebuild where state = $3 \
           except select subscriber_id from {s}.projection \
           except select subscriber_id from {s}.rebuild where state = any($4))) \
         limit $1))"
    );
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
    )
    .await
}

/// The seq every partition of `subscriber` has passed (0 when one has not started).
async fn passed(client: &Client, schema: &str, subscriber: &str) -> Result<i64, StoreError> {
    let row = client
        .query_one(
            &format!(
                "select count(*), coalesce(max(partitions), 0)::int8, coalesce(min(position), 0) \
                 from {}.checkpoint where subscriber_id = $1",
                quote_ident(schema)
            ),
            &[&subscriber],
        )
        .await
        .map_err(StoreError::db("reading checkpoints for pruning"))?;
    let (n, partitions, min): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    Ok(if n == 0 || n < partitions { 0 } else { min })
}

async fn delete_batches(
    client: &mut Client,
    fence: Option<&Fence>,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    batch: i64,
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
        let n = tx
            .execute(&statement, params)
            .await
            .map_err(StoreError::db("pruning"))?;
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

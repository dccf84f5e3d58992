//! Retention as replay policy: claims older than a subscriber's `dedup_retention` and
//! events older than the log's retention are deleted in small batches. An event is
//! never deleted before every projection's active subscriber and every rebuild in
//! progress has passed it, nor the log's head (the appender continues numbering from
//! it), nor while an open dead letter still needs it. A claim is never deleted before
//! every partition of its subscriber has passed its event: whatever walfold re-reads by
//! itself (a restart, a changed `parallelism`) still meets its claim. Retention bounds
//! only redeliveries from outside (a backfill, a retry).

use std::time::Duration;

use tokio_postgres::Client;

use crate::error::StoreError;
use crate::leader::Fence;
use crate::q;

/// What to prune.
#[derive(Debug, Clone)]
pub struct PrunePolicy {
    /// The event log's retention; `None` keeps events forever.
    pub event_log: Option<Duration>,
    /// Subscribers whose claims expire, with their retention.
    pub claims: Vec<(String, Duration)>,
    /// Rows per delete.
    pub batch: i64,
}

/// What one prune pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub claims: u64,
    pub events: u64,
}

/// One prune pass. With a `fence` (the leader's), every delete proves in its
/// transaction that this instance still leads.
pub async fn prune(
    client: &mut Client,
    schema: &str,
    policy: &PrunePolicy,
    fence: Option<&Fence>,
) -> Result<Pruned, StoreError> {
    let s = q(schema);
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
    // Claims of subscribers a rebuild retired (aborted, or replaced and finished).
    let retired = format!(
        "delete from {s}.processed_message where ctid = any(array( \
         select ctid from {s}.processed_message where subscriber_id = any(array( \
           select subscriber_id from {s}.rebuild where state = 'aborted' union \
           select previous_subscriber from {s}.rebuild where state = 'finished' \
           except select subscriber_id from {s}.projection \
           except select subscriber_id from {s}.rebuild where state in ('running', 'aborting'))) \
         limit $1))"
    );
    pruned.claims +=
        delete_batches(client, fence, &retired, &[&policy.batch], policy.batch).await?;
    let Some(retention) = policy.event_log else {
        return Ok(pruned);
    };
    // Every projection's active subscriber and every rebuild in progress must have
    // passed an event; the head stays.
    let holders: Vec<String> = client
        .query(
            &format!(
                "select subscriber_id from {s}.projection union \
                 select subscriber_id from {s}.rebuild where state in ('running', 'aborting')"
            ),
            &[],
        )
        .await
        .map_err(StoreError::db("reading subscribers for pruning"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut bound = crate::event_log::head(&*client, schema).await? - 1;
    for subscriber in &holders {
        bound = bound.min(passed(client, schema, subscriber).await?);
    }
    if bound <= 0 {
        return Ok(pruned);
    }
    let events = format!(
        "delete from {s}.event_log where seq = any(array( \
         select e.seq from {s}.event_log e \
         where e.seq <= $1 and e.appended_at < now() - make_interval(secs => $2) \
           and not exists (select 1 from {s}.dead_letter d where d.seq = e.seq \
                           and d.subscriber_id is not null and d.status in ('open', 'retrying', 'waiting')) \
         order by e.seq limit $3))"
    );
    pruned.events = delete_batches(
        client,
        fence,
        &events,
        &[&bound, &retention.as_secs_f64(), &policy.batch],
        policy.batch,
    )
    .await?;
    Ok(pruned)
}

/// The seq every partition of `subscriber` has passed (0 when one has not started).
async fn passed(client: &Client, schema: &str, subscriber: &str) -> Result<i64, StoreError> {
    let row = client
        .query_one(
            &format!(
                "select count(*), coalesce(max(partitions), 0)::int8, coalesce(min(position), 0) \
                 from {}.checkpoint where subscriber_id = $1",
                q(schema)
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

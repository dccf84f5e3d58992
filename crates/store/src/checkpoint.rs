//! Subscriber checkpoints: how far each partition has read the event log, with its
//! counters. Written in the same transaction as the claims and the projection change.

use std::time::SystemTime;

use tokio_postgres::{Client, Statement, Transaction};

use crate::error::StoreError;
use walfold_config::quote_ident;

/// Advisory-lock class serializing checkpoint reconciles (`'walC'`).
const CHECKPOINT_LOCK: i32 = 0x7761_6c43;

/// What one batch did, added to the partition's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartitionStats {
    pub applied: i64,
    pub duplicates: i64,
    pub stale: i64,
    pub dead_lettered: i64,
}

/// Checkpoint statements for one subscriber.
#[derive(Clone)]
pub struct Checkpoints {
    save: Statement,
    subscriber: String,
    partitions: i32,
}

impl Checkpoints {
    pub async fn prepare(
        client: &Client,
        schema: &str,
        subscriber: &str,
        partitions: u32,
    ) -> Result<Self, StoreError> {
        let save = client
            .prepare(&format!(
                "insert into {s}.checkpoint as c (subscriber_id, partition, partitions, position, \
                 applied, duplicates, stale, dead_lettered, last_committed_at, updated_at) \
                 values ($1, $2, $3, $4, $5, $6, $7, $8, $9, now()) \
                 on conflict (subscriber_id, partition) do update set \
                 partitions = excluded.partitions, \
                 position = greatest(c.position, excluded.position), \
                 applied = c.applied + excluded.applied, \
                 duplicates = c.duplicates + excluded.duplicates, \
                 stale = c.stale + excluded.stale, \
                 dead_lettered = c.dead_lettered + excluded.dead_lettered, \
                 last_committed_at = coalesce(excluded.last_committed_at, c.last_committed_at), \
                 updated_at = now() \
                 where c.partitions = excluded.partitions",
                s = quote_ident(schema)
            ))
            .await
            .map_err(StoreError::db("preparing checkpoint save"))?;
        Ok(Checkpoints {
            save,
            subscriber: subscriber.to_owned(),
            partitions: partitions as i32,
        })
    }

    /// Makes the subscriber's checkpoint rows match `partitions`, in one transaction,
    /// before any of its projectors runs. A partition without a row (a new subscriber)
    /// gets one at 0.
    /// When the partition count changed (an operator changed `parallelism`), aggregates
    /// move between partitions, so every new partition resumes at the lowest position of
    /// the old layout (0 if an old partition never saved one): never past an event some
    /// aggregate has not seen, and never further back than needed. The claims absorb the
    /// re-read, and claims are never pruned past the lowest position (see `prune`). The
    /// counters are kept, summed into partition 0.
    pub async fn reconcile(
        client: &mut Client,
        schema: &str,
        subscriber: &str,
        partitions: u32,
        fence: &crate::leader::Fence,
    ) -> Result<(), StoreError> {
        let s = quote_ident(schema);
        let n = partitions as i32;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::db("reconciling checkpoints"))?;
        // Serializes with another reconcile of this subscriber (rows may not exist yet).
        tx.execute(
            "select pg_advisory_xact_lock($1::int4, hashtext($2))",
            &[&CHECKPOINT_LOCK, &subscriber],
        )
        .await
        .map_err(StoreError::db("locking checkpoints"))?;
        let rows = tx
            .query(
                &format!(
                    "select partition, partitions, position from {s}.checkpoint \
                     where subscriber_id = $1 for update"
                ),
                &[&subscriber],
            )
            .await
            .map_err(StoreError::db("reading checkpoints"))?;
        let stored: Vec<(i32, i32, i64)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        if stored.iter().all(|&(_, np, _)| np == n) {
            // Same layout: a partition without a row has read nothing yet.
            if stored.len() < partitions as usize {
                tx.execute(
                    &format!(
                        "insert into {s}.checkpoint (subscriber_id, partition, partitions, position) \
                         select $1::text, p, $2::int4, 0 from generate_series(0, $2::int4 - 1) as p \
                         on conflict do nothing"
                    ),
                    &[&subscriber, &n],
                )
                .await
                .map_err(StoreError::db("creating checkpoints"))?;
                fence.check(&tx).await?;
                tx.commit()
                    .await
                    .map_err(StoreError::db("creating checkpoints"))?;
            }
            return Ok(());
        }
        let old_partitions = stored.iter().map(|&(_, np, _)| np).max().unwrap_or(0);
        let resume = if stored.len() < old_partitions.max(0) as usize {
            0
        } else {
            stored.iter().map(|&(_, _, pos)| pos).min().unwrap_or(0)
        };
        let totals = tx
            .query_one(
                &format!(
                    "with old as (delete from {s}.checkpoint where subscriber_id = $1 returning *) \
                     select coalesce(sum(applied), 0)::int8, coalesce(sum(duplicates), 0)::int8, \
                     coalesce(sum(stale), 0)::int8, coalesce(sum(dead_lettered), 0)::int8, \
                     max(last_committed_at) from old"
                ),
                &[&subscriber],
            )
            .await
            .map_err(StoreError::db("resetting checkpoints"))?;
        let (applied, duplicates, stale, dead): (i64, i64, i64, i64) =
            (totals.get(0), totals.get(1), totals.get(2), totals.get(3));
        let last: Option<SystemTime> = totals.get(4);
        tx.execute(
            &format!(
                "insert into {s}.checkpoint (subscriber_id, partition, partitions, position, \
                 applied, duplicates, stale, dead_lettered, last_committed_at) \
                 select $1::text, p, $2::int4, $3::int8, \
                   case when p = 0 then $4::int8 else 0 end, case when p = 0 then $5::int8 else 0 end, \
                   case when p = 0 then $6::int8 else 0 end, case when p = 0 then $7::int8 else 0 end, \
                   $8::timestamptz \
                 from generate_series(0, $2::int4 - 1) as p"
            ),
            &[
                &subscriber,
                &n,
                &resume,
                &applied,
                &duplicates,
                &stale,
                &dead,
                &last,
            ],
        )
        .await
        .map_err(StoreError::db("resetting checkpoints"))?;
        // A deposed leader with another layout must not rewrite the new leader's rows.
        fence.check(&tx).await?;
        tx.commit()
            .await
            .map_err(StoreError::db("reconciling checkpoints"))?;
        tracing::info!(subscriber, from = old_partitions, to = partitions, position = resume, "partition count changed: every partition resumes at the lowest position of the old layout");
        Ok(())
    }

    /// Where `partition` resumes (after [`Checkpoints::reconcile`]).
    pub async fn position(
        client: &Client,
        schema: &str,
        subscriber: &str,
        partition: u32,
    ) -> Result<i64, StoreError> {
        Ok(client
            .query_opt(
                &format!(
                    "select position from {}.checkpoint where subscriber_id = $1 and partition = $2",
                    quote_ident(schema)
                ),
                &[&subscriber, &(partition as i32)],
            )
            .await
            .map_err(StoreError::db("loading a checkpoint"))?
            .map_or(0, |r| r.get(0)))
    }

    /// Saves a partition's position and adds `stats` (in the batch's transaction; the
    /// projector's unit of work is the only caller).
    pub async fn save(
        &self,
        tx: &Transaction<'_>,
        partition: u32,
        position: i64,
        stats: PartitionStats,
        last_committed_at: Option<SystemTime>,
    ) -> Result<(), StoreError> {
        let saved = tx
            .execute(
                &self.save,
                &[
                    &self.subscriber,
                    &(partition as i32),
                    &self.partitions,
                    &position,
                    &stats.applied,
                    &stats.duplicates,
                    &stats.stale,
                    &stats.dead_lettered,
                    &last_committed_at,
                ],
            )
            .await
            .map_err(StoreError::db(format!(
                "saving checkpoint of {}",
                self.subscriber
            )))?;
        if saved == 0 {
            // Another instance runs this subscriber with another parallelism: positions
            // of different partitionings must never mix. Retry; a reload reconciles.
            return Err(StoreError::Busy(format!(
                "checkpoint of {} was written with another partition count",
                self.subscriber
            )));
        }
        Ok(())
    }
}

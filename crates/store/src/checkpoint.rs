//! Subscriber checkpoints: how far each partition has read the event log, with its
//! counters. Written in the same transaction as the claims and the projection change.

use std::time::SystemTime;

use tokio_postgres::{Client, Statement, Transaction};

use crate::error::StoreError;
use crate::schema::Schema;
use walfold_pg::RowExt;

/// Advisory-lock class serializing checkpoint reconciles (`'walC'`).
const CHECKPOINT_LOCK: i32 = 0x7761_6c43;

/// Saves partition `$2`'s position `$4` and adds the batch's counters, unless the
/// partition count changed under it (`$3`).
const SAVE: &str =
    "insert into {schema}.checkpoint as c (subscriber_id, partition, partitions, position, \
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
     where c.partitions = excluded.partitions";

/// Subscriber `$1`'s checkpoint rows, locked for the reconcile.
const LOCK_ALL: &str = "select partition, partitions, position from {schema}.checkpoint \
     where subscriber_id = $1 for update";

/// A row at 0 for each of partitions 0..`$2` of subscriber `$1` that has none.
const CREATE_MISSING: &str =
    "insert into {schema}.checkpoint (subscriber_id, partition, partitions, position) \
     select $1::text, p, $2::int4, 0 from generate_series(0, $2::int4 - 1) as p \
     on conflict do nothing";

/// Deletes subscriber `$1`'s checkpoint rows and sums their counters.
const DELETE_SUMMED: &str =
    "with old as (delete from {schema}.checkpoint where subscriber_id = $1 returning *) \
     select coalesce(sum(applied), 0)::int8 as applied, \
     coalesce(sum(duplicates), 0)::int8 as duplicates, \
     coalesce(sum(stale), 0)::int8 as stale, \
     coalesce(sum(dead_lettered), 0)::int8 as dead_lettered, \
     max(last_committed_at) as last_committed_at from old";

/// Partitions 0..`$2` of subscriber `$1` at position `$3`, the summed counters on 0.
const CREATE_LAYOUT: &str =
    "insert into {schema}.checkpoint (subscriber_id, partition, partitions, position, \
     applied, duplicates, stale, dead_lettered, last_committed_at) \
     select $1::text, p, $2::int4, $3::int8, \
       case when p = 0 then $4::int8 else 0 end, case when p = 0 then $5::int8 else 0 end, \
       case when p = 0 then $6::int8 else 0 end, case when p = 0 then $7::int8 else 0 end, \
       $8::timestamptz \
     from generate_series(0, $2::int4 - 1) as p";

/// Where partition `$2` of subscriber `$1` resumes.
const POSITION: &str =
    "select position from {schema}.checkpoint where subscriber_id = $1 and partition = $2";

/// A checkpoint row as the reconcile reads it.
struct Stored {
    partitions: i32,
    position: i64,
}

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
    pub(crate) async fn prepare(
        client: &Client,
        schema: &Schema,
        subscriber: &str,
        partitions: u32,
    ) -> Result<Self, StoreError> {
        let save = client
            .prepare(&schema.sql(SAVE))
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
        schema: &Schema,
        subscriber: &str,
        partitions: u32,
        fence: &crate::leader::Fence,
    ) -> Result<(), StoreError> {
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
            .query(&schema.sql(LOCK_ALL), &[&subscriber])
            .await
            .map_err(StoreError::db("reading checkpoints"))?;
        let stored: Vec<Stored> = rows
            .iter()
            .map(|r| {
                let r = r.of("checkpoint");
                Ok(Stored {
                    partitions: r.col("partitions")?,
                    position: r.col("position")?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        if stored.iter().all(|c| c.partitions == n) {
            // Same layout: a partition without a row has read nothing yet.
            if stored.len() < partitions as usize {
                tx.execute(&schema.sql(CREATE_MISSING), &[&subscriber, &n])
                    .await
                    .map_err(StoreError::db("creating checkpoints"))?;
                fence.check(&tx).await?;
                tx.commit()
                    .await
                    .map_err(StoreError::db("creating checkpoints"))?;
            }
            return Ok(());
        }
        let old_partitions = stored.iter().map(|c| c.partitions).max().unwrap_or(0);
        let resume = if stored.len() < old_partitions.max(0) as usize {
            0
        } else {
            stored.iter().map(|c| c.position).min().unwrap_or(0)
        };
        let totals = tx
            .query_one(&schema.sql(DELETE_SUMMED), &[&subscriber])
            .await
            .map_err(StoreError::db("resetting checkpoints"))?;
        let totals = totals.of("checkpoint");
        let (applied, duplicates, stale, dead): (i64, i64, i64, i64) = (
            totals.col("applied")?,
            totals.col("duplicates")?,
            totals.col("stale")?,
            totals.col("dead_lettered")?,
        );
        let last: Option<SystemTime> = totals.col("last_committed_at")?;
        tx.execute(
            &schema.sql(CREATE_LAYOUT),
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
    pub(crate) async fn position(
        client: &Client,
        schema: &Schema,
        subscriber: &str,
        partition: u32,
    ) -> Result<i64, StoreError> {
        client
            .query_opt(&schema.sql(POSITION), &[&subscriber, &(partition as i32)])
            .await
            .map_err(StoreError::db("loading a checkpoint"))?
            .map_or(Ok(0), |r| Ok(r.of("checkpoint").col("position")?))
    }

    /// Saves a partition's position and adds `stats` (in the batch's transaction;
    /// [`crate::SubscriberTx::commit`] is the only caller).
    pub(crate) async fn save(
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
            .map_err(StoreError::db("saving the checkpoint"))?;
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

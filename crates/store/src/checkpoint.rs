//! Subscriber checkpoints: how far each partition has read the event log, with its
//! counters. Written in the same transaction as the claims and the projection change.

use std::time::SystemTime;

use tokio_postgres::{Client, Statement, Transaction};

use crate::error::StoreError;
use crate::q;

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
                s = q(schema)
            ))
            .await
            .map_err(StoreError::db("preparing checkpoint save"))?;
        Ok(Checkpoints {
            save,
            subscriber: subscriber.to_owned(),
            partitions: partitions as i32,
        })
    }

    /// Where each partition resumes. When the partition count changed since the last
    /// run, every partition resumes from the lowest stored position: aggregates moved
    /// between partitions, and the claims skip whatever was already applied.
    pub async fn load(
        client: &Client,
        schema: &str,
        subscriber: &str,
        partitions: u32,
    ) -> Result<Vec<i64>, StoreError> {
        let rows = client
            .query(
                &format!(
                    "select partition, partitions, position from {}.checkpoint \
                     where subscriber_id = $1",
                    q(schema)
                ),
                &[&subscriber],
            )
            .await
            .map_err(StoreError::db(format!(
                "loading checkpoints of {subscriber}"
            )))?;
        let stored: Vec<(i32, i32, i64)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        if stored.iter().all(|&(_, n, _)| n == partitions as i32) {
            let mut positions = vec![0; partitions as usize];
            for (p, _, pos) in stored {
                if let Some(slot) = positions.get_mut(p as usize) {
                    *slot = pos;
                }
            }
            return Ok(positions);
        }
        // An old partition that never saved a position had read nothing: resume from 0.
        let old_partitions = stored.first().map_or(0, |&(_, n, _)| n.max(0) as usize);
        let min = if stored.len() < old_partitions {
            0
        } else {
            stored.iter().map(|&(_, _, pos)| pos).min().unwrap_or(0)
        };
        if !stored.is_empty() {
            client
                .execute(
                    &format!(
                        "with gone as (delete from {s}.checkpoint \
                         where subscriber_id = $1 and partition >= $3) \
                         update {s}.checkpoint set position = $2, partitions = $3 \
                         where subscriber_id = $1 and partition < $3",
                        s = q(schema)
                    ),
                    &[&subscriber, &min, &(partitions as i32)],
                )
                .await
                .map_err(StoreError::db("resetting checkpoints"))?;
        }
        Ok(vec![min; partitions as usize])
    }

    /// Saves a partition's position and adds `stats` (in the batch's transaction).
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

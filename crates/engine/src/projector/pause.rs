//! A partition's pause: entered on an environment error (said once per cause in the
//! log, `walfold status` and the metrics), left after the next commit.

use std::time::Duration;

use tokio_postgres::Client;
use walfold_store::{StoreError, Subscriber};
use walfold_telemetry::signal::Signal;

use super::Partition;
use crate::error::EngineError;

/// How long recording a pause waits for a connection of the pool (best effort).
const PAUSE_RECORD_WAIT: Duration = Duration::from_secs(2);

/// The error, with where its fix is for the causes an operator meets most: a right
/// walfold's role lacks, a table or column the projection names that is missing.
fn with_fix(e: &EngineError) -> String {
    match e.fix() {
        Some(fix) => format!("{e}; {fix}"),
        None => e.to_string(),
    }
}

/// A partition's pause: entered on an environment error, left after the next commit.
#[derive(Default)]
pub(super) struct Pause {
    /// The cause last logged (logged again only when it changes).
    cause: Option<String>,
    pub paused: bool,
}

impl Pause {
    pub async fn enter(&mut self, part: &Partition, bound: &Subscriber, e: &EngineError) {
        let cause = with_fix(e);
        if self.cause.as_deref() != Some(cause.as_str()) {
            Signal::PartitionPauseCause {
                subscriber: part.subscriber(),
                projection: &part.options.name,
                partition: part.partition,
                sqlstate: e.sqlstate().unwrap_or(""),
                error: &cause,
            }
            .report();
            self.cause = Some(cause.clone());
            // Best effort: the cause may keep this write from landing too.
            let recorded = async {
                let mut client = tokio::time::timeout(PAUSE_RECORD_WAIT, part.pool.lease())
                    .await
                    .map_err(|_| {
                        StoreError::Busy("no connection of the pool came free".into())
                    })??;
                bound
                    .record_pause(&mut client, e.sqlstate(), &cause)
                    .await?;
                client.release();
                Ok::<(), StoreError>(())
            };
            if let Err(write) = recorded.await {
                tracing::debug!(error = %write, "could not record the pause");
            }
        }
        if !self.paused {
            self.paused = true;
            Signal::PartitionPaused {
                subscriber: part.subscriber(),
            }
            .report();
        }
    }

    /// After a commit: a paused partition works again.
    pub async fn leave(&mut self, part: &Partition, bound: &Subscriber, client: &Client) {
        if !self.paused {
            return;
        }
        self.paused = false;
        self.cause = None;
        Signal::PartitionResumed {
            subscriber: part.subscriber(),
            partition: part.partition,
        }
        .report();
        if let Err(e) = bound.clear_pause(client).await {
            tracing::debug!(error = %e, "could not clear the pause");
        }
    }

    /// On shutdown: the gauge must not stay up for a partition that no longer runs.
    pub fn drop_gauge(&mut self, part: &Partition) {
        if self.paused {
            self.paused = false;
            Signal::PausedPartitionStopped {
                subscriber: part.subscriber(),
            }
            .report();
        }
    }
}

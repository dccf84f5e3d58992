//! A rebuild's switch-over, by the leader: it holds the units of the live subscriber and
//! of the rebuild (wherever they run, they stop at their fence, and their transactions in
//! flight end first), runs the rebuild's partitions here alone until each has read as far
//! as the live one (the live table does not move meanwhile; at most `CATCH_UP_LIMIT`),
//! then switches in one transaction. Done: the live subscriber's units go, the rebuild's
//! write the live table from now on. Not done: both sets are let go again and the
//! switch-over is tried later. Until the hold the live table is served as before.

use std::time::Duration;

use tokio::task::JoinSet;
use tokio_postgres::Client;
use walfold_store::rebuild::{self, Switch as Switched};
use walfold_store::work_unit;
use walfold_store::{Fence, Rebuild};

use super::definition::{Definition, UnitRun};
use super::plan::Planner;
use crate::error::EngineError;

/// How long after a failed switch-over it is tried again.
const SWITCH_BACKOFF: Duration = Duration::from_secs(30);
/// How long a rebuild found not due at its switch-over waits before the next attempt.
const SWITCH_RETRY: Duration = Duration::from_secs(3);
/// How long a rebuild's partitions may take, alone, to catch up with the live ones
/// before a switch-over (the live table does not move meanwhile).
const CATCH_UP_LIMIT: Duration = Duration::from_secs(10);

/// A rebuild whose switch-over failed or was not due yet, and until when it waits.
#[derive(Clone)]
pub(super) struct FailedSwitch {
    pub subscriber: String,
    until: tokio::time::Instant,
}

impl FailedSwitch {
    pub(super) fn over(&self) -> bool {
        self.until <= tokio::time::Instant::now()
    }
}

/// One switch-over attempt.
pub(super) struct Switch<'a> {
    pub planner: &'a Planner,
    pub definition: &'a Definition,
    pub rebuild: &'a Rebuild,
    /// The live subscriber it replaces.
    pub live: &'a str,
    pub fence: &'a Fence,
}

impl Switch<'_> {
    /// Whether the rebuild is live now.
    pub(super) async fn run(
        self,
        client: &mut Client,
        failed: &mut Vec<FailedSwitch>,
    ) -> Result<bool, EngineError> {
        let (planner, r, fence) = (self.planner, self.rebuild, self.fence);
        let target = &planner.target;
        let schema = &target.schema;
        planner
            .hold(client, fence, &[self.live, &r.subscriber])
            .await?;
        self.catch_up(client).await;
        let outcome = rebuild::switch(client, schema, r, fence).await;
        let done = matches!(outcome, Ok(Switched::Done));
        let live = self.live;
        planner
            .fenced(client, fence, async |tx, schema| {
                if done {
                    work_unit::unplan(tx, schema, live).await?;
                    work_unit::go_live(tx, schema, &r.subscriber).await?;
                } else {
                    work_unit::let_go(tx, schema, live).await?;
                }
                work_unit::let_go(tx, schema, &r.subscriber).await
            })
            .await?;
        planner.shared.units_changed().await;
        match outcome {
            Ok(Switched::Done) => {
                tracing::info!(target = target.label(), projection = %r.projection, subscriber = %r.subscriber, live = %r.live, retired = %r.retired, "rebuild switched over: the rebuilt table is live")
            }
            Ok(Switched::Gone) => {}
            // Its projectors stopped a batch behind the live ones (or a dead letter came
            // with it): they go on, and it is tried again.
            Ok(Switched::NotYet(why)) => {
                tracing::info!(target = target.label(), projection = %r.projection, why = %why, "switch-over not due yet; trying again in {}s", SWITCH_RETRY.as_secs());
                // Said in status too: after the catch-up, this is something an operator
                // may need to see (a paused or slow partition).
                if let Err(note) = rebuild::switch_failed(client, schema, r, &why, fence).await {
                    tracing::debug!(error = %note, "could not record why the switch-over waits");
                }
                failed.push(FailedSwitch {
                    subscriber: r.subscriber.clone(),
                    until: tokio::time::Instant::now() + SWITCH_RETRY,
                });
            }
            Err(e) => {
                tracing::warn!(target = target.label(), projection = %r.projection, error = %e, "switch-over failed; trying again in {}s", SWITCH_BACKOFF.as_secs());
                // Best effort: what failed the switch may fail this too.
                if let Err(note) =
                    rebuild::switch_failed(client, schema, r, &e.to_string(), fence).await
                {
                    tracing::debug!(error = %note, "could not record the failed switch-over");
                }
                failed.push(FailedSwitch {
                    subscriber: r.subscriber.clone(),
                    until: tokio::time::Instant::now() + SWITCH_BACKOFF,
                });
            }
        }
        Ok(done)
    }

    /// With both sets held: the rebuild's partitions run here alone, under the leader's
    /// fence, until each has read as far as the live subscriber's, at most
    /// `CATCH_UP_LIMIT`. Under a steady stream the two stop at different points; without
    /// this the switch would find the rebuild a batch behind again and again. The switch
    /// transaction checks the result.
    async fn catch_up(&self, client: &Client) {
        let (planner, r) = (self.planner, self.rebuild);
        let schema = &planner.target.schema;
        let to = match rebuild::catch_up_to(client, schema, r).await {
            // Every partition has read as far as the live one: nothing to run.
            Ok(to) if to.is_empty() => return,
            Ok(to) => to,
            Err(e) => {
                tracing::warn!(projection = %r.projection, error = %e, "cannot read where the rebuild must catch up to");
                return;
            }
        };
        let shadow = match self.definition.for_table(schema, &r.shadow_table()) {
            Ok(Some(shadow)) => shadow,
            _ => return,
        };
        let shared = &planner.shared;
        let pools = shared.pools_of(&planner.target);
        let cancel = planner.stop.child_token();
        let mut tasks = JoinSet::new();
        let partitions = self.definition.options.parallelism;
        for (partition, until) in to {
            let mut worker = self.definition.partition(UnitRun {
                config: &shared.config,
                subscriber: &r.subscriber,
                partition: partition as u32,
                partitions,
                replay: Some(shadow.clone()),
                fence: self.fence.clone(),
                pools: &pools,
                pages: shared.pages_of(&planner.target),
                reached_head: None,
            });
            worker.until = Some(until);
            let (cancel, head) = (cancel.clone(), shared.head.subscribe());
            tasks.spawn(async move { worker.run(cancel, head).await });
        }
        let joined = async {
            while let Some(done) = tasks.join_next().await {
                match done {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(projection = %r.projection, error = %e, "a rebuild partition failed while catching up")
                    }
                    Err(e) => {
                        tracing::warn!(projection = %r.projection, error = %e, "a rebuild partition panicked while catching up")
                    }
                }
            }
        };
        if tokio::time::timeout(CATCH_UP_LIMIT, joined).await.is_err() {
            cancel.cancel();
            while tasks.join_next().await.is_some() {}
        }
    }
}

//! A projection whose definition differs from the one its live subscriber folded with:
//! the leader's planner decides about it, once, under its fence, before it plans the
//! projection's units. `refuse` stops with what differs and the fix; `accept` records
//! the new definition (who, when) and restarts the subscriber's units with it;
//! `rebuild` starts a blue/green rebuild under `SUBSCRIBER~DIGEST`, recorded with the
//! new definition in the rebuild's own transaction (so a second leader finds it and
//! starts none), while the live subscriber goes on folding with the recorded, old one.
//! A subscriber with nothing recorded (its first start, or the first under this
//! release) records the definition it runs with.

use tokio_postgres::Client;
use walfold_config::{short_digest, OnDefinitionChange};
use walfold_store::definition::{self, RecordedDefinition};
use walfold_store::{work_unit, Fence, Rebuild, Refusal};

use super::definition::Definition;
use super::plan::Planner;
use crate::error::{EngineError, RebuildRefusal};
use crate::ops::{History, Recording};

/// What the decision did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decided {
    /// Nothing to change: the definitions match.
    Same,
    /// A rebuild of the config's definition is under way; the live subscriber folds
    /// with its recorded one until the switch-over.
    RebuildUnderWay,
    /// Recorded or accepted: the plan goes on.
    Recorded,
    /// A rebuild started (or could not start yet): the rebuilds changed, plan again.
    Rebuilding,
}

trait IntoEngine {
    fn into_engine(self) -> EngineError;
}

impl IntoEngine for Refusal {
    fn into_engine(self) -> EngineError {
        EngineError::Store(self.into())
    }
}

/// Who decided, for the record: the OS user, the host and this instance.
pub(super) fn who(instance: &uuid::Uuid) -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    format!(
        "{user}@{} (walfold instance {instance})",
        walfold_store::instance::host_name()
    )
}

/// The subscriber a changed definition rebuilds under: the configured ID (without an
/// earlier rebuild's suffix) and the new definition's short digest.
pub(super) fn derived_subscriber(configured: &str, digest: &str) -> String {
    let base = configured.split('~').next().unwrap_or(configured);
    format!("{base}~{}", short_digest(digest))
}

impl Planner {
    /// Decides about `d`'s definition against what its live subscriber `active` folded
    /// with; `running`: the projection's rebuild replaying, if any.
    pub(super) async fn decide_definition(
        &self,
        client: &mut Client,
        fence: &Fence,
        d: &Definition,
        active: &str,
        running: Option<&Rebuild>,
    ) -> Result<Decided, EngineError> {
        let schema = &self.target.schema;
        let (name, wanted) = (&d.options.name, &d.fold);
        let digest = wanted.digest();
        let Some(recorded) = definition::recorded(&*client, schema, active).await? else {
            self.fenced(client, fence, async |tx, schema| {
                definition::record_first(tx, schema, active, name, wanted).await
            })
            .await?;
            tracing::info!(projection = %name, subscriber = active, digest = short_digest(&digest), "recorded the projection's definition");
            return Ok(Decided::Recorded);
        };
        if recorded.digest == digest {
            return Ok(Decided::Same);
        }
        if let Some(r) = running {
            match definition::recorded(&*client, schema, &r.subscriber).await? {
                // A rebuild of the config's definition: the change is being dealt with.
                Some(theirs) if theirs.digest == digest => return Ok(Decided::RebuildUnderWay),
                None => {
                    self.fenced(client, fence, async |tx, schema| {
                        definition::record_first(tx, schema, &r.subscriber, name, wanted).await
                    })
                    .await?;
                    return Ok(Decided::RebuildUnderWay);
                }
                Some(_) => {}
            }
        }
        let diff = walfold_config::definition_diff(&recorded.text, &wanted.text());
        match d.options.on_definition_change {
            OnDefinitionChange::Refuse => Err(Refusal::DefinitionChanged {
                projection: name.clone(),
                subscriber: active.to_owned(),
                diff,
            }
            .into_engine()),
            OnDefinitionChange::Accept => {
                self.accept(client, fence, d, active, &recorded).await?;
                Ok(Decided::Recorded)
            }
            OnDefinitionChange::Rebuild => {
                if let Some(r) = running {
                    return Err(Refusal::DefinitionRebuildOpen {
                        projection: name.clone(),
                        subscriber: r.subscriber.clone(),
                    }
                    .into_engine());
                }
                self.rebuild(fence, d, &recorded, diff).await
            }
        }
    }

    async fn accept(
        &self,
        client: &mut Client,
        fence: &Fence,
        d: &Definition,
        active: &str,
        recorded: &RecordedDefinition,
    ) -> Result<(), EngineError> {
        let by = who(&self.shared.me.id);
        let diff = walfold_config::definition_diff(&recorded.text, &d.fold.text());
        definition::accept(client, &self.target.schema, fence, recorded, &d.fold, &by).await?;
        tracing::warn!(projection = %d.options.name, subscriber = active, from = short_digest(&recorded.digest), to = short_digest(&d.fold.digest()), by = %by, diff = %diff, "accepted a changed definition (on_definition_change = \"accept\"): the fold goes on with it over the rows the old one built");
        // Units already running fold with the old definition: held and let go, each is
        // taken again and starts with the recorded one.
        self.hold(client, fence, &[active]).await?;
        self.fenced(client, fence, async |tx, schema| {
            work_unit::let_go(tx, schema, active).await
        })
        .await?;
        self.shared.units_changed().await;
        Ok(())
    }

    async fn rebuild(
        &self,
        fence: &Fence,
        d: &Definition,
        recorded: &RecordedDefinition,
        diff: String,
    ) -> Result<Decided, EngineError> {
        let digest = d.fold.digest();
        let subscriber = derived_subscriber(&d.options.subscriber, &digest);
        let by = who(&self.shared.me.id);
        let started = crate::ops::start_rebuild_recording(
            &self.shared.config,
            &d.options,
            &subscriber,
            History::Whole,
            Recording {
                definition: Some(&d.fold),
                fence: Some(fence),
                changed_from: Some((recorded, &by)),
            },
        )
        .await;
        match started {
            Ok(r) => {
                tracing::warn!(projection = %d.options.name, subscriber = %r.subscriber, serving = %r.previous, diff = %diff, "the projection's definition changed: rebuilding it under a new subscriber (on_definition_change = \"rebuild\"); the old definition serves until the switch-over");
                Ok(Decided::Rebuilding)
            }
            // The leader's own prune pass holds the lock: tried again next round.
            Err(EngineError::Refused(RebuildRefusal::PruneRunning)) => {
                tracing::info!(projection = %d.options.name, "a prune pass is running; the rebuild for the changed definition starts after it");
                Ok(Decided::Rebuilding)
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_definition_rebuilds_under_the_configured_id_and_its_digest() {
        assert_eq!(
            derived_subscriber("orders.total.v1", "0123456789abcdef"),
            "orders.total.v1~01234567"
        );
        assert_eq!(
            derived_subscriber("orders.total.v1~01234567", "fedcba9876543210"),
            "orders.total.v1~fedcba98"
        );
    }
}

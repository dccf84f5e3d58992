//! The projection trait: write a projection in Rust and run it on the same engine
//! (claims, version guards, checkpoints and dead letters are the engine's job).

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio_postgres::{Client, Transaction};
use walfold_config::QualifiedName;
use walfold_event::Event;

use crate::error::ProjectionError;

/// What applying one event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The read model changed.
    Changed,
    /// Nothing changed: a version guard found the event stale (counted as stale).
    Stale,
}

/// A projection: folds events into read-model tables inside the engine's transaction.
/// The engine has already claimed each event for the subscriber in that transaction;
/// `apply` must only change the read model, through `tx`, and should guard on versions.
pub trait Projection: Send + Sync + 'static {
    /// Called when each of its partitions starts (and again after a pause), on one
    /// connection of the target's pool (e.g. to create what the projection needs). The
    /// default does nothing. `apply` runs on any connection of the pool: prepare nothing
    /// here that `apply` relies on (an unnamed `tx.query_typed` or `tx.prepare` works).
    fn install<'a>(&'a self, client: &'a mut Client) -> BoxFuture<'a, Result<(), ProjectionError>> {
        let _ = client;
        Box::pin(async { Ok(()) })
    }

    /// The same projection writing to `table` instead of its own storage: what a rebuild
    /// replays into (a shadow table created like the live one). `None`, the default,
    /// means the projection cannot be rebuilt.
    fn for_table(&self, table: &QualifiedName) -> Option<Arc<dyn Projection>> {
        let _ = table;
        None
    }

    /// Whether `apply` has no effect beyond its writes through `tx` (no other
    /// connection, no state of its own): the engine may then send a batch's apply
    /// beside its claim, before it knows which events are duplicates, and roll the
    /// transaction back when some were. The default, `false`, claims first.
    fn writes_only_through_tx(&self) -> bool {
        false
    }

    /// The version of this projection's code: part of its definition, so raising it
    /// (when `apply` folds differently) is a changed definition, which
    /// `on_definition_change` decides about (refuse, rebuild, accept) before any event is
    /// folded with it onto the old rows. The default is 1.
    fn definition_version(&self) -> u32 {
        1
    }

    /// Applies one event.
    fn apply<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        event: &'a Event,
    ) -> BoxFuture<'a, Result<Applied, ProjectionError>>;

    /// Applies events in order; the default calls [`Projection::apply`] one at a time.
    fn apply_batch<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        events: &'a [&'a Event],
    ) -> BoxFuture<'a, Result<Vec<Applied>, ProjectionError>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(events.len());
            for event in events {
                out.push(self.apply(tx, event).await?);
            }
            Ok(out)
        })
    }
}

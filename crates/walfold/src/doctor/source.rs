//! Doctor's checks of one source: its shape read once from the catalog (with what the
//! target recorded of it), then each check in turn, in the order they print.

use tokio_postgres::Client;
use walfold_config::SourceView;
use walfold_source::shape::SourceShape;
use walfold_source::Verdict;
use walfold_store::StoreError;

use super::finding::{Finding, Report};
use super::{ha, outboxes, publication, server, slot, stand_in, writers};

/// What a source's checks read: the config, the source's shape, what `walfold run`
/// would refuse of it, and how far walfold ingested through its slot.
pub(super) struct Source<'a> {
    pub(super) view: &'a SourceView<'a>,
    pub(super) shape: SourceShape,
    pub(super) verdict: Verdict,
    /// The slot's ingest position recorded in the target, as PostgreSQL writes it.
    pub(super) ingested: Option<String>,
    /// The publication the slot was last read through.
    pub(super) read_through: Option<String>,
    /// Above this, the WAL a slot keeps is a warning.
    pub(super) max_retained_mb: i64,
}

impl Source<'_> {
    /// The source role, quoted.
    pub(super) fn role(&self) -> String {
        walfold_config::quote_ident(&self.shape.role.name)
    }

    pub(super) fn slot(&self) -> &str {
        &self.view.source().slot
    }

    pub(super) fn publication(&self) -> &str {
        &self.view.source().publication
    }
}

type Check = fn(&Source<'_>) -> Vec<Finding>;

/// Every check of a source, in the order they print.
const CHECKS: &[Check] = &[
    server::wal_level,
    server::replication_slots,
    server::wal_senders,
    server::slot_wal_keep_size,
    server::replication_role,
    outboxes::refusals,
    outboxes::tables,
    outboxes::versions_for_guards,
    stand_in::keyed_on_a_stand_in,
    writers::message_outboxes,
    writers::heartbeat_right,
    publication::publication,
    slot::slot,
    ha::failover_slot,
    ha::behind_the_ingest_position,
];

/// Runs every check of the source `view` (reached through `source`); `target` holds
/// walfold's record of its slot.
pub(super) async fn check(
    r: &mut Report,
    view: &SourceView<'_>,
    source: &Client,
    target: Option<&Client>,
    max_retained_mb: i64,
) -> Result<(), StoreError> {
    let shape = SourceShape::read(source, view).await?;
    let verdict = walfold_source::judge(source, &shape.outboxes, view).await?;
    // A slot walfold has read from goes on only through the publication it was read
    // through (see the source's checks): creating another is no fix.
    let schema = walfold_store::Schema::new(&view.target.schema);
    let slot = &view.source().slot;
    let (ingested, read_through) = match target {
        Some(t) => (
            walfold_store::ingested_through(t, &schema, slot)
                .await
                .ok()
                .flatten(),
            walfold_store::read_through(t, &schema, slot)
                .await
                .ok()
                .flatten(),
        ),
        None => (None, None),
    };
    let facts = Source {
        view,
        shape,
        verdict,
        ingested,
        read_through,
        max_retained_mb,
    };
    for check in CHECKS {
        r.extend(check(&facts));
    }
    ha::hosts(r, view).await
}

//! The operator's handle: what `walfold status`, `events`, `dead-letters`, `phantoms`,
//! `rebuild` and `prune` read and change on one target, bound once to its connection,
//! its walfold schema and, for the writes only a leader may make, the leader's fence.
//!
//! Writes fall in two kinds (guarantee 9: only the leader writes):
//!
//! - **The leader's work** (ending a rebuild, pruning, recording target holds): with a
//!   fence bound ([`Operator::leading`]), each such transaction proves inside itself
//!   that its instance still leads, like a projector's commit, so a deposed leader's
//!   write fails with [`StoreError::Fenced`] instead of landing. Aborting a rebuild
//!   refuses to run without one. A command's `rebuild --finish` (which never leads) and
//!   its prune beside a leading daemon run without one; why that is safe is said at
//!   each.
//! - **Requests** (retry or discard a dead letter, accept a phantom, start or ask to
//!   abort a rebuild): a command records what the operator wants, in one statement or
//!   transaction of its own, and the leader acts on it in its fenced work. A command
//!   never leads while a daemon does, so these take no fence: no instance's work lands
//!   through them, and a deposed leader has nothing in flight here.

use std::borrow::{Borrow, BorrowMut};
use std::time::Duration;

use tokio_postgres::Client;
use uuid::Uuid;
use walfold_config::QualifiedName;
use walfold_telemetry::metrics::DatabaseReading;

use crate::dead_letter::DeadLetters;
use crate::error::StoreError;
use crate::event_trail;
use crate::leader::Fence;
use crate::phantom;
use crate::prune;
use crate::rebuild::{self, Rebuild, RebuildState};
use crate::refusal::Refusal;
use crate::registry;
use crate::schema::Schema;
use crate::status;

pub use crate::dead_letter::{DeadLetterEntry, RetryRequest};
pub use crate::event_trail::{
    Claim, DeadLetterAt, LogFilter, LoggedEvent, PartitionPosition, Recorded,
};
pub use crate::phantom::{Accept, PhantomEntry};
pub use crate::prune::{LogPruned, PrunePolicy, Pruned};
pub use crate::status::{
    IngestPause, IngestStatus, InstanceStatus, PauseStatus, RebuildStatus, SlotStatus, SourceProbe,
    SourceStatus, Status, SubscriberStatus, TargetReach, TargetStatus, UnitStatus,
    SOURCE_READ_TIMEOUT,
};

/// An operator's view of one target: its connection (owned, `Client`, or borrowed,
/// `&Client`), its walfold schema and, when this process leads, the leader's fence.
pub struct Operator<C = Client> {
    client: C,
    schema: Schema,
    fence: Option<Fence>,
}

impl Operator<Client> {
    /// A connection to `url` (a daemon's: no statement timeout).
    pub async fn connect(url: &str, schema: &Schema) -> Result<Self, StoreError> {
        Ok(Operator::new(walfold_pg::connect(url).await?, schema))
    }

    /// A connection for a one-shot command to `url` (`server` names it in errors): it
    /// answers within seconds or says which server did not.
    pub async fn for_command(url: &str, server: &str, schema: &Schema) -> Result<Self, StoreError> {
        Ok(Operator::new(
            walfold_pg::connect_for_command(url, server).await?,
            schema,
        ))
    }
}

impl<C: Borrow<Client>> Operator<C> {
    pub fn new(client: C, schema: &Schema) -> Self {
        Operator {
            client,
            schema: schema.clone(),
            fence: None,
        }
    }

    /// Binds the leader's fence: every write of the leader's work through this handle
    /// checks it in its transaction.
    pub fn leading(mut self, fence: Fence) -> Self {
        self.fence = Some(fence);
        self
    }

    /// The fence bound, if this process leads.
    pub fn fence(&self) -> Option<&Fence> {
        self.fence.as_ref()
    }

    pub fn client(&self) -> &Client {
        self.client.borrow()
    }

    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    // Status and metrics.

    /// What `walfold status` reports for this target (the main one: it holds the log)
    /// and `sources`.
    pub async fn status(&self, sources: &[SourceProbe<'_>]) -> Result<Status, StoreError> {
        status::status_of(self.client(), &self.schema, sources).await
    }

    /// [`Operator::status`] for a single source, its slot on `source`.
    pub async fn status_of_slot(&self, source: &Client, slot: &str) -> Result<Status, StoreError> {
        status::status(source, self.client(), &self.schema, slot).await
    }

    /// The status of the extra target `target` (named `name`) against this target's log.
    pub async fn target_status<T: Borrow<Client>>(
        &self,
        target: &Operator<T>,
        name: &str,
    ) -> Result<TargetStatus, StoreError> {
        status::target_status(
            self.client(),
            &self.schema,
            target.client(),
            &target.schema,
            name,
        )
        .await
    }

    /// The database gauges of a metrics scrape (`extra`: the extra targets' status,
    /// `active`: the (target, subscriber) pairs that serve a projection now).
    pub async fn metrics_reading(
        &self,
        sources: &[SourceProbe<'_>],
        extra: Vec<TargetStatus>,
        active: &[(String, String)],
    ) -> Result<DatabaseReading, StoreError> {
        status::metrics_reading(sources, self.client(), &self.schema, extra, active).await
    }

    /// The planner's estimate of the event log's rows.
    pub async fn event_log_estimate(&self) -> Result<i64, StoreError> {
        status::event_log_estimate(self.client(), &self.schema).await
    }

    /// Every projection and its live subscriber.
    pub async fn active_projections(&self) -> Result<Vec<(String, String)>, StoreError> {
        registry::active_projections(self.client(), &self.schema).await
    }

    // The event trail (`walfold events`).

    /// At most `limit` events after seq `after` that match `filter`.
    pub async fn log_page(
        &self,
        after: i64,
        filter: &LogFilter,
        limit: i64,
    ) -> Result<Vec<LoggedEvent>, StoreError> {
        event_trail::log_page(self.client(), &self.schema, after, filter, limit).await
    }

    /// The server's time `ago` before now, as text the log's timestamps compare with.
    pub async fn log_time_ago(&self, ago: Duration) -> Result<String, StoreError> {
        event_trail::log_time_ago(self.client(), ago).await
    }

    /// `text` read as a timestamp by the server.
    pub async fn log_time(&self, text: &str) -> Result<String, StoreError> {
        event_trail::log_time(self.client(), text).await
    }

    /// Whether this target has heard of `subscriber`.
    pub async fn knows_subscriber(&self, subscriber: &str) -> Result<bool, StoreError> {
        event_trail::knows_subscriber(self.client(), &self.schema, subscriber).await
    }

    /// Whether `subscriber` has a checkpoint here.
    pub async fn subscriber_has_read(&self, subscriber: &str) -> Result<bool, StoreError> {
        event_trail::subscriber_has_read(self.client(), &self.schema, subscriber).await
    }

    /// The subscribers with a checkpoint here.
    pub async fn checkpointed_subscribers(&self) -> Result<Vec<String>, StoreError> {
        event_trail::checkpointed_subscribers(self.client(), &self.schema).await
    }

    /// The projection `subscriber` serves or served, if recorded.
    pub async fn projection_of(&self, subscriber: &str) -> Result<Option<String>, StoreError> {
        event_trail::projection_of(self.client(), &self.schema, subscriber).await
    }

    /// What `subscriber` recorded for these events (claims, by ID and claim seq; dead
    /// letters, by seq; positions).
    pub async fn recorded_for(
        &self,
        subscriber: &str,
        event_ids: &[Uuid],
        claim_seqs: &[i64],
        seqs: &[i64],
    ) -> Result<Recorded, StoreError> {
        let schema = &self.schema;
        event_trail::recorded_for(
            self.client(),
            schema,
            subscriber,
            event_ids,
            claim_seqs,
            seqs,
        )
        .await
    }

    // Dead letters.

    /// Dead letters, newest first: open ones unless `all`; of one subscriber when given
    /// (`ingest`: the rows rejected before any subscriber).
    pub async fn dead_letters(
        &self,
        subscriber: Option<&str>,
        all: bool,
        limit: i64,
    ) -> Result<Vec<DeadLetterEntry>, StoreError> {
        DeadLetters::list(self.client(), &self.schema, subscriber, all, limit).await
    }

    /// Marks dead letters `retrying`; how many. A request (see the module docs): the
    /// leader's projector of their subscriber applies them, fenced, and records how each
    /// went.
    pub async fn retry(&self, request: RetryRequest<'_>) -> Result<u64, StoreError> {
        DeadLetters::request_retry(self.client(), &self.schema, request).await
    }

    /// Marks open dead letter `id` discarded with `reason`; false when there is no open
    /// one. A request: it changes only the letter's status (from open, which no
    /// projector writes), and the leader's projector releases a park it leaves.
    pub async fn discard(&self, id: i64, reason: &str) -> Result<bool, StoreError> {
        DeadLetters::discard(self.client(), &self.schema, id, reason).await
    }

    // Phantoms.

    /// Phantoms found after a failover (of slot `slot` when given): open ones unless
    /// `all`.
    pub async fn phantoms(
        &self,
        slot: Option<&str>,
        all: bool,
        limit: i64,
    ) -> Result<Vec<PhantomEntry>, StoreError> {
        phantom::list_phantoms(self.client(), &self.schema, slot, all, limit).await
    }

    /// Which of `events` (event ID, claim seq) subscribers here claimed, as (event,
    /// subscriber).
    pub async fn claimed(&self, events: &[(Uuid, i64)]) -> Result<Vec<(Uuid, String)>, StoreError> {
        phantom::claimed(self.client(), &self.schema, events).await
    }

    /// Accepts open phantoms with `reason`; how many. A request: it marks the phantom
    /// rows, which only reads of the log (a rebuild, a new subscriber) consult.
    pub async fn accept_phantoms(&self, what: Accept<'_>, reason: &str) -> Result<u64, StoreError> {
        phantom::accept_phantoms(self.client(), &self.schema, what, reason).await
    }

    // Rebuilds.

    /// Rebuilds not ended yet.
    pub async fn rebuilds(&self) -> Result<Vec<Rebuild>, StoreError> {
        rebuild::open(self.client(), &self.schema).await
    }

    /// The state of the rebuild under subscriber ID `subscriber`, if there is one.
    pub async fn rebuild_state(
        &self,
        subscriber: &str,
    ) -> Result<Option<RebuildState>, StoreError> {
        rebuild::state_of(self.client(), &self.schema, subscriber).await
    }

    /// Whether subscriber ID `subscriber` has left any trace here.
    pub async fn subscriber_used(&self, subscriber: &str) -> Result<bool, StoreError> {
        rebuild::subscriber_used(self.client(), &self.schema, subscriber).await
    }

    /// Asks the leader to abort the running rebuild of `projection`. A request: the
    /// leader stops the rebuild's projectors and ends it through [`Operator::abort_rebuild`].
    pub async fn request_abort(&self, projection: &str) -> Result<Rebuild, StoreError> {
        rebuild::request_abort(self.client(), &self.schema, projection).await
    }

    // Pruning.

    /// How far the event log was pruned, if at all.
    pub async fn log_pruned(&self) -> Result<Option<LogPruned>, StoreError> {
        prune::log_pruned(self.client(), &self.schema).await
    }

    /// Takes the prune lock for this session if no pass holds it; false if one does.
    pub async fn try_hold_off_pruning(&self) -> Result<bool, StoreError> {
        prune::try_hold_off_pruning(self.client(), &self.schema).await
    }

    /// Waits for the prune lock, held for this session's life.
    pub async fn lock_pruning(&self) -> Result<(), StoreError> {
        prune::lock_pruning(self.client(), &self.schema).await
    }

    /// How far this (extra) target lets go of the log.
    pub async fn hold(&self) -> Result<Option<i64>, StoreError> {
        prune::hold(self.client(), &self.schema).await
    }

    /// Deletes a retired subscriber's claims, `batch` rows at a time. No fence: nothing
    /// reads or writes a retired subscriber's claims, whoever leads.
    pub async fn forget_claims(&self, subscriber: &str, batch: i64) -> Result<u64, StoreError> {
        rebuild::forget_claims(self.client(), &self.schema, subscriber, batch).await
    }
}

impl<C: BorrowMut<Client>> Operator<C> {
    fn client_mut(&mut self) -> &mut Client {
        self.client.borrow_mut()
    }

    /// The subscriber ID serving `projection` live, given the config's `configured` ID
    /// and its live table `storage`, if named (registering the projection). No fence: the
    /// registration is idempotent and the registry row's lock orders it with the leader's.
    pub async fn active_subscriber(
        &mut self,
        projection: &str,
        configured: &str,
        storage: Option<&walfold_config::QualifiedName>,
    ) -> Result<String, StoreError> {
        let schema = self.schema.clone();
        registry::active_subscriber(self.client_mut(), &schema, projection, configured, storage)
            .await
    }

    /// Starts a rebuild of `projection` (live table `live`, served by `previous`) under
    /// the unused subscriber ID `subscriber`. A request: it creates an empty shadow table,
    /// prepares the statement `probe` gives for it there (when it gives one) and records
    /// the rebuild (with what `with` holds: the new subscriber's definition, and when the leader
    /// starts it for a changed definition, its fence and the trail) in one transaction;
    /// the leader replays into it, fenced.
    pub async fn start_rebuild(
        &mut self,
        projection: &str,
        live: &QualifiedName,
        previous: &str,
        subscriber: &str,
        probe: &(dyn Fn(&QualifiedName) -> Option<rebuild::Probe> + Sync),
        with: rebuild::StartWith<'_>,
    ) -> Result<Rebuild, StoreError> {
        let schema = self.schema.clone();
        let fence = self.fence.clone();
        rebuild::start(
            self.client_mut(),
            &schema,
            projection,
            live,
            previous,
            subscriber,
            probe,
            rebuild::StartWith {
                fence: with.fence.or(fence.as_ref()),
                ..with
            },
        )
        .await
    }

    /// Ends an aborting or running rebuild (drops the shadow table and the new
    /// subscriber's state). The leader's work: refused without a fence, checked inside
    /// the transaction.
    pub async fn abort_rebuild(&mut self, r: &Rebuild) -> Result<(), StoreError> {
        let Some(fence) = self.fence.clone() else {
            return Err(Refusal::NotLeader {
                projection: r.projection.clone(),
            }
            .into());
        };
        let schema = self.schema.clone();
        rebuild::abort(self.client_mut(), &schema, r, &fence).await
    }

    /// Ends the switched rebuild of `projection`: drops its retired table and the
    /// previous subscriber's state. Fenced when a fence is bound (the daemon's); a
    /// command may finish beside a leading daemon: nothing reads or writes a retired
    /// table, and the rebuild row's state change orders it with the daemon's own finish.
    pub async fn finish_rebuild(&mut self, projection: &str) -> Result<Rebuild, StoreError> {
        let (schema, fence) = (self.schema.clone(), self.fence.clone());
        rebuild::finish(self.client_mut(), &schema, projection, fence.as_ref()).await
    }

    /// One prune pass of this target's claims and, on the main target, the event log.
    /// Every delete is fenced when a fence is bound; a command prunes beside a leading
    /// daemon without one: it deletes only what every checkpoint has passed, which the
    /// leader's work only moves forward.
    pub async fn prune(&mut self, policy: &PrunePolicy) -> Result<Pruned, StoreError> {
        let (schema, fence) = (self.schema.clone(), self.fence.clone());
        prune::prune(self.client_mut(), &schema, policy, fence.as_ref()).await
    }

    /// The claims of this extra target past their retention (the event log is `log`'s),
    /// fenced like [`Operator::prune`].
    pub async fn prune_claims<L: Borrow<Client>>(
        &mut self,
        log: &Operator<L>,
        policy: &PrunePolicy,
    ) -> Result<Pruned, StoreError> {
        let (schema, fence) = (self.schema.clone(), self.fence.clone());
        prune::prune_claims_elsewhere(
            self.client_mut(),
            &schema,
            log.client(),
            &log.schema,
            policy,
            fence.as_ref(),
        )
        .await
    }

    /// Records how far each extra target lets go of the log (`configured`: the targets
    /// in the config); returns the bound of removed targets and which they are. Fenced
    /// like [`Operator::prune`].
    pub async fn record_holds(
        &mut self,
        holds: &[(String, Option<i64>)],
        configured: &[String],
    ) -> Result<(Option<i64>, Vec<(String, i64)>), StoreError> {
        let (schema, fence) = (self.schema.clone(), self.fence.clone());
        prune::record_holds(
            self.client_mut(),
            &schema,
            holds,
            configured,
            fence.as_ref(),
        )
        .await
    }
}

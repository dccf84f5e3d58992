//! This instance's life: it registers in the main target and heartbeats there every
//! second (on its control session, which also listens for the other instances' news),
//! leads when the leader is gone (`lead.rs`), and runs its share of the work units
//! (`assign.rs`): each round it gives back the units that are another's, takes those that
//! are its own and free (or whose owner is dead: that owner's sessions are ended first),
//! and runs each taken unit's projector under the unit's fence (`work_unit.rs`).
//!
//! Handover: a unit given back (another instance joined, this one stops) is released
//! after its projector finished its batch, and taken by its new owner at once (told by a
//! notification). A killed instance is found dead about 2 s after its sessions ended,
//! a frozen or cut-off one after `[cluster] lease_s` without a heartbeat: its units are
//! taken in the next round, so they run elsewhere within `lease_s` + 3 s plus the batch
//! in flight. An instance that finds itself silent for longer than its lease (it was
//! the one frozen) stops all its work before it rejoins: its fences refuse it anyway.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinSet;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use walfold_config::{quote_ident, Config};
use walfold_pg::Notice;
use walfold_store::instance::{self, Registration, Seen};
use walfold_store::work_unit::{self, Taken, Unit, UnitKey, UnitLeases};
use walfold_store::{Attempt, LeaderRow, Leadership};
use walfold_telemetry::signal::Signal;

use super::assign::{assign, Place, Worker};
use super::definition::{Definition, TargetPools, UnitRun};
use super::lead::Duties;
use super::target_down::TargetDown;
use crate::error::EngineError;
use crate::pages::SharedPages;
use crate::target::Target;

/// How often an instance heartbeats and looks at the units.
const ROUND: Duration = Duration::from_secs(1);

/// What every part of this instance shares.
pub(crate) struct Shared {
    pub config: Arc<Config>,
    pub definitions: Vec<Definition>,
    pub me: Registration,
    pub lease: Duration,
    /// The log's head as this instance knows it: from its own ingest when it leads, else
    /// from the leader's notifications.
    pub head: watch::Sender<i64>,
    targets: Vec<(Target, TargetPools, Arc<SharedPages>)>,
    /// Wakes the planners (a rebuild's partition reached the head).
    pub planners: Notify,
    /// Wakes this instance's round (the units changed).
    round_now: Notify,
    /// A rebuild's partition here reached the head.
    rebuild_at_head: Arc<Notify>,
    /// The channel all instances of this deployment listen to.
    pub channel: String,
    /// The instances as last seen, and whether that look was settled (see
    /// [`Seen::alive`]).
    seen: Mutex<(Vec<Seen>, bool)>,
    /// The session news are sent on.
    notifier: tokio::sync::Mutex<Option<Client>>,
}

impl Shared {
    pub(crate) fn pools_of(&self, target: &Target) -> TargetPools {
        self.targets
            .iter()
            .find(|(t, ..)| t == target)
            .map(|(_, p, _)| p.clone())
            .expect("every target has its pools")
    }

    pub(crate) fn pages_of(&self, target: &Target) -> Arc<SharedPages> {
        self.targets
            .iter()
            .find(|(t, ..)| t == target)
            .map(|(.., p)| p.clone())
            .expect("every target has its pages")
    }

    fn main(&self) -> &Target {
        &self.targets[0].0
    }

    /// The tag of instance `id` when it was last seen dead; `None` when alive or unknown.
    pub(crate) fn dead_tag(&self, id: &Uuid) -> Option<i32> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.0
            .iter()
            .find(|s| s.id == *id && s.id != self.me.id && !s.alive(self.lease, seen.1))
            .map(|s| s.tag)
    }

    /// Says that the units changed: every instance (this one too) looks again now.
    pub(crate) async fn units_changed(&self) {
        self.round_now.notify_one();
        self.tell("u").await;
    }

    /// Sends `news` to every instance (best effort: the rounds find out anyway).
    pub(crate) async fn tell(&self, news: &str) {
        let mut session = self.notifier.lock().await;
        if session.as_ref().is_none_or(Client::is_closed) {
            *session = notifier(&self.config).await.ok();
        }
        if let Some(client) = session.as_ref() {
            if let Err(e) = client
                .execute("select pg_notify($1, $2)", &[&self.channel, &news])
                .await
            {
                tracing::debug!(error = %e, "could not notify the other instances");
                *session = None;
            }
        }
    }

    /// The log's head moved to `head` (as far as this instance knows).
    pub(crate) fn head_at(&self, head: i64) {
        self.head.send_if_modified(|h| {
            let newer = head > *h;
            if newer {
                *h = head;
            }
            newer
        });
    }
}

/// A session to send notifications on: nothing it does needs to be durable.
async fn notifier(config: &Config) -> Result<Client, EngineError> {
    let client = walfold_pg::connect(config.target_url()).await?;
    client
        .batch_execute("set synchronous_commit = off")
        .await
        .map_err(walfold_store::StoreError::db(
            "configuring the notification session",
        ))?;
    Ok(client)
}

/// The channel of the deployment whose walfold schema is `schema`: one per schema, so
/// deployments sharing a database do not wake each other.
fn channel_of(schema: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in schema.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("walfold_{h:08x}")
}

/// The instance's session on the main target: heartbeats, leadership, notifications.
struct Control {
    client: Client,
    notices: mpsc::UnboundedReceiver<Notice>,
    since: Instant,
}

impl Control {
    async fn open(shared: &Shared) -> Result<Control, EngineError> {
        let main = shared.main();
        let (client, notices) = walfold_pg::connect_listening(&main.url).await?;
        client
            .batch_execute(&format!(
                "set tcp_keepalives_idle = 30; set tcp_keepalives_interval = 10; \
                 set tcp_keepalives_count = 3; set statement_timeout = 0; \
                 set synchronous_commit = off; listen {}",
                quote_ident(&shared.channel)
            ))
            .await
            .map_err(walfold_store::StoreError::db(
                "configuring the control session",
            ))?;
        instance::register(&client, &main.schema, &shared.me).await?;
        Ok(Control {
            client,
            notices,
            since: Instant::now(),
        })
    }
}

/// How a running unit is to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// It runs on.
    Keep,
    /// Given back once its projector stopped.
    Release,
    /// Taken by another (or gone from the plan): only forgotten.
    Lost,
}

struct Running {
    token: i64,
    stop: CancellationToken,
    end: End,
}

/// A unit's projector that ended.
struct Ended {
    place: (String, UnitKey),
    token: i64,
    result: Result<(), EngineError>,
}

struct Leading {
    leadership: Leadership,
    duties: Duties,
}

/// Runs this instance until `cancel`: see the module docs.
pub(crate) async fn run(
    config: Arc<Config>,
    definitions: Vec<Definition>,
    cancel: CancellationToken,
) -> Result<(), EngineError> {
    let tag = walfold_pg::tag_sessions();
    let me = Registration {
        id: Uuid::new_v4(),
        host: instance::host_name(),
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        runs: config.cluster.projections.clone(),
        knows: definitions.iter().map(|d| d.options.name.clone()).collect(),
        leads: config.cluster.lead,
        tag,
    };
    tracing::info!(instance = %me.id, host = %me.host, "instance started");
    let targets = TargetPools::all(&config)
        .into_iter()
        .map(|(t, p)| {
            let pages = Arc::new(SharedPages::new(config.pipeline.page_bytes));
            (t, p, pages)
        })
        .collect();
    let shared = Arc::new(Shared {
        lease: Duration::from_secs(config.cluster.lease_s),
        channel: channel_of(&config.target.schema),
        head: watch::channel(0).0,
        targets,
        planners: Notify::new(),
        round_now: Notify::new(),
        rebuild_at_head: Arc::new(Notify::new()),
        seen: Mutex::new((Vec::new(), false)),
        notifier: tokio::sync::Mutex::new(None),
        definitions,
        me,
        config,
    });
    let mut runner = Runner {
        down: HashMap::new(),
        control: None,
        leases: HashMap::new(),
        running: HashMap::new(),
        tasks: JoinSet::new(),
        leading: None,
        older: None,
        heard: Instant::now(),
        cannot_fold: HashSet::new(),
        shared,
    };
    let result = runner.run(&cancel).await;
    runner.shutdown().await;
    result
}

struct Runner {
    shared: Arc<Shared>,
    control: Option<Control>,
    /// This instance's lease session on each target, by label.
    leases: HashMap<String, UnitLeases>,
    down: HashMap<String, TargetDown>,
    running: HashMap<(String, UnitKey), Running>,
    tasks: JoinSet<Ended>,
    leading: Option<Leading>,
    /// The backend of an older release that leads, while one does.
    older: Option<i32>,
    /// When the last heartbeat landed.
    heard: Instant,
    /// Subscribers whose recorded definition this program cannot build (said once).
    cannot_fold: HashSet<String>,
}

impl Runner {
    async fn run(&mut self, cancel: &CancellationToken) -> Result<(), EngineError> {
        let mut tick = tokio::time::interval(ROUND);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let shared = self.shared.clone();
        loop {
            let notice = async {
                match self.control.as_mut() {
                    Some(c) => c.notices.recv().await,
                    None => std::future::pending().await,
                }
            };
            let duties = async {
                match self.leading.as_mut() {
                    Some(l) => l.duties.ended().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Ok(()),
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    let ended = done.unwrap_or_else(|join| Ended {
                        place: (String::new(), UnitKey { subscriber: String::new(), partition: 0 }),
                        token: 0,
                        result: Err(super::joined_error("a projector", join)),
                    });
                    self.unit_ended(ended).await?;
                }
                result = duties => self.duties_ended(result).await?,
                notice = notice => match notice {
                    Some(n) => self.heard_news(&n),
                    None => self.control = None,
                },
                _ = shared.rebuild_at_head.notified() => match self.leading.is_some() {
                    true => shared.planners.notify_waiters(),
                    false => shared.tell("r").await,
                },
                _ = tick.tick() => self.round_or_retry().await?,
                _ = shared.round_now.notified() => self.round_or_retry().await?,
            }
        }
    }

    fn heard_news(&mut self, n: &Notice) {
        match n.payload.split_once(' ') {
            Some(("h", head)) => {
                if let Ok(head) = head.parse() {
                    self.shared.head_at(head);
                }
            }
            _ if n.payload == "u" => self.shared.round_now.notify_one(),
            _ if n.payload == "r" && self.leading.is_some() => {
                self.shared.planners.notify_waiters()
            }
            _ => {}
        }
    }

    /// [`Runner::round`]; a failure it can retry (a connection lost, the server
    /// restarting) is said, and the sessions that failed are opened again next round.
    async fn round_or_retry(&mut self) -> Result<(), EngineError> {
        match self.round().await {
            Err(e) if e.kind().retries() => {
                tracing::warn!(error = %e, "this instance's round failed; trying again");
                if self.control.as_ref().is_some_and(|c| c.client.is_closed()) {
                    self.control = None;
                }
                self.leases.retain(|_, l| !l.is_closed());
                self.stand_down_if_silent().await;
                Ok(())
            }
            other => other,
        }
    }

    /// One round: the heartbeat, leadership, then the units.
    async fn round(&mut self) -> Result<(), EngineError> {
        if self.leading.is_some() {
            // Tests: a leader that stalls (its heartbeats stop, its work goes on).
            walfold_telemetry::failpoint::delay("leader_heartbeat").await;
        }
        let shared = self.shared.clone();
        let schema = &shared.main().schema;
        if self.control.as_ref().is_none_or(|c| c.client.is_closed()) {
            self.control = None;
            match Control::open(&shared).await {
                Ok(c) => self.control = Some(c),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot reach the main target to heartbeat; retrying");
                    self.stand_down_if_silent().await;
                    return Ok(());
                }
            }
        }
        let control = self.control.as_ref().expect("opened above");
        let beat = match instance::heartbeat(&control.client, schema, &shared.me.id).await {
            Ok(Some(beat)) => beat,
            Ok(None) => {
                instance::register(&control.client, schema, &shared.me).await?;
                return Ok(());
            }
            Err(e) => {
                tracing::warn!(error = %e, "heartbeat failed; reconnecting");
                self.control = None;
                self.stand_down_if_silent().await;
                return Ok(());
            }
        };
        let silent = self.heard.elapsed();
        self.heard = Instant::now();
        if silent > shared.lease {
            tracing::warn!(silent_s = silent.as_secs(), "this instance was silent for longer than its lease (stopped, frozen, or cut off from the main target): its work may have moved to others; starting over");
            self.stop_everything().await;
        }
        let (leader, epoch) = beat;
        if let Some(l) = &self.leading {
            if leader != Some(shared.me.id) || epoch != l.leadership.epoch() {
                tracing::warn!("lost leadership; stopped leading");
                self.end_leading(false).await;
            }
        }
        let control = self.control.as_ref().expect("opened above");
        let seen = instance::seen(&control.client, schema).await?;
        let settled = control.since.elapsed() >= shared.lease;
        *shared.seen.lock().unwrap_or_else(|e| e.into_inner()) = (seen.clone(), settled);
        let alive: Vec<&Seen> = seen
            .iter()
            .filter(|s| s.id == shared.me.id || s.alive(shared.lease, settled))
            .collect();
        self.lead_if_gone(
            LeaderRow {
                epoch,
                owner: leader,
            },
            &seen,
            &alive,
        )
        .await?;
        if self.older.is_some() {
            // The older release runs every projection itself.
            for r in self.running.values_mut() {
                r.end = End::Release;
                r.stop.cancel();
            }
            return Ok(());
        }
        self.units(&seen, &alive).await
    }

    /// Takes leadership when its holder is gone (dead, departed, or nobody).
    async fn lead_if_gone(
        &mut self,
        row: LeaderRow,
        seen: &[Seen],
        alive: &[&Seen],
    ) -> Result<(), EngineError> {
        let shared = self.shared.clone();
        let me = shared.me.id;
        if self.leading.is_some() || !shared.me.leads {
            return Ok(());
        }
        let gone = match row.owner {
            None => true,
            Some(o) => o == me || !alive.iter().any(|s| s.id == o),
        };
        if !gone {
            self.older = None;
            return Ok(());
        }
        let control = &self.control.as_ref().expect("the round opened it").client;
        let schema = &shared.main().schema;
        let dead = row
            .owner
            .filter(|o| *o != me)
            .and_then(|o| seen.iter().find(|s| s.id == o))
            .map(|s| s.tag);
        if let Some(tag) = dead {
            let ended = instance::end_sessions(control, schema, tag).await?;
            if ended.ended > 0 {
                tracing::info!(
                    sessions = ended.ended,
                    "ended the sessions of the dead leader"
                );
            }
        }
        match Leadership::try_take(control, schema, me, row, dead).await? {
            Attempt::Leads(leadership) => {
                self.older = None;
                Signal::LeadershipTaken.report();
                let duties = Duties::start(shared.clone(), leadership.fence(), dead);
                self.leading = Some(Leading { leadership, duties });
            }
            Attempt::Older { pid } => {
                if self.older != Some(pid) {
                    tracing::error!(pid, "an instance of an older walfold release leads this schema (its backend pid on the main target): this instance runs nothing beside it; stop that instance (see the upgrade notes)");
                }
                self.older = Some(pid);
            }
            Attempt::Lost => {}
        }
        Ok(())
    }

    /// The units' round: reads every target's units, and gives back, takes and starts.
    async fn units(&mut self, seen: &[Seen], alive: &[&Seen]) -> Result<(), EngineError> {
        let shared = self.shared.clone();
        let me = shared.me.id;
        let mut all: Vec<(Target, Unit)> = Vec::new();
        let mut read: HashSet<String> = HashSet::new();
        for (target, ..) in &shared.targets {
            if target.is_extra() && !shared.definitions.iter().any(|d| d.target == *target) {
                continue;
            }
            let label = target.label().to_owned();
            match self.units_of(target).await {
                Ok(units) => {
                    self.down_of(&label).leave();
                    all.extend(units.into_iter().map(|u| (target.clone(), u)));
                    read.insert(label);
                }
                Err(e) => {
                    self.leases.remove(&label);
                    let subscribers: Vec<String> = self
                        .running
                        .keys()
                        .filter(|(l, _)| *l == label)
                        .map(|(_, k)| k.subscriber.clone())
                        .collect();
                    let down = self.down_of(&label);
                    down.serving(subscribers);
                    down.enter(&e);
                }
            }
        }
        // Computed apart: what it borrows lives only here.
        let assigned = {
            let workers: Vec<Worker> = alive
                .iter()
                .map(|s| Worker {
                    id: s.id,
                    projections: s.knows.iter().filter(|p| s.runs(p)).cloned().collect(),
                })
                .collect();
            let places: Vec<(Place, &str)> = all
                .iter()
                .map(|(t, u)| (place_of(t, u), u.projection.as_str()))
                .collect();
            assign(&places, &workers)
        };
        Signal::WorkUnits {
            owned: all.iter().filter(|(_, u)| u.owner == Some(me)).count(),
            unowned: all
                .iter()
                .filter(|(_, u)| {
                    !u.held && !u.owner.is_some_and(|o| alive.iter().any(|s| s.id == o))
                })
                .count(),
        }
        .report();
        // Planned no more (read, and not there): gone.
        for (key, r) in self.running.iter_mut() {
            if read.contains(&key.0)
                && !all
                    .iter()
                    .any(|(t, u)| t.label() == key.0 && u.key == key.1)
            {
                r.end = End::Lost;
                r.stop.cancel();
            }
        }
        let mut ended: HashSet<(String, i32)> = HashSet::new();
        for (target, unit) in &all {
            let label = target.label().to_owned();
            let mine = assigned.get(&place_of(target, unit)) == Some(&me);
            if let Some(r) = self.running.get_mut(&(label.clone(), unit.key.clone())) {
                if unit.token != r.token || unit.owner != Some(me) {
                    r.end = End::Lost;
                    r.stop.cancel();
                } else if !mine && r.end == End::Keep {
                    r.end = End::Release;
                    r.stop.cancel();
                }
                continue;
            }
            if unit.held {
                continue;
            }
            let Some(leases) = self.leases.get_mut(&label) else {
                continue;
            };
            let waiting = leases.taken().any(|k| *k == unit.key);
            if unit.owner == Some(me) && !(mine && waiting) {
                // Owned but not running, and not a take that waits: given back, so it is
                // taken afresh (by this instance, if it is its own).
                if let Err(e) = leases.release(&unit.key, unit.token).await {
                    tracing::warn!(unit = %unit.key, error = %e, "cannot give a work unit back yet");
                }
                continue;
            }
            if !mine {
                continue;
            }
            let dead = match unit.owner {
                Some(o) if o == me => None,
                Some(o) if alive.iter().any(|s| s.id == o) => continue,
                Some(o) => seen.iter().find(|s| s.id == o).map(|s| s.tag),
                None => None,
            };
            if let Some(tag) = dead {
                if ended.insert((label.clone(), tag)) {
                    let ended =
                        instance::end_sessions(leases.client(), &target.schema, tag).await?;
                    if ended.ended > 0 {
                        tracing::info!(target = %label, sessions = ended.ended, "ended the sessions of a dead instance");
                    }
                }
            }
            let stop = CancellationToken::new();
            match leases.take(unit, dead, stop.clone()).await? {
                Taken::Owned(fence) => self.start(target, unit, fence, stop).await?,
                Taken::Lost | Taken::Waiting => {}
            }
        }
        Ok(())
    }

    fn down_of(&mut self, label: &str) -> &mut TargetDown {
        self.down
            .entry(label.to_owned())
            .or_insert_with(|| TargetDown::new(label))
    }

    /// `target`'s units, through this instance's lease session there (opened if needed).
    async fn units_of(&mut self, target: &Target) -> Result<Vec<Unit>, EngineError> {
        let label = target.label().to_owned();
        let unreachable = |source| match target.is_extra() {
            true => EngineError::Unreachable {
                target: label.clone(),
                source,
            },
            false => EngineError::from(source),
        };
        if self.leases.get(&label).is_none_or(UnitLeases::is_closed) {
            if target.is_extra() {
                walfold_store::migrate(&target.url, &target.schema)
                    .await
                    .map_err(unreachable)?;
            }
            let leases = UnitLeases::open(&target.url, &target.schema, self.shared.me.id, &label)
                .await
                .map_err(unreachable)?;
            self.leases.insert(label.clone(), leases);
        }
        let leases = &self.leases[&label];
        work_unit::units(leases.client(), &target.schema)
            .await
            .map_err(unreachable)
    }

    /// Starts the projector of `unit`, taken at `fence`.
    async fn start(
        &mut self,
        target: &Target,
        unit: &Unit,
        fence: walfold_store::Fence,
        stop: CancellationToken,
    ) -> Result<(), EngineError> {
        let shared = self.shared.clone();
        let label = target.label().to_owned();
        let token = fence.epoch();
        let Some(definition) = shared
            .definitions
            .iter()
            .find(|d| d.options.name == unit.projection && d.target == *target)
        else {
            return self.give_back(&label, &unit.key, token).await;
        };
        // A unit folds with what its subscriber recorded, whatever this instance's config
        // says: the leader decides about a changed definition, once.
        let recorded = walfold_store::definition::recorded(
            self.leases[&label].client(),
            &target.schema,
            &unit.key.subscriber,
        )
        .await?;
        let Some(definition) = definition.folding(recorded.as_ref())? else {
            if self.cannot_fold.insert(unit.key.subscriber.clone()) {
                tracing::warn!(projection = %unit.projection, subscriber = %unit.key.subscriber, "this subscriber folds with a definition this program cannot build (a Rust projection's older version): its units wait, and its read model stays as it is, until a rebuild switches over or the change is accepted");
            }
            return self.give_back(&label, &unit.key, token).await;
        };
        let definition = &definition;
        let replay = match unit.rebuild {
            false => None,
            true => {
                let leases = &self.leases[&label];
                let open = walfold_store::rebuild::open(leases.client(), &target.schema).await?;
                let shadow = match open.iter().find(|r| r.subscriber == unit.key.subscriber) {
                    Some(r) => definition.for_table(&target.schema, &r.shadow_table())?,
                    None => None,
                };
                match shadow {
                    Some(shadow) => Some(shadow),
                    None => return self.give_back(&label, &unit.key, token).await,
                }
            }
        };
        let pools = shared.pools_of(target);
        let partition = definition.partition(UnitRun {
            config: &shared.config,
            subscriber: &unit.key.subscriber,
            partition: unit.key.partition,
            partitions: unit.partitions,
            reached_head: unit.rebuild.then(|| shared.rebuild_at_head.clone()),
            replay,
            fence,
            pools: &pools,
            pages: shared.pages_of(target),
        });
        let place = (label, unit.key.clone());
        let name = format!(
            "{}{}[{}]",
            unit.projection,
            if unit.rebuild { "~rebuild" } else { "" },
            unit.key.partition
        );
        let (head, task_stop) = (shared.head.subscribe(), stop.clone());
        let task_place = place.clone();
        self.tasks.spawn(async move {
            let (_, result) = super::named(name, partition.run(task_stop, head)).await;
            Ended {
                place: task_place,
                token,
                result,
            }
        });
        self.running.insert(
            place,
            Running {
                token,
                stop,
                end: End::Keep,
            },
        );
        Ok(())
    }

    async fn give_back(
        &mut self,
        label: &str,
        key: &UnitKey,
        token: i64,
    ) -> Result<(), EngineError> {
        if let Some(leases) = self.leases.get_mut(label) {
            leases.release(key, token).await?;
        }
        Ok(())
    }

    /// A unit's projector ended: given back, forgotten, or (an error it cannot go on
    /// from) the instance stops.
    async fn unit_ended(&mut self, ended: Ended) -> Result<(), EngineError> {
        let Ended {
            place,
            token,
            result,
        } = ended;
        let running = self.running.remove(&place);
        if let Err(e) = result {
            if !e.is_fenced() {
                tracing::error!(unit = %place.1, error = %e, "projector failed; stopping");
                return Err(e);
            }
        }
        let end = running.map_or(End::Lost, |r| match r.end {
            // Its fence refused a write: another instance owns it now.
            End::Keep if r.stop.is_cancelled() => End::Lost,
            end => end,
        });
        let Some(leases) = self.leases.get_mut(&place.0) else {
            return Ok(());
        };
        let done = match end {
            End::Release | End::Keep => {
                let r = leases.release(&place.1, token).await;
                self.shared.units_changed().await;
                r
            }
            End::Lost => leases.forget(&place.1).await,
        };
        if let Err(e) = done {
            tracing::debug!(unit = %place.1, error = %e, "the lease session failed; it is opened again");
            self.leases.remove(&place.0);
        }
        Ok(())
    }

    async fn duties_ended(&mut self, result: Result<(), EngineError>) -> Result<(), EngineError> {
        self.end_leading(false).await;
        match result {
            Err(e) if !e.is_fenced() => Err(e),
            _ => Ok(()),
        }
    }

    /// Ends this instance's term as leader; `release`: a clean stop, the next leader
    /// takes over without waiting for the lease.
    async fn end_leading(&mut self, release: bool) {
        let Some(Leading { leadership, duties }) = self.leading.take() else {
            return;
        };
        duties.stop().await;
        Signal::LeadershipEnded.report();
        let schema = &self.shared.main().schema;
        match &self.control {
            Some(c) if !c.client.is_closed() => {
                leadership
                    .end(&c.client, schema, self.shared.me.id, release)
                    .await
            }
            _ => drop(leadership),
        }
    }

    /// Stops every unit and the leader's duties (their fences refuse them anyway), and
    /// drops the lease sessions: the instance starts over.
    async fn stop_everything(&mut self) {
        for r in self.running.values_mut() {
            r.end = End::Lost;
            r.stop.cancel();
        }
        self.end_leading(false).await;
        while let Some(done) = self.tasks.join_next().await {
            if let Ok(ended) = done {
                self.running.remove(&ended.place);
            }
        }
        self.leases.clear();
    }

    /// Unable to heartbeat: past half its lease, the others are about to take this
    /// instance's work, so it stops.
    async fn stand_down_if_silent(&mut self) {
        if self.heard.elapsed() > self.shared.lease / 2
            && (!self.running.is_empty() || self.leading.is_some())
        {
            tracing::warn!("no heartbeat for half the lease: stopping this instance's work until the main target answers");
            self.stop_everything().await;
        }
    }

    /// A clean stop: every unit finishes its batch and is given back, leadership is given
    /// up, and the instance leaves.
    async fn shutdown(&mut self) {
        for r in self.running.values_mut() {
            r.end = End::Release;
            r.stop.cancel();
        }
        if let Some(l) = &self.leading {
            l.duties.cancel();
        }
        while let Some(done) = self.tasks.join_next().await {
            if let Ok(ended) = done {
                if let Err(e) = self
                    .unit_ended(Ended {
                        result: Ok(()),
                        ..ended
                    })
                    .await
                {
                    tracing::debug!(error = %e, "while stopping");
                }
            }
        }
        self.end_leading(true).await;
        if let Some(c) = &self.control {
            if let Err(e) =
                instance::leave(&c.client, &self.shared.main().schema, &self.shared.me.id).await
            {
                tracing::debug!(error = %e, "could not deregister; the others find this instance gone");
            }
        }
    }
}

fn place_of(target: &Target, unit: &Unit) -> Place {
    Place {
        target: target.label().to_owned(),
        subscriber: unit.key.subscriber.clone(),
        partition: unit.key.partition,
    }
}

//! The reader: alone owns the replication connection. It reads the pgoutput messages the
//! wire layer decoded (`wire/change.rs`), maps outbox inserts to events, sends them in
//! order to the appender through a bounded channel (a full channel stops reading, so
//! back-pressure reaches the server), and forwards durable positions as feedback.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use walfold_config::SourceView;
use walfold_event::{DeadLetter, Lsn, NewEvent, RowOrigin};
use walfold_pg::ConnectOptions;
use walfold_store::{StagedChange, StagedRow};
use walfold_telemetry::throttle::{Admit, Throttle};

use crate::budget::InFlightBytes;
use crate::error::SourceError;
use crate::feedback::Acknowledger;
use crate::outbox::{pg_time, Mapped, Mapping, MessageMapping, TxContext};
use crate::wire::{
    Change, MessageFilter, ReplicationClient, ReplicationEvent, WireConfig, WireError,
};

/// What the reader hands the appender, in stream order.
// Events are nearly every item: boxing them would cost an allocation per event.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Item {
    Event(NewEvent),
    Rejected(Box<DeadLetter>),
    /// An update, delete or truncate of an outbox table: not an event, counted.
    Ignored,
    /// Every source transaction ending at or before this LSN has been sent in full.
    Through(Lsn),
    /// Protocol 2: a change of a transaction still in progress, staged until it ends.
    Staged(StagedChange),
    /// A streamed transaction (`subxid == xid`) or one of its subtransactions aborted.
    StreamAbort {
        xid: u32,
        subxid: u32,
    },
    /// A streamed transaction committed: its staged changes go into the event log.
    StreamCommit {
        xid: u32,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_time: Option<SystemTime>,
    },
}

/// The replication connection settings for the source URL.
pub fn replication_config(config: &SourceView<'_>) -> Result<WireConfig, SourceError> {
    let options = ConnectOptions::parse(&config.source().url).map_err(SourceError::SourceUrl)?;
    let pg = options.pg_config().map_err(SourceError::SourceUrl)?;
    // libpq's rules: one port for every host, or one per host.
    let ports = pg.get_ports();
    let port_of = |i: usize| match ports {
        [] => 5432,
        [one] => *one,
        many => many.get(i).copied().unwrap_or(5432),
    };
    let user = pg.get_user().unwrap_or("postgres").to_owned();
    let password = pg
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let database = pg.get_dbname().unwrap_or(&user).to_owned();
    // libpq's `hostaddr` (key=value form) is where a host is reached, its `host` only
    // names it for TLS; the replication client connects to the address.
    let addrs = pg.get_hostaddrs();
    let names: Vec<String> = pg
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .collect();
    let mut hosts: Vec<(String, u16)> = (0..names.len().max(addrs.len()))
        .map(|i| {
            let host = addrs
                .get(i)
                .map(ToString::to_string)
                .or_else(|| names.get(i).cloned())
                .unwrap_or_default();
            (host, port_of(i))
        })
        .collect();
    if hosts.is_empty() {
        hosts.push(("127.0.0.1".into(), port_of(0)));
    }
    Ok(WireConfig {
        hosts,
        read_write: pg.get_target_session_attrs()
            == tokio_postgres::config::TargetSessionAttrs::ReadWrite,
        user,
        password,
        database,
        ssl_mode: options.ssl_mode,
        root_cert: options.root_cert,
        slot: config.source().slot.clone(),
        // pgoutput splits publication_names like an identifier list, folding unquoted
        // names to lower case: quoted, `PubQuoted` is used as written.
        publication: walfold_config::quote_ident(&config.source().publication),
        // pgoutput 2 sends a streamed transaction's messages under its top-level xid: a
        // message in a savepoint rolled back after it streamed could not be told apart,
        // so message outboxes are read with protocol 1 (config refuses an explicit 2).
        protocol: config.source().protocol.or(config
            .outboxes()
            .any(|o| o.message_prefix.is_some())
            .then_some(1)),
        // Deterministic text output for the values we parse.
        settings: Some(
            "set datestyle = 'ISO'; set timezone = 'UTC'; set extra_float_digits = 3".into(),
        ),
        application_name: "walfold".into(),
        status_interval: Duration::from_secs(1),
        silence: Duration::from_secs(30),
        buffer: 1024,
        stop_lsn: None,
        observer: None,
        expect: None,
        budget: None,
        messages: Some(MessageFilter {
            prefixes: config
                .outboxes()
                .filter_map(|o| o.message_prefix.clone())
                .collect(),
            max_bytes: config.pipeline.max_event_bytes,
        }),
    })
}

/// A logical message's content: read, or left in the stream (its length; see
/// [`MessageFilter`]).
#[derive(Clone, Copy)]
enum Content<'a> {
    Read(&'a [u8]),
    LeftOut(usize),
}

impl Content<'_> {
    fn map(
        self,
        mapping: &MessageMapping,
        tx: TxContext,
        origin: Option<RowOrigin>,
    ) -> Result<NewEvent, Box<DeadLetter>> {
        match self {
            Content::Read(content) => mapping.map(content, tx, origin),
            Content::LeftOut(len) => Err(mapping.too_large(len, tx, origin)),
        }
    }

    fn reject_nontransactional(self, mapping: &MessageMapping, tx: TxContext) -> Box<DeadLetter> {
        match self {
            Content::Read(content) => mapping.reject_nontransactional(content, tx),
            Content::LeftOut(len) => mapping.reject_nontransactional_left_out(len, tx),
        }
    }
}

/// A relation as its Relation message announced it.
struct Relation {
    /// `schema.table`, for messages.
    name: String,
    /// `None`: no `[[outbox]]` is this table.
    mapping: Option<Mapping>,
}

/// At most this many lines about malformed rows each [`MALFORMED_LINES_WINDOW`].
const MALFORMED_LINES: u32 = 20;
const MALFORMED_LINES_WINDOW: Duration = Duration::from_secs(60);

pub(crate) struct Reader<'a> {
    config: &'a SourceView<'a>,
    relations: HashMap<u32, Relation>,
    messages: Vec<MessageMapping>,
    /// Prefixes of transactional messages that are no outbox's, warned about once.
    unknown_prefixes: HashSet<String>,
    tx: Option<TxContext>,
    /// The WAL record of the last insert and how many rows it held before this one.
    change: Option<(Lsn, i32)>,
    /// Protocol 2: streamed transactions not yet committed or aborted.
    streamed: HashMap<u32, Streamed>,
    items: mpsc::Sender<(Item, InFlightBytes)>,
    /// The bytes of the message being handled, taken from the budget by the replication
    /// worker: they go with the first item made of it, and are given back once that is
    /// appended.
    held: InFlightBytes,
    /// The ingest position when this attempt started: transactions committed before it
    /// are in the log already.
    durable: Lsn,
    /// Lines about malformed rows: a bad batch's every row is a dead letter, not a line.
    malformed_lines: Throttle,
}

/// What the reader keeps of a streamed transaction between its segments: a bounded
/// amount, whatever its size.
#[derive(Debug, Default)]
struct Streamed {
    /// The next change's order.
    ord: i64,
    /// As [`Reader::change`], for this transaction.
    change: Option<(Lsn, i32)>,
    /// A change that stops ingest (an unmapped table, a missing column) and the
    /// subtransaction that made it: raised at the commit, with its position, and
    /// forgotten when that (sub)transaction aborts.
    problem: Option<(u32, SourceError)>,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(
        config: &'a SourceView<'a>,
        items: mpsc::Sender<(Item, InFlightBytes)>,
        durable: Lsn,
    ) -> Self {
        Reader {
            durable,
            config,
            relations: HashMap::new(),
            messages: config
                .outboxes()
                .filter_map(MessageMapping::new)
                .map(|m| m.with_max_bytes(config.pipeline.max_event_bytes))
                .collect(),
            unknown_prefixes: HashSet::new(),
            tx: None,
            change: None,
            streamed: HashMap::new(),
            items,
            held: InFlightBytes::default(),
            malformed_lines: Throttle::new(MALFORMED_LINES_WINDOW, MALFORMED_LINES),
        }
    }

    /// Whether to log this malformed row (or message); says what was held back first.
    fn say_malformed(&mut self) -> bool {
        match self.malformed_lines.admit() {
            Admit::Say { held_back } => {
                if held_back > 0 {
                    tracing::warn!(
                        held_back,
                        "more malformed outbox rows were sent to dead letters without a line each"
                    );
                }
                true
            }
            Admit::SayLast => {
                tracing::warn!(
                    "malformed outbox rows: at most {MALFORMED_LINES} lines a minute from here; \
                     walfold_malformed_total and `walfold dead-letters list` have every one"
                );
                true
            }
            Admit::Hold => false,
        }
    }

    /// Streams until cancelled (then drains cleanly) or an error.
    pub(crate) async fn run(
        mut self,
        mut cfg: WireConfig,
        mut ack: Acknowledger,
        cancel: &CancellationToken,
    ) -> Result<(), SourceError> {
        let name = self.config.source().name.clone();
        cfg.observer = Some(ack.observer(&name));
        let mut client = ReplicationClient::connect(cfg).await?;
        tracing::info!(source = %name, slot = %self.config.source().slot, host = %client.identity.host, timeline = client.identity.timeline, protocol = client.protocol, server_version = client.server_version, "streaming from slot");
        let metrics = walfold_telemetry::metrics::metrics();
        metrics.set_streaming(&name, true);
        // One waiter each for the whole stream, not one per message: the cancellation,
        // and the appender failing (stop now, even on an idle stream). The clone of the
        // sender goes with the loop, before the appender is let finish.
        let cancelled = cancel.cancelled();
        tokio::pin!(cancelled);
        let appender = self.items.clone();
        let result = {
            let appender_gone = appender.closed();
            tokio::pin!(appender_gone);
            loop {
                tokio::select! {
                    biased;
                    _ = &mut cancelled => break Ok(()),
                    Some(lsn) = ack.next() => ack.acknowledge(&client, lsn),
                    _ = &mut appender_gone => break Err(SourceError::StreamEnded),
                    event = client.recv() => match event {
                        Ok(Some((ReplicationEvent::StoppedAt { reached }, _))) => {
                            tracing::info!(lsn = %Lsn(reached.as_u64()), "reached the stop position");
                            break Ok(());
                        }
                        Ok(Some((event, held))) => {
                            self.held = held;
                            let handled = self.handle(event).await;
                            // What no item took is given back now: the next message may
                            // need the whole budget.
                            self.held = InFlightBytes::default();
                            if let Err(e) = handled {
                                break Err(e);
                            }
                        }
                        Ok(None) => break Err(SourceError::StreamEnded),
                        Err(WireError::Decode(e)) => break Err(SourceError::Decode(e.to_string())),
                        Err(e) => break Err(e.into()),
                    },
                }
            }
        };
        drop(appender);
        metrics.set_streaming(&name, false);
        // Let the appender finish what it has, then report its final position.
        drop(self.items);
        if result.is_ok() {
            ack.finish(&client).await;
            if let Err(e) = client.shutdown().await {
                tracing::debug!(error = %e, "replication shutdown");
            }
        } else {
            client.abort();
        }
        result
    }

    async fn handle(&mut self, event: ReplicationEvent) -> Result<(), SourceError> {
        match event {
            ReplicationEvent::KeepAlive { wal_end, .. } => {
                // Between transactions everything the server decoded up to wal_end has
                // reached us, so once it is durable the slot may move there (an idle or
                // filtered database then still releases WAL).
                if self.tx.is_none() && !wal_end.is_zero() {
                    self.send(Item::Through(Lsn(wal_end.as_u64()))).await?;
                }
            }
            ReplicationEvent::Change {
                wal_start,
                change,
                stream,
            } => self.read(Lsn(wal_start.as_u64()), change, stream).await?,
            ReplicationEvent::StoppedAt { .. } => {}
        }
        Ok(())
    }

    /// A logical decoding message: an event of a message outbox when transactional and
    /// under its prefix; a heartbeat (or anyone's non-transactional message) otherwise.
    /// `xid`: the (sub)transaction of a message in a streamed block (protocol 2),
    /// staged like a streamed insert.
    async fn message(
        &mut self,
        transactional: bool,
        at: Lsn,
        prefix: &str,
        content: Content<'_>,
        (xid, stream): (Option<u32>, Option<u32>),
    ) -> Result<(), SourceError> {
        let streamed = match (transactional, stream) {
            (true, Some(top)) => Some((top, xid.unwrap_or(top))),
            _ => None,
        };
        let Some(mapping) = self.messages.iter().find(|m| m.prefix == prefix) else {
            if transactional {
                // Counted with the ignored changes (`status`, metrics): a mistyped prefix
                // shows there, and its messages exist only in the WAL.
                if self.unknown_prefixes.len() < 32
                    && self.unknown_prefixes.insert(prefix.to_owned())
                {
                    tracing::warn!(prefix, "transactional messages with this prefix are no [[outbox]]'s message_prefix: ignored (counted as ignored changes)");
                }
                self.send(Item::Ignored).await?;
            } else if self.tx.is_none() {
                // Between transactions: like a keepalive, everything before it has
                // reached us.
                self.send(Item::Through(at)).await?;
            }
            return Ok(());
        };
        let (tx, item) = match (transactional, streamed, self.tx) {
            // The move into the event log sets the commit LSN and time.
            (true, Some((top, _)), _) => {
                let origin = origin(&mut self.streamed.entry(top).or_default().change, at);
                let tx = TxContext {
                    commit_lsn: Lsn::ZERO,
                    commit_time: None,
                };
                (
                    tx,
                    content
                        .map(mapping, tx, origin)
                        .map_or_else(Item::Rejected, Item::Event),
                )
            }
            (true, None, Some(tx)) => {
                let origin = origin(&mut self.change, at);
                (
                    tx,
                    content
                        .map(mapping, tx, origin)
                        .map_or_else(Item::Rejected, Item::Event),
                )
            }
            // Sent at once, whether its transaction commits or not: never an event.
            _ => {
                let tx = TxContext {
                    commit_lsn: at,
                    commit_time: None,
                };
                (
                    tx,
                    Item::Rejected(content.reject_nontransactional(mapping, tx)),
                )
            }
        };
        if let Item::Rejected(dead) = &item {
            if self.say_malformed() {
                tracing::warn!(prefix, lsn = %tx.commit_lsn, error = %dead.error, "malformed outbox message sent to dead letters");
            }
        }
        self.emit(streamed, item).await?;
        if !transactional && self.tx.is_none() {
            self.send(Item::Through(at)).await?;
        }
        Ok(())
    }

    /// One decoded message. `at`: where the server says it is; for a change, its WAL
    /// record's LSN. `stream`: the top-level xid of the streamed block it is in.
    async fn read(
        &mut self,
        at: Lsn,
        change: Change,
        stream: Option<u32>,
    ) -> Result<(), SourceError> {
        match change {
            Change::Begin(begin) => {
                self.tx = Some(TxContext {
                    commit_lsn: Lsn(begin.final_lsn),
                    commit_time: pg_time(begin.commit_time),
                });
                self.change = None;
            }
            Change::Commit(commit) => {
                self.tx = None;
                self.send(Item::Through(Lsn(commit.end_lsn))).await?;
            }
            Change::Message {
                transactional,
                lsn,
                prefix,
                content,
                xid,
                left_out,
            } => {
                let content = match left_out {
                    Some(len) => Content::LeftOut(len),
                    None => Content::Read(&content),
                };
                self.message(transactional, Lsn(lsn), &prefix, content, (xid, stream))
                    .await?
            }
            // What an earlier session staged was cleared when this one began (the
            // server sends every unfinished transaction again from its first segment),
            // so a first segment has nothing to replace.
            Change::StreamStart(start) => {
                if start.first_segment {
                    self.streamed.insert(start.xid, Streamed::default());
                }
            }
            Change::StreamAbort(abort) => {
                let staged = self.streamed.get(&abort.xid).is_some_and(|s| s.ord > 0);
                if abort.subxid == abort.xid {
                    self.streamed.remove(&abort.xid);
                } else if let Some(s) = self.streamed.get_mut(&abort.xid) {
                    if s.problem
                        .as_ref()
                        .is_some_and(|(sub, _)| *sub == abort.subxid)
                    {
                        s.problem = None;
                    }
                }
                if staged {
                    self.send(Item::StreamAbort {
                        xid: abort.xid,
                        subxid: abort.subxid,
                    })
                    .await?;
                }
            }
            Change::StreamCommit(commit) => {
                let state = self.streamed.remove(&commit.xid).unwrap_or_default();
                let commit_lsn = Lsn(commit.commit_lsn);
                if let Some((_, problem)) = state.problem {
                    match problem.at_commit(commit_lsn) {
                        SourceError::OutboxChanged { .. } if self.in_log(commit_lsn) => {}
                        problem => return Err(problem),
                    }
                }
                let staged = state.ord > 0;
                let end_lsn = Lsn(commit.end_lsn);
                // A streamed transaction without outbox rows (a large write elsewhere,
                // walfold's own appends when the target is the source) ends like any
                // committed transaction without events.
                let item = if staged {
                    Item::StreamCommit {
                        xid: commit.xid,
                        commit_lsn: Lsn(commit.commit_lsn),
                        end_lsn,
                        commit_time: pg_time(commit.commit_time),
                    }
                } else {
                    Item::Through(end_lsn)
                };
                self.send(item).await?;
            }
            // A partition's own Relation message comes beside its root's even when the
            // publication publishes through the root: only a change for it is a problem.
            Change::Relation(rel) => {
                let mapping = self
                    .config
                    .outboxes()
                    .find(|o| {
                        o.table_name()
                            .is_some_and(|t| t.schema == rel.namespace && t.name == rel.name)
                    })
                    .map(|o| {
                        Mapping::new(o, &rel).with_max_bytes(self.config.pipeline.max_event_bytes)
                    });
                let name = format!("{}.{}", rel.namespace, rel.name);
                self.relations.insert(rel.id, Relation { name, mapping });
            }
            Change::Insert {
                xid,
                relation_id,
                row,
            } => {
                let streamed = stream.map(|top| (top, xid.unwrap_or(top)));
                let origin = match streamed {
                    Some((xid, _)) => origin(&mut self.streamed.entry(xid).or_default().change, at),
                    None => origin(&mut self.change, at),
                };
                let mapping = match self.mapping(relation_id, "an insert") {
                    Ok(m) => m,
                    Err(e) => return self.defer(streamed, e),
                };
                // A streamed transaction's commit LSN and time are known at its commit;
                // the move into the event log sets them.
                let tx = match streamed {
                    Some(_) => TxContext {
                        commit_lsn: Lsn::ZERO,
                        commit_time: None,
                    },
                    None => self.tx.ok_or_else(|| {
                        SourceError::Decode("insert outside a transaction".into())
                    })?,
                };
                // A column renamed or dropped while running: every row would be a dead
                // letter. Stop ingest before the transaction is acknowledged instead,
                // unless the log holds it already (read before the change). A streamed
                // transaction's commit is not known yet: decided at its commit.
                // A column changed to a large object's `oid` under a running walfold: its
                // rows would fold the object's number. Stop before the acknowledgement.
                if let Some(refusal) = mapping.unreadable() {
                    if streamed.is_none() && self.in_log(tx.commit_lsn) {
                        return self.send(Item::Ignored).await;
                    }
                    return self.defer(streamed, SourceError::Refused(refusal));
                }
                if let Some((key, column)) = mapping.missing_required() {
                    if streamed.is_none() && self.in_log(tx.commit_lsn) {
                        return self.send(Item::Ignored).await;
                    }
                    let e = SourceError::OutboxChanged {
                        table: mapping.table.to_string(),
                        key,
                        column,
                        columns: mapping.column_names(),
                        commit_lsn: tx.commit_lsn,
                    };
                    return self.defer(streamed, e);
                }
                let tuple = row
                    .tuple()
                    .map_err(|e| SourceError::Decode(e.to_string()))?;
                let mapped = mapping.map(&tuple, tx, origin);
                if let Mapped::Filtered = mapped {
                    // `where` is not true for it: counted with the other changes that are
                    // no events.
                    tracing::debug!(table = %mapping.table, change_lsn = %at, "outbox row filtered out by where");
                    return self.send(Item::Ignored).await;
                }
                for outcome in mapped {
                    let item = match outcome {
                        Ok(event) => Item::Event(event),
                        Err(dead) if !self.say_malformed() => Item::Rejected(dead),
                        Err(dead) => {
                            // Named here, not per row: most rows make no dead letter.
                            let table = self
                                .relations
                                .get(&relation_id)
                                .and_then(|r| r.mapping.as_ref())
                                .map(|m| m.table.to_string())
                                .unwrap_or_default();
                            match streamed {
                                // Its commit LSN is not known yet: name the change instead.
                                Some((xid, _)) => {
                                    tracing::warn!(table = %table, xid, change_lsn = %at, error = %dead.error, "malformed outbox row of a streamed transaction sent to dead letters")
                                }
                                None => {
                                    tracing::warn!(table = %table, lsn = %tx.commit_lsn, error = %dead.error, "malformed outbox row sent to dead letters")
                                }
                            }
                            Item::Rejected(dead)
                        }
                    };
                    self.emit(streamed, item).await?;
                }
            }
            Change::Update { xid, relation_id } => {
                let streamed = stream.map(|top| (top, xid.unwrap_or(top)));
                if let Err(e) = self.mapping(relation_id, "an update") {
                    return self.defer(streamed, e);
                }
                self.send(Item::Ignored).await?;
            }
            Change::Delete { xid, relation_id } => {
                let streamed = stream.map(|top| (top, xid.unwrap_or(top)));
                if let Err(e) = self.mapping(relation_id, "a delete") {
                    return self.defer(streamed, e);
                }
                self.send(Item::Ignored).await?;
            }
            // A truncate removes rows, it writes none: never an event, whatever the table.
            Change::Truncate(t) => {
                for id in t.relation_ids {
                    match self.relations.get(&id) {
                        Some(Relation {
                            mapping: Some(_), ..
                        }) => {}
                        Some(Relation { name, .. }) => {
                            tracing::warn!(relation = %name, publication = %self.config.source().publication, "truncate of a table that is no [[outbox]], ignored; remove it from the publication");
                        }
                        None => {
                            tracing::warn!(
                                relation_id = id,
                                "truncate of an unannounced relation, ignored"
                            );
                        }
                    }
                    self.send(Item::Ignored).await?;
                }
            }
            // The end of a streamed block, an origin, a type: nothing for us.
            Change::StreamStop | Change::Other => {}
        }
        Ok(())
    }

    /// Whether the transaction committed at `commit_lsn` was in the log before this
    /// attempt started (read again after a reconnect, before the slot moved past it).
    fn in_log(&self, commit_lsn: Lsn) -> bool {
        commit_lsn < self.durable
    }

    /// A change that stops ingest: at once in a committed transaction; in a streamed one
    /// (`streamed`: its xid and the change's own) at its commit, unless the
    /// (sub)transaction aborts first.
    fn defer(&mut self, streamed: Option<(u32, u32)>, e: SourceError) -> Result<(), SourceError> {
        let Some((xid, subxid)) = streamed else {
            return Err(e);
        };
        let state = self.streamed.entry(xid).or_default();
        if state.problem.is_none() {
            tracing::warn!(xid, change = %e.summary(), "a streamed transaction holds a change walfold cannot take: ingest stops at its commit unless it rolls back");
            state.problem = Some((subxid, e));
        }
        Ok(())
    }

    /// The outbox a change belongs to. A change of any other table stops ingest before
    /// its transaction is acknowledged: skipping it could drop events silently (a
    /// partition published under its own name, a table added to the publication).
    fn mapping(&self, relation_id: u32, change: &'static str) -> Result<&Mapping, SourceError> {
        match self.relations.get(&relation_id) {
            Some(Relation {
                mapping: Some(m), ..
            }) => Ok(m),
            Some(Relation { name, .. }) => {
                let commit_lsn = self.tx.map_or(Lsn::ZERO, |t| t.commit_lsn);
                Err(SourceError::Unmapped {
                    change,
                    relation: name.clone(),
                    publication: self.config.source().publication.clone(),
                    slot: self.config.source().slot.clone(),
                    commit_lsn,
                    skip_to: Lsn(commit_lsn.0 + 1),
                })
            }
            None => Err(SourceError::Decode(format!(
                "change for relation {relation_id} before its Relation message"
            ))),
        }
    }

    /// Sends an event or a rejected row: as it is, or staged when it belongs to a
    /// streamed transaction (`streamed`: its top-level xid and the change's own xid).
    async fn emit(&mut self, streamed: Option<(u32, u32)>, item: Item) -> Result<(), SourceError> {
        let Some((xid, subxid)) = streamed else {
            return self.send(item).await;
        };
        let row = match item {
            Item::Event(e) => StagedRow::Event(e),
            Item::Rejected(d) => StagedRow::Rejected(d),
            other => return self.send(other).await,
        };
        let state = self.streamed.entry(xid).or_default();
        let ord = state.ord;
        state.ord += 1;
        self.send(Item::Staged(StagedChange {
            xid,
            subxid,
            ord,
            row,
        }))
        .await
    }

    async fn send(&mut self, item: Item) -> Result<(), SourceError> {
        let held = std::mem::take(&mut self.held);
        // A closed channel means the appender failed; its error is the one reported.
        self.items
            .send((item, held))
            .await
            .map_err(|_| SourceError::StreamEnded)
    }
}

/// Where an insert was read, from the server's position for its message: the change's
/// own WAL record (pgoutput sends a change with the record's LSN; the same on every
/// replay). The rows of one multi-insert record (COPY) share it, so each also gets its
/// index in the record. `None` when the server gave no position.
fn origin(last: &mut Option<(Lsn, i32)>, at: Lsn) -> Option<RowOrigin> {
    if at == Lsn::ZERO {
        return None;
    }
    let index = match *last {
        Some((lsn, index)) if lsn == at => index + 1,
        _ => 0,
    };
    *last = Some((at, index));
    Some(RowOrigin::Wal {
        lsn: at,
        index,
        element: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_url_may_name_several_hosts() {
        let hosts = |url: &str| {
            let c = walfold_config::Config::from_toml(
                &format!("[source]\nurl = \"{url}\"\n[[outbox]]\ntable = \"outbox\"\n"),
                vec![],
            )
            .unwrap();
            let w = replication_config(&c.source_views()[0]).unwrap();
            (w.hosts, w.read_write)
        };
        let two = vec![("a".to_owned(), 5432), ("b".to_owned(), 5433)];
        assert_eq!(
            hosts("postgresql://u@a:5432,b:5433/db?target_session_attrs=read-write"),
            (two.clone(), true)
        );
        // Several hosts: the primary, as with target_session_attrs=read-write.
        assert_eq!(hosts("postgresql://u@a:5432,b:5433/db"), (two, true));
        assert_eq!(
            hosts("postgresql://u@a,b:6000/db"),
            (vec![("a".to_owned(), 5432), ("b".to_owned(), 6000)], true)
        );
        assert_eq!(
            hosts("postgresql://u@a/db"),
            (vec![("a".to_owned(), 5432)], false)
        );
        // libpq's key=value form, a standby listed first.
        let two = vec![("standby".to_owned(), 5433), ("primary".to_owned(), 5432)];
        assert_eq!(
            hosts("host=standby,primary port=5433,5432 dbname=db user=u target_session_attrs=read-write"),
            (two.clone(), true)
        );
        assert_eq!(
            hosts("host=standby,primary port=5433,5432 dbname=db"),
            (two, true)
        );
        assert_eq!(
            hosts("host=h hostaddr=10.0.0.1 port=6000 dbname=db"),
            (vec![("10.0.0.1".to_owned(), 6000)], false)
        );
    }

    #[test]
    fn rows_of_one_wal_record_are_told_apart_by_their_index() {
        let mut last = None;
        let at = |n| {
            Some(RowOrigin::Wal {
                lsn: Lsn(100),
                index: n,
                element: 0,
            })
        };
        assert_eq!(origin(&mut last, Lsn(100)), at(0));
        assert_eq!(origin(&mut last, Lsn(100)), at(1));
        assert_eq!(
            origin(&mut last, Lsn(180)),
            Some(RowOrigin::Wal {
                lsn: Lsn(180),
                index: 0,
                element: 0,
            })
        );
        assert_eq!(origin(&mut last, Lsn::ZERO), None);
    }
}

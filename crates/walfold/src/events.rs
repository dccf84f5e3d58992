//! `walfold events`: the event log as JSON lines, filtered, optionally followed, and
//! optionally with what one subscriber did with each event — what an operator reaches
//! for when a read model looks wrong.
//!
//! What a subscriber did is read from what walfold keeps: its claims
//! (`processed_message`), its dead letters, its parked aggregates and its checkpoints.
//! A claim means the event went through the projection, applied or skipped as stale;
//! walfold does not record which per event (the projector's hot path stays as it is).
//! For a `table` projection the difference follows from the version guard alone: a
//! claimed event was stale exactly when an earlier claimed event of its aggregate
//! carried a version at least as high, because the guarded upsert keeps the highest
//! applied version and a subscriber claims each aggregate's events in log order. So
//! for `table` projections `events` reads each aggregate's claimed history from the
//! start of the log and reports `applied` or `stale`; for `sql` and Rust projections,
//! whose statements decide for themselves, it reports `claimed`.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use walfold_config::{Config, ProjectionConfig, ProjectionKind};
use walfold_event::{DeadLetterStatus, Reason};
use walfold_store::operator::LogFilter;
use walfold_store::{Operator, Schema};

use crate::run::load;
use crate::Failure;

/// What `walfold events` was asked for.
#[derive(Debug, Clone)]
pub struct Query {
    pub aggregate: Option<String>,
    /// Only events from this `[[source]]`.
    pub source: Option<String>,
    pub aggregate_type: Option<String>,
    pub event_type: Option<String>,
    pub after: i64,
    pub since: Option<String>,
    pub follow: bool,
    pub subscriber: Option<String>,
    pub limit: Option<u64>,
}

/// Events read per statement.
const PAGE: i64 = 1000;
/// How often `--follow` looks for new events.
const FOLLOW_POLL: Duration = Duration::from_millis(500);
/// With `--follow --subscriber`, how long a new event is held back while the subscriber
/// has not reached it, so the line shows its outcome rather than `pending`.
const HOLD: Duration = Duration::from_secs(5);
/// Aggregates whose claimed versions are remembered for `applied`/`stale`; past this
/// (a scan over a huge log without `--aggregate`) new aggregates are reported `claimed`.
const MAX_TRACKED: usize = 1_000_000;

pub async fn events(path: &Path, q: Query) -> Result<(), Failure> {
    let config = load(path)?;
    let log = Operator::for_command(
        config.target_url(),
        "target main",
        &Schema::new(&config.target.schema),
    )
    .await
    .map_err(Failure::runtime)?;
    if let Some(source) = &q.source {
        // Not refused: the log keeps the events of a source taken out of the config.
        if config.sources().iter().all(|s| s.name != *source) {
            eprintln!(
                "walfold: no [[source]] named {source} in the config (sources: {}); showing the log's events from {source}, if any",
                crate::ops::source_names(&config)
            );
        }
    }
    let since = match &q.since {
        Some(s) => Some(since(&log, s).await?),
        None => None,
    };
    // The subscriber's state lives on its projection's target (the log on the main one).
    let home = match &q.subscriber {
        Some(s) => home_of(&config, s).await?,
        None => None,
    };
    let state = home.as_ref().unwrap_or(&log);
    let subscriber = match &q.subscriber {
        Some(s) => Some(Subscriber::resolve(state, &config, s).await?),
        None => None,
    };
    // Applied-or-stale needs each aggregate's claimed history from the log's start:
    // then only the aggregate filters go into SQL and the others apply here.
    let history = subscriber.as_ref().is_some_and(|s| s.guarded);
    let sql_filter = LogFilter {
        aggregate_id: q.aggregate.clone(),
        source: q.source.clone(),
        aggregate_type: q.aggregate_type.clone(),
        event_type: if history { None } else { q.event_type.clone() },
        since: if history { None } else { since.clone() },
    };
    let mut reader = Reader {
        log: &log,
        position: if history { 0 } else { q.after },
        filter: sql_filter,
    };
    let mut out = Output {
        stdout: std::io::BufWriter::new(std::io::stdout().lock()),
        printed: 0,
        limit: q.limit,
    };
    let mut fold = Fold::default();
    let mut queue: VecDeque<Queued> = VecDeque::new();
    // Set once the log's head was reached: from then on events are new, and a pending
    // one is worth holding (history behind a lagging subscriber is printed as it is).
    let mut tailing = false;
    let mut caught_up = false;
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    loop {
        // A new page only once everything read is out: a held event keeps its place.
        if queue.is_empty() {
            tailing |= caught_up;
            let page = reader.next_page().await?;
            caught_up = (page.len() as i64) < PAGE;
            let now = Instant::now();
            queue.extend(page.into_iter().map(|row| Queued { row, seen: now }));
        }
        if !queue.is_empty() {
            let outcomes = match &subscriber {
                Some(s) => s.outcomes(state, &queue).await?,
                None => vec![Outcome::None; queue.len()],
            };
            // In log order; with --follow a pending event (and what follows it) waits up
            // to HOLD for the subscriber to reach it.
            let mut emitted = 0;
            for (item, outcome) in queue.iter().zip(outcomes) {
                if q.follow
                    && tailing
                    && matches!(outcome, Outcome::Pending)
                    && item.seen.elapsed() < HOLD
                {
                    break;
                }
                emitted += 1;
                let verdict = fold.verdict(&item.row, &outcome, history);
                let shown = item.row.seq > q.after
                    && q.event_type
                        .as_ref()
                        .is_none_or(|t| *t == item.row.event_type)
                    && since
                        .as_ref()
                        .is_none_or(|s| item.row.at.as_deref().is_some_and(|at| at >= s.as_str()));
                if shown && !out.print(&line(&item.row, subscriber.as_ref(), verdict))? {
                    return Ok(());
                }
            }
            queue.drain(..emitted);
        }
        out.flush()?;
        if queue.is_empty() && !caught_up {
            continue;
        }
        if queue.is_empty() && !q.follow {
            return Ok(());
        }
        tokio::select! {
            biased;
            _ = &mut interrupt => return Ok(()),
            _ = tokio::time::sleep(FOLLOW_POLL) => {}
        }
    }
}

/// `--since`: a duration ago or a timestamp, as the server's `timestamptz` text (so it
/// compares with the log's times as the server orders them).
async fn since(log: &Operator, text: &str) -> Result<String, Failure> {
    let at = match walfold_config::parse_retention(text).ok().flatten() {
        Some(ago) => log.log_time_ago(ago).await,
        None => log.log_time(text).await,
    };
    at.map_err(|_| {
        Failure::config(format!(
            "--since `{text}` is neither a timestamp (2026-11-30T12:00:00Z) nor a duration (15m, 2h, 1d)"
        ))
    })
}

/// One event of the log, with its JSON rendering.
struct Row {
    seq: i64,
    /// The seq its claims are on (see `LoggedEvent::claim_seq`).
    claim_seq: i64,
    event_id: uuid::Uuid,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    version: Option<i64>,
    partition_hash: i32,
    /// Commit (else append) time, UTC, in the format of [`since`].
    at: Option<String>,
    json: Map<String, Value>,
}

struct Queued {
    row: Row,
    seen: Instant,
}

struct Reader<'a> {
    log: &'a Operator,
    position: i64,
    filter: LogFilter,
}

impl Reader<'_> {
    async fn next_page(&mut self) -> Result<Vec<Row>, Failure> {
        let events = self.log.log_page(self.position, &self.filter, PAGE).await?;
        let page: Vec<Row> = events
            .into_iter()
            .map(|e| Row {
                json: match walfold_event::json::parse(&e.json) {
                    Ok(Value::Object(m)) => m,
                    _ => Map::new(),
                },
                seq: e.seq,
                claim_seq: e.claim_seq,
                event_id: e.event_id,
                aggregate_type: e.aggregate_type,
                aggregate_id: e.aggregate_id,
                event_type: e.event_type,
                version: e.version,
                partition_hash: e.partition_hash,
                at: e.at,
            })
            .collect();
        if let Some(last) = page.last() {
            self.position = last.seq;
        }
        Ok(page)
    }
}

/// The extra target holding `subscriber`'s state, connected (`None`: the main target):
/// its projection's `database`, else the extra target that knows the ID (a rebuild's or
/// a replaced one).
async fn home_of(config: &Config, subscriber: &str) -> Result<Option<Operator>, Failure> {
    let connect = |t: walfold_engine::Target| async move {
        Ok::<_, Failure>(
            Operator::for_command(&t.url, &format!("target {}", t.label()), &t.schema).await?,
        )
    };
    if let Some(p) = config
        .projection
        .iter()
        .find(|p| p.subscriber == subscriber)
    {
        let t = walfold_engine::Target::of(config, p);
        return if t.is_extra() {
            Ok(Some(connect(t).await?))
        } else {
            Ok(None)
        };
    }
    for t in walfold_engine::Target::all(config)
        .into_iter()
        .filter(walfold_engine::Target::is_extra)
    {
        let home = connect(t).await?;
        if home.knows_subscriber(subscriber).await? {
            return Ok(Some(home));
        }
    }
    Ok(None)
}

/// The subscriber `--subscriber` names, and what its projection makes knowable.
struct Subscriber {
    id: String,
    /// The projection it serves (or rebuilds, or served), when the config has it.
    projection: Option<ProjectionConfig>,
    /// A `table` projection: claimed events are `applied` or `stale` by the guard.
    guarded: bool,
}

/// What walfold recorded about one event for the subscriber.
#[derive(Debug, Clone)]
enum Outcome {
    None,
    Claimed {
        at: Value,
    },
    /// Its latest dead letter for the subscriber (not claimed since).
    DeadLetter(Value),
    /// The projection's filters leave it out.
    Filtered,
    /// The subscriber's partition has not read it yet.
    Pending,
    /// Read but neither claimed nor dead-lettered: its claim was pruned
    /// (`dedup_retention`) or the filters were different when it was read.
    NotClaimed,
}

impl Subscriber {
    async fn resolve(home: &Operator, config: &Config, id: &str) -> Result<Subscriber, Failure> {
        let known = home.subscriber_has_read(id).await?;
        if !known {
            let names = home.checkpointed_subscribers().await?;
            eprintln!(
                "walfold: subscriber {id} has read nothing yet (known subscribers: {})",
                if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                }
            );
        }
        // The projection: by its configured subscriber, or through a rebuild or the
        // registry (a rebuild's new ID, or the one it replaced).
        let mut projection = config
            .projection
            .iter()
            .find(|p| p.subscriber == id)
            .cloned();
        if projection.is_none() {
            let name = home.projection_of(id).await?;
            projection = name.and_then(|n| config.projection.iter().find(|p| p.name == n).cloned());
        }
        let guarded = projection
            .as_ref()
            .is_some_and(|p| matches!(p.kind, ProjectionKind::Table { .. }));
        Ok(Subscriber {
            id: id.to_owned(),
            projection,
            guarded,
        })
    }

    /// What was recorded for each queued event (a few indexed reads per page).
    async fn outcomes(
        &self,
        home: &Operator,
        queue: &VecDeque<Queued>,
    ) -> Result<Vec<Outcome>, Failure> {
        let ids: Vec<uuid::Uuid> = queue.iter().map(|q| q.row.event_id).collect();
        let claim_seqs: Vec<i64> = queue.iter().map(|q| q.row.claim_seq).collect();
        let seqs: Vec<i64> = queue.iter().map(|q| q.row.seq).collect();
        let recorded = home
            .recorded_for(&self.id, &ids, &claim_seqs, &seqs)
            .await?;
        let claims: HashMap<uuid::Uuid, Value> = recorded
            .claims
            .into_iter()
            .map(|c| (c.event_id, c.processed_at))
            .collect();
        // The latest one wins.
        let letters: HashMap<i64, Value> = recorded
            .dead_letters
            .into_iter()
            .map(|d| (d.seq, d.letter))
            .collect();
        let positions: HashMap<i32, (i32, i64)> = recorded
            .positions
            .into_iter()
            .map(|p| (p.partition, (p.partitions, p.position)))
            .collect();
        let partitions = positions.values().map(|p| p.0).max().unwrap_or(1).max(1);
        Ok(queue
            .iter()
            .map(|q| {
                let e = &q.row;
                if let Some(at) = claims.get(&e.event_id) {
                    return Outcome::Claimed { at: at.clone() };
                }
                if let Some(dl) = letters.get(&e.seq) {
                    return Outcome::DeadLetter(dl.clone());
                }
                if let Some(p) = &self.projection {
                    let skip_type = p
                        .event_types
                        .as_ref()
                        .is_some_and(|t| !t.contains(&e.event_type));
                    let skip_agg = p
                        .aggregate_types
                        .as_ref()
                        .is_some_and(|t| !t.contains(&e.aggregate_type));
                    let skip_source = p.sources.as_ref().is_some_and(|t| {
                        e.json
                            .get("source")
                            .and_then(Value::as_str)
                            .is_some_and(|source| !t.iter().any(|s| s == source))
                    });
                    if skip_type || skip_agg || skip_source {
                        return Outcome::Filtered;
                    }
                }
                let partition = e.partition_hash % partitions;
                match positions.get(&partition) {
                    Some((_, position)) if *position >= e.seq => Outcome::NotClaimed,
                    _ => Outcome::Pending,
                }
            })
            .collect())
    }
}

/// The highest claimed version per aggregate, in log order: what the guard compared.
#[derive(Default)]
struct Fold {
    highest: HashMap<(String, String), Option<i64>>,
    warned: bool,
}

impl Fold {
    /// The outcome's name and details, folding a claimed event into the history.
    fn verdict(&mut self, e: &Row, outcome: &Outcome, history: bool) -> Option<Value> {
        let claimed_at = match outcome {
            Outcome::None => return None,
            Outcome::Claimed { at } => at.clone(),
            Outcome::DeadLetter(dl) => {
                let parked = dl["reason"] == Reason::AggregateParked.as_str();
                let discarded = dl["status"].as_str() == Some(DeadLetterStatus::Discarded.as_str());
                let name = match (parked, discarded) {
                    (_, true) => "discarded",
                    (true, _) => "parked",
                    (false, _) => "dead_lettered",
                };
                return Some(json!({ "outcome": name, "dead_letter": dl }));
            }
            Outcome::Filtered => return Some(json!({ "outcome": "filtered" })),
            Outcome::Pending => return Some(json!({ "outcome": "pending" })),
            Outcome::NotClaimed => return Some(json!({ "outcome": "not_claimed" })),
        };
        let name = if !history {
            "claimed"
        } else {
            let key = (e.aggregate_type.clone(), e.aggregate_id.clone());
            let tracked = self.highest.len() < MAX_TRACKED || self.highest.contains_key(&key);
            if !tracked && !self.warned {
                self.warned = true;
                eprintln!(
                    "walfold: more than {MAX_TRACKED} aggregates: events of further ones show `claimed` \
                     (pass --aggregate to see applied/stale)"
                );
            }
            match (tracked, e.version) {
                (true, Some(v)) => {
                    let highest = self.highest.entry(key).or_insert(None);
                    let stale = highest.is_some_and(|h| h >= v);
                    if !stale {
                        *highest = Some(v);
                    }
                    if stale {
                        "stale"
                    } else {
                        "applied"
                    }
                }
                _ => "claimed",
            }
        };
        Some(json!({ "outcome": name, "claimed_at": claimed_at }))
    }
}

fn line(e: &Row, subscriber: Option<&Subscriber>, verdict: Option<Value>) -> String {
    let mut m = e.json.clone();
    if let (Some(s), Some(Value::Object(v))) = (subscriber, verdict) {
        let mut detail = Map::new();
        detail.insert("id".into(), Value::String(s.id.clone()));
        detail.extend(v);
        m.insert("subscriber".into(), Value::Object(detail));
    }
    Value::Object(m).to_string()
}

/// Standard output, ending quietly when the reader goes away (`| head`).
struct Output<W: Write> {
    stdout: W,
    printed: u64,
    limit: Option<u64>,
}

impl<W: Write> Output<W> {
    /// Prints a line; `false` when done (the limit reached or the pipe closed).
    fn print(&mut self, line: &str) -> Result<bool, Failure> {
        if self.limit.is_some_and(|l| self.printed >= l) {
            return Ok(false);
        }
        match writeln!(self.stdout, "{line}") {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(false),
            Err(e) => return Err(Failure::runtime(e)),
        }
        self.printed += 1;
        if self.limit.is_some_and(|l| self.printed >= l) {
            self.flush()?;
            return Ok(false);
        }
        Ok(true)
    }

    fn flush(&mut self) -> Result<(), Failure> {
        match self.stdout.flush() {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Failure::runtime(e)),
            _ => Ok(()),
        }
    }
}

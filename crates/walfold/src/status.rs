//! `walfold status [--json | --watch]`.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use tokio_postgres::Client;
use walfold_config::Config;
use walfold_store::operator::{SourceProbe, Status, TargetReach, SOURCE_READ_TIMEOUT};
use walfold_store::Operator;

use crate::{run::load, Failure};

/// The target, and each source (one that cannot be reached is reported in its line,
/// and makes `status` exit 1). Every connection answers within seconds or is named.
pub(crate) struct Connections {
    pub target: Client,
    sources: Vec<Result<Client, String>>,
}

pub(crate) async fn connect(config: &Config) -> Result<Connections, Failure> {
    let target = walfold_pg::connect_for_command(config.target_url(), "target main")
        .await
        .map_err(Failure::runtime)?;
    let mut sources = Vec::new();
    for source in config.sources() {
        let server = format!("source {}", source.name);
        match walfold_pg::connect_for_command(&source.url, &server).await {
            Ok(c) => sources.push(Ok(c)),
            Err(e) => sources.push(Err(e.to_string())),
        }
    }
    Ok(Connections { target, sources })
}

impl Connections {
    /// Connects again when a connection closed (a restart of the database) or a source
    /// did not answer, keeping the old ones when that fails too: followers and watchers
    /// ride out a restart instead of exiting.
    pub(crate) async fn refresh(&mut self, config: &Config) {
        let closed = self.target.is_closed()
            || self
                .sources
                .iter()
                .any(|s| s.as_ref().map_or(true, Client::is_closed));
        if closed {
            if let Ok(c) = connect(config).await {
                *self = c;
            }
        }
    }
}

/// The status of the sources and the main target, with every extra target's
/// subscribers, rebuilds and dead letters added (an unreachable one is listed as such,
/// not an error).
pub(crate) async fn read(config: &Config, c: &Connections) -> Result<Status, Failure> {
    let probes: Vec<SourceProbe<'_>> = config
        .sources()
        .iter()
        .zip(&c.sources)
        .map(|(s, client)| SourceProbe {
            name: &s.name,
            slot: &s.slot,
            client: client.as_ref().map_err(Clone::clone),
        })
        .collect();
    let main = walfold_engine::Target::main(config);
    let log = Operator::new(&c.target, &main.schema);
    // The sources' slots are each bounded on their own (SOURCE_READ_TIMEOUT).
    let within = walfold_pg::STATEMENT_TIMEOUT + SOURCE_READ_TIMEOUT * probes.len() as u32;
    let mut status = walfold_pg::answer_within(
        config.target_url(),
        "target main",
        within,
        log.status(&probes),
    )
    .await
    .map_err(Failure::runtime)?;
    for t in walfold_engine::Target::all(config)
        .iter()
        .filter(|t| t.is_extra())
    {
        let server = format!("target {}", t.label());
        let part = async {
            let extra = Operator::for_command(&t.url, &server, &t.schema).await?;
            walfold_pg::answer_within(
                &t.url,
                &server,
                walfold_pg::STATEMENT_TIMEOUT,
                log.target_status(&extra, t.label()),
            )
            .await
        };
        let reach = match part.await {
            Ok(part) => {
                status.add(part);
                None
            }
            Err(e) => Some(e.to_string()),
        };
        status.targets.push(TargetReach {
            name: t.label().to_owned(),
            reachable: reach.is_none(),
            error: reach,
        });
    }
    Ok(status)
}

/// The position walfold had ingested through a slot that is gone, if it had.
fn lost_through(source: &walfold_store::operator::SourceStatus) -> Option<&str> {
    let ingest = source.ingest.as_ref()?;
    (source.slot.is_none() && source.error.is_none() && ingest.lsn != "0/0")
        .then_some(ingest.lsn.as_str())
}

/// Exit 1 (after the report) when a source or an extra target could not be read, or a
/// slot walfold had ingested through is gone.
fn unreachable(s: &Status) -> Result<(), Failure> {
    let mut down: Vec<String> = s
        .sources
        .iter()
        .filter(|source| source.error.is_some())
        .map(|source| format!("source {}", source.name))
        .collect();

    down.extend(
        s.targets
            .iter()
            .filter(|t| !t.reachable)
            .map(|t| format!("target {}", t.name)),
    );
    let lost: Vec<&str> = s
        .sources
        .iter()
        .filter(|source| lost_through(source).is_some())
        .map(|source| source.name.as_str())
        .collect();
    if down.is_empty() && !lost.is_empty() {
        return Err(Failure::runtime(format!(
            "the slot of source {} is missing (see above)",
            lost.join(", ")
        )));
    }
    match down.is_empty() {
        true => Ok(()),
        false => Err(Failure::runtime(format!(
            "unreachable: {} (see above)",
            down.join(", ")
        ))),
    }
}

pub async fn status(path: &Path, json: bool) -> Result<(), Failure> {
    let config = load(path)?;
    let connections = connect(&config).await?;
    let s = read(&config, &connections).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&s).map_err(Failure::runtime)?
        );
        return unreachable(&s);
    }
    print!("{}", render(&config, &s));
    unreachable(&s)
}

/// Redraws the status every second until Ctrl-C: in place on a terminal (indicatif
/// redraws the block), as a new timestamped block per second elsewhere.
pub async fn watch(path: &Path) -> Result<(), Failure> {
    let config = load(path)?;
    let mut connections = connect(&config).await?;
    let terminal = std::io::stdout().is_terminal();
    let screen = terminal.then(|| {
        let bar =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stdout());
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar
    });
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = &mut interrupt => break,
            _ = tick.tick() => {}
        }
        let now = walfold_store::server_time(&connections.target)
            .await
            .unwrap_or_else(|_| "-".into());
        connections.refresh(&config).await;
        let text = match read(&config, &connections).await {
            Ok(s) => render(&config, &s),
            // Keep watching through a restart of the database; say so meanwhile.
            Err(e) => format!("cannot read the status: {}\n", e.message),
        };
        let header = format!("walfold status at {now} (every 1s, Ctrl-C to stop)\n");
        match &screen {
            Some(bar) => bar.set_message(format!("{header}{}", text.trim_end())),
            None => {
                use std::io::Write as _;
                // A closed pipe (`| head`) ends the watch quietly.
                if writeln!(std::io::stdout().lock(), "{header}{text}").is_err() {
                    break;
                }
            }
        }
    }
    if let Some(bar) = screen {
        bar.abandon();
    }
    Ok(())
}

/// The status as `walfold status` prints it.
fn render(config: &Config, s: &Status) -> String {
    let mut out = String::new();
    macro_rules! println {
        ($($arg:tt)*) => {{
            let _ = writeln!(out, $($arg)*);
        }};
    }
    let several = s.sources.len() > 1;
    for source in &s.sources {
        let name = if several {
            format!("source {}: ", source.name)
        } else {
            String::new()
        };
        match (&source.slot, &source.error) {
            (_, Some(e)) => println!("{name}slot {}: UNREACHABLE: {e}", source.slot_name),
            (Some(slot), None) => println!(
                "{name}slot {}: active={} confirmed_flush={} lag_bytes={} retained_bytes={} wal_status={}",
                slot.name,
                slot.active,
                slot.confirmed_flush_lsn.as_deref().unwrap_or("-"),
                opt(slot.lag_bytes),
                opt(slot.retained_bytes),
                slot.wal_status.as_deref().unwrap_or("-"),
            ),
            (None, None) => match lost_through(source) {
                Some(lsn) => println!(
                    "{name}slot {}: MISSING, but walfold had ingested through it up to {lsn}: \
                     logical slots do not survive a failover (unless synced to the standby), or \
                     it was dropped. Ingest stops until it is back: `walfold run` exits naming \
                     the fix (create the slot, backfill the table outboxes over the gap); with \
                     on_slot_lost = \"recreate\" it does both by itself \
                     (docs/OPERATIONS.md: After a failover)",
                    source.slot_name
                ),
                None => println!("{name}slot {}: missing", source.slot_name),
            },
        }
        if let Some(i) = &source.ingest {
            println!(
                "{name}ingest: lsn={} appended={} duplicates={} id_conflicts={} malformed={} ignored={}",
                i.lsn, i.appended, i.duplicates, i.id_conflicts, i.malformed, i.ignored_changes
            );
            if let Some(p) = i.paused.as_ref().filter(|p| p.stopped) {
                println!(
                    "{name}INGEST STOPPED since {}s ago: {} (a definite error: this source's ingest stays stopped until it is fixed and walfold restarted; the other sources go on)",
                    (unix_now() - p.since_unix).max(0.0).round(),
                    crate::text::escape_controls(&p.error)
                );
            } else if let Some(p) = &i.paused {
                println!(
                    "{name}INGEST PAUSED since {}s ago: {} (an error of the target or the config: the slot keeps the WAL meanwhile; ingest resumes by itself once it is fixed)",
                    (unix_now() - p.since_unix).max(0.0).round(),
                    crate::text::escape_controls(&p.error)
                );
            }
        }
    }
    println!("event log head: {}", s.event_log_head);
    render_instances(config, s, &mut out);
    for t in &s.targets {
        match &t.error {
            None => println!("target {}: reachable", t.name),
            Some(e) => println!(
                "TARGET {} UNREACHABLE: {e} (its projections are paused; they resume by themselves once it answers)",
                t.name
            ),
        }
    }
    // The target column only when there is more than one target.
    let several = !s.targets.is_empty();
    let target_of = |name: &str| {
        if several {
            format!(" {name}")
        } else {
            String::new()
        }
    };
    println!(
        "{:<28} {:>10} {:>10} {:>8} {:>10} {:>10} {:>8} {:>8} {:>6} {:<10}{}",
        "subscriber",
        "position",
        "lag",
        "lag_s",
        "applied",
        "dupes",
        "stale",
        "dead",
        "parked",
        "serves",
        target_of("target")
    );
    for sub in &s.subscribers {
        // The registry still names a projection the config no longer has: nothing runs it.
        let serves = match (&sub.serves[..], &sub.projection) {
            ("live", Some(name)) if !config.projection.iter().any(|p| p.name == *name) => "unused",
            (serves, _) => serves,
        };
        // A retired or unused subscriber reads nothing more: its lag is no one's delay.
        let reading = matches!(serves, "live" | "rebuilding");
        println!(
            "{:<28} {:>10} {:>10} {:>8} {:>10} {:>10} {:>8} {:>8} {:>6} {:<10}{}",
            sub.subscriber,
            sub.position,
            if reading {
                sub.lag_events.to_string()
            } else {
                "-".into()
            },
            sub.lag_seconds
                .filter(|_| reading)
                .map_or_else(|| "-".into(), |l| format!("{l:.1}")),
            sub.applied,
            sub.duplicates,
            sub.stale,
            sub.dead_lettered,
            sub.parked_aggregates,
            serves,
            target_of(&sub.target)
        );
    }
    // Read your own writes: how far each projection served now has folded each source.
    for sub in s.subscribers.iter().filter(|sub| sub.serves == "live") {
        for f in &sub.folded {
            println!(
                "folded {} ({}): source {} up to {}, newest folded commit {}",
                sub.projection.as_deref().unwrap_or("-"),
                sub.subscriber,
                f.source,
                f.lsn,
                f.newest_commit_age_s
                    .map_or_else(|| "none yet".into(), |a| format!("{a:.1}s old"))
            );
        }
    }
    for sub in &s.subscribers {
        let Some(d) = &sub.definition else { continue };
        if !matches!(&sub.serves[..], "live" | "rebuilding") {
            continue;
        }
        let how = match d.origin {
            walfold_store::definition::DefinitionOrigin::First => {
                "recorded at its first start".to_owned()
            }
            walfold_store::definition::DefinitionOrigin::Rebuild => {
                "recorded by its rebuild".to_owned()
            }
            walfold_store::definition::DefinitionOrigin::Accepted => format!(
                "accepted by {} {:.0}s ago, replacing {}",
                d.accepted_by.as_deref().unwrap_or("?"),
                (unix_now() - d.recorded_at_unix).max(0.0),
                d.previous_digest
                    .as_deref()
                    .map_or("?", walfold_config::short_digest)
            ),
        };
        println!(
            "definition {} ({}): {}{} {how}",
            sub.projection.as_deref().unwrap_or("-"),
            sub.subscriber,
            walfold_config::short_digest(&d.digest),
            d.version
                .map_or_else(String::new, |v| format!(" version {v}")),
        );
    }
    for sub in &s.subscribers {
        if let Some(p) = &sub.paused {
            println!(
                "PAUSED {}{}: {} partition(s) since {}s ago, {}{} (an error of the target or the config: nothing is dead-lettered for it; it resumes by itself once fixed)",
                sub.subscriber,
                if several {
                    format!(" on target {}", sub.target)
                } else {
                    String::new()
                },
                p.partitions,
                (unix_now() - p.since_unix).max(0.0).round(),
                p.sqlstate.as_deref().map_or_else(String::new, |c| format!("SQLSTATE {c}: ")),
                crate::text::escape_controls(&p.error)
            );
        }
    }
    for r in &s.rebuilds {
        println!(
            "rebuild {} → {}: {} read={} remaining={} replayed={} rate={:.0}/s eta={} retired_table={}{}",
            r.projection,
            r.subscriber,
            r.state,
            r.read,
            r.remaining,
            r.replayed,
            r.rate_per_s,
            r.eta_s.map_or_else(|| "-".into(), |s| format!("{s:.0}s")),
            r.retired_table,
            if several {
                format!(" target={}", r.target)
            } else {
                String::new()
            }
        );
        if r.for_changed_definition && r.state == walfold_store::RebuildState::Running {
            println!(
                "  for a changed definition (on_definition_change = \"rebuild\"): {} serves the old one until the switch-over",
                s.subscribers
                    .iter()
                    .find(|sub| sub.serves == "live" && sub.projection.as_deref() == Some(&r.projection))
                    .map_or("the live subscriber", |sub| sub.subscriber.as_str())
            );
        }
        if let Some(e) = &r.switch_error {
            let ago = r.switch_failed_at_unix.map_or_else(String::new, |t| {
                format!(" {:.0}s ago", (unix_now() - t).max(0.0))
            });
            println!("  switch-over failed{ago} (the leader tries again while it is due): {e}");
        }
        if r.state == walfold_store::RebuildState::Running && r.open_dead_letters > 0 {
            println!(
                "  {} open dead letters of {} hold the switch-over (`walfold dead-letters list --subscriber {}`)",
                r.open_dead_letters, r.subscriber, r.subscriber
            );
        }
    }
    if s.slot_gaps > 0 {
        println!(
            "slot gaps: {} (WAL ranges the slot skipped: lost and recreated, a failover, or moved by someone else; see {}.slot_gap), {} open: events committed in an open one may be missing",
            s.slot_gaps, config.target.schema, s.slot_gaps_open
        );
    }
    for source in &s.sources {
        if let Some(scanned) = source.gap_backfill_scanned {
            println!(
                "source {}: backfilling its slot gap, {scanned} outbox rows read so far (progress in the log)",
                source.name
            );
        }
    }
    if s.phantoms > 0 {
        println!(
            "phantoms: {} (events read from an old primary past a failover's fork that the new primary does not have; see {}.phantom_event; rebuild the projections they reached)",
            s.phantoms, config.target.schema
        );
    }
    println!("dead letters open: {}", s.dead_letters_open);
    println!(
        "processed_message rows (estimate): {}",
        s.processed_message_rows
    );
    out
}

/// The instances, and who owns each work unit.
fn render_instances(config: &Config, s: &Status, out: &mut String) {
    use std::fmt::Write;
    let lease = config.cluster.lease_s as f64;
    let short = |id: &uuid::Uuid| id.simple().to_string()[..8].to_owned();
    // Gone: silent past the lease, or silent and without a session.
    let alive = |i: &walfold_store::operator::InstanceStatus| {
        i.heartbeat_age_s <= lease && (i.connected || i.heartbeat_age_s <= 2.0)
    };
    if s.instances.is_empty() {
        let _ = writeln!(out, "instances: none running");
    } else {
        let _ = writeln!(
            out,
            "{:<10} {:<20} {:>8} {:<10} {:>10} {:>10} {:>6} {:<8}",
            "instance", "host", "pid", "version", "up_s", "heartbeat", "units", "role"
        );
    }
    if let Some(pid) = s.older_release_leader_pid {
        let _ = writeln!(
            out,
            "OLDER RELEASE LEADS: an instance of a walfold release older than this schema leads \
             (backend pid {pid} on the main target); it appends events but applies none here, and \
             the instances of this release run nothing beside it: stop it (or upgrade it) to \
             finish the upgrade"
        );
    }
    let mut releases: Vec<&str> = s
        .instances
        .iter()
        .filter(|i| alive(i))
        .map(|i| i.version.as_str())
        .collect();
    releases.sort_unstable();
    releases.dedup();
    if releases.len() > 1 {
        let _ = writeln!(
            out,
            "instances run different releases ({}): a rolling upgrade in progress; finish it \
             (every instance of a deployment runs one release)",
            crate::text::escape_controls(&releases.join(", "))
        );
    }
    for i in &s.instances {
        let units = s.units.iter().filter(|u| u.owner == Some(i.id)).count();
        let role = match (alive(i), s.leader == Some(i.id)) {
            (false, _) => "GONE",
            (true, true) => "leader",
            (true, false) if i.runs.as_ref().is_some_and(Vec::is_empty) => "no-work",
            (true, false) => "worker",
        };
        let _ = writeln!(
            out,
            "{:<10} {:<20} {:>8} {:<10} {:>10.0} {:>9.1}s {:>6} {:<8}",
            short(&i.id),
            crate::text::escape_controls(&i.host),
            i.pid,
            crate::text::escape_controls(&i.version),
            (unix_now() - i.started_at_unix).max(0.0),
            i.heartbeat_age_s,
            units,
            role
        );
    }
    let mut subscribers: Vec<(&str, &str)> = s
        .units
        .iter()
        .map(|u| (u.target.as_str(), u.subscriber.as_str()))
        .collect();
    subscribers.dedup();
    for (target, subscriber) in subscribers {
        let owners: Vec<String> = s
            .units
            .iter()
            .filter(|u| u.target == target && u.subscriber == subscriber)
            .map(|u| {
                let owner = match (&u.owner, u.held) {
                    (_, true) => "held".to_owned(),
                    (Some(o), false) if s.instances.iter().any(|i| i.id == *o && alive(i)) => {
                        short(o)
                    }
                    _ => "UNOWNED".to_owned(),
                };
                format!("{}={owner}", u.partition)
            })
            .collect();
        let _ = writeln!(
            out,
            "units {subscriber}{}: {}",
            if target == "main" {
                String::new()
            } else {
                format!(" (target {target})")
            },
            owners.join(" ")
        );
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn opt(v: Option<i64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

//! `walfold phantoms list|accept`: the events a failover left that the new primary does
//! not have (see docs/OPERATIONS.md, After a failover). They live in the main target
//! with the event log; the read models they reached are the claims on every target.

use uuid::Uuid;
use walfold_config::Config;
use walfold_engine::Target;
use walfold_store::operator::{Accept, PhantomEntry};
use walfold_store::Operator;

use crate::cli::PhantomCommand;
use crate::text::escape_controls;
use crate::{run::load, Failure};

async fn connect(t: &Target) -> Result<Operator, Failure> {
    Ok(Operator::for_command(&t.url, &format!("target {}", t.label()), &t.schema).await?)
}

/// The slot of the [[source]] named `name`.
fn slot_of<'a>(config: &'a Config, name: Option<&str>) -> Result<Option<&'a str>, Failure> {
    let Some(name) = name else { return Ok(None) };
    config
        .sources()
        .iter()
        .find(|s| s.name == name)
        .map(|s| Some(s.slot.as_str()))
        .ok_or_else(|| {
            Failure::config(format!(
                "--source {name}: no such [[source]]; the sources are: {}",
                config
                    .sources()
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

pub async fn run(command: PhantomCommand) -> Result<(), Failure> {
    match command {
        PhantomCommand::List {
            config,
            source,
            all,
            json,
            limit,
        } => {
            let config = load(&config)?;
            let slot = slot_of(&config, source.as_deref())?;
            let main = Target::main(&config);
            let mut phantoms = connect(&main).await?.phantoms(slot, all, limit).await?;
            reached_elsewhere(&config, &mut phantoms).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&phantoms).map_err(Failure::runtime)?
                );
                return Ok(());
            }
            println!(
                "{:>8}  {:<36} {:<10} {:<20} {:<16} {:<12} {:<8}  reached",
                "seq", "event", "source", "event type", "aggregate", "fork", "status"
            );
            for p in &phantoms {
                println!(
                    "{:>8}  {:<36} {:<10} {:<20} {:<16} {:<12} {:<8}  {}",
                    p.seq,
                    p.event_id,
                    escape_controls(p.source.as_deref().unwrap_or("-")),
                    escape_controls(p.event_type.as_deref().unwrap_or("-")),
                    escape_controls(p.aggregate_id.as_deref().unwrap_or("-")),
                    p.fork_lsn,
                    if p.accepted_at_unix.is_some() {
                        "accepted"
                    } else {
                        "open"
                    },
                    if p.reached.is_empty() {
                        "-".into()
                    } else {
                        p.reached.join(", ")
                    }
                );
            }
            if !phantoms.is_empty() && !all {
                println!("rebuild the projections they reached (`walfold rebuild`, which skips open phantoms), or accept those that are right: `walfold phantoms accept EVENT_ID --reason …`");
            }
            Ok(())
        }
        PhantomCommand::Accept {
            config,
            event_ids,
            all,
            source,
            reason,
        } => {
            let config = load(&config)?;
            if reason.trim().is_empty() {
                return Err(Failure::config("--reason must say why they are right"));
            }
            let ids = event_ids
                .iter()
                .map(|id| {
                    id.parse::<Uuid>()
                        .map_err(|_| Failure::config(format!("{id} is not an event ID (a UUID)")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let slot = slot_of(&config, source.as_deref())?;
            let what = if all {
                Accept::All(slot)
            } else {
                Accept::Ids(&ids)
            };
            let main = Target::main(&config);
            let n = connect(&main).await?.accept_phantoms(what, &reason).await?;
            if n == 0 {
                return Err(Failure::config(
                    "no open phantom matched (`walfold phantoms list` shows the open ones)",
                ));
            }
            if !all && (n as usize) < ids.len() {
                println!(
                    "{n} of {} phantom(s) accepted; the others were not open phantoms",
                    ids.len()
                );
            } else {
                println!("{n} phantom(s) accepted: reads of the log (a rebuild, a new subscriber) include them again");
            }
            Ok(())
        }
    }
}

/// Adds the subscribers of the extra targets that claimed each phantom (`name@target`).
async fn reached_elsewhere(config: &Config, phantoms: &mut [PhantomEntry]) -> Result<(), Failure> {
    let events: Vec<(Uuid, i64)> = phantoms.iter().map(|p| (p.event_id, p.claim_seq)).collect();
    if events.is_empty() {
        return Ok(());
    }
    for t in Target::all(config).into_iter().filter(|t| t.name.is_some()) {
        let claims = connect(&t).await?.claimed(&events).await?;
        for (id, subscriber) in claims {
            if let Some(p) = phantoms.iter_mut().find(|p| p.event_id == id) {
                p.reached.push(format!("{subscriber}@{}", t.label()));
            }
        }
    }
    Ok(())
}

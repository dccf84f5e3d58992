//! `walfold dead-letters list|retry|discard`, on every target: the main one holds the
//! rows rejected at ingest and its projections' letters, each `[targets.NAME]` its own
//! projections' (IDs are per target: `--target` says which).

use walfold_config::Config;
use walfold_engine::Target;
use walfold_store::operator::{DeadLetterEntry, RetryRequest};
use walfold_store::Operator;

use crate::cli::DeadLetterCommand;
use crate::text::escape_controls;
use crate::{run::load, Failure};

/// The target named `name` (`main` or absent: the main target).
fn target(config: &Config, name: Option<&str>) -> Result<Target, Failure> {
    let all = Target::all(config);
    match name {
        None | Some("main") => Ok(Target::main(config)),
        Some(n) => all
            .into_iter()
            .find(|t| t.name.as_deref() == Some(n))
            .ok_or_else(|| {
                Failure::config(format!(
                    "--target {n}: no such target; the targets are: main{}",
                    config
                        .targets
                        .keys()
                        .map(|k| format!(", {k}"))
                        .collect::<String>()
                ))
            }),
    }
}

async fn connect(t: &Target) -> Result<Operator, Failure> {
    Ok(Operator::for_command(&t.url, &format!("target {}", t.label()), &t.schema).await?)
}

pub async fn run(command: DeadLetterCommand) -> Result<(), Failure> {
    match command {
        DeadLetterCommand::List {
            config,
            subscriber,
            all,
            json,
            limit,
        } => {
            let config = load(&config)?;
            let mut listed = Vec::new();
            for t in Target::all(&config) {
                let entries = connect(&t)
                    .await?
                    .dead_letters(subscriber.as_deref(), all, limit)
                    .await?;
                listed.extend(entries.into_iter().map(|e| (t.label().to_owned(), e)));
            }
            listed.sort_by(|a, b| {
                b.1.last_failed_at_unix
                    .total_cmp(&a.1.last_failed_at_unix)
                    .then(b.1.id.cmp(&a.1.id))
            });
            listed.truncate(limit.max(0) as usize);
            let several = !config.targets.is_empty();
            if json {
                let values = listed
                    .iter()
                    .map(|(t, e)| {
                        let mut v = serde_json::to_value(e)?;
                        if let Some(o) = v.as_object_mut() {
                            o.insert("target".into(), t.clone().into());
                        }
                        Ok(v)
                    })
                    .collect::<Result<Vec<_>, serde_json::Error>>()
                    .map_err(Failure::runtime)?;
                println!(
                    "{}",
                    serde_json::to_string_pretty(&values).map_err(Failure::runtime)?
                );
                return Ok(());
            }
            let target_col = |t: &str| {
                if several {
                    format!("{t:<10} ")
                } else {
                    String::new()
                }
            };
            // The source column only with several sources: the source of a row rejected
            // at ingest (a projector's letters name their subscriber).
            let sources = config.sources().len() > 1;
            let source_col = |e: Option<&DeadLetterEntry>| match (sources, e) {
                (false, _) => String::new(),
                (true, None) => format!("{:<10} ", "source"),
                (true, Some(e)) if e.subscriber_id.is_none() => {
                    format!("{:<10} ", escape_controls(&e.source))
                }
                (true, Some(_)) => format!("{:<10} ", "-"),
            };
            println!(
                "{:>6}  {}{}{:<18} {:<20} {:<10} {:<36} {:>3}  error",
                "id",
                target_col("target"),
                source_col(None),
                "subscriber",
                "reason",
                "status",
                "event",
                "try"
            );
            for (t, e) in &listed {
                println!(
                    "{:>6}  {}{}{:<18} {:<20} {:<10} {:<36} {:>3}  {}",
                    e.id,
                    target_col(t),
                    source_col(Some(e)),
                    e.subscriber_id.as_deref().unwrap_or("(ingest)"),
                    e.reason,
                    e.status,
                    e.event_id.map_or_else(|| "-".into(), |id| id.to_string()),
                    e.attempts,
                    escape_controls(&e.error)
                );
            }
            Ok(())
        }
        DeadLetterCommand::Retry {
            config,
            id,
            all,
            subscriber,
            target: name,
        } => {
            let config = load(&config)?;
            let targets = match (all, &name) {
                (true, None) => Target::all(&config),
                _ => vec![target(&config, name.as_deref())?],
            };
            let mut n = 0;
            for t in &targets {
                let op = connect(t).await?;
                let request = match (id, all) {
                    (Some(id), false) => RetryRequest::One(id),
                    _ => RetryRequest::All(subscriber.as_deref()),
                };
                n += op.retry(request).await?;
            }
            println!("{n} dead letter(s) queued for retry; the leading daemon applies them within a second (`walfold dead-letters list --all` shows the outcome)");
            Ok(())
        }
        DeadLetterCommand::Discard {
            config,
            id,
            reason,
            target: name,
        } => {
            let config = load(&config)?;
            if reason.trim().is_empty() {
                return Err(Failure::config("--reason must say why it is discarded"));
            }
            let t = target(&config, name.as_deref())?;
            if connect(&t).await?.discard(id, &reason).await? {
                println!("dead letter {id} discarded");
                Ok(())
            } else {
                Err(Failure::config(format!(
                    "no open dead letter with id {id} on target {}",
                    t.label()
                )))
            }
        }
    }
}

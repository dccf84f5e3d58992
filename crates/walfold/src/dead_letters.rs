//! `walfold dead-letters list|discard`.

use walfold_store::{DeadLetters, RetryRequest};

use crate::cli::DeadLetterCommand;
use crate::{run::load, Failure};

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
            let client = walfold_store::connect(config.target_url())
                .await
                .map_err(Failure::runtime)?;
            let entries = DeadLetters::list(
                &client,
                &config.target.schema,
                subscriber.as_deref(),
                all,
                limit,
            )
            .await
            .map_err(Failure::runtime)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&entries).map_err(Failure::runtime)?
                );
                return Ok(());
            }
            println!(
                "{:>6}  {:<18} {:<20} {:<10} {:<36} {:>3}  error",
                "id", "subscriber", "reason", "status", "event", "try"
            );
            for e in &entries {
                println!(
                    "{:>6}  {:<18} {:<20} {:<10} {:<36} {:>3}  {}",
                    e.id,
                    e.subscriber_id.as_deref().unwrap_or("(ingest)"),
                    e.reason,
                    e.status,
                    e.event_id.map_or_else(|| "-".into(), |id| id.to_string()),
                    e.attempts,
                    e.error
                );
            }
            Ok(())
        }
        DeadLetterCommand::Retry {
            config,
            id,
            all,
            subscriber,
        } => {
            let config = load(&config)?;
            let client = walfold_store::connect(config.target_url())
                .await
                .map_err(Failure::runtime)?;
            let request = match (id, all) {
                (Some(id), false) => RetryRequest::One(id),
                _ => RetryRequest::All(subscriber.as_deref()),
            };
            let n = DeadLetters::request_retry(&client, &config.target.schema, request)
                .await
                .map_err(crate::store_failure)?;
            println!("{n} dead letter(s) queued for retry; the leading daemon applies them within a second (`walfold dead-letters list --all` shows the outcome)");
            Ok(())
        }
        DeadLetterCommand::Discard { config, id, reason } => {
            let config = load(&config)?;
            if reason.trim().is_empty() {
                return Err(Failure::config("--reason must say why it is discarded"));
            }
            let client = walfold_store::connect(config.target_url())
                .await
                .map_err(Failure::runtime)?;
            if DeadLetters::discard(&client, &config.target.schema, id, &reason)
                .await
                .map_err(Failure::runtime)?
            {
                println!("dead letter {id} discarded");
                Ok(())
            } else {
                Err(Failure::config(format!("no open dead letter with id {id}")))
            }
        }
    }
}

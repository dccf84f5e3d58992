//! The walfold binary: parses the command line, loads config, starts telemetry, runs the
//! pipeline or a one-shot command, and maps the outcome to an exit code
//! (0 ok, 2 bad configuration or usage, 1 anything else).

mod cli;
mod dead_letters;
mod demo;
mod doctor;
mod events;
mod http;
mod init;
mod open_files;
mod ops;
mod phantoms;
mod progress;
mod run;
mod shutdown;
mod status;
mod telemetry;
mod text;
mod wait;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

/// Fixes glibc's mmap threshold at 1 MiB, as `MALLOC_MMAP_THRESHOLD_=1048576` would, so
/// every freed buffer of 1 MiB or more (a payload, a connection's grown buffer) goes back
/// to the system at once and memory stays bounded in bytes however the binary is started.
/// Left to itself, glibc raises the threshold as large buffers are freed and keeps later
/// ones in its per-thread arenas (docs/OPERATIONS.md, memory). A threshold the
/// environment sets is kept.
#[allow(unsafe_code)]
fn return_large_buffers() {
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() {
        return;
    }
    // SAFETY: mallopt only sets one of malloc's tunables; no other thread exists yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// A failure with its exit code.
pub(crate) struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn config(message: impl ToString) -> Self {
        Failure {
            code: 2,
            message: message.to_string(),
        }
    }
    pub fn runtime(message: impl ToString) -> Self {
        Failure {
            code: 1,
            message: message.to_string(),
        }
    }
}

/// A store error as a failure: an operator request the state refuses, or a URL behind a
/// pooler walfold cannot work through, is a usage error.
pub(crate) fn store_failure(e: walfold_store::StoreError) -> Failure {
    match e.is_usage() {
        true => Failure::config(e),
        false => Failure::runtime(e),
    }
}

/// A row that cannot be read (a drifted table, an unexpected catalog) fails the command
/// like any other store error.
impl From<walfold_store::StoreError> for Failure {
    fn from(e: walfold_store::StoreError) -> Self {
        store_failure(e)
    }
}

/// A connection or a row that fails (a URL behind a pooler is a usage error).
impl From<walfold_pg::PgError> for Failure {
    fn from(e: walfold_pg::PgError) -> Self {
        match e.is_usage() {
            true => Failure::config(e),
            false => Failure::runtime(e),
        }
    }
}

/// An engine error as a failure (see [`store_failure`]).
pub(crate) fn engine_failure(e: walfold_engine::EngineError) -> Failure {
    match e.usage() {
        Some(m) => Failure::config(m),
        None => Failure::runtime(e),
    }
}

fn main() -> ExitCode {
    return_large_buffers();
    // `walfold status | head`: a closed stdout ends the command quietly, not with a
    // panic and a backtrace.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.contains("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        default_hook(info);
    }));
    #[cfg(not(feature = "failpoints"))]
    if std::env::var_os("WALFOLD_FAILPOINTS").is_some() {
        eprintln!("walfold: WALFOLD_FAILPOINTS is set but this build has no failpoints (build with --features failpoints)");
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("walfold: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Run {
                config,
                projections,
                no_projections,
            } => {
                let runs = match no_projections {
                    true => Some(Vec::new()),
                    false => projections,
                };
                run::run(&config, runs).await
            }
            Command::Demo => demo::demo().await,
            Command::Status {
                config,
                json,
                watch,
            } => match watch {
                true => status::watch(&config).await,
                false => status::status(&config, json).await,
            },
            Command::Init {
                url,
                tables,
                message_prefixes,
                read_model,
                r#where,
                aggregate_id,
                output,
            } => {
                let outboxes = init::Wanted {
                    tables,
                    message_prefixes,
                    r#where,
                    aggregate_id,
                };
                init::init(&url.0, &outboxes, read_model.as_deref(), &output).await
            }
            Command::Events {
                config,
                aggregate,
                source,
                aggregate_type,
                event_type,
                after,
                since,
                follow,
                subscriber,
                limit,
            } => {
                let query = events::Query {
                    aggregate,
                    source,
                    aggregate_type,
                    event_type,
                    after: after.unwrap_or(0),
                    since,
                    follow,
                    subscriber,
                    limit,
                };
                events::events(&config, query).await
            }
            Command::Completions { shell } => {
                let mut command = <Cli as clap::CommandFactory>::command();
                clap_complete::generate(shell, &mut command, "walfold", &mut std::io::stdout());
                Ok(())
            }
            Command::Man => {
                let command = <Cli as clap::CommandFactory>::command();
                clap_mangen::Man::new(command)
                    .render(&mut std::io::stdout())
                    .map_err(Failure::runtime)
            }
            Command::Migrate { config } => run::migrate_only(&config).await,
            Command::DeadLetters(command) => dead_letters::run(command).await,
            Command::Phantoms(command) => phantoms::run(command).await,
            Command::Rebuild {
                config,
                projection,
                subscriber,
                finish,
                abort,
                wait,
                from_retained_log,
            } => {
                ops::rebuild(
                    &config,
                    &projection,
                    subscriber.as_deref(),
                    ops::RebuildAction::from_flags(finish, abort, wait),
                    if from_retained_log {
                        walfold_engine::ops::History::Retained
                    } else {
                        walfold_engine::ops::History::Whole
                    },
                )
                .await
            }
            Command::Backfill {
                config,
                outbox,
                source,
                order_by,
                batch,
            } => {
                ops::backfill(
                    &config,
                    &outbox,
                    source.as_deref(),
                    order_by.as_deref(),
                    batch,
                )
                .await
            }
            Command::Prune { config } => ops::prune(&config).await,
            Command::Doctor {
                config,
                max_retained_mb,
            } => doctor::doctor(&config, max_retained_mb).await,
        }
    });
    // Connection tasks may still be parked; don't wait for them.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("walfold: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

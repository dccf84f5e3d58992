//! Command-line interface (clap: derive-based parsing, help and usage errors for free).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "walfold",
    version,
    about = "Outbox events from PostgreSQL logical replication, folded into read models effectively once"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: ingest from the slot and run every projection until SIGTERM.
    Run {
        /// Path to walfold.toml.
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
    },
    /// Start a throwaway PostgreSQL, stream sample events through two projections, print them.
    Demo,
    /// Show slot lag, event-log head, subscriber positions and dead letters.
    Status {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Create or upgrade walfold's schema in the target database, then exit.
    Migrate {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
    },
    /// Inspect and resolve dead letters.
    #[command(name = "dead-letters", subcommand)]
    DeadLetters(DeadLetterCommand),
}

#[derive(Debug, Subcommand)]
pub enum DeadLetterCommand {
    /// List dead letters, newest first (open ones unless --all).
    List {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
        /// Only this subscriber's (`ingest` for rows rejected at ingest).
        #[arg(long)]
        subscriber: Option<String>,
        /// Include retried and discarded ones.
        #[arg(long)]
        all: bool,
        /// Print JSON (with the raw rows) instead of a table.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Mark a dead letter discarded, with the reason recorded.
    Discard {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
        id: i64,
        #[arg(long)]
        reason: String,
    },
}

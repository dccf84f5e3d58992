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
        /// Run only these projections on this instance (by name, comma-separated);
        /// `[cluster] projections` for this instance alone.
        #[arg(long, value_delimiter = ',', conflicts_with = "no_projections")]
        projections: Option<Vec<String>>,
        /// Run no projection on this instance: it only leads (reads the slots, prunes,
        /// plans the work units) when no other instance does.
        #[arg(long)]
        no_projections: bool,
    },
    /// Start a throwaway PostgreSQL, stream sample events through three projections, print them.
    Demo,
    /// Connect to an existing database, find its outbox table (or take message outboxes)
    /// and write a commented walfold.toml for it (never overwriting a file), then check
    /// what `doctor` checks.
    Init {
        /// The source database, e.g. postgresql://user@host:5432/app (the password, if
        /// any, is used to connect and left out of the file).
        #[arg(long, env = "WALFOLD_SOURCE__URL", hide_env_values = true)]
        url: Url,
        /// The outbox table (`schema.table`), when the database has several candidates;
        /// repeat for several outboxes.
        #[arg(long = "table", value_name = "SCHEMA.TABLE")]
        tables: Vec<String>,
        /// A message outbox: the prefix of its `pg_logical_emit_message(true, prefix, json)`
        /// calls; repeat for several. Without --table, no table is looked for.
        #[arg(long = "message-prefix", value_name = "PREFIX")]
        message_prefixes: Vec<String>,
        /// A read-model table to write a `table` projection for (without one, the
        /// config carries a commented `sql` projection to start from).
        #[arg(long, value_name = "SCHEMA.TABLE")]
        read_model: Option<String>,
        /// The rows of the (one) table that are events, an expression: for a framework
        /// that writes one row per event and per listener (Spring Modulith) or endpoint
        /// (Wolverine), on a table without rows to pick one from.
        #[arg(long = "where", value_name = "EXPR")]
        r#where: Option<String>,
        /// The (one) table's aggregate ID, a column or expression, where the framework's
        /// rows carry none (init otherwise proposes one from the payloads it samples).
        #[arg(long, value_name = "EXPR")]
        aggregate_id: Option<String>,
        /// Where to write the config (`-` for standard output); an existing file is
        /// never overwritten.
        #[arg(short, long, default_value = "walfold.toml")]
        output: PathBuf,
    },
    /// Show slot lag, event-log head, subscriber positions and dead letters.
    Status {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long, conflicts_with = "watch")]
        json: bool,
        /// Redraw every second until Ctrl-C.
        #[arg(long)]
        watch: bool,
    },
    /// Print events from the event log as JSON lines (oldest first), optionally with
    /// what a subscriber did with each one.
    Events {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
        /// Only this aggregate ID.
        #[arg(long)]
        aggregate: Option<String>,
        /// Only this aggregate type.
        #[arg(long)]
        aggregate_type: Option<String>,
        /// Only events from this [[source]] (by name).
        #[arg(long)]
        source: Option<String>,
        /// Only this event type.
        #[arg(long = "type", value_name = "EVENT_TYPE")]
        event_type: Option<String>,
        /// Only events after this position in the log (seq).
        #[arg(long, value_name = "SEQ")]
        after: Option<i64>,
        /// Only events committed at or after this time: a timestamp
        /// (`2026-11-30T12:00:00Z`) or a duration ago (`15m`, `2h`, `1d`).
        #[arg(long)]
        since: Option<String>,
        /// Keep printing events as they are appended, until Ctrl-C.
        #[arg(long)]
        follow: bool,
        /// Add, per event, what this subscriber did with it (applied, stale, claimed,
        /// dead-lettered, parked, pending, filtered).
        #[arg(long)]
        subscriber: Option<String>,
        /// Stop after this many events.
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Print a shell completion script (e.g. `walfold completions bash > /etc/bash_completion.d/walfold`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `walfold man > walfold.1`.
    Man,
    /// Create or upgrade walfold's schema in the target database, then exit.
    Migrate {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
    },
    /// Inspect and resolve dead letters.
    #[command(name = "dead-letters", subcommand)]
    DeadLetters(DeadLetterCommand),
    /// List phantoms (events read from an old primary past a failover's fork that the
    /// new primary does not have) with the read models they reached; accept those that
    /// are right after all.
    #[command(subcommand)]
    Phantoms(PhantomCommand),
    /// Rebuild a projection under a new subscriber ID into a shadow table while the live
    /// one keeps serving; the running daemon replays, then swaps them when caught up.
    Rebuild {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
        /// The projection's name.
        projection: String,
        /// The new subscriber ID to replay under (never used before).
        #[arg(long, required_unless_present_any = ["finish", "abort", "wait"])]
        subscriber: Option<String>,
        /// Follow the rebuild (replayed, remaining, rate, ETA) until it switches over;
        /// without --subscriber, follow the one already running. Ctrl-C stops following,
        /// not the rebuild.
        #[arg(long, conflicts_with_all = ["finish", "abort"])]
        wait: bool,
        /// Drop the table a switched rebuild retired.
        #[arg(long, conflicts_with_all = ["abort", "subscriber"])]
        finish: bool,
        /// Stop a rebuild that has not switched: drop its shadow table, change nothing live.
        #[arg(long, conflicts_with = "subscriber")]
        abort: bool,
        /// Rebuild from what the event log still holds after retention pruned it (the
        /// new table lacks whatever the pruned events built); refused without it.
        #[arg(long, requires = "subscriber")]
        from_retained_log: bool,
    },
    /// Import rows an outbox table already holds into the event log (the daemon must be
    /// stopped); the slot carries on from there without a gap.
    Backfill {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
        /// The outbox table, as in [[outbox]] table.
        #[arg(long)]
        outbox: String,
        /// The [[source]] (by name) whose database holds it; needed only when two
        /// sources have an outbox of that name.
        #[arg(long)]
        source: Option<String>,
        /// Page (and append) in this column's order, then the ID's (default: the ID).
        #[arg(long)]
        order_by: Option<String>,
        #[arg(long, default_value_t = 5000)]
        batch: i64,
    },
    /// Check the source and target for what walfold needs (wal_level, slots, WAL limits,
    /// publication, replica identity, the slot's health, privileges); exit 1 on a failure.
    Doctor {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
        /// Warn when the slot retains more WAL than this many MB.
        #[arg(long, default_value_t = 1024)]
        max_retained_mb: i64,
    },
    /// Delete claims and events past their retention (the daemon also does this
    /// every retention.prune_interval_s).
    Prune {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
    },
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
    /// Send dead letters through their subscriber again (claim and version guard as
    /// usual); a parked aggregate is released when its chain succeeds.
    Retry {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
        /// The dead letter (its aggregate's whole chain is retried, in order).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<i64>,
        /// Every open dead letter of every subscriber (or of --subscriber).
        #[arg(long)]
        all: bool,
        #[arg(long, requires = "all")]
        subscriber: Option<String>,
        /// The target holding the dead letter (`[targets.NAME]`; `main` by default). With
        /// --all and no --target, every target's.
        #[arg(long)]
        target: Option<String>,
    },
    /// Mark a dead letter discarded, with the reason recorded.
    Discard {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
        id: i64,
        #[arg(long)]
        reason: String,
        /// The target holding the dead letter (`[targets.NAME]`; `main` by default).
        #[arg(long)]
        target: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum PhantomCommand {
    /// List phantoms, oldest first (open ones unless --all), each with the subscribers
    /// that claimed it: the read models it reached.
    List {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
        /// Only this [[source]]'s (by name).
        #[arg(long)]
        source: Option<String>,
        /// Include accepted ones.
        #[arg(long)]
        all: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 1000)]
        limit: i64,
    },
    /// Accept phantoms you know are right (the application deleted their outbox rows, or
    /// they came from a message outbox): reads of the log include them again, and status,
    /// doctor and walfold_phantom_events stop counting them. The reason is recorded.
    Accept {
        #[arg(short, long, env = "WALFOLD_CONFIG", default_value = "walfold.toml")]
        config: PathBuf,
        /// The phantoms' event IDs.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        event_ids: Vec<String>,
        /// Every open phantom (of --source, when given).
        #[arg(long)]
        all: bool,
        #[arg(long, requires = "all")]
        source: Option<String>,
        /// Why they are right.
        #[arg(long)]
        reason: String,
    },
}

/// A connection URL from the command line; `Debug` masks its passwords.
#[derive(Clone)]
pub struct Url(pub String);

impl From<String> for Url {
    fn from(url: String) -> Url {
        Url(url)
    }
}

impl std::fmt::Debug for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&walfold_config::redact_url(&self.0))
    }
}

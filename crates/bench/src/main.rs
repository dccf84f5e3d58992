//! `walfold-bench`: runs each scenario against a throwaway PostgreSQL and prints one
//! table with walfold's figure beside the limit measured in the same run.

mod measure;
mod scenarios;
mod setup;

use clap::Parser;

/// Benchmark walfold against the machine's own limits.
#[derive(Debug, Parser)]
#[command(name = "walfold-bench")]
pub struct Args {
    /// Outbox rows in the decode/drain backlog (100-row transactions).
    #[arg(long, default_value_t = 1_000_000)]
    pub events: u64,
    /// Runs of the decode scenario per side (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Live-latency scenario: offered single-row transactions per second.
    #[arg(long, default_value_t = 2000)]
    pub rate: u64,
    /// Live-latency scenario duration in seconds.
    #[arg(long, default_value_t = 60)]
    pub latency_secs: u64,
    /// Keep-up scenario duration in seconds (unthrottled pgbench).
    #[arg(long, default_value_t = 30)]
    pub keepup_secs: u64,
    /// Rows in the single big transaction of the memory scenario (0 skips it).
    #[arg(long, default_value_t = 1_000_000)]
    pub big_txn: u64,
    /// Rows in the single transaction of the protocol scenario (one run with pgoutput
    /// protocol 1, one with 2; 0 skips it).
    #[arg(long, default_value_t = 1_000_000)]
    pub stream_txn: u64,
    /// Run only one scenario: `protocols` (one big transaction, protocol 1 and 2),
    /// `sources` (a backlog drained from one source, then the same split over two), or
    /// `history` (a drain into an empty walfold schema, then `--history` earlier events
    /// and their claims seeded set-based, then the same drain again; on the cluster
    /// `--history-cluster` names).
    /// `handover` runs three `walfold` processes (the release binary beside this one)
    /// on one config: the share each applies, and the handover time over
    /// `--handover-rounds` SIGKILLs and as many SIGSTOPs.
    /// `wait` measures read your own writes: one waiter's rounds, then many waiters'
    /// cost, beside `--rate` single-row transactions a second. `live` runs the live
    /// latency and keep-up scenarios alone.
    #[arg(long, value_parser = ["protocols", "sources", "history", "handover", "wait", "live"])]
    pub only: Option<String>,
    /// Rounds of the wait scenario's single waiter.
    #[arg(long, default_value_t = 1000)]
    pub wait_rounds: u64,
    /// Concurrent waiters of the wait scenario's second part.
    #[arg(long, default_value_t = 64)]
    pub waiters: u64,
    /// Seconds of the wait scenario's concurrent waiters.
    #[arg(long, default_value_t = 15)]
    pub wait_secs: u64,
    /// Kills, and freezes, of the handover scenario.
    #[arg(long, default_value_t = 10)]
    pub handover_rounds: usize,
    /// Earlier events (each claimed by both drain projections) of the history scenario.
    #[arg(
        long = "history",
        alias = "history-events",
        default_value_t = 5_000_000
    )]
    pub history_events: u64,
    /// Events in each of the history scenario's two drains.
    #[arg(long, default_value_t = 200_000)]
    pub history_drain: u64,
    /// The history scenario's cluster: `default` (the server's defaults but fsync on:
    /// shared_buffers 128MB, max_wal_size 1GB, checkpoint_timeout 5min) or `tuned` (the
    /// other scenarios' cluster: shared_buffers 512MB, max_wal_size 8GB, 30min).
    #[arg(long, default_value = "default", value_parser = ["default", "tuned"])]
    pub history_cluster: String,
    /// Extra `name=value` server settings of the history scenario's cluster, repeatable
    /// (experiments such as `wal_compression=lz4`, `max_wal_size=8GB`).
    #[arg(long = "set")]
    pub settings: Vec<String>,
    /// The producers' event IDs in the history scenario (seeded and drained): `v4`
    /// (random) or `v7` (time-ordered, as UUIDv7).
    #[arg(long, default_value = "v4", value_parser = ["v4", "v7"])]
    pub history_ids: String,
    /// Outbox rows in the several-sources drain (split evenly over two sources).
    #[arg(long, default_value_t = 200_000)]
    pub sources_events: u64,
    /// The cluster's `fsync`: on (as users run PostgreSQL) or off (the test clusters').
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub fsync: String,
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = runtime.block_on(scenarios::run_all(args)) {
        eprintln!("walfold-bench: {e}");
        std::process::exit(1);
    }
}

//! Several sources: two source servers, each with its outbox, folded into read models
//! on the main target and on a second target server (three clusters in all), through an
//! outage of one source and SIGKILLs of the daemon.
//!
//! By behaviour: the fold through outages and kills (`fold.rs`), which source an event
//! or a rejection is of (`attribution.rs`), sources added, renamed or broken in the
//! config or on the server (`config_changes.rs`).

mod attribution;
mod config_changes;
mod fold;

use std::sync::OnceLock;

use walfold_tempdb::{Cluster, Options};

/// The second source's server: its own cluster, stopped and started by the test.
fn second_cluster() -> &'static Cluster {
    static SECOND: OnceLock<Cluster> = OnceLock::new();
    SECOND.get_or_init(|| Cluster::start(Options::default()).expect("second cluster"))
}

/// A config of two sources named `a` and `b` (slots `{tag}_a`, `{tag}_b`), each with its
/// `public.outbox`, and a `ledger` projection on `target`; then `extra`.
fn two_sources(tag: &str, a: &str, b: &str, target: &str, extra: &str) -> String {
    format!(
        r#"
[[source]]
name = "a"
url = "{a}"
slot = "{tag}_a"
heartbeat_interval_s = 1

[[source]]
name = "b"
url = "{b}"
slot = "{tag}_b"
heartbeat_interval_s = 1

[target]
url = "{target}"

[[outbox]]
source = "a"
table = "public.outbox"

[[outbox]]
source = "b"
table = "public.outbox"

[pipeline]
max_backoff_ms = 500

[[projection]]
name = "ledger"
subscriber = "ledger.v1"
sql = "insert into ledger (event_id, order_id, amount) values (:event_id, :source, 0)"
{extra}
"#
    )
}

fn rows(tag: &str, n: usize) -> String {
    format!(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         select md5('{tag}' || i)::uuid, 'order', '{tag}-' || i, 'Placed', 1, '{{}}' \
         from generate_series(1, {n}) i"
    )
}

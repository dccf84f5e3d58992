//! Memory is bounded in bytes: large payloads fold with a peak RSS of at most 64 MiB plus
//! twice the largest single payload, and an event past `pipeline.max_event_bytes` is
//! dead-lettered as too large.

use std::time::{Duration, Instant};

use walfold_tests::{config_builder, eventually, Daemon, TestDb};

const MIB: u64 = 1024 * 1024;

/// The daemon's peak resident set (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kib * 1024
}

/// Resets the peak to the current resident set, so each case is measured on its own
/// (after what the cases before it kept).
fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset VmHWM");
}

/// Writes `sql` (one transaction of outbox rows), waits until `events` more events are
/// folded, and returns the peak RSS meanwhile.
async fn fold(db: &TestDb, d: &Daemon, sql: &str, folded: i64) -> u64 {
    let pid = d.child.id();
    reset_peak(pid);
    db.psql(sql);
    eventually(Duration::from_secs(40), "the events to fold", || async {
        db.psql("select count(*) from folded").parse::<i64>().unwrap() >= folded
    })
    .await;
    peak_rss(pid)
}

/// Each case's peak RSS over its bound, for one message naming every case.
fn over_bound(case: &str, peak: u64, largest_payload: u64) -> Option<String> {
    let bound = 64 * MIB + 2 * largest_payload;
    eprintln!(
        "{case}: peak RSS {} MiB (bound {} MiB)",
        peak / MIB,
        bound / MIB
    );
    (peak > bound).then(|| {
        format!(
            "{case}: peak RSS {} MiB is over 64 MiB + 2 × {} MiB",
            peak / MIB,
            largest_payload / MIB
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_payloads_fold_within_64_mib_plus_twice_the_largest() {
    let started = Instant::now();
    let db = TestDb::new("memory");
    db.psql("create table folded (event_id uuid primary key, size bigint not null, kind text)");
    let config = config_builder(&db.url())
        .set("log", "level", "info")
        .text(
            r#"
[[projection]]
name = "sizes"
subscriber = "memory.sizes.v1"
sql = "insert into folded (event_id, size, kind) values (:event_id, length(:payload::text), :payload.kind)"
"#,
        )
        .to_toml();
    let (mut d, _client) = Daemon::streaming(&db, &config).await;
    let row = |i: u32, payload: &str| {
        format!(
            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
             select '00000000-0000-4000-8000-{i:012}', 'doc', 'd{i}', 'Big', 1, {payload};"
        )
    };

    // One 50 MB payload.
    let blob = 50_000_000;
    let sql = row(1, &format!("jsonb_build_object('kind', 'one', 'blob', repeat('x', {blob}))"));
    let mut over = Vec::new();
    let peak = fold(&db, &d, &sql, 1).await;
    over.extend(over_bound("one 50 MB payload", peak, blob));

    // A 12 MB jsonb array of 4M numbers.
    let sql = row(
        2,
        "(select jsonb_agg(n % 100) from generate_series(1, 4000000) n)",
    );
    let peak = fold(&db, &d, &sql, 2).await;
    let size: u64 = db
        .psql("select size from folded where event_id = '00000000-0000-4000-8000-000000000002'")
        .parse()
        .unwrap();
    assert!(size > 11_000_000, "the array is {size} bytes as text");
    over.extend(over_bound("a 12 MB array of 4M numbers", peak, size));

    // One transaction of 8 × 16 MB payloads.
    let each = 16_000_000;
    let sql = format!(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         select ('00000000-0000-4000-8000-' || lpad((100 + i)::text, 12, '0'))::uuid, 'doc', \
                'e' || i, 'Big', 1, jsonb_build_object('blob', repeat(chr(97 + i), {each})) \
         from generate_series(1, 8) i;"
    );
    let peak = fold(&db, &d, &sql, 10).await;
    over.extend(over_bound("one transaction of 8 × 16 MB payloads", peak, each));
    assert!(over.is_empty(), "{over:#?}");

    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

//! Memory is bounded in bytes: large payloads fold with a peak RSS of at most 64 MiB plus
//! twice the largest single payload, and a row over `pipeline.max_event_bytes` becomes a
//! `too_large` dead letter, read once.

use std::time::Duration;

use walfold_tests::{config_builder, eventually, slot_active, Daemon, TestDb};

const MIB: u64 = 1024 * 1024;

/// 16 MB of random hex text, which TOAST cannot compress.
const RANDOM_16MB: &str = "(select string_agg(md5(random()::text), '') \
     from generate_series(1, 500000))";

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

/// Resets the peak to the current resident set, so each case is measured on its own,
/// after whatever the cases before it kept.
fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset VmHWM");
}

/// Runs `sql`, waits until `done` holds, and returns the peak RSS meanwhile.
async fn measure(db: &TestDb, pid: u32, sql: &str, done: &str) -> u64 {
    reset_peak(pid);
    db.psql(sql);
    eventually(Duration::from_secs(40), done, || async {
        db.psql(done) == "t"
    })
    .await;
    peak_rss(pid)
}

/// The case's peak over its bound, if it is.
fn over(case: &str, peak: u64, bound: u64) -> Option<String> {
    eprintln!(
        "{case}: peak RSS {} MiB (bound {} MiB)",
        peak / MIB,
        bound / MIB
    );
    (peak > bound).then(|| {
        format!(
            "{case}: peak RSS {} MiB, over {} MiB",
            peak / MIB,
            bound / MIB
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_payloads_fold_within_64_mib_plus_twice_the_largest() {
    let db = TestDb::new("memory");
    db.psql("create table folded (event_id uuid primary key, kind text)");
    let config = config_builder(&db.url())
        .set("log", "level", "info")
        .set("pipeline", "max_event_bytes", 60_000_000)
        .text(
            r#"
[[projection]]
name = "kinds"
subscriber = "memory.kinds.v1"
sql = "insert into folded (event_id, kind) values (:event_id, :payload.kind)"
"#,
        )
        .to_toml();
    // As a user starts the binary: no allocator settings in the environment (the
    // binary's own allocator gives large buffers back when they are freed).
    assert!(
        std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none(),
        "run the memory test without MALLOC_MMAP_THRESHOLD_: it holds the binary's own bound"
    );
    let d = Daemon::start(&config, &[]);
    slot_active(&db.client().await).await;
    let pid = d.child.id();
    let insert = |rows: &str| {
        format!(
            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
             select ('00000000-0000-4000-8000-' || lpad(i::text, 12, '0'))::uuid, 'doc', \
             'd' || i, 'Big', 1, p from ({rows}) r(i, p);"
        )
    };
    let folded = |n: usize| format!("select count(*) = {n} from folded");
    let cases = [
        (
            "one 50 MB payload",
            insert("select 1, jsonb_build_object('kind', 'one', 'blob', repeat('x', 50000000))"),
            folded(1),
            "'d1'",
        ),
        (
            "a 12 MB jsonb array of 4M numbers",
            insert("select 2, jsonb_agg(n % 100) from generate_series(1, 4000000) n"),
            folded(2),
            "'d2'",
        ),
        (
            "one transaction of 8 × 16 MB payloads",
            // Incompressible: 128 MB of WAL, so the source streams the transaction
            // (protocol 2) and its rows are staged before they reach the log.
            insert(&format!(
                "select 10 + i, jsonb_build_object('kind', 'many', 'blob', {RANDOM_16MB}) \
                 from generate_series(1, 8) i"
            )),
            folded(10),
            "'d11', 'd12', 'd13', 'd14', 'd15', 'd16', 'd17', 'd18'",
        ),
        (
            // Compressed by TOAST: a small transaction for the source, sent at its commit.
            "one transaction of 8 × 16 MB payloads, not streamed",
            insert(
                "select 20 + i, jsonb_build_object('kind', 'more', \
                 'blob', repeat(chr(97 + i), 16000000)) from generate_series(1, 8) i",
            ),
            folded(18),
            "'d21', 'd22', 'd23', 'd24', 'd25', 'd26', 'd27', 'd28'",
        ),
    ];
    let mut problems = Vec::new();
    for (case, sql, done, aggregates) in &cases {
        let peak = measure(&db, pid, sql, done).await;
        // The largest payload of the case, as text: what walfold holds.
        let largest: u64 = db
            .psql(&format!(
                "select max(octet_length(payload::text)) from walfold.event_log \
                 where aggregate_id in ({aggregates})"
            ))
            .parse()
            .unwrap();
        problems.extend(over(case, peak, 64 * MIB + 2 * largest));
    }
    assert_ne!(
        db.psql(
            "select coalesce(stream_txns, 0) from pg_stat_replication_slots \
             where slot_name = 'walfold'"
        ),
        "0",
        "the 8 × 16 MB transaction was streamed"
    );
    assert_eq!(
        db.psql("select string_agg(coalesce(kind, '-'), ',' order by event_id) from folded"),
        "one,-,many,many,many,many,many,many,many,many,more,more,more,more,more,more,more,more",
        "each object's kind was read (an array has none)"
    );

    // Over max_event_bytes: a dead letter without the payload, the row read once.
    let size = 70_000_000;
    let peak = measure(
        &db,
        pid,
        &insert(&format!(
            "select 99, jsonb_build_object('kind', 'huge', 'blob', {RANDOM_16MB} || \
             {RANDOM_16MB} || {RANDOM_16MB} || {RANDOM_16MB} || repeat('z', {}))",
            size - 4 * 16_000_000
        )),
        "select exists (select from walfold.dead_letter where reason = 'too_large')",
    )
    .await;
    problems.extend(over(
        "a 70 MB payload over max_event_bytes",
        peak,
        64 * MIB + size,
    ));
    let (event_id, error, raw_bytes) = {
        let row = db.psql(
            "select event_id, error, length(raw::text) from walfold.dead_letter \
             where reason = 'too_large'",
        );
        let parts: Vec<String> = row.split('|').map(str::to_owned).collect();
        (
            parts[0].clone(),
            parts[1].clone(),
            parts[2].parse::<u64>().unwrap(),
        )
    };
    assert_eq!(event_id, "00000000-0000-4000-8000-000000000099");
    assert!(
        error.contains("over pipeline.max_event_bytes (60000000)"),
        "{error}"
    );
    assert!(raw_bytes < 4096, "the dead letter keeps {raw_bytes} bytes");
    assert!(problems.is_empty(), "{problems:#?}");

    // The pipeline goes on after it.
    db.psql(&insert("select 100, '{\"kind\": \"small\"}'::jsonb"));
    eventually(Duration::from_secs(20), "a small event after", || async {
        db.psql(&folded(19)) == "t"
    })
    .await;
    let mut d = d;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

/// A logical message walfold does not read whole (a prefix no outbox has, or content over
/// `max_event_bytes`) is left in the stream as it arrives: memory does not grow with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_logical_messages_walfold_does_not_read_pass_in_bounded_memory() {
    let db = TestDb::new("bigmessages");
    db.psql(walfold_tests::REVOKE_PUBLIC_EMIT);
    db.psql("create table folded (event_id uuid primary key, kind text)");
    let config = config_builder(&db.url())
        .set("pipeline", "max_event_bytes", 10_000_000)
        .text(
            r#"
[[outbox]]
message_prefix = "walfold:orders"

[[projection]]
name = "kinds"
subscriber = "bigmessages.kinds.v1"
sql = "insert into folded (event_id, kind) values (:event_id, :payload.kind)"
"#,
        )
        .to_toml();
    let d = Daemon::start(&config, &[]);
    slot_active(&db.client().await).await;
    let pid = d.child.id();
    let order = |id: u32, kind: &str| {
        format!(
            "select pg_logical_emit_message(true, 'walfold:orders', jsonb_build_object(\
             'id', '00000000-0000-4000-8000-{id:012}', 'aggregate_type', 'order', \
             'aggregate_id', 'o{id}', 'event_type', 'Placed', 'version', 1, \
             'payload', jsonb_build_object('kind', {kind}))::text);"
        )
    };
    let mut problems = Vec::new();
    // 200 MB under a prefix no outbox has, then an order behind it.
    let peak = measure(
        &db,
        pid,
        &format!(
            "begin; select pg_logical_emit_message(true, 'someone-else', repeat('x', 200000000)); \
             {} commit;",
            order(1, "'first'")
        ),
        "select count(*) = 1 from folded",
    )
    .await;
    problems.extend(over(
        "a 200 MB message under another prefix",
        peak,
        64 * MIB,
    ));
    // 50 MB under the outbox's prefix, over max_event_bytes: a dead letter with its size.
    let peak = measure(
        &db,
        pid,
        &order(2, "repeat('y', 50000000)"),
        "select exists (select from walfold.dead_letter where reason = 'too_large')",
    )
    .await;
    problems.extend(over("a 50 MB order over max_event_bytes", peak, 64 * MIB));
    assert!(problems.is_empty(), "{problems:#?}");
    let error = db.psql("select error from walfold.dead_letter where reason = 'too_large'");
    assert!(
        error.contains("the message is 50000") && error.contains("over pipeline.max_event_bytes"),
        "{error}"
    );
    // The pipeline goes on after them.
    db.psql(&order(3, "'after'"));
    eventually(Duration::from_secs(20), "an order after", || async {
        db.psql("select string_agg(kind, ',' order by event_id) from folded") == "first,after"
    })
    .await;
    let mut d = d;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

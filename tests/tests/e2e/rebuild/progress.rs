//! A rebuild's progress counted like with like: a filtered projection claims few of the
//! events it reads past, and `rebuild --wait` once set those claims against every event
//! left in the log (and said "caught up" by that count).

use std::time::Duration;

use walfold_tests::{caught_up, walfold, Daemon, TestDb};

use super::config;

/// 4000 events, one in 20 an `OrderPaid`; `paid` takes those only and replays slowly
/// (10 a transaction, each commit 20 ms late), so `--wait` prints lines on its way.
/// Each line's read and remaining positions add up to the log's span, the last says
/// switched over with nothing remaining, and no line says it caught up before it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_rebuild_counts_its_progress_in_positions_of_the_log() {
    let db = TestDb::new("filteredrebuild");
    db.psql("create table paid (event_id text primary key, order_id text not null)");
    let text = config(
        &db,
        r#"
[[projection]]
name = "paid"
subscriber = "paid.v1"
event_types = ["OrderPaid"]
rebuild_batch_size = 10
target = "public.paid"
sql = "insert into {table} (event_id, order_id) values (:event_id, :aggregate_id) on conflict do nothing"
"#,
    );
    let (d, client) = Daemon::streaming(&db, &text).await;
    db.psql(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         select gen_random_uuid(), 'order', 'o-' || i, \
                case when i % 20 = 0 then 'OrderPaid' else 'OrderNoted' end, 1, \
                jsonb_build_object('status', 's', 'amount', '1') \
         from generate_series(1, 4000) as i",
    );
    caught_up(&client, 4000, 3).await;
    assert_eq!(db.psql("select count(*) from paid"), "200");
    drop(d);
    let d = Daemon::start(
        &text,
        &[("WALFOLD_FAILPOINTS", "projector_commit=sleep:20")],
    );
    let span: u64 = db
        .psql("select max(seq) - min(seq) + 1 from walfold.event_log")
        .parse()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (code, out, err) = walfold(
        &[
            "rebuild",
            "paid",
            "--subscriber",
            "paid.v2",
            "--wait",
            "-c",
            d.config_path(),
        ],
        &[],
    );
    eprintln!("{err}");
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("rebuild of paid switched over: paid.v2 serves it"),
        "{out}"
    );
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("rebuild of paid → paid.v2: "))
        .collect();
    assert!(lines.len() >= 2, "{err}");
    for line in &lines {
        // `…: 1200 log events, 2800 remaining (30%), …`
        let numbers: Vec<u64> = line
            .trim_start_matches("rebuild of paid → paid.v2: ")
            .split([' ', ','])
            .filter_map(|w| w.parse().ok())
            .take(2)
            .collect();
        assert_eq!(numbers.len(), 2, "{line}");
        assert_eq!(numbers[0] + numbers[1], span, "read + remaining: {line}");
    }
    let last = lines.last().unwrap();
    assert!(
        last.contains(&format!("{span} log events, 0 remaining (100%)"))
            && last.ends_with("switched"),
        "{last}"
    );
    assert!(!err.contains("caught up"), "{err}");
    assert_eq!(db.psql("select count(*) from paid"), "200");
}

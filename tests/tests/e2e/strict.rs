//! Strict-sequence projections (`version_mode = "strict"`) for delta events, with the
//! real `walfold` binary: every version applies exactly once and in order, a gap waits,
//! a gap that never fills becomes a dead letter, and crashes change none of it.

use std::time::Duration;

use walfold_config::builder::ConfigBuilder;
use walfold_tests::{count, eventually, slot_active, walfold, Daemon, Rng, TestDb};

/// A running balance per account, recording the order its versions were applied in.
const BALANCE: &str = r#"
[[projection]]
name = "balance"
subscriber = "balance.v1"
version_mode = "strict"
gap_timeout = "3s"
target = "public.balance"
batch_size = 50
sql = """
insert into {table} as b (account, amount, versions)
values (:aggregate_id, :payload.amount::numeric, :version::text)
on conflict (account) do update
set amount = b.amount + excluded.amount, versions = b.versions || ',' || excluded.versions
"""
"#;

/// [`BALANCE`] on `db` with no prune pass of its own, then `extra`.
fn config(db: &TestDb, extra: &str) -> String {
    ConfigBuilder::new(&db.url())
        .outbox_table("public.outbox")
        .set("pipeline", "max_backoff_ms", 500)
        .set("retention", "prune_interval_s", 0)
        .text(BALANCE)
        .text(extra)
        .to_toml()
}

fn db(prefix: &str) -> TestDb {
    let db = TestDb::new(prefix);
    db.psql(
        "create table balance (account text primary key, amount numeric not null, \
         versions text not null)",
    );
    db
}

fn credit(account: &str, version: i64, amount: i64) -> String {
    format!(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         values (gen_random_uuid(), 'account', '{account}', 'Credited', {version}, \
                 '{{\"amount\": \"{amount}\"}}');"
    )
}

async fn versions(client: &tokio_postgres::Client, account: &str) -> String {
    client
        .query_opt(
            "select versions from balance where account = $1",
            &[&account],
        )
        .await
        .ok()
        .flatten()
        .map_or_else(String::new, |r| r.get(0))
}

async fn versions_become(client: &tokio_postgres::Client, account: &str, expected: &str) {
    eventually(
        Duration::from_secs(60),
        &format!("{account} to have versions {expected}"),
        || async { versions(client, account).await == expected },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_versions_fill_the_gap_and_everything_applies_once_in_order() {
    let db = db("strictorder");
    let (_d, client) = Daemon::streaming(&db, &config(&db, "")).await;
    // v1, v3, v2, v4 in separate transactions: v3 waits for v2, then both apply.
    db.psql(&credit("a-1", 1, 10));
    versions_become(&client, "a-1", "1").await;
    db.psql(&credit("a-1", 3, 30));
    eventually(Duration::from_secs(30), "v3 to wait", || async {
        count(
            &client,
            "select count(*) from walfold.dead_letter where reason = 'version_gap' and status = 'waiting'",
        )
        .await
            == 1
    })
    .await;
    assert_eq!(
        versions(&client, "a-1").await,
        "1",
        "v3 must not apply before v2"
    );
    db.psql(&credit("a-1", 2, 20));
    db.psql(&credit("a-1", 4, 40));
    versions_become(&client, "a-1", "1,2,3,4").await;
    // A second event carrying an applied version, under a new ID: not applied, and an
    // open dead letter (a person tells a retry from a second delta); the rest goes on.
    db.psql(&credit("a-1", 2, 999));
    db.psql(&credit("a-1", 5, 50));
    versions_become(&client, "a-1", "1,2,3,4,5").await;
    assert_eq!(
        db.psql("select amount from balance where account = 'a-1'"),
        "150"
    );
    assert_eq!(
        db.psql(
            "select reason || ' ' || (raw->'payload'->>'amount') from walfold.dead_letter \
             where status in ('open', 'waiting')"
        ),
        "version_conflict 999"
    );
    assert_eq!(
        count(&client, "select count(*) from walfold.parked_aggregate").await,
        0
    );
    assert_eq!(
        db.psql(
            "select version from walfold.aggregate_version where subscriber_id = 'balance.v1' \
             and aggregate_id = 'a-1'"
        ),
        "5"
    );
    assert_eq!(
        db.psql("select dead_lettered from walfold.checkpoint where subscriber_id = 'balance.v1'"),
        "1",
        "the repeated version 2 is counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_that_never_fills_becomes_a_dead_letter_and_discarding_it_releases_the_rest() {
    let db = db("strictgap");
    let (d, client) = Daemon::streaming(&db, &config(&db, "")).await;
    db.psql(&format!(
        "{}{}{}{}",
        credit("a-1", 1, 1),
        credit("a-1", 3, 3),
        credit("a-1", 4, 4),
        credit("b-1", 1, 7)
    ));
    versions_become(&client, "b-1", "1").await;
    versions_become(&client, "a-1", "1").await;
    // After gap_timeout (3 s) the gap is an open dead letter that says what is missing.
    eventually(Duration::from_secs(30), "the gap's dead letter", || async {
        count(
            &client,
            "select count(*) from walfold.dead_letter where reason = 'version_gap' \
             and status = 'open' and seq is null and error like 'version 2 of account a-1 is missing%'",
        )
        .await
            == 1
    })
    .await;
    let (code, out, err) = walfold(
        &["dead-letters", "list", "--json", "-c", d.config_path()],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let letters: serde_json::Value = serde_json::from_str(&out).unwrap();
    let gap = letters
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["reason"] == "version_gap")
        .expect("the gap is listed as an open dead letter")
        .clone();
    // A retry while v2 is still missing changes nothing: the gap is open again.
    let id = gap["id"].as_i64().unwrap().to_string();
    let (code, _, err) = walfold(&["dead-letters", "retry", &id, "-c", d.config_path()], &[]);
    assert_eq!(code, 0, "{err}");
    eventually(Duration::from_secs(30), "the retried gap to reopen", || async {
        count(
            &client,
            &format!("select count(*) from walfold.dead_letter where id = {id} and status = 'open' and attempts = 1"),
        )
        .await
            == 1
    })
    .await;
    assert_eq!(versions(&client, "a-1").await, "1");
    // Discarding the gap gives up on v2: v3 and v4 apply, in order, and a-1 is released.
    let (code, _, err) = walfold(
        &[
            "dead-letters",
            "discard",
            &id,
            "--reason",
            "v2 was never written",
            "-c",
            d.config_path(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    versions_become(&client, "a-1", "1,3,4").await;
    eventually(Duration::from_secs(30), "a-1 to be released", || async {
        count(&client, "select count(*) from walfold.parked_aggregate").await == 0
    })
    .await;
    db.psql(&credit("a-1", 5, 5));
    versions_become(&client, "a-1", "1,3,4,5").await;
    assert_eq!(
        count(
            &client,
            "select count(*) from walfold.dead_letter where status in ('open', 'waiting', 'retrying')"
        )
        .await,
        0
    );
    // The operator's decision stands, with their reason.
    assert_eq!(
        db.psql(&format!(
            "select status || ': ' || resolution from walfold.dead_letter where id = {id}"
        )),
        "discarded: v2 was never written; its waiting versions applied without the missing ones"
    );
    // The missing version arrives after all: not applied, and not silently either.
    db.psql(&credit("a-1", 2, 2));
    eventually(Duration::from_secs(30), "the late version's dead letter", || async {
        count(
            &client,
            "select count(*) from walfold.dead_letter where reason = 'version_conflict' \
             and status = 'open' and error like 'version 2 of account a-1 came under a new event ID after the aggregate had applied through version 5%'",
        )
        .await
            == 1
    })
    .await;
    db.psql(&credit("a-1", 6, 6));
    versions_become(&client, "a-1", "1,3,4,5,6").await;
    let (code, out, _) = walfold(&["status", "-c", d.config_path()], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("dead letters open: 1"), "{out}");
}

/// Shuffled versions over many accounts, several per transaction and across
/// transactions, while the daemon is SIGKILLed at random moments: every version of
/// every account applies exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shuffled_versions_through_crashes_apply_once_in_order() {
    let db = db("strictcrash");
    let (mut d, client) = Daemon::streaming(&db, &config(&db, "parallelism = 2")).await;
    let mut rng = Rng::from_time();
    let accounts = 12;
    let per_account = 25i64;
    // Every (account, version) once, by version, then shuffled within windows of 36
    // (three versions of the 12 accounts): an account's versions arrive out of order,
    // across transactions, and each gap fills soon.
    let mut all: Vec<(usize, i64)> = (0..accounts)
        .flat_map(|a| (1..=per_account).map(move |v| (a, v)))
        .collect();
    all.sort_by_key(|&(a, v)| (v, a));
    for chunk in all.chunks_mut(36) {
        for i in (1..chunk.len()).rev() {
            chunk.swap(i, rng.below(i as u64 + 1) as usize);
        }
    }
    // The test is only worth something if versions arrive ahead of a missing one across
    // transactions: some account's v+1 is in an earlier transaction than its v.
    let txn_of = |a: usize, v: i64| all.iter().position(|&x| x == (a, v)).unwrap() / 3;
    assert!(
        (0..accounts).any(|a| (1..per_account).any(|v| txn_of(a, v + 1) < txn_of(a, v))),
        "the shuffle must reorder versions across transactions"
    );
    let writer = {
        let url = db.url();
        tokio::spawn(async move {
            let c = walfold_pg::connect(&url).await.unwrap();
            for chunk in all.chunks(3) {
                let sql: String = chunk
                    .iter()
                    .map(|&(a, v)| credit(&format!("acc-{a}"), v, v))
                    .collect();
                c.batch_execute(&format!("begin; {sql} commit;"))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        })
    };
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300 + rng.below(700))).await;
        d.kill_and_restart(None);
    }
    writer.await.unwrap();
    let expected: String = (1..=per_account)
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(",");
    for a in 0..accounts {
        versions_become(&client, &format!("acc-{a}"), &expected).await;
    }
    let total: i64 = (1..=per_account).sum::<i64>() * accounts as i64;
    assert_eq!(
        db.psql("select sum(amount) from balance"),
        total.to_string()
    );
    assert_eq!(
        count(
            &client,
            "select count(*) from walfold.dead_letter where status in ('open', 'waiting')"
        )
        .await,
        0
    );
}

/// A rebuild of a strict projection under a new subscriber replays the log and applies
/// every version in order again: the rebuilt table equals the live one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_of_a_strict_projection_gives_the_same_read_model() {
    let db = db("strictrebuild");
    let (d, client) = Daemon::streaming(&db, &config(&db, "")).await;
    let mut sql = String::new();
    for a in 0..5 {
        // Versions written 2, 1, 4, 3, 6, 5, … per account.
        for pair in 0..10 {
            let v = pair * 2 + 1;
            sql.push_str(&credit(&format!("r-{a}"), v + 1, v + 1));
            sql.push_str(&credit(&format!("r-{a}"), v, v));
        }
    }
    db.psql(&format!("begin; {sql} commit;"));
    let expected: String = (1..=20)
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(",");
    for a in 0..5 {
        versions_become(&client, &format!("r-{a}"), &expected).await;
    }
    let live = db.psql("select string_agg(account || '=' || amount || ':' || versions, ' ' order by account) from balance");
    let (code, _, err) = walfold(
        &[
            "rebuild",
            "balance",
            "--subscriber",
            "balance.v2",
            "-c",
            d.config_path(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    eventually(Duration::from_secs(60), "the switch-over", || async {
        count(
            &client,
            "select count(*) from walfold.rebuild where subscriber_id = 'balance.v2' and state = 'switched'",
        )
        .await
            == 1
    })
    .await;
    // The switch comes within 100 events of the head; the new subscriber, now live,
    // then reads the rest.
    let rebuilt = "select coalesce(string_agg(account || '=' || amount || ':' || versions, ' ' \
                   order by account), '') from balance";
    eventually(
        Duration::from_secs(30),
        "the rebuilt table to catch up",
        || async {
            client
                .query_one(rebuilt, &[])
                .await
                .is_ok_and(|r| r.get::<_, String>(0) == live)
        },
    )
    .await;
    assert_eq!(
        db.psql("select sum(stale) from walfold.checkpoint where subscriber_id = 'balance.v2'"),
        "0"
    );
}

/// A version whose data fails is dead-lettered and parks its aggregate; the versions
/// after it wait behind it, and a retry after the fix applies them all in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_version_parks_and_its_retry_applies_the_rest_in_order() {
    let db = db("strictretry");
    db.psql("alter table balance add constraint small check (amount < 1000)");
    let envs = [
        ("WALFOLD_PROJECTION__0__MAX_ATTEMPTS", "1"),
        ("WALFOLD_PROJECTION__0__RETRY_BACKOFF_MS", "10"),
    ];
    let d = Daemon::start(&config(&db, ""), &envs);
    let client = db.client().await;
    slot_active(&client).await;
    db.psql(&credit("a-1", 1, 1));
    versions_become(&client, "a-1", "1").await;
    db.psql(&credit("a-1", 3, 3));
    db.psql(&credit("a-1", 2, 5000));
    db.psql(&credit("a-1", 4, 4));
    eventually(Duration::from_secs(30), "v2 to be dead-lettered", || async {
        count(
            &client,
            "select count(*) from walfold.dead_letter where reason = 'projection_failed' and status = 'open'",
        )
        .await
            == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(versions(&client, "a-1").await, "1");
    db.psql("alter table balance drop constraint small");
    let (code, out, err) = walfold(
        &["dead-letters", "retry", "--all", "-c", d.config_path()],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    versions_become(&client, "a-1", "1,2,3,4").await;
    eventually(Duration::from_secs(30), "a-1 to be released", || async {
        count(&client, "select count(*) from walfold.parked_aggregate").await == 0
    })
    .await;
    db.psql(&credit("a-1", 5, 5));
    versions_become(&client, "a-1", "1,2,3,4,5").await;
}

/// What a strict projection must never skip silently: a version below `first_version`
/// of a new aggregate, and a version whose statement changed no row. Both are
/// dead-lettered with the reason (and park their aggregate), at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_before_the_first_or_without_effect_is_dead_lettered_not_skipped() {
    let db = db("strictskip");
    db.psql(
        "create table credit_only (account text primary key, amount numeric not null); \
         insert into credit_only values ('u-1', 0);",
    );
    let extra = r#"
[[projection]]
name = "update_only"
subscriber = "update.v1"
version_mode = "strict"
sql = "update credit_only set amount = amount + :payload.amount::numeric where account = :aggregate_id"
"#;
    let (_d, client) = Daemon::streaming(&db, &config(&db, extra)).await;
    // A producer counting from 0 with first_version = 1, and an account the update
    // statement has no row for.
    db.psql(&format!(
        "{}{}{}",
        credit("z-1", 0, 1000),
        credit("u-1", 1, 10),
        credit("v-1", 1, 100)
    ));
    eventually(Duration::from_secs(30), "both dead letters", || async {
        count(
            &client,
            "select count(*) from walfold.dead_letter where reason = 'projection_failed' \
             and status = 'open' and ((subscriber_id = 'balance.v1' and aggregate_id = 'z-1' \
             and error like '%below first_version = 1%') or (subscriber_id = 'update.v1' \
             and aggregate_id = 'v-1' and error like '%changed no row%'))",
        )
        .await
            == 2
    })
    .await;
    assert_eq!(
        db.psql("select amount from credit_only where account = 'u-1'"),
        "10"
    );
    assert_eq!(versions(&client, "u-1").await, "1");
    // Dead-lettered at once: a cause retrying cannot change is not retried.
    assert_eq!(
        count(
            &client,
            "select max(attempts)::int8 from walfold.dead_letter where reason = 'projection_failed'"
        )
        .await,
        1
    );
}

/// A strict projection that takes only some event types still counts the versions the
/// others carry: they advance the aggregate without being applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_types_a_strict_projection_does_not_take_still_advance_the_version() {
    let db = db("stricttypes");
    let text = config(&db, "").replace(
        "version_mode = \"strict\"",
        "version_mode = \"strict\"\nevent_types = [\"Credited\"]",
    );
    let (_d, client) = Daemon::streaming(&db, &text).await;
    db.psql(&format!(
        "{}{}{}",
        credit("t-1", 1, 10).replace("'Credited'", "'AccountOpened'"),
        credit("t-1", 2, 20),
        credit("t-1", 3, 30)
    ));
    versions_become(&client, "t-1", "2,3").await;
    db.psql(&credit("t-1", 4, 40).replace("'Credited'", "'AddressChanged'"));
    db.psql(&credit("t-1", 5, 50));
    versions_become(&client, "t-1", "2,3,5").await;
    assert_eq!(
        count(&client, "select count(*) from walfold.parked_aggregate").await,
        0
    );
}

/// A subscriber that applied events in guard mode does not know its versions: switching
/// it to strict is refused at start with the fix, never a wall of gaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_a_running_subscriber_to_strict_is_refused_with_the_fix() {
    let db = db("strictswitch");
    let guard = config(&db, "").replace("version_mode = \"strict\"\n", "");
    let (mut d, client) = Daemon::streaming(&db, &guard).await;
    db.psql(&credit("m-1", 1, 1));
    versions_become(&client, "m-1", "1").await;
    d.kill();
    // The version mode is part of the fold's definition: accepted here, so that what
    // refuses is the strict check (a changed definition alone is refused with exit 2,
    // tests/tests/e2e/definitions.rs).
    let strict = config(&db, "").replace(
        "version_mode = \"strict\"\n",
        "version_mode = \"strict\"\non_definition_change = \"accept\"\n",
    );
    std::fs::write(d.config_path(), strict).unwrap();
    d.kill_and_restart(None);
    assert_eq!(d.wait_exit("the refusal").await, Some(1));
    let log = d.log_text();
    assert!(
        log.contains("applied events in version_mode = \"guard\"")
            && log.contains("walfold rebuild balance --subscriber balance.v1.strict"),
        "{log}"
    );
}

/// After downtime longer than `gap_timeout`, a gap whose missing version is already in
/// the backlog is filled, not reported: gaps are judged only once the partition has
/// read to the head. And `retry --all` includes open gap letters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gaps_are_judged_after_the_backlog_and_retry_all_includes_them() {
    let db = db("strictdowntime");
    let (mut d, client) = Daemon::streaming(&db, &config(&db, "")).await;
    db.psql(&format!("{}{}", credit("q-1", 1, 1), credit("q-1", 3, 3)));
    versions_become(&client, "q-1", "1").await;
    d.terminate(Duration::from_secs(20));
    db.psql(&credit("q-1", 2, 2));
    tokio::time::sleep(Duration::from_secs(4)).await;
    d.kill_and_restart(None);
    versions_become(&client, "q-1", "1,2,3").await;
    assert_eq!(
        count(
            &client,
            "select count(*) from walfold.dead_letter where reason = 'version_gap' and seq is null"
        )
        .await,
        0,
        "no gap was reported: its version was in the backlog"
    );
    // A real gap, reported, then retried with --all: still missing, so open again.
    db.psql(&credit("q-1", 5, 5));
    eventually(Duration::from_secs(30), "the gap's dead letter", || async {
        count(
            &client,
            "select count(*) from walfold.dead_letter where reason = 'version_gap' and seq is null and status = 'open'",
        )
        .await
            == 1
    })
    .await;
    let (code, _, err) = walfold(
        &["dead-letters", "retry", "--all", "-c", d.config_path()],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    eventually(
        Duration::from_secs(30),
        "the retried gap to reopen",
        || async {
            count(
            &client,
            "select count(*) from walfold.dead_letter where reason = 'version_gap' and seq is null \
             and status = 'open' and attempts = 1",
        )
        .await
            == 1
        },
    )
    .await;
    db.psql(&credit("q-1", 4, 4));
    versions_become(&client, "q-1", "1,2,3,4,5").await;
    assert_eq!(
        count(
            &client,
            "select count(*) from walfold.dead_letter where status in ('open', 'waiting')"
        )
        .await,
        0
    );
}

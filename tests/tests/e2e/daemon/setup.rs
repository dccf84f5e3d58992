//! Configuration and setup errors, refused with the fix (a bad key, `wal_level`, a
//! missing outbox), and a least-privilege role over SCRAM and verified TLS.

use std::time::Duration;

use walfold_tempdb::{Cluster, Options};
use walfold_tests::{
    caught_up, config_for, eventually, walfold, write_config, write_events, Daemon, TestDb,
};

#[test]
fn bad_configuration_exits_2_and_names_the_key() {
    let good = config_for("postgresql://postgres@127.0.0.1:1/x", "");
    type Case<'a> = (String, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            good.replace("[source]", "[source]\ncolour = \"red\""),
            vec![],
            "colour",
        ),
        (
            good.replace("url = \"postgresql://postgres@127.0.0.1:1/x\"", ""),
            vec![],
            "url",
        ),
        (
            good.replace(":payload.note", ":paylod.note"),
            vec![],
            "projection[0].columns.note",
        ),
        (
            good.replace("parallelism = 2", "parallelism = 0"),
            vec![],
            "projection[1].parallelism",
        ),
        (
            good.clone(),
            vec![("WALFOLD_PROJECTION__9__NAME", "x")],
            "WALFOLD_PROJECTION__9__NAME",
        ),
        (
            good.clone(),
            vec![("WALFOLD_SOURCE__SLOT", "Not-A-Slot")],
            "source.slot",
        ),
        ("this is not toml".into(), vec![], "invalid config"),
    ];
    for (text, envs, key) in cases {
        let path = write_config(&text);
        let (code, _, stderr) = walfold(&["run", "-c", path.to_str().unwrap()], &envs);
        assert_eq!(code, 2, "expected exit 2 for {key}: {stderr}");
        assert!(
            stderr.contains(key),
            "stderr does not name {key}:\n{stderr}"
        );
    }
    let (code, _, stderr) = walfold(&["run", "-c", "/nonexistent/walfold.toml"], &[]);
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot read config file"), "{stderr}");
    let (code, _, _) = walfold(&["frobnicate"], &[]);
    assert_eq!(code, 2, "usage errors exit 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_level_replica_is_refused_with_the_fix() {
    let cluster: &'static Cluster = Box::leak(Box::new(
        Cluster::start(Options {
            extra_settings: vec![("wal_level".into(), "replica".into())],
            ..Options::default()
        })
        .expect("private cluster"),
    ));
    let db = TestDb::on(cluster, "replica");
    let mut d = Daemon::start(&db.config(""), &[]);
    d.wait_exit("the daemon to exit").await;
    assert_eq!(d.exited().unwrap().code(), Some(1));
    assert!(
        d.log_text().contains("set wal_level=logical"),
        "{}",
        d.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_outbox_table_is_refused_with_the_fix() {
    let db = TestDb::new("nooutbox");
    db.psql("drop table outbox");
    let mut d = Daemon::start(&db.config(""), &[]);
    d.wait_exit("the daemon to exit").await;
    assert_eq!(d.exited().unwrap().code(), Some(1));
    let log = d.log_text();
    assert!(
        log.contains("outbox table public.outbox does not exist"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_and_verified_tls_with_a_least_privilege_role() {
    let db = TestDb::new("scram");
    let cluster = db.cluster;
    let ca = cluster
        .ca_cert()
        .expect("tls cluster")
        .display()
        .to_string();
    db.psql(&format!(
        "grant create on database {} to walfold_scram; \
         alter table outbox owner to walfold_scram; alter table order_state owner to walfold_scram; \
         alter table order_total owner to walfold_scram; alter table ledger owner to walfold_scram;",
        db.name
    ));
    let url = format!(
        "postgresql://walfold_scram:walfold-secret@localhost:{}/{}?sslmode=verify-full&sslrootcert={ca}",
        cluster.port(),
        db.name
    );
    let (_d, client) = Daemon::streaming(&db, &config_for(&url, "")).await;
    // Every walfold connection is TLS and SCRAM-authenticated as the limited role.
    let sql = "select count(*), coalesce(bool_and(s.ssl), false) from pg_stat_activity a \
               join pg_stat_ssl s using (pid) where a.usename = 'walfold_scram'";
    eventually(Duration::from_secs(30), "walfold's connections", || async {
        client
            .query_one(sql, &[])
            .await
            .is_ok_and(|r| r.get::<_, i64>(0) >= 4)
    })
    .await;
    let row = client.query_one(sql, &[]).await.unwrap();
    assert!(row.get::<_, bool>(1), "a connection without TLS");
    let expected = write_events(db.url(), 5, 10, 3, Duration::from_millis(5), 19).await;
    caught_up(&client, expected.distinct(), 3).await;
    expected.check(&client).await;
}

/// Found on call: migrations but the claims one set no `lock_timeout`, so a migration
/// behind a long application transaction waited forever, holding every later session of
/// the table in the lock queue. Each migration gives up after 10 s and names the
/// session in the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_behind_a_long_transaction_gives_up_naming_it() {
    let db = TestDb::new("migrate_blocked");
    let schema = walfold_store::Schema::new("walfold");
    walfold_store::migrate(&db.url(), &schema).await.unwrap();
    // As before the last migration that alters ingest_position was applied.
    db.psql(
        "alter table walfold.ingest_position drop column publication_signature, \
         drop column publication_checked_at; \
         delete from walfold._sqlx_migrations where version = 20261207100300",
    );
    let holder = db.client().await;
    holder
        .batch_execute("begin; lock table walfold.ingest_position in access share mode")
        .await
        .unwrap();
    let pid: i32 = holder
        .query_one("select pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let path = write_config(&db.config(""));
    let started = std::time::Instant::now();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        walfold(&["migrate", "-c", path.to_str().unwrap()], &[])
    })
    .await
    .unwrap();
    let took = started.elapsed();
    assert_ne!(code, 0, "{out}{err}");
    assert!(took < Duration::from_secs(25), "took {took:?}");
    assert!(
        err.contains("waited 10s for a lock") && err.contains(&format!("pid {pid}")),
        "{err}"
    );
    holder.batch_execute("rollback").await.unwrap();
    let path = write_config(&db.config(""));
    let (code, out, err) = walfold(&["migrate", "-c", path.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}{err}");
}

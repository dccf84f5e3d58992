//! `sslmode=verify-full` against a server whose certificate is self-signed (as `openssl
//! req -x509` makes it: a CA) and given as `sslrootcert`, as psql accepts it: every
//! connection the daemon opens (migrations, SQL, replication) verifies; another name, or
//! another certificate as the root, is still refused.

use std::path::Path;
use std::time::Duration;

use walfold_tempdb::{Cluster, Options};
use walfold_tests::{caught_up, config_for, write_events, Daemon, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_trusts_a_self_signed_certificate_given_as_its_root() {
    let cluster: &'static Cluster = Box::leak(Box::new(
        Cluster::start(Options {
            tls: true,
            ..Options::default()
        })
        .expect("private cluster"),
    ));
    let cert = cluster
        .serve_self_signed_cert("localhost")
        .expect("a self-signed certificate");
    let db = TestDb::on(cluster, "selfsigned");
    let url = |mode: &str, root: &Path| {
        format!(
            "postgresql://postgres@localhost:{}/{}?sslmode={mode}&sslrootcert={}",
            cluster.port(),
            db.name,
            root.display()
        )
    };

    let client = walfold_pg::connect(&url("verify-full", &cert))
        .await
        .expect("verify-full with the server's own certificate as root");
    let row = client
        .query_one(
            "select ssl from pg_stat_ssl where pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));

    // The daemon: migrations, SQL sessions and the replication session.
    let (mut daemon, client) =
        Daemon::streaming(&db, &config_for(&url("verify-full", &cert), "")).await;
    let expected = write_events(db.url(), 3, 5, 3, Duration::from_millis(5), 7).await;
    caught_up(&client, expected.distinct(), 3).await;
    expected.check(&client).await;
    let walsender_ssl = client
        .query_one(
            "select coalesce(bool_and(s.ssl), false) from pg_stat_activity a join pg_stat_ssl s \
             using (pid) where a.backend_type = 'walsender' and a.datname = current_database()",
            &[],
        )
        .await
        .unwrap();
    assert!(walsender_ssl.get::<_, bool>(0), "replication without TLS");
    assert_eq!(daemon.terminate(Duration::from_secs(30)), Some(0));

    // Another self-signed certificate for the same name is no root for this one.
    let (other, _) = walfold_tempdb::self_signed_cert(cluster.socket_dir(), "localhost", &[])
        .expect("another self-signed certificate");
    let refused = walfold_pg::connect(&url("verify-full", &other))
        .await
        .expect_err("verify-full with another certificate as root");
    assert!(refused.to_string().contains("certificate"), "{refused}");

    // A self-signed certificate for another name: the name is still checked.
    let elsewhere = cluster
        .serve_self_signed_cert("db.example")
        .expect("a self-signed certificate for another name");
    let refused = walfold_pg::connect(&url("verify-full", &elsewhere))
        .await
        .expect_err("verify-full with a certificate for another name");
    assert!(
        refused.to_string().contains("not valid for name"),
        "{refused}"
    );
    walfold_pg::connect(&url("verify-ca", &elsewhere))
        .await
        .expect("verify-ca does not check the name");
    walfold_pg::connect(&url("verify-full", &cert))
        .await
        .expect_err("the first certificate is not the server's any more");
}

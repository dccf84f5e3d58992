//! Passwords never reach an operator's screen or the daemon's log: in every form a
//! connection string carries one (user info, `password` and `sslpassword` parameters, a
//! URL-encoded key, several hosts, libpq's key=value), `doctor`, `status`, `init` and
//! `walfold run` print the URL masked, whether the server is down or refuses the password.

use std::time::{Duration, Instant};

use walfold_tempdb::{Cluster, SCRAM_USER};
use walfold_tests::{config_for, free_port, walfold, write_config, Daemon};

const SECRET: &str = "Wf-s3cret-9q";

/// Every URL form of a password walfold.toml accepts, for `host` (`127.0.0.1:PORT`).
fn url_forms(host: &str) -> Vec<String> {
    let u = SCRAM_USER;
    vec![
        format!("postgresql://{u}:{SECRET}@{host}/postgres"),
        format!("postgres://{u}:{SECRET}@{host}/postgres?sslmode=disable"),
        format!("postgresql://{u}@{host}/postgres?password={SECRET}"),
        format!(
            "postgresql://{u}@{host}/postgres?sslmode=prefer&password={SECRET}&connect_timeout=5"
        ),
        format!("postgresql://{u}@{host}/postgres?%70assword={SECRET}"),
        format!("postgresql://{u}@{host}/postgres?sslpassword={SECRET}"),
        format!("postgresql://{u}:{SECRET}@{host},{host}/postgres?target_session_attrs=any"),
    ]
}

/// `text` shows `url` masked (so it did show it) and never the password.
fn assert_masked(what: &str, url: &str, text: &str) {
    assert!(
        !text.contains(SECRET) && !text.contains("s3cret"),
        "{what} shows the password of {url}:\n{text}"
    );
    assert!(
        text.contains("***"),
        "{what} does not show {url}, masked or not:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_are_masked_by_doctor_status_init_and_the_daemon() {
    let cluster = Cluster::shared();
    // A server that refuses the password (SCRAM over TCP), and a port nobody listens on.
    let servers = [
        ("a wrong password", format!("127.0.0.1:{}", cluster.port())),
        (
            "an unreachable server",
            format!("127.0.0.1:{}", free_port()),
        ),
    ];
    for (server, host) in &servers {
        for url in url_forms(host) {
            let config = write_config(&config_for(&url, ""));
            let config = config.to_str().unwrap();
            for command in [&["doctor", "-c", config][..], &["status", "-c", config]] {
                let (code, out, err) = walfold(command, &[]);
                assert_ne!(code, 0, "{command:?} with {server}");
                assert_masked(
                    &format!("`walfold {}` with {server}", command[0]),
                    &url,
                    &format!("{out}{err}"),
                );
            }
            let (code, out, err) = walfold(&["init", "--url", &url, "-o", "-"], &[]);
            assert_ne!(code, 0, "init with {server}");
            assert_masked(
                &format!("`walfold init` with {server}"),
                &url,
                &format!("{out}{err}"),
            );
        }
    }
    for (server, host) in &servers {
        for url in url_forms(host) {
            let daemon = Daemon::start(&config_for(&url, ""), &[]);
            let start = Instant::now();
            let (log, line) = loop {
                let log = daemon.log_text();
                let line = log
                    .lines()
                    .find(|l| {
                        l.contains("cannot connect to")
                            || l.contains("invalid database url")
                            // `sslpassword`: refused at load, naming the key.
                            || l.contains("is not a connection key")
                    })
                    .map(str::to_owned);
                if let Some(line) = line {
                    break (log, line);
                }
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "the daemon did not report {server} with its URL for {url}:\n{log}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            assert_masked(&format!("the daemon's error with {server}"), &url, &line);
            assert_masked(&format!("the daemon's log with {server}"), &url, &log);
        }
    }
    // libpq's key=value form: `init --url` takes it, and a wrong password or a server
    // that is down never shows it; a key walfold does not take is refused (exit 2)
    // without showing it either.
    for conninfo in [
        format!(
            "host=127.0.0.1 port={} user={SCRAM_USER} password={SECRET} dbname=postgres",
            cluster.port()
        ),
        format!(
            "host=127.0.0.1 port={} password = '{SECRET} x' sslmode=disable",
            free_port()
        ),
    ] {
        let (code, out, err) = walfold(&["init", "--url", &conninfo, "-o", "-"], &[]);
        assert_eq!(code, 1, "{out}{err}");
        assert_masked(
            "`walfold init` with key=value pairs",
            &conninfo,
            &format!("{out}{err}"),
        );
    }
    let (code, out, err) = walfold(
        &[
            "init",
            "--url",
            &format!("host=127.0.0.1 port=1 service=x password={SECRET}"),
            "-o",
            "-",
        ],
        &[],
    );
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("`service` is not a connection key"), "{err}");
    assert!(!format!("{out}{err}").contains(SECRET), "{out}{err}");
}

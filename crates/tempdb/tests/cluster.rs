//! End-to-end tests against real throwaway clusters (need PostgreSQL binaries and openssl).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use walfold_tempdb::{Cluster, Options, SCRAM_PASSWORD, SCRAM_USER};

const ORPHAN_ENV: &str = "WALFOLD_TEMPDB_ORPHAN_CHILD";
const ORPHAN_MARK: &str = "walfold-orphan-cluster";

/// Runs psql with a libpq connection string as the current OS user.
fn psql_conninfo(cluster: &Cluster, conninfo: &str, password: Option<&str>) -> Output {
    let mut cmd = Command::new(cluster.bin_dir().join("psql"));
    cmd.args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", conninfo, "-c"])
        .arg("select current_user, coalesce((select ssl from pg_stat_ssl where pid = pg_backend_pid()), false)")
        .env_remove("PGPASSWORD")
        .env_remove("PGSSLMODE")
        .env("PGCONNECT_TIMEOUT", "10");
    if let Some(password) = password {
        cmd.env("PGPASSWORD", password);
    }
    cmd.output().expect("run psql")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "psql failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name; zombies count as gone.
        Ok(stat) => {
            !matches!(stat.rsplit(')').next().map(str::trim_start), Some(s) if s.starts_with('Z') || s.starts_with('X'))
        }
        Err(_) => false,
    }
}

fn wait_until_gone(pid: u32, dir: &Path, within: Duration) {
    let deadline = Instant::now() + within;
    while process_alive(pid) || dir.exists() {
        assert!(
            Instant::now() < deadline,
            "after {within:?}: postmaster {pid} alive: {}, {} exists: {}",
            process_alive(pid),
            dir.display(),
            dir.exists()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn shared_cluster_is_logical_and_creates_databases() {
    let cluster = Cluster::shared();
    let a = cluster.create_database("tempdb_test").unwrap();
    let b = cluster.create_database("tempdb_test").unwrap();
    assert_ne!(a, b);
    assert!(a.starts_with("tempdb_test_"));
    for db in [&a, &b] {
        assert_eq!(cluster.psql(db, "show wal_level").unwrap(), "logical\n");
        assert_eq!(
            cluster
                .psql(db, "select current_database()")
                .unwrap()
                .trim(),
            db.as_str()
        );
    }
    let settings = cluster
        .psql(&a, "select setting from pg_settings where name in ('max_replication_slots', 'max_wal_senders', 'max_connections', 'fsync', 'listen_addresses') order by name")
        .unwrap();
    assert_eq!(settings, "off\n127.0.0.1\n200\n64\n64\n");
    assert_eq!(
        cluster.url(&a),
        format!("postgresql://postgres@127.0.0.1:{}/{a}", cluster.port())
    );
    assert!(cluster
        .socket_dir()
        .join(format!(".s.PGSQL.{}", cluster.port()))
        .exists());
    assert!(cluster.data_dir().starts_with(cluster.socket_dir()));
    assert!(cluster.bin_dir().join("initdb").is_file());
}

#[test]
fn psql_reports_sql_errors() {
    let cluster = Cluster::shared();
    let err = cluster
        .psql("postgres", "select 1; select nope;")
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("psql on database \"postgres\" failed"),
        "{msg}"
    );
    assert!(msg.contains("nope"), "{msg}");
    let multi = cluster
        .psql("postgres", "create temp table t (a int, b text); insert into t values (1, 'x'), (2, 'y'); select * from t order by a;")
        .unwrap();
    assert_eq!(multi, "1|x\n2|y\n");
}

#[test]
fn scram_role_needs_its_password_over_tcp() {
    let cluster = Cluster::shared();
    let conninfo = format!(
        "host=127.0.0.1 port={} user={SCRAM_USER} dbname=postgres sslmode=disable",
        cluster.port()
    );
    let ok = psql_conninfo(cluster, &conninfo, Some(SCRAM_PASSWORD));
    assert_eq!(stdout(&ok), "walfold_scram|f");
    let wrong = psql_conninfo(cluster, &conninfo, Some("not-the-password"));
    assert!(!wrong.status.success());
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
    let stored = cluster
        .psql("postgres", "select rolpassword like 'SCRAM-SHA-256$%' from pg_authid where rolname = 'walfold_scram'")
        .unwrap();
    assert_eq!(stored, "t\n");
}

#[test]
fn shared_cluster_speaks_tls() {
    let cluster = Cluster::shared();
    let port = cluster.port();
    let ca = cluster.ca_cert().expect("shared cluster has tls");
    assert!(ca.is_file());
    let require =
        format!("sslmode=require host=127.0.0.1 port={port} user=postgres dbname=postgres");
    assert_eq!(
        stdout(&psql_conninfo(cluster, &require, None)),
        "postgres|t"
    );
    for host in ["host=localhost hostaddr=127.0.0.1", "host=127.0.0.1"] {
        let verify = format!(
            "sslmode=verify-full sslrootcert={} {host} port={port} user={SCRAM_USER} dbname=postgres",
            ca.display()
        );
        let out = psql_conninfo(cluster, &verify, Some(SCRAM_PASSWORD));
        assert_eq!(stdout(&out), "walfold_scram|t", "{verify}");
    }
}

#[test]
fn restart_stop_start_and_drop() {
    let opts = Options {
        tls: false,
        extra_settings: vec![("work_mem".into(), "7MB".into())],
        ..Options::default()
    };
    let cluster = Cluster::start(opts).unwrap();
    assert!(cluster.ca_cert().is_none());
    let db = cluster.create_database("lifecycle").unwrap();
    cluster
        .psql(
            &db,
            "create table t (id int primary key); insert into t values (1);",
        )
        .unwrap();
    assert_eq!(cluster.psql(&db, "show work_mem").unwrap(), "7MB\n");
    let require = format!(
        "sslmode=require host=127.0.0.1 port={} user=postgres dbname=postgres",
        cluster.port()
    );
    assert!(!psql_conninfo(&cluster, &require, None).status.success());

    let before = cluster.postmaster_pid().unwrap();
    cluster.restart("immediate").unwrap();
    let after = cluster.postmaster_pid().unwrap();
    assert_ne!(before, after);
    assert_eq!(cluster.psql(&db, "select count(*) from t").unwrap(), "1\n");
    cluster.restart("fast").unwrap();
    assert_eq!(cluster.psql(&db, "show wal_level").unwrap(), "logical\n");

    cluster.stop("fast").unwrap();
    assert!(cluster.postmaster_pid().is_none());
    assert!(matches!(
        cluster.psql(&db, "select 1"),
        Err(walfold_tempdb::Error::Sql { .. })
    ));
    cluster.start_again().unwrap();
    assert_eq!(cluster.psql(&db, "select count(*) from t").unwrap(), "1\n");
    assert!(matches!(
        cluster.restart("slow"),
        Err(walfold_tempdb::Error::InvalidMode(_))
    ));
    assert!(cluster.log_file().is_file());

    let pid = cluster.postmaster_pid().unwrap();
    let dir: PathBuf = cluster.socket_dir().to_owned();
    drop(cluster);
    wait_until_gone(pid, &dir, Duration::from_secs(10));
}

/// Not a test by itself: the process `orphaned_cluster_is_cleaned_up_after_sigkill` starts
/// and kills. Does nothing unless `WALFOLD_TEMPDB_ORPHAN_CHILD` is set.
#[test]
#[ignore = "helper process for orphaned_cluster_is_cleaned_up_after_sigkill"]
fn orphan_child_helper() {
    if std::env::var_os(ORPHAN_ENV).is_none() {
        return;
    }
    let cluster = Cluster::start(Options::default()).unwrap();
    let pid = cluster.postmaster_pid().unwrap();
    println!("\n{ORPHAN_MARK} {pid} {}", cluster.data_dir().display());
    // Live until killed, or until the parent test goes away (stdin closes).
    let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
}

#[test]
fn orphaned_cluster_is_cleaned_up_after_sigkill() {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "orphan_child_helper",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ORPHAN_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let reader = BufReader::new(child.stdout.take().unwrap());
    let line = reader
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.find(ORPHAN_MARK).map(|at| l[at..].to_owned()));
    let Some(line) = line else {
        let _ = child.kill();
        panic!(
            "child exited without starting a cluster: {:?}",
            child.wait()
        );
    };
    let mut fields = line.split_whitespace().skip(1);
    let pid: u32 = fields.next().unwrap().parse().unwrap();
    let data_dir = PathBuf::from(fields.next().unwrap());
    let dir = data_dir.parent().unwrap().to_owned();
    assert!(process_alive(pid) && dir.exists());
    child.kill().unwrap(); // SIGKILL: no destructors run
    child.wait().unwrap();
    wait_until_gone(pid, &dir, Duration::from_secs(10));
}

#[test]
fn startup_failure_shows_the_server_log() {
    let opts = Options {
        tls: false,
        extra_settings: vec![("max_connections".into(), "lots".into())],
        ..Options::default()
    };
    let err = Cluster::start(opts).unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("postgresql server start failed"), "{msg}");
    assert!(msg.contains("server log tail:"), "{msg}");
    assert!(msg.contains("max_connections"), "{msg}");
}

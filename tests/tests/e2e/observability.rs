//! The observability pack (`deploy/observability/`) against a real Prometheus (Debian's
//! `prometheus` package, which `.ci/run` installs): the rules pass `promtool check rules`
//! and their unit tests (`promtool test rules`),
//! a live scrape passes `promtool check metrics`, and a Prometheus scraping a running
//! walfold every second evaluates every dashboard expression to at least one series and
//! fires the dead-letter and slot-inactive alerts for real.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use walfold_tests::{free_port, http_get, insert_event, walfold, Daemon, TestDb};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

fn rules_file() -> PathBuf {
    repo().join("deploy/observability/prometheus/walfold-alerts.yml")
}

fn dashboard_file() -> PathBuf {
    repo().join("deploy/observability/grafana/dashboards/walfold.json")
}

/// `prometheus` and `promtool` from PATH. Missing: the test is skipped with a message,
/// except in CI (`CI=true`), where `.ci/run` installs them and a missing one fails.
fn prometheus_bins() -> Option<(PathBuf, PathBuf)> {
    let find = |name: &str| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join(name))
                .find(|p| p.is_file())
        })
    };
    match (find("prometheus"), find("promtool")) {
        (Some(p), Some(t)) => Some((p, t)),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("prometheus/promtool not found in CI: .ci/run installs Debian's `prometheus` package")
        }
        _ => {
            eprintln!(
                "SKIPPED: prometheus and promtool are not installed (apt-get install prometheus); \
                 in CI this test fails instead"
            );
            None
        }
    }
}

#[test]
fn the_alert_rules_pass_promtool() {
    let Some((_, promtool)) = prometheus_bins() else {
        return;
    };
    let out = Command::new(&promtool)
        .arg("check")
        .arg("rules")
        .arg(rules_file())
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool check rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The rules' unit tests: each alert fires once its threshold and `for` are met, not
    // before, and the look-alikes stay quiet (synthetic series, promtool's evaluator).
    let out = Command::new(&promtool)
        .arg("test")
        .arg("rules")
        .arg(repo().join("deploy/observability/prometheus/walfold-alerts.test.yml"))
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every PromQL expression of the dashboard, with Grafana's variables as the dashboard
/// would send them (`$subscriber` = All = `.+`, `$__rate_interval` = 1m).
fn dashboard_expressions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(dashboard_file()).expect("read the dashboard");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(dash["uid"], "walfold");
    let mut out = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for panel in dash["panels"].as_array().expect("panels") {
        // What Grafana needs of each panel: a unique id, a place, and (for queries) the
        // data source variable.
        assert!(
            ids.insert(panel["id"].as_i64().expect("a panel id")),
            "duplicate panel id"
        );
        assert!(panel["gridPos"]["w"]
            .as_i64()
            .is_some_and(|w| (1..=24).contains(&w)));
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{}",
                panel["title"]
            );
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a target has an expr");
            let expr = expr
                .replace("$__rate_interval", "1m")
                .replace("$subscriber", ".+");
            assert!(!expr.contains('$'), "unknown variable in {expr}");
            out.push((panel["title"].as_str().unwrap_or("?").to_owned(), expr));
        }
    }
    assert!(
        out.len() >= 20,
        "the dashboard has {} expressions",
        out.len()
    );
    out
}

/// A Prometheus on a loopback port with a temp data dir, killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    fn start(bin: &Path, scrape_port: u16) -> Prometheus {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("walfold-prom-{}-{port}", std::process::id()));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: walfold\n    static_configs:\n      - targets: ['127.0.0.1:{scrape_port}']\n",
            rules = rules_file().display()
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        Prometheus { child, port, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// The result vector of an instant query.
    fn query(&self, expr: &str) -> Vec<serde_json::Value> {
        let (status, body) = get(self.port, &format!("/api/v1/query?query={}", encode(expr)));
        assert_eq!(status, 200, "query {expr}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("prometheus answers JSON");
        assert_eq!(v["status"], "success", "{expr}: {body}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    fn firing(&self, alert: &str) -> bool {
        !self
            .query(&format!(
                "ALERTS{{alertname=\"{alert}\", alertstate=\"firing\"}}"
            ))
            .is_empty()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A GET whose body may come chunked (Prometheus streams larger answers).
fn get(port: u16, path: &str) -> (u16, String) {
    let (status, body) = http_get(port, path);
    (status, dechunk(&body))
}

fn dechunk(body: &str) -> String {
    // A chunked body starts with a hex size line; a JSON body starts with `{`.
    if body.starts_with('{') || body.is_empty() {
        return body.to_owned();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn wait_for(timeout: Duration, what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    loop {
        match check() {
            Ok(()) => return,
            Err(why) if start.elapsed() > timeout => {
                panic!("timed out after {timeout:?} waiting for {what}: {why}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_sees_every_dashboard_series_and_fires_the_alerts() {
    let Some((prometheus, promtool)) = prometheus_bins() else {
        return;
    };
    let expressions = dashboard_expressions();
    let db = TestDb::new("observability");
    db.psql(
        "create table pause_model (order_id text primary key, note text, version bigint not null)",
    );
    let metrics_port = free_port();
    let config = db.config(&format!(
        r#"
[[projection]]
name = "pause_model"
subscriber = "orders.pause.v1"
table = "public.pause_model"
key = "order_id"
version_column = "version"
columns = {{ note = ":payload.note" }}

[metrics]
listen = "127.0.0.1:{metrics_port}"
"#
    ));
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    let prom = Prometheus::start(&prometheus, metrics_port);
    wait_for(
        Duration::from_secs(30),
        "prometheus to be ready",
        || match http_get(prom.port, "/-/ready").0 {
            200 => Ok(()),
            s => Err(format!("status {s}\n{}", prom.log())),
        },
    )
    .await;

    // Before anything is set aside: scraped, and no dead-letter alert.
    wait_for(Duration::from_secs(30), "a first scrape", || {
        match prom.query("walfold_dead_letters_open == 0").len() {
            1 => Ok(()),
            n => Err(format!("{n} series")),
        }
    })
    .await;
    assert!(prom
        .query("ALERTS{alertname=\"WalfoldDeadLetters\"}")
        .is_empty());

    // A malformed row (a null ID) alone fires the dead-letter alert.
    db.psql(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         values (null, 'order', 'o-2', 'OrderPlaced', 1, '{}')",
    );
    wait_for(
        Duration::from_secs(60),
        "WalfoldDeadLetters to fire",
        || {
            if prom.firing("WalfoldDeadLetters") {
                Ok(())
            } else {
                Err(format!("{:?}", prom.query("ALERTS")))
            }
        },
    )
    .await;
    assert_eq!(
        db.psql("select string_agg(reason, ',') from walfold.dead_letter"),
        "malformed",
        "the malformed row is the only dead letter"
    );

    // What every other panel shows: applied and stale events, a producer retry, a
    // projection failing on an event's data (dead letter, parked aggregate), a paused
    // projection and a rebuild.
    let id = |n: u32| format!("00000000-0000-4000-8000-{n:012}");
    db.psql(
        &[
            insert_event(
                &id(1),
                "o-1",
                "OrderPlaced",
                1,
                r#"{"status": "placed", "amount": "10"}"#,
            ),
            insert_event(
                &id(2),
                "o-1",
                "OrderPaid",
                2,
                r#"{"status": "paid", "amount": "10"}"#,
            ),
            insert_event(
                &id(2),
                "o-1",
                "OrderPaid",
                2,
                r#"{"status": "paid", "amount": "10"}"#,
            ),
            insert_event(
                &id(3),
                "o-1",
                "OrderPlaced",
                1,
                r#"{"status": "late", "amount": "0"}"#,
            ),
            insert_event(
                &id(4),
                "o-bad",
                "OrderPlaced",
                1,
                r#"{"status": "placed", "amount": "not a number"}"#,
            ),
        ]
        .concat(),
    );
    walfold_tests::caught_up(&client, 4, 4).await;
    db.psql("alter table pause_model rename column note to remark");
    db.psql(&insert_event(
        &id(5),
        "o-3",
        "OrderPlaced",
        1,
        r#"{"status": "placed", "amount": "1", "note": "n"}"#,
    ));
    let (code, out, err) = walfold(
        &[
            "rebuild",
            "order_state",
            "--subscriber",
            "orders.state.v2",
            "-c",
            d.config_path(),
        ],
        &[],
    );
    assert_eq!(code, 0, "rebuild: {out}{err}");

    // The scrape walfold serves is valid exposition format.
    let (status, scrape) = http_get(metrics_port, "/metrics");
    assert_eq!(status, 200);
    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    std::io::Write::write_all(&mut check.stdin.take().unwrap(), scrape.as_bytes()).unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics on a live scrape:\n{}{}\n{scrape}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    // Every dashboard expression returns at least one series.
    wait_for(
        Duration::from_secs(90),
        "every dashboard expression to return a series",
        || {
            let empty: Vec<String> = expressions
                .iter()
                .filter(|(_, expr)| prom.query(expr).is_empty())
                .map(|(panel, expr)| format!("{panel}: {expr}"))
                .collect();
            if empty.is_empty() {
                Ok(())
            } else {
                Err(format!("no series for\n  {}", empty.join("\n  ")))
            }
        },
    )
    .await;
    eprintln!(
        "prometheus: all {} dashboard expressions return series",
        expressions.len()
    );

    // The failed event parks its aggregate; the slot-inactive alert stays quiet with the
    // daemon streaming.
    wait_for(
        Duration::from_secs(30),
        "WalfoldParkedAggregates to fire",
        || {
            if prom.firing("WalfoldParkedAggregates") {
                Ok(())
            } else {
                Err(format!("{:?}", prom.query("ALERTS")))
            }
        },
    )
    .await;
    assert!(!prom.firing("WalfoldSlotInactive"));
    assert!(
        prom.query("ALERTS{alertname=\"WalfoldSlotInactive\"}")
            .is_empty(),
        "slot-inactive is not even pending while the daemon streams"
    );

    // Stop the daemon: nobody streams the slot; after its `for: 1m` the alert fires.
    assert_eq!(
        d.terminate(Duration::from_secs(30)),
        Some(0),
        "{}",
        d.log_text()
    );
    let stopped = Instant::now();
    wait_for(
        Duration::from_secs(120),
        "WalfoldSlotInactive to fire",
        || {
            if prom.firing("WalfoldSlotInactive") {
                Ok(())
            } else {
                Err(format!("{:?}", prom.query("ALERTS")))
            }
        },
    )
    .await;
    let after = stopped.elapsed();
    assert!(
        after >= Duration::from_secs(59),
        "fired after {after:?}, before its `for`"
    );
    eprintln!("prometheus: WalfoldSlotInactive fired {after:?} after the daemon stopped");
}

//! Three `walfold run` processes on one config share 10 projections × 4 partitions under a
//! steady producer: the share of the events each instance applied, then the handover
//! time (until every unit has a live owner again) over repeated SIGKILLs and SIGSTOPs,
//! each followed by the instance's return. The bound it is judged against is the one
//! walfold states: `[cluster] lease_s` + 3 s for a frozen instance; a killed one's sessions
//! end at once, so about 3 s.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use walfold_tempdb::Cluster;

use super::Line;
use crate::setup::{self, BoxError};

const DB: &str = "handover";
const PROJECTIONS: usize = 10;
const PARTITIONS: u32 = 4;
const UNITS: usize = PROJECTIONS * PARTITIONS as usize;
const LEASE_S: u64 = 10;

struct Instance {
    child: Child,
    port: u16,
}

fn config_text(cluster: &Cluster) -> String {
    let mut text = format!(
        "[source]\nurl = \"{}?sslmode=disable\"\n\n[[outbox]]\ntable = \"public.outbox\"\n\n\
         [log]\nlevel = \"warn\"\n\n[retention]\nprune_interval_s = 0\n",
        cluster.url(DB)
    );
    for i in 0..PROJECTIONS {
        text.push_str(&format!(
            "\n[[projection]]\nname = \"p{i}\"\nsubscriber = \"p{i}.v1\"\nparallelism = {PARTITIONS}\n\
             sql = \"insert into total as t (projection, order_id, amount) values ('p{i}', :aggregate_id, \
             coalesce(:payload.amount::numeric, 0)) on conflict (projection, order_id) do update \
             set amount = t.amount + excluded.amount\"\n"
        ));
    }
    text
}

fn walfold_bin() -> Result<std::path::PathBuf, BoxError> {
    let bin = std::env::current_exe()?
        .parent()
        .ok_or("no directory")?
        .join("walfold");
    if !bin.exists() {
        return Err(format!(
            "{} not found: build it beside the bench (cargo build --release -p walfold -p walfold-bench)",
            bin.display()
        )
        .into());
    }
    Ok(bin)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

fn spawn(config: &std::path::Path) -> Result<Instance, BoxError> {
    let port = free_port();
    let child = Command::new(walfold_bin()?)
        .args(["run", "-c", config.to_str().ok_or("path")?])
        .env("WALFOLD_METRICS__LISTEN", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(Instance { child, port })
}

fn signal(i: &Instance, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &i.child.id().to_string()])
        .status();
}

/// Events this instance applied since it started (`walfold_applied_total`, summed).
async fn applied(port: u16) -> f64 {
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return 0.0;
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await;
    let mut body = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut body)).await;
    body.lines()
        .filter(|l| l.starts_with("walfold_applied_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The live owners: instances whose heartbeat is recent and whose process runs.
async fn owners_ok(client: &tokio_postgres::Client, gone: i32) -> Result<(bool, usize), BoxError> {
    let row = client
        .query_one(
            "select count(*) filter (where not u.held and u.owner is not null \
               and i.pid <> $1 and i.heartbeat_at > now() - interval '3 s'), \
             count(distinct u.owner) filter (where i.pid <> $1) \
             from walfold.work_unit u left join walfold.instance i on i.id = u.owner",
            &[&gone],
        )
        .await?;
    let owned: i64 = row.try_get(0)?;
    let owners: i64 = row.try_get(1)?;
    Ok((owned as usize == UNITS, owners as usize))
}

/// Waits until every unit has a live owner other than the instance of pid `gone`; the
/// time it took.
async fn handed_over(client: &tokio_postgres::Client, gone: i32) -> Result<Duration, BoxError> {
    let start = Instant::now();
    loop {
        if owners_ok(client, gone).await?.0 {
            return Ok(start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(120) {
            return Err("units without a live owner after 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the units are spread over three owners again.
async fn settled(client: &tokio_postgres::Client) -> Result<(), BoxError> {
    let start = Instant::now();
    while owners_ok(client, 0).await? != (true, 3) {
        if start.elapsed() > Duration::from_secs(120) {
            return Err("the units did not spread over three instances again".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

fn median_max(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let secs = |d: Duration| d.as_secs_f64();
    (
        secs(v[v.len() / 2]),
        secs(*v.last().unwrap_or(&Duration::ZERO)),
    )
}

pub(super) async fn handover(
    cluster: &'static Cluster,
    rounds: usize,
    lines: &mut Vec<Line>,
) -> Result<(), BoxError> {
    setup::create_db(cluster, DB)?;
    cluster.psql(
        DB,
        "create table total (projection text, order_id text, amount numeric, \
           primary key (projection, order_id))",
    )?;
    let dir = std::env::temp_dir().join(format!("walfold-bench-handover-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("walfold.toml");
    std::fs::write(&config, config_text(cluster))?;
    let client = walfold_pg::connect(&format!("{}?sslmode=disable", cluster.url(DB))).await?;
    let mut instances = vec![spawn(&config)?];
    tokio::time::sleep(Duration::from_secs(2)).await;
    instances.push(spawn(&config)?);
    instances.push(spawn(&config)?);
    settled(&client).await?;

    // A steady producer: about 300 single-event transactions a second.
    let producer = {
        let url = format!("{}?sslmode=disable", cluster.url(DB));
        tokio::spawn(async move {
            let Ok(c) = walfold_pg::connect(&url).await else {
                return;
            };
            let mut n = 0u64;
            loop {
                let sql = format!(
                    "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
                     values (gen_random_uuid(), 'order', 'o-{}', 'Paid', {n}, '{{\"amount\": 1}}')",
                    n % 500
                );
                if c.batch_execute(&sql).await.is_err() {
                    return;
                }
                n += 1;
                tokio::time::sleep(Duration::from_micros(3300)).await;
            }
        })
    };

    // The share of the work: events each instance applied over 20 s.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut before = Vec::new();
    for i in &instances {
        before.push(applied(i.port).await);
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    let mut shares = Vec::new();
    for (i, b) in instances.iter().zip(&before) {
        shares.push(applied(i.port).await - b);
    }
    let total: f64 = shares.iter().sum();
    let shares: Vec<String> = shares
        .iter()
        .map(|s| format!("{:.0}%", 100.0 * s / total.max(1.0)))
        .collect();
    let most = shares.iter().max().cloned().unwrap_or_default();
    lines.push(Line {
        scenario: format!(
            "share of the events applied, 3 instances × {PROJECTIONS} projections × {PARTITIONS} partitions"
        ),
        walfold: shares.join(" / "),
        limit: "fair: 33% each, at most 60%".into(),
        ratio: format!("max {most}"),
        cpu: "-".into(),
        rss: "-".into(),
    });

    for (what, sig) in [("SIGKILL", "-KILL"), ("SIGSTOP", "-STOP")] {
        let mut took = Vec::new();
        for r in 0..rounds {
            let k = r % instances.len();
            let pid = instances[k].child.id() as i32;
            signal(&instances[k], sig);
            let t = handed_over(&client, pid).await?;
            eprintln!("handover after {what} {}: {t:?}", r + 1);
            took.push(t);
            if sig == "-STOP" {
                signal(&instances[k], "-CONT");
                // It finds itself silent past its lease and rejoins.
            } else {
                let _ = instances[k].child.wait();
                instances[k] = spawn(&config)?;
            }
            settled(&client).await?;
        }
        let (median, max) = median_max(took);
        let bound = if sig == "-STOP" {
            LEASE_S as f64 + 3.0
        } else {
            3.0
        };
        lines.push(Line {
            scenario: format!("handover after {what}, {rounds} times (lease_s = {LEASE_S})"),
            walfold: format!("median {median:.2} s, max {max:.2} s"),
            limit: format!("stated bound {bound:.0} s"),
            ratio: format!("{:.2}× the bound (max)", max / bound),
            cpu: "-".into(),
            rss: "-".into(),
        });
    }
    producer.abort();
    for mut i in instances {
        signal(&i, "-CONT");
        let _ = i.child.kill();
        let _ = i.child.wait();
    }
    Ok(())
}

//! Scenario 8: one backlog drained from one source, then split over two.

use std::time::Duration;

use walfold_config::Config;
use walfold_tempdb::Cluster;

use super::{blocking, connect, reset_peak_rss, start, wait_subscribers, Line};
use crate::measure::{rss_mib, Span};
use crate::setup::{self, BoxError};

/// The same backlog drained (event log and the two drain projections) once from one
/// source and once split over two sources (two databases, two slots, two readers and
/// appenders taking turns in one log): what the second source costs or gains.
pub(super) async fn several_sources(
    cluster: &'static Cluster,
    n: u64,
    lines: &mut Vec<Line>,
) -> Result<(), BoxError> {
    let half = n / 2;
    let n = half * 2;
    blocking(move || {
        for (db, rows) in [("src_one", n), ("src_a", half), ("src_b", half)] {
            setup::create_db(cluster, db)?;
            setup::create_slot(cluster, db, &format!("walfold_{db}"))?;
            setup::write_backlog(cluster, db, rows)?;
        }
        for db in ["tgt_one", "tgt_two"] {
            setup::create_db(cluster, db)?;
        }
        Ok(())
    })
    .await?;
    let url = |db: &str| format!("{}?sslmode=disable", cluster.url(db));
    let source = |name: &str, db: &str| {
        format!(
            "[[source]]\nname = \"{name}\"\nurl = \"{}\"\nslot = \"walfold_{db}\"\n\n\
             [[outbox]]\nsource = \"{name}\"\ntable = \"public.outbox\"\n\n",
            url(db)
        )
    };
    let mut rates = Vec::new();
    for (label, sources, target) in [
        ("one source", source("one", "src_one"), "tgt_one"),
        (
            "two sources",
            format!("{}{}", source("a", "src_a"), source("b", "src_b")),
            "tgt_two",
        ),
    ] {
        let text = format!(
            "{sources}[target]\nurl = \"{}\"\n\n[log]\nlevel = \"warn\"\n{}",
            url(target),
            setup::DRAIN_PROJECTIONS
        );
        let config = Config::from_toml(&text, Vec::<(String, String)>::new())?;
        let client = connect(cluster, target).await?;
        reset_peak_rss();
        let span = Span::start();
        let (cancel, task) = start(config);
        wait_subscribers(&client, n as i64, 2, Duration::from_secs(1800)).await?;
        let (wall, cpu, _) = span.stop();
        let (_, peak) = rss_mib();
        cancel.cancel();
        task.await??;
        eprintln!("{label}: {n} events drained in {wall:.1} s");
        rates.push(n as f64 / wall);
        lines.push(Line {
            scenario: format!("8. drain {n} events (log + 2 projections), {label}"),
            walfold: format!("{:.0} ev/s", n as f64 / wall),
            limit: if rates.len() == 1 {
                "the one-source drain of the same run".into()
            } else {
                format!("{:.0} ev/s (one source, same run)", rates[0])
            },
            ratio: if rates.len() == 1 {
                "1.00×".into()
            } else {
                format!("{:.2}×", rates[1] / rates[0])
            },
            cpu: format!("{cpu:.1}"),
            rss: format!("{peak:.0}"),
        });
    }
    Ok(())
}

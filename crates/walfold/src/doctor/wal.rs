//! Doctor's report of what the target server's WAL settings cost walfold: every event
//! appends to the log and claims once per subscriber, each a random place in a large
//! index; after each checkpoint the first change of a page writes its full 8 kB image
//! to WAL. Informational: a warning at most, never a failure (docs/BENCHMARKS.md has the
//! measured effect).

use tokio_postgres::Client;
use walfold_store::target_shape::{self, Checkpoints, WalSettings};
use walfold_store::{Schema, StoreError};

use super::finding::Finding;

/// Reports `target`'s WAL settings and its checkpoints against the event rate of the
/// log in `schema`.
pub(super) async fn checks(target: &Client, schema: &Schema) -> Result<Vec<Finding>, StoreError> {
    let settings = target_shape::wal_settings(target).await?;
    let mut found = vec![settings_finding(&settings)];
    if let Some(c) = target_shape::checkpoints(target).await {
        let rate = walfold_store::event_rate(target, schema)
            .await
            .ok()
            .flatten();
        found.push(checkpoints_finding(&settings, &c, rate));
    }
    Ok(found)
}

fn settings_finding(s: &WalSettings) -> Finding {
    let (fpw, compression) = (&s.full_page_writes, &s.wal_compression);
    let note = match (fpw.as_str(), compression.as_str()) {
        ("on", "off") => {
            "; the first change of a page after each checkpoint writes its whole \
             image to WAL, uncompressed (wal_compression = lz4 or pglz shrinks them; \
             docs/BENCHMARKS.md has the measured effect)"
        }
        ("off", _) => "; full-page writes off is safe only on storage that never tears a page",
        _ => "",
    };
    Finding::ok(format!(
        "target WAL: full_page_writes = {fpw}, wal_compression = {compression}, \
         max_wal_size = {}, checkpoint_timeout = {}{note}",
        s.max_wal_size, s.checkpoint_timeout
    ))
}

/// The checkpoints since their statistics were reset, against the log's event `rate`:
/// a warning when requested ones dominate (WAL reaches max_wal_size first).
fn checkpoints_finding(s: &WalSettings, c: &Checkpoints, rate: Option<f64>) -> Finding {
    let hours = c.seconds / 3600.0;
    let total = c.timed + c.requested;
    let every = if total > 0 {
        format!(", one every {:.1} min", c.seconds / 60.0 / total as f64)
    } else {
        String::new()
    };
    let events = match rate {
        Some(rate) => format!("; the event log grew by {rate:.1} events/s on average"),
        None => String::new(),
    };
    let wal = match c.wal_bytes {
        Some(w) if c.seconds > 0.0 => format!(", the server's WAL {:.2} MB/s", w / c.seconds / 1e6),
        _ => String::new(),
    };
    let what = format!(
        "target checkpoints in the {hours:.1} h since the statistics were reset: {} timed, \
         {} requested{every}{events}{wal}",
        c.timed, c.requested
    );
    if !(c.requested > c.timed && c.requested >= 3) {
        return Finding::ok(what);
    }
    let suggest = c
        .wal_bytes
        .filter(|_| c.seconds > 0.0)
        .map(|w| {
            // A checkpoint starts when the WAL since the last one reaches about
            // max_wal_size / (1 + checkpoint_completion_target): room for twice a
            // timeout's WAL keeps the timed ones in charge.
            let mb = (2.0 * w / c.seconds * s.checkpoint_timeout_s / 1e6).ceil();
            format!(
                " to about {} MB (twice a checkpoint_timeout's WAL at this rate)",
                mb.max(1.0)
            )
        })
        .unwrap_or_default();
    Finding::warn(
        format!(
            "{what}: requested checkpoints dominate, so WAL reaches max_wal_size \
             ({}) before checkpoint_timeout ({}) ends, or CHECKPOINT \
             commands or base backups request them",
            s.max_wal_size, s.checkpoint_timeout
        ),
        format!(
            "raise max_wal_size{suggest}: each checkpoint makes the next change of \
             every page write its full image, so fewer checkpoints write less WAL \
             per event (a reload, no restart)"
        ),
    )
}

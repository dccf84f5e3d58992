//! Work in hand that does not move. A holder of work (a source's appender with what the
//! reader sent it; a projector partition's turn: a connection of the pool, a page of the
//! log, its apply and checkpoint) registers while it holds it ([`hold`]) and says when it
//! moves ([`moved`]: an append or a projector transaction committed). Work held longer
//! than the threshold without moving is *stalled*: `/readyz` answers 503 naming it and
//! `walfold_ingest_stalled` / `walfold_projection_stalled` count it.
//!
//! Why held work and not positions: a quiet system holds nothing, and a long transaction
//! that streams in (or that the source is still decoding) commits piece by piece or holds
//! nothing here yet, so neither is stalled; a commit blocked behind a lock, or a turn that
//! waits for a connection or a read that never comes, is. It is per process, so each
//! instance answers for the work units it holds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A unit of work that can stall.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unit {
    /// A source's ingest (its appender).
    Ingest { source: String },
    /// One partition of a subscriber.
    Partition { subscriber: String, partition: u32 },
}

impl std::fmt::Display for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unit::Ingest { source } => write!(f, "ingest of source {source}"),
            Unit::Partition {
                subscriber,
                partition,
            } => write!(f, "subscriber {subscriber} partition {partition}"),
        }
    }
}

struct Entry {
    /// When the work now held was taken or last moved; `None`: holding nothing.
    moved_at: Option<Instant>,
    doing: String,
}

struct Registry {
    units: Mutex<BTreeMap<Unit, Entry>>,
    threshold_ms: AtomicU64,
}

/// Until [`set_threshold`]: the config's default.
const DEFAULT_THRESHOLD: Duration = Duration::from_secs(60);

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        units: Mutex::new(BTreeMap::new()),
        threshold_ms: AtomicU64::new(DEFAULT_THRESHOLD.as_millis() as u64),
    })
}

fn units() -> std::sync::MutexGuard<'static, BTreeMap<Unit, Entry>> {
    registry().units.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long work may be held without moving before it counts as stalled.
pub fn set_threshold(threshold: Duration) {
    registry()
        .threshold_ms
        .store(threshold.as_millis() as u64, Ordering::Relaxed);
}

fn threshold() -> Duration {
    Duration::from_millis(registry().threshold_ms.load(Ordering::Relaxed))
}

/// Work held by `unit` until the guard is dropped.
#[must_use = "the work counts as held until this is dropped"]
pub struct Held(Unit);

/// `unit` takes work (`doing` says what, for `/readyz`).
pub fn hold(unit: Unit, doing: impl Into<String>) -> Held {
    units().insert(
        unit.clone(),
        Entry {
            moved_at: Some(Instant::now()),
            doing: doing.into(),
        },
    );
    Held(unit)
}

impl Held {
    /// What the work is doing now (it has not moved for that).
    pub fn doing(&self, doing: impl Into<String>) {
        if let Some(e) = units().get_mut(&self.0) {
            e.doing = doing.into();
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(e) = units().get_mut(&self.0) {
            e.moved_at = None;
        }
    }
}

/// `unit`'s work moved (something committed).
pub fn moved(unit: &Unit) {
    if let Some(Entry {
        moved_at: Some(at), ..
    }) = units().get_mut(unit)
    {
        *at = Instant::now();
    }
}

/// A unit whose work has not moved for longer than the threshold.
#[derive(Debug, Clone)]
pub struct Stalled {
    pub unit: Unit,
    pub for_: Duration,
    pub doing: String,
}

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} has not moved for {} s while {}",
            self.unit,
            self.for_.as_secs(),
            self.doing
        )
    }
}

/// Every stalled unit of this process.
pub fn stalled() -> Vec<Stalled> {
    let limit = threshold();
    units()
        .iter()
        .filter_map(|(unit, e)| {
            let for_ = e.moved_at?.elapsed();
            (for_ > limit).then(|| Stalled {
                unit: unit.clone(),
                for_,
                doing: e.doing.clone(),
            })
        })
        .collect()
}

/// Every unit that has held work, with whether it is stalled now (for the gauges, which
/// show 0 once a unit has worked).
pub(crate) fn each(mut f: impl FnMut(&Unit, bool)) {
    let limit = threshold();
    for (unit, e) in units().iter() {
        f(unit, e.moved_at.is_some_and(|at| at.elapsed() > limit));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_work_stalls_only_when_it_does_not_move() {
        set_threshold(Duration::from_millis(50));
        let unit = Unit::Partition {
            subscriber: "stall.test".into(),
            partition: 0,
        };
        let mine = |s: Vec<Stalled>| s.into_iter().filter(|s| s.unit == unit).count();
        {
            let held = hold(unit.clone(), "applying 3 events");
            assert_eq!(mine(stalled()), 0);
            std::thread::sleep(Duration::from_millis(80));
            assert_eq!(mine(stalled()), 1, "held without moving");
            moved(&unit);
            assert_eq!(mine(stalled()), 0, "it moved");
            held.doing("committing");
            std::thread::sleep(Duration::from_millis(80));
            assert_eq!(mine(stalled()), 1);
        }
        assert_eq!(mine(stalled()), 0, "holding nothing is never stalled");
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(mine(stalled()), 0);
        set_threshold(DEFAULT_THRESHOLD);
    }
}

//! The subscriber's store in memory, for unit tests of the rules above it (strict
//! order, retries, parking) without PostgreSQL. It keeps what the tables keep, with the
//! same rules as their statements; a transaction works on a copy that its commit puts
//! in place, so a transaction dropped (or failed) leaves nothing behind.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use futures::future::BoxFuture;
use uuid::Uuid;
use walfold_event::{Aggregate, DeadLetter, DeadLetterStatus, Event, Reason};

use super::{SubscriberStore, SubscriberTx};
use crate::checkpoint::PartitionStats;
use crate::dead_letter::{Gap, RetryItem};
use crate::error::StoreError;

/// A dead letter as the memory store keeps it.
#[derive(Debug, Clone)]
pub struct Letter {
    pub id: i64,
    pub letter: DeadLetter,
    pub status: DeadLetterStatus,
    pub resolution: Option<String>,
}

/// What the subscriber's tables hold.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// The event log, by seq.
    pub log: BTreeMap<i64, Event>,
    /// Claimed claim seqs (`processed_message`, keyed by `Event::claim_seq`).
    pub claims: HashSet<i64>,
    /// Last applied version per aggregate (`aggregate_version`).
    pub versions: HashMap<Aggregate, i64>,
    /// Dead letters by ID.
    pub letters: BTreeMap<i64, Letter>,
    /// Parked aggregates: the letter each waits behind, and since when (a counter).
    pub parks: HashMap<Aggregate, (i64, u64)>,
    /// The checkpoint's position and counters.
    pub position: i64,
    pub stats: PartitionStats,
    /// Commits so far.
    pub commits: u64,
    next_letter: i64,
}

impl State {
    fn park_letter(&self, aggregate: &Aggregate) -> Option<&Letter> {
        self.parks
            .get(aggregate)
            .and_then(|(id, _)| self.letters.get(id))
    }
}

/// A subscriber's store in memory; clones share the state.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    /// An error the next commit fails with (a lost leadership, a lost connection).
    fail_commit: Arc<Mutex<Option<StoreError>>>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// The committed state.
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `event` to the log.
    pub fn append(&self, event: Event) {
        self.state().log.insert(event.seq, event);
    }

    /// The next commit fails with `error`, and lands nothing.
    pub fn fail_next_commit(&self, error: StoreError) {
        *self.fail_commit.lock().unwrap_or_else(|p| p.into_inner()) = Some(error);
    }

    /// Sets a dead letter's status, as an operator's command would (retry, discard).
    pub fn set_status(&self, letter: i64, status: DeadLetterStatus) {
        if let Some(l) = self.state().letters.get_mut(&letter) {
            l.status = status;
        }
    }
}

/// A transaction on a copy of the state.
#[derive(Debug)]
pub struct MemoryTx<'a> {
    store: &'a MemoryStore,
    state: State,
}

impl MemoryTx<'_> {
    /// What this transaction sees.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// What this transaction sees, to change (a projection's writes).
    pub fn state_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

fn retry_item(l: &Letter) -> Option<RetryItem> {
    Some(RetryItem {
        id: l.id,
        seq: l.letter.seq?,
        aggregate_type: l.letter.aggregate_type.clone()?,
        aggregate_id: l.letter.aggregate_id.clone()?,
    })
}

fn of(l: &Letter, aggregate: &Aggregate) -> bool {
    l.letter.aggregate_type.as_deref() == Some(&aggregate.kind)
        && l.letter.aggregate_id.as_deref() == Some(&aggregate.id)
}

fn read(state: &State, seqs: &[i64]) -> Vec<Event> {
    seqs.iter()
        .filter_map(|s| state.log.get(s).cloned())
        .collect()
}

impl SubscriberStore for MemoryStore {
    type Tx<'a>
        = MemoryTx<'a>
    where
        Self: 'a;

    fn begin<'a>(&'a mut self) -> BoxFuture<'a, Result<MemoryTx<'a>, StoreError>> {
        Box::pin(async move {
            let state = self.state().clone();
            Ok(MemoryTx { store: self, state })
        })
    }

    fn position<'a>(&'a self) -> BoxFuture<'a, Result<i64, StoreError>> {
        Box::pin(async move { Ok(self.state().position) })
    }

    fn parked<'a>(&'a self) -> BoxFuture<'a, Result<Vec<(Aggregate, bool)>, StoreError>> {
        Box::pin(async move {
            let s = self.state();
            Ok(s.parks
                .keys()
                .map(|a| {
                    let gap = s
                        .park_letter(a)
                        .is_some_and(|l| l.letter.reason == Reason::VersionGap);
                    (a.clone(), gap)
                })
                .collect())
        })
    }

    fn retry_aggregates<'a>(&'a self) -> BoxFuture<'a, Result<Vec<Aggregate>, StoreError>> {
        Box::pin(async move {
            let s = self.state();
            let mut out: Vec<Aggregate> = Vec::new();
            for l in s.letters.values() {
                if l.status == DeadLetterStatus::Retrying && l.letter.seq.is_some() {
                    if let Some(item) = retry_item(l) {
                        let a = item.aggregate();
                        if !out.contains(&a) {
                            out.push(a);
                        }
                    }
                }
            }
            Ok(out)
        })
    }

    fn retry_page<'a>(
        &'a self,
        aggregate: &'a Aggregate,
        after: i64,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<RetryItem>, StoreError>> {
        Box::pin(async move {
            let s = self.state();
            let mut items: Vec<RetryItem> = s
                .letters
                .values()
                .filter(|l| of(l, aggregate))
                .filter(|l| DeadLetterStatus::OPEN_OR_RETRYING.contains(&l.status))
                .filter_map(retry_item)
                .filter(|i| i.seq > after)
                .collect();
            items.sort_by_key(|i| (i.seq, i.id));
            items.truncate(limit.max(0) as usize);
            Ok(items)
        })
    }

    fn discarded_parks<'a>(&'a self) -> BoxFuture<'a, Result<Vec<Aggregate>, StoreError>> {
        Box::pin(async move {
            let s = self.state();
            Ok(s.parks
                .keys()
                .filter(|a| {
                    s.park_letter(a).is_some_and(|l| {
                        l.status == DeadLetterStatus::Discarded
                            && l.letter.reason != Reason::VersionGap
                    }) && !s
                        .letters
                        .values()
                        .any(|o| of(o, a) && DeadLetterStatus::UNRESOLVED.contains(&o.status))
                })
                .cloned()
                .collect())
        })
    }

    fn gaps<'a>(&'a self) -> BoxFuture<'a, Result<Vec<Gap>, StoreError>> {
        Box::pin(async move {
            let s = self.state();
            Ok(s.parks
                .iter()
                .filter_map(|(a, (id, since))| {
                    let l = s.letters.get(id)?;
                    (l.letter.reason == Reason::VersionGap).then(|| Gap {
                        aggregate_type: a.kind.clone(),
                        aggregate_id: a.id.clone(),
                        letter: *id,
                        status: l.status,
                        since_unix: *since as f64,
                    })
                })
                .collect())
        })
    }

    fn read_events<'a>(&'a self, seqs: &'a [i64]) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        Box::pin(async move { Ok(read(&self.state(), seqs)) })
    }
}

impl SubscriberTx for MemoryTx<'_> {
    fn claim<'a>(
        &'a mut self,
        ids: &'a [(Uuid, i64)],
    ) -> BoxFuture<'a, Result<HashSet<Uuid>, StoreError>> {
        Box::pin(async move {
            Ok(ids
                .iter()
                .filter(|(_, seq)| self.state.claims.insert(*seq))
                .map(|(id, _)| *id)
                .collect())
        })
    }

    fn unclaim<'a>(&'a mut self, seqs: &'a [i64]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            for seq in seqs {
                self.state.claims.remove(seq);
            }
            Ok(())
        })
    }

    fn applied_versions<'a>(
        &'a self,
        aggregates: &'a [Aggregate],
    ) -> BoxFuture<'a, Result<HashMap<Aggregate, i64>, StoreError>> {
        Box::pin(async move {
            Ok(aggregates
                .iter()
                .filter_map(|a| self.state.versions.get(a).map(|v| (a.clone(), *v)))
                .collect())
        })
    }

    fn record_versions<'a>(
        &'a mut self,
        versions: &'a [(Aggregate, i64)],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            for (a, v) in versions {
                self.state.versions.insert(a.clone(), *v);
            }
            Ok(())
        })
    }

    fn read_events<'a>(&'a self, seqs: &'a [i64]) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        Box::pin(async move { Ok(read(&self.state, seqs)) })
    }

    fn dead_letter<'a>(
        &'a mut self,
        letter: &'a DeadLetter,
    ) -> BoxFuture<'a, Result<Option<i64>, StoreError>> {
        Box::pin(async move {
            self.state.next_letter += 1;
            let id = self.state.next_letter;
            let status = letter.reason.initial_status(letter.seq.is_some());
            self.state.letters.insert(
                id,
                Letter {
                    id,
                    letter: letter.clone(),
                    status,
                    resolution: None,
                },
            );
            Ok(Some(id))
        })
    }

    fn park<'a>(
        &'a mut self,
        aggregate: &'a Aggregate,
        letter: i64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let since = self.state.commits;
            self.state
                .parks
                .entry(aggregate.clone())
                .or_insert((letter, since));
            Ok(())
        })
    }

    fn unpark<'a>(&'a mut self, aggregate: &'a Aggregate) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.state.parks.remove(aggregate);
            Ok(())
        })
    }

    fn waiting<'a>(
        &'a self,
        aggregates: &'a [Aggregate],
    ) -> BoxFuture<'a, Result<Vec<RetryItem>, StoreError>> {
        Box::pin(async move {
            let mut items: Vec<RetryItem> = self
                .state
                .letters
                .values()
                .filter(|l| aggregates.iter().any(|a| of(l, a)))
                .filter(|l| {
                    l.letter.reason == Reason::VersionGap && l.status == DeadLetterStatus::Waiting
                })
                .filter_map(retry_item)
                .collect();
            items.sort_by_key(|i| (i.seq, i.id));
            Ok(items)
        })
    }

    fn repark_waiting<'a>(
        &'a mut self,
        aggregate: &'a Aggregate,
        letter: i64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let since = self.state.commits;
            let waiting = self
                .state
                .park_letter(aggregate)
                .is_some_and(|l| l.status == DeadLetterStatus::Waiting);
            if let Some(park) = self.state.parks.get_mut(aggregate) {
                if park.0 != letter && waiting {
                    *park = (letter, since);
                }
            }
            Ok(())
        })
    }

    fn forget_waiting<'a>(
        &'a mut self,
        letters: &'a [i64],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.state
                .letters
                .retain(|id, l| !(letters.contains(id) && l.status == DeadLetterStatus::Waiting));
            Ok(())
        })
    }

    fn resolve_gap<'a>(
        &'a mut self,
        aggregate: &'a Aggregate,
        resolution: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            use DeadLetterStatus::*;
            for l in self.state.letters.values_mut() {
                if of(l, aggregate)
                    && l.letter.reason == Reason::VersionGap
                    && l.letter.seq.is_none()
                    && matches!(l.status, Open | Retrying | Discarded)
                {
                    if l.status == Discarded {
                        l.resolution = Some(match l.resolution.take() {
                            Some(r) => format!("{r}; {resolution}"),
                            None => resolution.to_owned(),
                        });
                    } else {
                        l.status = Retried;
                        l.resolution = Some(resolution.to_owned());
                    }
                }
            }
            Ok(())
        })
    }

    fn open_gap<'a>(
        &'a mut self,
        gap: &'a Gap,
        error: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let letter = DeadLetter {
                subscriber_id: None,
                event_id: None,
                seq: None,
                aggregate_type: Some(gap.aggregate_type.clone()),
                aggregate_id: Some(gap.aggregate_id.clone()),
                reason: Reason::VersionGap,
                error: error.to_owned(),
                raw: None,
                existing: None,
                attempts: 0,
                source_lsn: None,
                origin: None,
            };
            let id = self.dead_letter(&letter).await?;
            if let (Some(id), Some(park)) = (id, self.state.parks.get_mut(&gap.aggregate())) {
                park.0 = id;
            }
            Ok(())
        })
    }

    fn gap_still_open<'a>(
        &'a mut self,
        letter: i64,
        error: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if let Some(l) = self.state.letters.get_mut(&letter) {
                if l.status == DeadLetterStatus::Retrying {
                    l.status = DeadLetterStatus::Open;
                    l.letter.error = error.to_owned();
                    l.letter.attempts += 1;
                }
            }
            Ok(())
        })
    }

    fn retried<'a>(
        &'a mut self,
        letter: i64,
        outcome: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if let Some(l) = self.state.letters.get_mut(&letter) {
                l.status = DeadLetterStatus::Retried;
                l.resolution = Some(outcome.to_owned());
                l.letter.attempts += 1;
            }
            Ok(())
        })
    }

    fn retry_failed<'a>(
        &'a mut self,
        aggregate: &'a Aggregate,
        head: i64,
        error: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            for l in self.state.letters.values_mut() {
                if of(l, aggregate) && l.status == DeadLetterStatus::Retrying {
                    l.status = DeadLetterStatus::Open;
                    if l.id == head {
                        l.letter.error = error.to_owned();
                        l.letter.attempts += 1;
                    }
                }
            }
            Ok(())
        })
    }

    fn commit<'a>(
        mut self,
        position: i64,
        stats: PartitionStats,
        _last_committed_at: Option<SystemTime>,
    ) -> BoxFuture<'a, Result<(), StoreError>>
    where
        Self: 'a,
    {
        Box::pin(async move {
            let failed = self
                .store
                .fail_commit
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(e) = failed {
                return Err(e);
            }
            let s = &mut self.state;
            s.position = s.position.max(position);
            s.stats.applied += stats.applied;
            s.stats.duplicates += stats.duplicates;
            s.stats.stale += stats.stale;
            s.stats.dead_lettered += stats.dead_lettered;
            s.commits += 1;
            *self.store.state() = self.state;
            Ok(())
        })
    }
}

//! The projector's rules on the in-memory store (no PostgreSQL): what a claim decides,
//! strict order and its gaps, and what becomes of an event that fails.

use std::collections::HashMap;
use std::sync::Mutex;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use walfold_config::{ProjectionConfig, VersionMode};
use walfold_event::{Aggregate, DeadLetterStatus, ErrorKind, Event, Reason};
use walfold_store::memory::{MemoryStore, MemoryTx};
use walfold_store::StoreError;

use super::retry::{self, Paged};
use super::strict::{self, HeldAggregates};
use super::work::{Apply, Rules};
use crate::error::ProjectionError;
use crate::projection::Applied;

/// How an event fails when applied.
#[derive(Debug, Clone, Copy)]
enum Failure {
    /// It can never apply (`ProjectionError::Invalid`: data, permanent).
    Invalid,
    /// The connection failed (transient).
    Transient,
}

/// A projection that records what it applied and fails as told.
#[derive(Default)]
struct Fake {
    /// Seqs applied, in order (whether or not their transaction committed).
    applied: Mutex<Vec<i64>>,
    /// Seqs that fail, and how.
    failing: Mutex<HashMap<i64, Failure>>,
}

impl Fake {
    fn fail(&self, seq: i64, how: Failure) {
        self.failing.lock().unwrap().insert(seq, how);
    }

    fn heal(&self) {
        self.failing.lock().unwrap().clear();
    }

    fn applied(&self) -> Vec<i64> {
        self.applied.lock().unwrap().clone()
    }
}

impl Apply<MemoryStore> for Fake {
    fn apply<'a, 't>(
        &'a self,
        _tx: &'a MemoryTx<'t>,
        events: &'a [&'a Event],
    ) -> BoxFuture<'a, Result<Vec<Applied>, ProjectionError>>
    where
        't: 'a,
        MemoryStore: 't,
    {
        Box::pin(async move {
            let mut out = Vec::new();
            for e in events {
                match self.failing.lock().unwrap().get(&e.seq) {
                    Some(Failure::Invalid) => {
                        return Err(ProjectionError::Invalid(format!("seq {} is bad", e.seq)))
                    }
                    Some(Failure::Transient) => {
                        return Err(ProjectionError::Row(StoreError::Busy("lost".into())))
                    }
                    None => {}
                }
                self.applied.lock().unwrap().push(e.seq);
                out.push(Applied::Changed);
            }
            Ok(out)
        })
    }
}

fn event(seq: i64, aggregate: &str, version: Option<i64>) -> Event {
    Event {
        seq,
        claim_seq: seq,
        id: uuid::Uuid::from_u64_pair(0, seq as u64),
        aggregate_type: "account".into(),
        aggregate_id: aggregate.into(),
        event_type: "Credited".into(),
        version,
        payload: serde_json::json!({}).into(),
        headers: None,
        occurred_at: None,
        source_lsn: walfold_event::Lsn(0),
        committed_at: None,
        source: "default".into(),
    }
}

fn options(mode: VersionMode) -> ProjectionConfig {
    let mut o = ProjectionConfig::new("balances", "balances");
    o.version_mode = mode;
    o.parallelism = 1;
    o.first_version = 1;
    o.max_attempts = 3;
    o.retry_backoff_ms = 1;
    o
}

fn account(id: &str) -> Aggregate {
    Aggregate::new("account", id)
}

/// A page through the rules, as the run loop hands it over.
async fn page(
    rules: &Rules<'_, Fake>,
    store: &mut MemoryStore,
    held: &mut HeldAggregates,
    events: &[Event],
) -> Result<Paged, crate::error::EngineError> {
    for e in events {
        store.append(e.clone());
    }
    let position = events.iter().map(|e| e.seq).max().unwrap_or(0);
    retry::page(
        rules,
        store,
        events,
        position,
        held,
        &CancellationToken::new(),
        true,
    )
    .await
}

#[tokio::test]
async fn a_duplicate_claim_is_skipped() {
    let (fake, options) = (Fake::default(), options(VersionMode::Guard));
    let rules = Rules {
        options: &options,
        partition: 0,
        projection: &fake,
    };
    let (mut store, mut held) = (MemoryStore::new(), HeldAggregates::default());
    let events = [event(1, "a", None), event(2, "b", None)];
    page(&rules, &mut store, &mut held, &events).await.unwrap();
    // Read again (a restart from an older checkpoint): claimed before, not applied.
    page(&rules, &mut store, &mut held, &events).await.unwrap();
    assert_eq!(fake.applied(), [1, 2]);
    let s = store.state();
    assert_eq!((s.stats.applied, s.stats.duplicates), (2, 2));
    assert_eq!(s.position, 2);
}

#[tokio::test]
async fn a_strict_event_ahead_of_a_missing_version_waits_then_applies_when_it_arrives() {
    let (fake, options) = (Fake::default(), options(VersionMode::Strict));
    let rules = Rules {
        options: &options,
        partition: 0,
        projection: &fake,
    };
    let (mut store, mut held) = (MemoryStore::new(), HeldAggregates::default());
    let v1 = event(1, "a", Some(1));
    let v3 = event(2, "a", Some(3));
    let v2 = event(3, "a", Some(2));
    page(&rules, &mut store, &mut held, &[v1.clone(), v3.clone()])
        .await
        .unwrap();
    assert_eq!(fake.applied(), [1]);
    {
        let s = store.state();
        // Version 3 waits: its claim was given back, it is set aside as waiting and its
        // aggregate parked behind it; the checkpoint moved past it.
        assert!(s.claims.contains(&v1.claim_seq) && !s.claims.contains(&v3.claim_seq));
        assert_eq!(s.versions[&account("a")], 1);
        let waiting: Vec<_> = s.letters.values().collect();
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].letter.reason, Reason::VersionGap);
        assert_eq!(waiting[0].status, DeadLetterStatus::Waiting);
        assert_eq!(waiting[0].letter.seq, Some(2));
        assert_eq!(s.parks[&account("a")].0, waiting[0].id);
        assert_eq!(s.position, 2);
    }
    assert!(held.gaps.contains(&account("a")));
    // Another aggregate goes on meanwhile.
    page(&rules, &mut store, &mut held, &[event(4, "b", Some(1))])
        .await
        .unwrap();
    assert_eq!(fake.applied(), [1, 4]);
    // Version 2 arrives: 2 then 3 apply, in version order, in its transaction.
    page(&rules, &mut store, &mut held, std::slice::from_ref(&v2))
        .await
        .unwrap();
    assert_eq!(fake.applied(), [1, 4, 3, 2]);
    let s = store.state();
    assert_eq!(s.versions[&account("a")], 3);
    assert!(s.claims.contains(&v2.claim_seq) && s.claims.contains(&v3.claim_seq));
    assert!(
        s.letters.is_empty(),
        "waiting letters are forgotten once applied"
    );
    assert!(s.parks.is_empty());
    assert!(held.gaps.is_empty());
}

#[tokio::test]
async fn a_strict_version_already_applied_under_a_new_id_is_a_conflict_not_applied() {
    let (fake, options) = (Fake::default(), options(VersionMode::Strict));
    let rules = Rules {
        options: &options,
        partition: 0,
        projection: &fake,
    };
    let (mut store, mut held) = (MemoryStore::new(), HeldAggregates::default());
    page(&rules, &mut store, &mut held, &[event(1, "a", Some(1))])
        .await
        .unwrap();
    page(&rules, &mut store, &mut held, &[event(2, "a", Some(1))])
        .await
        .unwrap();
    assert_eq!(fake.applied(), [1]);
    let s = store.state();
    let letters: Vec<_> = s.letters.values().collect();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].letter.reason, Reason::VersionConflict);
    assert_eq!(letters[0].status, DeadLetterStatus::Open);
    assert!(s.parks.is_empty(), "a conflict parks nothing");
}

#[tokio::test]
async fn a_strict_event_without_a_version_can_never_apply() {
    let (fake, options) = (Fake::default(), options(VersionMode::Strict));
    let rules = Rules {
        options: &options,
        partition: 0,
        projection: &fake,
    };
    let (mut store, mut held) = (MemoryStore::new(), HeldAggregates::default());
    page(&rules, &mut store, &mut held, &[event(1, "a", None)])
        .await
        .unwrap();
    let s = store.state();
    let letter = s.letters.values().next().expect("dead-lettered");
    assert_eq!(letter.letter.reason, Reason::ProjectionFailed);
    assert_eq!(
        letter.letter.attempts, 1,
        "a permanent failure is not retried"
    );
    assert!(s.parks.contains_key(&account("a")));
}

#[tokio::test]
async fn a_definite_failure_parks_its_aggregate_and_the_others_go_on() {
    let (fake, options) = (Fake::default(), options(VersionMode::Guard));
    let rules = Rules {
        options: &options,
        partition: 0,
        projection: &fake,
    };
    let (mut store, mut held) = (MemoryStore::new(), HeldAggregates::default());
    fake.fail(2, Failure::Invalid);
    let events = [
        event(1, "a", None),
        event(2, "b", None),
        event(3, "b", None),
        event(4, "c", None),
    ];
    let paged = page(&rules, &mut store, &mut held, &events).await.unwrap();
    assert!(matches!(paged, Paged::OneByOne));
    // The batch rolled back, then each event went on its own.
    assert_eq!(fake.applied(), [1, 1, 4]);
    {
        let s = store.state();
        let letters: Vec<_> = s.letters.values().collect();
        assert_eq!(letters.len(), 2);
        assert_eq!(letters[0].letter.reason, Reason::ProjectionFailed);
        assert_eq!(letters[0].letter.seq, Some(2));
        assert_eq!(letters[0].letter.attempts, 1);
        assert_eq!(letters[1].letter.reason, Reason::AggregateParked);
        assert_eq!(letters[1].letter.seq, Some(3));
        assert_eq!(s.parks[&account("b")].0, letters[0].id);
        assert_eq!(s.position, 4);
        assert_eq!((s.stats.applied, s.stats.dead_lettered), (2, 2));
    }
    assert!(held.failed.contains(&account("b")));
    // Later events of the parked aggregate wait behind it in the fast path.
    page(&rules, &mut store, &mut held, &[event(5, "b", None)])
        .await
        .unwrap();
    assert_eq!(fake.applied(), [1, 1, 4]);

    // An operator retries the chain: it applies in log order, and the aggregate is free.
    fake.heal();
    let ids: Vec<i64> = store.state().letters.keys().copied().collect();
    for id in ids {
        store.set_status(id, DeadLetterStatus::Retrying);
    }
    retry::retries(&rules, &mut store, &mut held, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(fake.applied(), [1, 1, 4, 2, 3, 5]);
    let s = store.state();
    assert!(s
        .letters
        .values()
        .all(|l| l.status == DeadLetterStatus::Retried));
    assert!(s.parks.is_empty());
    assert!(held.failed.is_empty());
    assert_eq!(s.position, 5, "a retry keeps the position");
}

#[tokio::test]
async fn a_retry_that_fails_again_reopens_the_chain_and_keeps_the_park() {
    let (fake, options) = (Fake::default(), options(VersionMode::Guard));
    let rules = Rules {
        options: &options,
        partition: 0,
        projection: &fake,
    };
    let (mut store, mut held) = (MemoryStore::new(), HeldAggregates::default());
    fake.fail(1, Failure::Invalid);
    page(
        &rules,
        &mut store,
        &mut held,
        &[event(1, "a", None), event(2, "a", None)],
    )
    .await
    .unwrap();
    let ids: Vec<i64> = store.state().letters.keys().copied().collect();
    for id in &ids {
        store.set_status(*id, DeadLetterStatus::Retrying);
    }
    retry::retries(&rules, &mut store, &mut held, &CancellationToken::new())
        .await
        .unwrap();
    let s = store.state();
    assert!(s
        .letters
        .values()
        .all(|l| l.status == DeadLetterStatus::Open));
    assert_eq!(s.letters[&ids[0]].letter.attempts, 2);
    assert!(s.parks.contains_key(&account("a")));
    assert!(held.failed.contains(&account("a")));
    assert!(fake.applied().is_empty());
}

#[tokio::test]
async fn a_transient_failure_lands_nothing_and_is_retried_from_the_checkpoint() {
    let (fake, options) = (Fake::default(), options(VersionMode::Guard));
    let rules = Rules {
        options: &options,
        partition: 0,
        projection: &fake,
    };
    let (mut store, mut held) = (MemoryStore::new(), HeldAggregates::default());
    fake.fail(2, Failure::Transient);
    let events = [event(1, "a", None), event(2, "b", None)];
    let e = page(&rules, &mut store, &mut held, &events)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient);
    {
        let s = store.state();
        assert!(s.claims.is_empty() && s.letters.is_empty());
        assert_eq!((s.position, s.commits), (0, 0));
    }
    // The run loop reconnects and reads the page again from the checkpoint.
    fake.heal();
    page(&rules, &mut store, &mut held, &events).await.unwrap();
    let s = store.state();
    assert_eq!((s.position, s.stats.applied, s.stats.duplicates), (2, 2, 0));
}

#[tokio::test]
async fn a_commit_that_cannot_prove_leadership_lands_nothing() {
    let (fake, options) = (Fake::default(), options(VersionMode::Guard));
    let rules = Rules {
        options: &options,
        partition: 0,
        projection: &fake,
    };
    let (mut store, mut held) = (MemoryStore::new(), HeldAggregates::default());
    store.fail_next_commit(StoreError::Fenced);
    let e = page(&rules, &mut store, &mut held, &[event(1, "a", None)])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient);
    let s = store.state();
    assert!(s.claims.is_empty());
    assert_eq!(s.position, 0);
}

#[tokio::test]
async fn a_gap_past_its_timeout_opens_a_letter_and_discarding_it_applies_the_waiting_events() {
    let fake = Fake::default();
    let mut options = options(VersionMode::Strict);
    options.gap_timeout = walfold_config::Retention::After(std::time::Duration::from_secs(1));
    let rules = Rules {
        options: &options,
        partition: 0,
        projection: &fake,
    };
    let (mut store, mut held) = (MemoryStore::new(), HeldAggregates::default());
    page(&rules, &mut store, &mut held, &[event(1, "a", Some(3))])
        .await
        .unwrap();
    assert!(fake.applied().is_empty());
    // Not at the head: after downtime the missing versions may be in the backlog.
    strict::gap_checks(&rules, &mut store, &mut held, false)
        .await
        .unwrap();
    assert_eq!(store.state().letters.len(), 1);
    strict::gap_checks(&rules, &mut store, &mut held, true)
        .await
        .unwrap();
    let gap = {
        let s = store.state();
        let (letter, _) = s.parks[&account("a")];
        let gap = &s.letters[&letter];
        assert_eq!(gap.status, DeadLetterStatus::Open);
        assert_eq!(gap.letter.seq, None);
        assert!(gap
            .letter
            .error
            .contains("versions 1..2 of account a are missing"));
        letter
    };
    assert!(fake.applied().is_empty());
    // The operator gives up on the missing versions.
    store.set_status(gap, DeadLetterStatus::Discarded);
    strict::gap_checks(&rules, &mut store, &mut held, true)
        .await
        .unwrap();
    assert_eq!(fake.applied(), [1]);
    let s = store.state();
    assert_eq!(s.versions[&account("a")], 3);
    assert!(s.parks.is_empty());
    assert_eq!(s.letters.len(), 1, "the waiting letter is forgotten");
    assert_eq!(s.letters[&gap].status, DeadLetterStatus::Discarded);
    assert!(held.gaps.is_empty());
}

#[test]
fn a_subscriber_store_error_keeps_its_class_through_the_engine() {
    let wrapped = |e: StoreError| {
        crate::error::EngineError::from(StoreError::Subscriber {
            subscriber: "balances".into(),
            partition: 0,
            source: Box::new(e),
        })
    };
    for (e, kind) in [
        (StoreError::Fenced, ErrorKind::Transient),
        (
            StoreError::Busy("another layout".into()),
            ErrorKind::Transient,
        ),
        (
            StoreError::from(walfold_store::Refusal::NoDeadLetter { id: 1 }),
            ErrorKind::Definite,
        ),
        (
            StoreError::SchemaRights {
                schema: "walfold".into(),
                missing: "usage".into(),
            },
            ErrorKind::Environment,
        ),
    ] {
        let store_kind = e.kind().own_statement();
        assert_eq!(store_kind, kind);
        let e = wrapped(e);
        assert_eq!(e.kind(), kind, "{e}");
        assert!(e
            .to_string()
            .starts_with("subscriber balances, partition 0: "));
    }
}

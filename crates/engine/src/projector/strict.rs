//! Strict order (`version_mode = "strict"`): what of a batch applies in version order,
//! what waits for a missing version (its claim given back, set aside as `waiting`
//! behind a park), what is a version conflict, and the gap checks between batches
//! (timeout, discard, retry). The pure ordering is `sequence.rs`; this writes what it
//! decides, through the unit of work.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use walfold_config::VersionMode;
use walfold_event::{Aggregate, DeadLetterStatus, Event, Reason};
use walfold_store::{SubscriberStore, SubscriberTx};

use super::work::{waiting_letter, Apply, Rules, Work};
use crate::error::EngineError;
use crate::projection::Applied;
use crate::sequence::sequence;

/// The aggregates whose events this partition does not apply as they come.
#[derive(Debug, Default)]
pub(crate) struct HeldAggregates {
    /// Behind a dead letter (a failure): their events are set aside until a retry.
    pub failed: HashSet<Aggregate>,
    /// Waiting for a missing version (strict projections): their events are sequenced
    /// together with the waiting ones.
    pub gaps: HashSet<Aggregate>,
}

impl HeldAggregates {
    /// Applies what a committed transaction changed.
    pub fn update(&mut self, strict: StrictOutcome) {
        for k in strict.released {
            self.gaps.remove(&k);
        }
        self.gaps.extend(strict.gapped);
    }
}

/// What a strict transaction changed about the aggregates it held.
#[derive(Debug, Default)]
#[must_use]
pub(crate) struct StrictOutcome {
    /// Now waiting for a missing version.
    pub gapped: Vec<Aggregate>,
    /// No longer waiting.
    pub released: Vec<Aggregate>,
    /// Events of the candidates that wait.
    pub waiting: usize,
}

impl<'s, 'r, S, A> Work<'s, 'r, S, A>
where
    S: SubscriberStore + 's,
    A: Apply<S> + ?Sized,
{
    /// Strict mode: `events`, with the waiting events of their aggregates (and of
    /// `also`), are claimed, and what is next in version order is applied; what still
    /// waits for a missing version gives its claim back and is set aside as waiting (its
    /// aggregate parked behind the gap), to be claimed again in the transaction that
    /// applies it. An aggregate in `accept` gives up on its missing versions: its waiting
    /// events apply from the first of them on.
    pub async fn apply_strict(
        &mut self,
        events: &[&Event],
        held: &HeldAggregates,
        also: &[Aggregate],
        accept: &[Aggregate],
    ) -> Result<StrictOutcome, EngineError> {
        let rules = self.rules;
        let subscriber = rules.subscriber();
        let mut aggregates: Vec<Aggregate> = also.to_vec();
        for e in events {
            if !aggregates.iter().any(|a| a.has(e)) {
                aggregates.push(Aggregate::of(e));
            }
        }
        let gapped: Vec<Aggregate> = aggregates
            .iter()
            .filter(|k| held.gaps.contains(*k))
            .cloned()
            .collect();
        let letters = self.tx.waiting(&gapped).await?;
        let seqs: Vec<i64> = letters.iter().map(|l| l.seq).collect();
        let held_events = self.tx.read_events(&seqs).await?;
        let letter_of = |e: &Event| letters.iter().find(|l| l.seq == e.seq).map(|l| l.id);
        let mut candidates: Vec<&Event> = held_events.iter().collect();
        candidates.extend(events.iter().copied());
        let claimed = self.claim(&candidates).await?;
        let mut applied = self.tx.applied_versions(&aggregates).await?;
        for k in accept {
            let first = held_events
                .iter()
                .filter(|e| k.has(e))
                .filter_map(|e| e.version)
                .min();
            if let Some(first) = first {
                applied.insert(k.clone(), first - 1);
            }
        }
        let order = sequence(&claimed, &applied, rules.options.first_version);
        if let Some(e) = order.below_first.first() {
            return Err(rules.invalid_event(&format!(
                "version {} is below first_version = {} of an aggregate walfold has applied \
                 nothing of yet: set first_version to the producer's first version, or fix the \
                 producer",
                e.version.unwrap_or_default(),
                rules.options.first_version
            )));
        }
        // Events of types this projection does not take still carry the aggregate's
        // versions: they advance it without being applied.
        let (apply, passed): (Vec<&Event>, Vec<&Event>) = order.apply.iter().partition(|e| {
            rules
                .options
                .event_types
                .as_ref()
                .is_none_or(|t| t.contains(&e.event_type))
        });
        self.stats.duplicates += passed.len() as i64;
        let results = self.apply(&apply).await?;
        if let Some(i) = results.iter().position(|r| *r == Applied::Stale) {
            return Err(rules.invalid_event(&format!(
                "the statement changed no row for version {} of {} {}: in strict mode every \
                 version must apply, or it would be consumed without effect",
                apply[i].version.unwrap_or_default(),
                apply[i].aggregate_type,
                apply[i].aggregate_id
            )));
        }
        // A version the aggregate has passed, under an event ID never claimed: a producer
        // retry with a fresh ID, a second delta claiming the same version, or the missing
        // version of a discarded gap arriving late. Which one, only a person can tell, and
        // a delta skipped unseen is money lost: not applied, and an open dead letter.
        for e in &order.duplicates {
            let held = letter_of(e).is_some();
            if held || self.retrying {
                self.stats.stale += 1;
                continue;
            }
            let version = e.version.unwrap_or_default();
            let through = applied.get(&Aggregate::of(e)).copied().unwrap_or_default();
            tracing::error!(subscriber, event_id = %e.id, aggregate_type = %e.aggregate_type, aggregate_id = %e.aggregate_id, version, applied_through = through, "a version the aggregate has passed came under a new event ID: not applied, dead-lettered");
            let mut letter = waiting_letter(subscriber, e);
            letter.reason = Reason::VersionConflict;
            letter.attempts = 1;
            letter.error = format!(
                "version {version} of {} {} came under a new event ID after the aggregate had \
                 applied through version {through}: not applied. If it repeats an applied \
                 delta (a producer retry with a fresh ID), discard this letter; if it is \
                 another delta, or the missing version of a discarded gap arriving late, \
                 apply its effect by hand, then discard this letter",
                e.aggregate_type, e.aggregate_id
            );
            self.dead_letter(&letter, false).await?;
        }
        let waiting: Vec<i64> = order.waiting.iter().map(|e| e.claim_seq).collect();
        self.tx.unclaim(&waiting).await?;
        let done: Vec<i64> = order
            .apply
            .iter()
            .chain(&order.duplicates)
            .filter_map(|e| letter_of(e))
            .collect();
        self.tx.record_versions(&order.advanced).await?;
        let mut outcome = StrictOutcome {
            waiting: order.waiting.len(),
            ..StrictOutcome::default()
        };
        for (k, next) in &order.needs {
            let mut first_letter = None;
            for e in order.waiting.iter().filter(|e| k.has(e)) {
                let id = match letter_of(e) {
                    Some(id) => Some(id),
                    None => {
                        let mut letter = waiting_letter(subscriber, e);
                        letter.reason = Reason::VersionGap;
                        letter.error = format!("waiting for version {next} of this aggregate");
                        self.events += 1;
                        self.tx.dead_letter(&letter).await?
                    }
                };
                first_letter = first_letter.or(id);
            }
            let Some(id) = first_letter else { continue };
            if held.gaps.contains(k) {
                // The park may point at a waiting event that has just applied.
                self.tx.repark_waiting(k, id).await?;
            } else {
                self.tx.park(k, id).await?;
                outcome.gapped.push(k.clone());
            }
        }
        for k in gapped {
            if order.needs.iter().any(|(n, _)| *n == k) {
                continue;
            }
            let resolution = if accept.contains(&k) {
                "its waiting versions applied without the missing ones"
            } else {
                "the missing versions arrived"
            };
            self.tx.resolve_gap(&k, resolution).await?;
            self.tx.unpark(&k).await?;
            outcome.released.push(k);
        }
        // The waiting events that went through leave no dead letter behind: waiting is
        // ordinary in strict mode, and the open gap letter (if any) is the record.
        self.tx.forget_waiting(&done).await?;
        Ok(outcome)
    }

    /// What an open gap of `k` is missing, for its dead letter.
    pub async fn describe_gap(
        &self,
        k: &Aggregate,
        timeout: Option<Duration>,
    ) -> Result<String, EngineError> {
        let options = self.rules.options;
        let aggregate = std::slice::from_ref(k);
        let applied = self.tx.applied_versions(aggregate).await?;
        let next = applied
            .get(k)
            .map_or(options.first_version, |v| v.saturating_add(1));
        let letters = self.tx.waiting(aggregate).await?;
        let seqs: Vec<i64> = letters.iter().map(|l| l.seq).collect();
        let events = self.tx.read_events(&seqs).await?;
        let first = events
            .iter()
            .filter_map(|e| e.version)
            .min()
            .unwrap_or(next);
        let open = timeout.map_or_else(String::new, |t| format!(" for over {}s", t.as_secs()));
        let missing = if first - 1 == next {
            format!("version {next} of {} {} is", k.kind, k.id)
        } else {
            format!("versions {next}..{} of {} {} are", first - 1, k.kind, k.id)
        };
        Ok(format!(
            "{missing} missing{open}: {} events wait from version {first}; they apply once \
             the missing versions arrive (discard this dead letter to apply them without)",
            events.len()
        ))
    }
}

/// A strict projection's gaps, between batches: one open longer than `gap_timeout`
/// becomes an open dead letter saying which versions are missing; one an operator
/// discarded gives up on them (its waiting events apply from the first one on); one
/// an operator retried is checked again and reopened if the versions are still
/// missing.
pub(crate) async fn gap_checks<S, A>(
    rules: &Rules<'_, A>,
    store: &mut S,
    held: &mut HeldAggregates,
    at_head: bool,
) -> Result<(), EngineError>
where
    S: SubscriberStore,
    A: Apply<S> + ?Sized,
{
    if rules.options.version_mode != VersionMode::Strict || held.gaps.is_empty() {
        return Ok(());
    }
    let gaps = store.gaps().await?;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let timeout = rules.options.gap_timeout.after();
    for gap in gaps.into_iter().filter(|g| rules.owns(&g.aggregate())) {
        let k = gap.aggregate();
        let due = at_head && timeout.is_some_and(|t| now - gap.since_unix >= t.as_secs_f64());
        match gap.status {
            DeadLetterStatus::Waiting if due => {
                let mut work = Work::begin(store, rules).await?;
                let error = work.describe_gap(&k, timeout).await?;
                tracing::error!(subscriber = %rules.subscriber(), aggregate_type = %k.kind, aggregate_id = %k.id, error = %error, "a version gap outlived gap_timeout: open dead letter");
                work.tx.open_gap(&gap, &error).await?;
                work.commit(0, None).await?;
            }
            DeadLetterStatus::Discarded | DeadLetterStatus::Retrying => {
                let accept = gap.status == DeadLetterStatus::Discarded;
                let mut work = Work::begin(store, rules).await?;
                let accepted = if accept { vec![k.clone()] } else { Vec::new() };
                let strict = work
                    .apply_strict(&[], held, std::slice::from_ref(&k), &accepted)
                    .await?;
                if !accept && !strict.released.contains(&k) {
                    let error = work.describe_gap(&k, timeout).await?;
                    work.tx.gap_still_open(gap.letter, &error).await?;
                }
                work.commit(0, None).await?;
                if accept {
                    tracing::warn!(subscriber = %rules.subscriber(), aggregate_type = %k.kind, aggregate_id = %k.id, "version gap discarded: its waiting events applied without the missing versions");
                }
                held.update(strict);
            }
            _ => {}
        }
    }
    Ok(())
}

//! Batches and retries: the fast path (a page in one transaction), the slow path after
//! an event's data failed (event by event, retried with backoff up to `max_attempts`,
//! then dead-lettered with its aggregate parked), and the dead letters an operator
//! asked to retry or discarded.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use walfold_event::{Aggregate, ErrorKind, Event, Reason};
use walfold_store::{Backoff, RetryItem, SubscriberStore, SubscriberTx};
use walfold_telemetry::signal::Signal;

use super::strict::HeldAggregates;
use super::work::{waiting_letter, Apply, Rules, Work};
use crate::error::EngineError;

/// Dead letters of a chain retried per read.
const RETRY_PAGE: i64 = 200;

fn last_commit(events: &[Event]) -> Option<std::time::SystemTime> {
    events.iter().filter_map(|e| e.committed_at).max()
}

/// How a page of the log went.
#[derive(Debug)]
pub(crate) enum Paged {
    /// In one transaction.
    Batch,
    /// Event by event, after an event's data failed in the batch.
    OneByOne,
    /// Cancelled before every event was handled.
    Cancelled,
    /// The batch ran the server short of a resource (and may be smaller): nothing of
    /// it landed.
    Shrink(EngineError),
}

/// A page of the log, checkpointed at `position`: the fast path, and when an event's
/// data fails in it, the slow path, each event committing its own checkpoint; the
/// page's end is saved only once every event in it has been handled. A batch that ran
/// the server short of a resource is given back to be tried smaller when `shrinkable`.
/// Any other error returns: the run loop goes on from the checkpoint.
pub(crate) async fn page<S, A>(
    rules: &Rules<'_, A>,
    store: &mut S,
    events: &[Event],
    position: i64,
    held: &mut HeldAggregates,
    cancel: &CancellationToken,
    shrinkable: bool,
) -> Result<Paged, EngineError>
where
    S: SubscriberStore,
    A: Apply<S> + ?Sized,
{
    match batch(rules, store, events, position, held).await {
        Ok(()) => Ok(Paged::Batch),
        Err(e) if e.is_resource() && shrinkable => Ok(Paged::Shrink(e)),
        Err(e) if e.kind() == ErrorKind::Data => {
            tracing::debug!(subscriber = %rules.subscriber(), error = %e, "batch failed, isolating the event");
            if !one_by_one(rules, store, events, held, cancel).await? {
                return Ok(Paged::Cancelled);
            }
            Work::begin(store, rules)
                .await?
                .commit(position, None)
                .await?;
            Ok(Paged::OneByOne)
        }
        Err(e) => Err(e),
    }
}

/// The fast path: the whole batch in one transaction, checkpointed at `position`.
/// Events of aggregates parked behind a failure are set aside behind their aggregate
/// in the same transaction.
async fn batch<S, A>(
    rules: &Rules<'_, A>,
    store: &mut S,
    events: &[Event],
    position: i64,
    held: &mut HeldAggregates,
) -> Result<(), EngineError>
where
    S: SubscriberStore,
    A: Apply<S> + ?Sized,
{
    // Nothing parked (the usual case): no aggregate to look up per event.
    let (waiting, live): (Vec<&Event>, Vec<&Event>) = if held.failed.is_empty() {
        (Vec::new(), events.iter().collect())
    } else {
        events
            .iter()
            .partition(|e| held.failed.contains(&Aggregate::of(e)))
    };
    let mut work = Work::begin(store, rules).await?;
    let strict = match work.process_all_new(&live).await? {
        Some(true) => Default::default(),
        Some(false) => {
            // Duplicates among them: nothing of this transaction may land.
            drop(work);
            work = Work::begin(store, rules).await?;
            work.process(&live, held).await?
        }
        None => work.process(&live, held).await?,
    };
    for e in &waiting {
        work.dead_letter(&waiting_letter(rules.subscriber(), e), false)
            .await?;
    }
    let stats = work.commit(position, last_commit(events)).await?;
    held.update(strict);
    if stats.stale > 0 {
        tracing::debug!(subscriber = %rules.subscriber(), stale = stats.stale, "stale events skipped by version guard");
    }
    Ok(())
}

/// The slow path after a batch failed on an event's data: one transaction per event;
/// an event whose data keeps failing is dead-lettered and its aggregate parked.
/// Returns false when cancelled before every event was handled. Any other error
/// returns: the run loop goes on from the checkpoint, which every handled event has
/// moved.
async fn one_by_one<S, A>(
    rules: &Rules<'_, A>,
    store: &mut S,
    events: &[Event],
    held: &mut HeldAggregates,
    cancel: &CancellationToken,
) -> Result<bool, EngineError>
where
    S: SubscriberStore,
    A: Apply<S> + ?Sized,
{
    let subscriber = rules.subscriber();
    for event in events {
        if cancel.is_cancelled() {
            return Ok(false);
        }
        let aggregate = Aggregate::of(event);
        if held.failed.contains(&aggregate) {
            let mut work = Work::begin(store, rules).await?;
            work.dead_letter(&waiting_letter(subscriber, event), false)
                .await?;
            work.commit(event.seq, event.committed_at).await?;
            continue;
        }
        let first = Duration::from_millis(rules.options.retry_backoff_ms);
        let mut backoff = Backoff::exact(first, first * 64);
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let e = match single(rules, store, event, held).await {
                Ok(()) => break,
                Err(e) if e.kind() == ErrorKind::Data => e,
                Err(e) => return Err(e),
            };
            if attempt < rules.options.max_attempts && !e.is_permanent() {
                Signal::ApplyRetrying {
                    subscriber,
                    event_id: &event.id,
                    aggregate_id: &event.aggregate_id,
                    attempt,
                    error: &e,
                }
                .report();
                if !backoff.sleep(cancel).await {
                    return Ok(false);
                }
                continue;
            }
            Signal::ApplyFailed {
                subscriber,
                event_id: &event.id,
                aggregate_id: &event.aggregate_id,
                attempts: attempt,
                error: &e,
            }
            .report();
            let mut letter = waiting_letter(subscriber, event);
            letter.reason = Reason::ProjectionFailed;
            letter.error = e.to_string();
            letter.attempts = attempt as i32;
            let mut work = Work::begin(store, rules).await?;
            work.dead_letter(&letter, true).await?;
            work.commit(event.seq, event.committed_at).await?;
            held.failed.insert(aggregate);
            break;
        }
    }
    Ok(true)
}

/// One event: claim, apply, checkpoint, in one transaction.
async fn single<S, A>(
    rules: &Rules<'_, A>,
    store: &mut S,
    event: &Event,
    held: &mut HeldAggregates,
) -> Result<(), EngineError>
where
    S: SubscriberStore,
    A: Apply<S> + ?Sized,
{
    let mut work = Work::begin(store, rules).await?;
    let strict = work.process(&[event], held).await?;
    work.commit(event.seq, event.committed_at).await?;
    held.update(strict);
    Ok(())
}

/// Applies the dead letters an operator asked to retry (`walfold dead-letters retry`)
/// for this partition's aggregates, between batches: per aggregate in log order, a
/// page at a time, each event through the normal claim and guard in its own
/// transaction. The transaction of the chain's last event releases the parked
/// aggregate, so its later events follow in order. Cancelling stops between events;
/// the rest stays requested and goes on next time.
pub(crate) async fn retries<S, A>(
    rules: &Rules<'_, A>,
    store: &mut S,
    held: &mut HeldAggregates,
    cancel: &CancellationToken,
) -> Result<(), EngineError>
where
    S: SubscriberStore,
    A: Apply<S> + ?Sized,
{
    let subscriber = rules.subscriber();
    let aggregates: Vec<Aggregate> = store
        .retry_aggregates()
        .await?
        .into_iter()
        .filter(|a| rules.owns(a))
        .collect();
    for aggregate in aggregates {
        let mut after = 0;
        let mut applied = 0usize;
        let failure = 'chain: loop {
            let mut page = store.retry_page(&aggregate, after, RETRY_PAGE + 1).await?;
            let last_page = page.len() as i64 <= RETRY_PAGE;
            page.truncate(RETRY_PAGE as usize);
            let Some(end) = page.last().map(|i| i.seq) else {
                break None;
            };
            let seqs: Vec<i64> = page.iter().map(|i| i.seq).collect();
            let events = store.read_events(&seqs).await?;
            for (k, item) in page.iter().enumerate() {
                if cancel.is_cancelled() {
                    return Ok(());
                }
                let Some(event) = events.iter().find(|e| e.seq == item.seq) else {
                    break 'chain Some((
                        item.id,
                        "the event is no longer in the event log".to_owned(),
                    ));
                };
                let release = last_page && k + 1 == page.len();
                match retry_one(rules, store, item, event, release, held).await {
                    Ok(()) => applied += 1,
                    Err(e) if e.kind() == ErrorKind::Data => {
                        break 'chain Some((item.id, e.to_string()))
                    }
                    Err(e) => return Err(e),
                }
            }
            if last_page {
                break None;
            }
            after = end;
        };
        match failure {
            None => {
                Signal::RetryApplied {
                    subscriber,
                    aggregate_type: &aggregate.kind,
                    aggregate_id: &aggregate.id,
                    events: applied,
                }
                .report();
                held.failed.remove(&aggregate);
            }
            Some((head, message)) => {
                Signal::RetryFailedAgain {
                    subscriber,
                    aggregate_type: &aggregate.kind,
                    aggregate_id: &aggregate.id,
                    dead_letter: head,
                    error: &message,
                }
                .report();
                let mut work = Work::begin(store, rules).await?;
                work.tx.retry_failed(&aggregate, head, &message).await?;
                // Position 0 keeps the partition's position (the checkpoint keeps the greatest).
                work.commit(0, None).await?;
            }
        }
    }
    Ok(())
}

/// One retried event: claim, apply, resolve its dead letter (and release the
/// aggregate after its last one), in one transaction.
async fn retry_one<S, A>(
    rules: &Rules<'_, A>,
    store: &mut S,
    item: &RetryItem,
    event: &Event,
    release: bool,
    held: &mut HeldAggregates,
) -> Result<(), EngineError>
where
    S: SubscriberStore,
    A: Apply<S> + ?Sized,
{
    let mut work = Work::begin(store, rules).await?;
    work.retrying = true;
    if release {
        work.release(&Aggregate::of(event)).await?;
    }
    let strict = work.process(&[event], held).await?;
    work.retried(item.id, &strict).await?;
    // Position 0 keeps the partition's position (the checkpoint keeps the greatest).
    work.commit(0, None).await?;
    held.update(strict);
    Ok(())
}

/// Releases this partition's aggregates parked behind a dead letter an operator
/// discarded, once nothing else of theirs waits (`walfold dead-letters discard` of
/// the only letter): a discard means the event is given up on, and with nothing
/// left to retry the aggregate would stay parked for good.
pub(crate) async fn release_discarded<S, A>(
    rules: &Rules<'_, A>,
    store: &mut S,
    held: &mut HeldAggregates,
) -> Result<(), EngineError>
where
    S: SubscriberStore,
    A: Apply<S> + ?Sized,
{
    if held.failed.is_empty() {
        return Ok(());
    }
    let released: Vec<Aggregate> = store
        .discarded_parks()
        .await?
        .into_iter()
        .filter(|k| held.failed.contains(k) && rules.owns(k))
        .collect();
    for aggregate in released {
        let mut work = Work::begin(store, rules).await?;
        work.release(&aggregate).await?;
        // Position 0 keeps the partition's position (the checkpoint keeps the greatest).
        work.commit(0, None).await?;
        held.failed.remove(&aggregate);
        tracing::info!(subscriber = %rules.subscriber(), aggregate_type = %aggregate.kind, aggregate_id = %aggregate.id, "aggregate released: the dead letter it was parked behind was discarded, and nothing else of it waits");
    }
    Ok(())
}

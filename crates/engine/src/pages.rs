//! Pages of the event log read once and shared by every projector partition of the
//! leader. In a drain, every subscriber reads the same ranges of the log; the server's
//! work to read and send a page (the largest statement of a drain) is then done once.
//!
//! Only full pages of an unfiltered read are kept: all events with a seq in
//! `(after, position]`. Such a range never changes (one appender numbers and commits the
//! log in order; pruning deletes only what every subscriber has passed), so a kept page
//! is as good as a fresh read, and so is any part of it: a reader whose position falls
//! inside a kept page takes the rest of it and of the kept pages that follow. Readers
//! seldom stand at the same positions (a page read at the head ends where the head was,
//! so each subscriber's pages start at other seqs from then on): taking from inside a
//! page is what lets the slower subscriber take what the faster one read. An unfiltered
//! reader takes from kept pages when they hold its whole batch (`limit` events); readers
//! asking for the same page at the same time wait for one read. A partition with
//! filters (a hash partition, event types) takes its events from consecutive kept pages.
//! A miss reads the log as before.
//!
//! Read-ahead: when a reader takes a full unfiltered page, the page after what the kept
//! pages hold for its next batch is read in the background on a connection of the pool,
//! so the reader's next take is a hit instead of a read in series with its apply. At
//! most one read-ahead is in flight; its page is kept under the same rules (full pages
//! only, within the byte bound).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;
use walfold_event::Event;
use walfold_store::{read_page, Filter, Page, StoreError};

use futures::TryFutureExt;

use crate::pool::{Lease, Pool};

/// Pages kept (each up to one batch of events), newest last; within the byte bound.
const KEPT: usize = 64;

/// What an event held in a kept page costs beside its payload (its strings, IDs and
/// times), for the byte bound.
const EVENT_OVERHEAD: usize = 256;

type Slot = Arc<OnceCell<Arc<Page>>>;

#[derive(Debug)]
pub(crate) struct SharedPages {
    /// `((after, limit), page)`: a page being read, or a full page read.
    pages: Mutex<VecDeque<((i64, i64), Slot)>>,
    /// Most payload bytes a page holds (`pipeline.page_bytes`); kept pages hold at most
    /// twice that together.
    page_bytes: usize,
    /// A read-ahead is in flight (at most one page ahead).
    ahead: AtomicBool,
}

impl SharedPages {
    pub(crate) fn new(page_bytes: usize) -> SharedPages {
        SharedPages {
            pages: Mutex::default(),
            page_bytes,
            ahead: AtomicBool::new(false),
        }
    }

    /// `pipeline.page_bytes`, for a read.
    pub(crate) fn page_bytes(&self) -> i64 {
        i64::try_from(self.page_bytes).unwrap_or(i64::MAX)
    }

    /// The page of events after `after` for `filter` (at most `limit`): taken from kept
    /// pages, or read with `read` (and kept when it can be shared). Returns whether it
    /// was taken from a page another partition read.
    pub(crate) async fn page<E, F>(
        &self,
        after: i64,
        filter: &Filter,
        limit: i64,
        read: impl FnOnce() -> F,
    ) -> Result<(Arc<Page>, bool), E>
    where
        F: Future<Output = Result<Page, E>>,
    {
        if !filter.is_everything() {
            if let Some(page) = self.take(after, filter, limit) {
                return Ok((page, true));
            }
            return Ok((Arc::new(read().await?), false));
        }
        // The page itself (kept, or being read) is taken as it is; else the kept pages
        // around it, if they hold the batch. Where they end short of it at a page being
        // read (another reader's, a read-ahead), that read is waited for.
        for _ in 0..KEPT {
            if self.has(after, limit) {
                break;
            }
            if let Some(page) = self.take(after, filter, limit) {
                return Ok((page, true));
            }
            let Some(reading) = self.reading_after(after) else {
                break;
            };
            // Waits for that read; initializes nothing (a failed read leaves it unset).
            if reading
                .get_or_try_init(|| async { Err::<Arc<Page>, ()>(()) })
                .await
                .is_err()
            {
                break;
            }
        }
        let slot = self.slot(after, limit);
        let mut read_here = false;
        let page = slot
            .get_or_try_init(|| {
                read_here = true;
                async { read().await.map(Arc::new) }
            })
            .await?
            .clone();
        if read_here && (page.caught_up || page.events.len() as i64 != limit) {
            // At the head (the next reader must see what was appended since), or cut
            // for its bytes.
            self.forget(&slot);
        } else if read_here {
            self.trim();
        }
        Ok((page, !read_here))
    }

    /// After a reader with `filter` took `page` (asked for at most `limit` events): when
    /// it is a full unfiltered page, reads the next one on a connection of `pool` with
    /// the page read `sql`, in the background.
    pub(crate) fn read_ahead(
        self: &Arc<Self>,
        page: &Page,
        filter: &Filter,
        limit: i64,
        pool: &Arc<Pool>,
        sql: &Arc<str>,
    ) {
        if !filter.is_everything() || page.caught_up || page.events.len() as i64 != limit {
            return;
        }
        // The kept pages may hold the reader's next batch, or its start: read what
        // follows them.
        let Some(after) = self.ahead_from(page.position, limit) else {
            return;
        };
        let (pool, sql, filter) = (pool.clone(), sql.clone(), filter.clone());
        let max_bytes = self.page_bytes();
        self.ahead_with(
            after,
            limit,
            async move { pool.lease().await },
            move |lease: Lease| async move {
                let page = read_page(&lease, &sql, after, &filter, limit, max_bytes).await?;
                lease.release();
                Ok::<_, StoreError>(page)
            },
            Lease::release,
        );
    }

    /// Reads the unfiltered page `(after, limit)` in the background and keeps it if
    /// full, unless a read-ahead is in flight. First `connect` (a connection of the pool:
    /// no slot exists while it waits, so no reader that holds one waits for it), then,
    /// unless the page is kept or being read by then, `read` it on that connection (a
    /// reader asking for it meanwhile waits for this read); an unused connection goes
    /// to `unused`.
    fn ahead_with<C, E, P, F>(
        self: &Arc<Self>,
        after: i64,
        limit: i64,
        connect: P,
        read: impl FnOnce(C) -> F + Send + 'static,
        unused: impl FnOnce(C) + Send + 'static,
    ) where
        C: Send + 'static,
        P: Future<Output = Result<C, E>> + Send + 'static,
        F: Future<Output = Result<Page, E>> + Send + 'static,
        E: Send + 'static,
    {
        if self.ahead.swap(true, Ordering::AcqRel) {
            return;
        }
        let pages = self.clone();
        tokio::spawn(async move {
            pages.ahead_once(after, limit, connect, read, unused).await;
            pages.ahead.store(false, Ordering::Release);
        });
    }

    async fn ahead_once<C, E, P, F>(
        &self,
        after: i64,
        limit: i64,
        connect: P,
        read: impl FnOnce(C) -> F,
        unused: impl FnOnce(C),
    ) where
        P: Future<Output = Result<C, E>>,
        F: Future<Output = Result<Page, E>>,
    {
        let Ok(conn) = connect.await else { return };
        let slot = {
            let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
            if pages.iter().any(|((a, _), _)| *a == after) {
                None
            } else {
                if pages.len() == KEPT {
                    pages.pop_front();
                }
                let slot = Slot::default();
                pages.push_back(((after, limit), slot.clone()));
                Some(slot)
            }
        };
        let mut conn = Some(conn);
        let Some(slot) = slot else {
            unused(conn.take().expect("not taken"));
            return;
        };
        let full = match slot
            .get_or_try_init(|| read(conn.take().expect("taken once")).map_ok(Arc::new))
            .await
        {
            Ok(page) => !page.caught_up && page.events.len() as i64 == limit,
            Err(_) => false,
        };
        if let Some(conn) = conn {
            // A reader came first and read it on its own connection.
            unused(conn);
        }
        if full {
            self.trim();
        } else {
            // At the head, cut for its bytes, or failed: the next reader reads.
            self.forget(&slot);
        }
    }

    /// A page being read that starts where the kept full pages continuing from `after`
    /// end.
    fn reading_after(&self, after: i64) -> Option<Slot> {
        let pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        let mut end = after;
        while let Some(page) = covering(&pages, end) {
            end = page.position;
        }
        pages
            .iter()
            .find(|((a, _), slot)| *a == end && !slot.initialized())
            .map(|(_, slot)| slot.clone())
    }

    /// Whether the unfiltered page `(after, limit)` is kept or being read.
    fn has(&self, after: i64, limit: i64) -> bool {
        let pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        pages.iter().any(|(k, _)| *k == (after, limit))
    }

    /// The slot of an unfiltered page, made (and the oldest dropped) if new.
    fn slot(&self, after: i64, limit: i64) -> Slot {
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, slot)) = pages.iter().find(|(k, _)| *k == (after, limit)) {
            return slot.clone();
        }
        if pages.len() == KEPT {
            pages.pop_front();
        }
        let slot = Slot::default();
        pages.push_back(((after, limit), slot.clone()));
        slot
    }

    /// Drops the oldest kept pages while they hold more than twice `page_bytes`.
    fn trim(&self) {
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = |pages: &VecDeque<((i64, i64), Slot)>| -> usize {
            pages
                .iter()
                .filter_map(|(_, s)| s.get())
                .map(|p| p.bytes + p.events.len() * EVENT_OVERHEAD)
                .sum()
        };
        while pages.len() > 1 && bytes(&pages) > 2 * self.page_bytes {
            pages.pop_front();
        }
    }

    fn forget(&self, slot: &Slot) {
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        pages.retain(|(_, s)| !Arc::ptr_eq(s, slot));
    }

    /// Where a read-ahead for a reader at `position` (batches of `limit`) starts: after
    /// the kept full pages that continue from `position`; `None` when they hold its
    /// next batch already, or a page starting there is kept or being read.
    fn ahead_from(&self, position: i64, limit: i64) -> Option<i64> {
        let pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        let mut end = position;
        let mut events = 0i64;
        while let Some(page) = covering(&pages, end) {
            events += page.events.iter().filter(|e| e.seq > end).count() as i64;
            end = page.position;
            if events >= limit {
                return None;
            }
        }
        if pages.iter().any(|((a, _), _)| *a == end) {
            return None;
        }
        Some(end)
    }

    /// A reader's events from consecutive kept full pages, the first holding `after`
    /// (its start, or inside it). An unfiltered reader takes them only when they hold
    /// its whole batch (`limit` events); a filtered one whenever a page holds `after`.
    fn take(&self, after: i64, filter: &Filter, limit: i64) -> Option<Arc<Page>> {
        let everything = filter.is_everything();
        let pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        let mut events = Vec::new();
        let mut position = after;
        let mut covered = false;
        while let Some(page) = covering(&pages, position) {
            covered = true;
            events.extend(
                page.events
                    .iter()
                    .filter(|e| e.seq > position && filter.matches(e))
                    .cloned(),
            );
            position = page.position;
            if events.len() as i64 >= limit {
                break;
            }
        }
        if !covered || (everything && (events.len() as i64) < limit) {
            return None;
        }
        if events.len() as i64 > limit {
            events.truncate(limit as usize);
            position = events.last().map_or(position, |e: &Event| e.seq);
        }
        let bytes = events.iter().map(|e| e.payload.len()).sum();
        Some(Arc::new(Page {
            events,
            position,
            // Never: the head may be further on.
            caught_up: false,
            bytes,
        }))
    }
}

/// The kept full page holding `position`: its range `(after, position]` starts at or
/// before it and ends after it.
fn covering(pages: &VecDeque<((i64, i64), Slot)>, position: i64) -> Option<Arc<Page>> {
    pages
        .iter()
        .filter(|((a, _), _)| *a <= position)
        .filter_map(|(_, slot)| slot.get())
        .find(|p| !p.caught_up && !p.events.is_empty() && p.position > position)
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: i64, aggregate: &str) -> Event {
        Event {
            seq,
            claim_seq: seq,
            id: uuid::Uuid::from_u64_pair(0, seq as u64),
            aggregate_type: "order".into(),
            aggregate_id: aggregate.into(),
            event_type: if seq % 2 == 0 { "Paid" } else { "Placed" }.into(),
            version: Some(seq),
            payload: serde_json::json!({}).into(),
            headers: None,
            occurred_at: None,
            source_lsn: walfold_event::Lsn(0),
            committed_at: None,
            source: "default".into(),
        }
    }

    fn page(from: i64, to: i64, caught_up: bool) -> Page {
        Page {
            events: (from..=to).map(|s| event(s, &format!("o-{s}"))).collect(),
            position: to,
            caught_up,
            bytes: 0,
        }
    }

    fn all() -> Filter {
        Filter {
            partition: 0,
            partitions: 1,
            event_types: None,
            aggregate_types: None,
            sources: None,
        }
    }

    async fn read(
        pages: &SharedPages,
        after: i64,
        filter: &Filter,
        limit: i64,
        db: Page,
    ) -> (Arc<Page>, bool) {
        pages
            .page(after, filter, limit, || async { Ok::<_, ()>(db) })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn full_pages_are_read_once_and_filtered_readers_take_their_share() {
        let pages = SharedPages::new(4 << 20);
        let (first, shared) = read(&pages, 0, &all(), 4, page(1, 4, false)).await;
        assert!(!shared);
        assert_eq!(first.position, 4);
        // The same page again comes from memory, whatever the database would say now.
        let (again, shared) = read(&pages, 0, &all(), 4, page(100, 103, false)).await;
        assert!(shared);
        assert_eq!(again.events[0].seq, 1);
        read(&pages, 4, &all(), 4, page(5, 8, false)).await;
        // A page at the head is not kept: the next reader reads again.
        read(&pages, 8, &all(), 4, page(9, 9, true)).await;
        let (fresh, shared) = read(&pages, 8, &all(), 4, page(9, 10, true)).await;
        assert!(!shared);
        assert_eq!(fresh.position, 10);
        let paid = Filter {
            event_types: Some(vec!["Paid".into()]),
            ..all()
        };
        let (share, shared) = read(&pages, 0, &paid, 3, page(0, 0, true)).await;
        assert!(shared);
        let seqs: Vec<i64> = share.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [2, 4, 6]);
        assert_eq!(
            share.position, 6,
            "cut at the limit: position is the last taken"
        );
        let (rest, _) = read(&pages, 0, &paid, 10, page(0, 0, true)).await;
        assert_eq!(rest.events.len(), 4);
        assert_eq!(rest.position, 8, "every kept page consumed");
        assert!(!rest.caught_up);
        // Nothing kept from here: a filtered reader reads the database.
        let (own, shared) = read(&pages, 8, &paid, 10, page(10, 10, true)).await;
        assert!(!shared);
        assert_eq!(own.position, 10);
    }

    #[tokio::test]
    async fn readers_of_the_same_page_at_once_wait_for_one_read() {
        let pages = Arc::new(SharedPages::new(4 << 20));
        let reads = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let (pages, reads) = (pages.clone(), reads.clone());
            tasks.push(tokio::spawn(async move {
                pages
                    .page(0, &all(), 4, || async move {
                        reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        Ok::<_, ()>(page(1, 4, false))
                    })
                    .await
                    .unwrap()
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().0.position, 4);
        }
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_reader_inside_kept_pages_takes_the_rest_of_them() {
        let pages = Arc::new(SharedPages::new(4 << 20));
        read(&pages, 0, &all(), 4, page(1, 4, false)).await;
        read(&pages, 4, &all(), 4, page(5, 8, false)).await;
        // A reader whose pages started elsewhere (at 2): the rest of the first page and
        // the start of the next, from memory.
        let (mine, shared) = read(&pages, 2, &all(), 4, page(100, 103, false)).await;
        assert!(shared);
        let seqs: Vec<i64> = mine.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [3, 4, 5, 6]);
        assert_eq!(mine.position, 6);
        assert!(!mine.caught_up);
        // The kept pages hold less than its batch: it reads the log.
        let (own, shared) = read(&pages, 6, &all(), 4, page(7, 10, false)).await;
        assert!(!shared);
        assert_eq!(own.position, 10);
        // Its read-ahead starts after what the kept pages hold for its next batch.
        assert_eq!(pages.ahead_from(6, 4), None, "(6, 10] is kept");
        assert_eq!(pages.ahead_from(7, 4), Some(10));
        assert_eq!(pages.ahead_from(10, 4), Some(10));
    }

    #[tokio::test]
    async fn a_reader_whose_kept_pages_end_at_a_page_being_read_waits_for_it() {
        let pages = Arc::new(SharedPages::new(4 << 20));
        read(&pages, 0, &all(), 4, page(1, 4, false)).await;
        // Another reader is reading (4, 8].
        let reading = {
            let pages = pages.clone();
            tokio::spawn(async move {
                pages
                    .page(4, &all(), 4, || async {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        Ok::<_, ()>(page(5, 8, false))
                    })
                    .await
                    .unwrap()
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        // A reader at 2 takes the rest of (0, 4] and the start of (4, 8] once read,
        // instead of reading (2, 6] itself.
        let (mine, shared) = read(&pages, 2, &all(), 4, page(100, 103, false)).await;
        assert!(shared);
        let seqs: Vec<i64> = mine.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [3, 4, 5, 6]);
        assert_eq!(reading.await.unwrap().0.position, 8);
    }

    /// A read-ahead of the page after `after` (limit 4) that reads `db`.
    fn ahead(pages: &Arc<SharedPages>, after: i64, db: Result<Page, ()>) {
        pages.ahead_with(
            after,
            4,
            async { Ok::<_, ()>(()) },
            move |()| async move { db },
            |()| {},
        );
    }

    #[tokio::test]
    async fn the_next_full_page_is_read_ahead_and_a_page_at_the_head_is_not_kept() {
        let pages = Arc::new(SharedPages::new(4 << 20));
        let (first, _) = read(&pages, 0, &all(), 4, page(1, 4, false)).await;
        assert_eq!(first.position, 4);
        ahead(&pages, 4, Ok(page(5, 8, false)));
        // Only one page ahead: a second read-ahead while one is in flight does nothing.
        ahead(&pages, 8, Ok(page(9, 12, false)));
        tokio::task::yield_now().await;
        // The next take waits for the read-ahead instead of reading.
        let (next, shared) = read(&pages, 4, &all(), 4, page(100, 103, false)).await;
        assert!(shared);
        assert_eq!(next.events[0].seq, 5);
        while pages.ahead.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
        let (own, shared) = read(&pages, 8, &all(), 4, page(9, 12, false)).await;
        assert!(!shared, "the second read-ahead was not started");
        assert_eq!(own.position, 12);
        // A read-ahead that reaches the head is dropped: the next reader reads again.
        ahead(&pages, 12, Ok(page(13, 13, true)));
        while pages.ahead.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
        let (fresh, shared) = read(&pages, 12, &all(), 4, page(13, 14, true)).await;
        assert!(!shared);
        assert_eq!(fresh.position, 14);
        // A failed read-ahead leaves the page to the reader.
        ahead(&pages, 14, Err(()));
        while pages.ahead.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
        let (mine, shared) = read(&pages, 14, &all(), 4, page(15, 18, false)).await;
        assert!(!shared);
        assert_eq!(mine.position, 18);
    }

    #[test]
    fn a_partition_filter_matches_what_the_read_selects() {
        let f = Filter {
            partition: 1,
            partitions: 3,
            event_types: None,
            aggregate_types: Some(vec!["order".into()]),
            sources: None,
        };
        for s in 1..50 {
            let e = event(s, &format!("o-{s}"));
            let expected =
                walfold_event::partition_hash(&e.aggregate_type, &e.aggregate_id) % 3 == 1;
            assert_eq!(f.matches(&e), expected);
        }
    }
}

//! Strict sequencing (`version_mode = "strict"`): which events of a batch apply, in what
//! order, and which wait. Pure: the projector loads the applied versions and the waiting
//! events, and writes what this decides in one transaction.
//!
//! Per aggregate, the next version to apply is the last applied one + 1 (or the
//! projection's `first_version`). Candidates are taken in version order (log order
//! among equal versions): the next version applies and advances; a version already
//! applied is a duplicate; a higher one waits, with every later version behind it.

use std::collections::HashMap;

use walfold_event::Aggregate;
use walfold_event::Event;

/// What a strict projection does with its candidates.
#[derive(Debug, Default)]
pub(crate) struct Sequenced<'e> {
    /// To apply, in this order (ascending versions per aggregate).
    pub apply: Vec<&'e Event>,
    /// At or below a version already applied: skipped.
    pub duplicates: Vec<&'e Event>,
    /// Above the next version: they wait for the missing ones.
    pub waiting: Vec<&'e Event>,
    /// The last version applied, per aggregate that advanced.
    pub advanced: Vec<(Aggregate, i64)>,
    /// Per aggregate that still waits: the next version it needs.
    pub needs: Vec<(Aggregate, i64)>,
    /// Below `first_version` for an aggregate with none applied: a misconfiguration
    /// or a producer error, never skipped silently.
    pub below_first: Vec<&'e Event>,
}

/// Sequences `candidates` (each with a version) given each aggregate's last applied
/// version (`applied`; absent: none yet, so `first` is next).
pub(crate) fn sequence<'e>(
    candidates: &[&'e Event],
    applied: &HashMap<Aggregate, i64>,
    first: i64,
) -> Sequenced<'e> {
    let mut groups: Vec<(Aggregate, Vec<&'e Event>)> = Vec::new();
    let mut index: HashMap<Aggregate, usize> = HashMap::new();
    for e in candidates {
        let key = Aggregate::of(e);
        let i = *index.entry(key.clone()).or_insert_with(|| {
            groups.push((key, Vec::new()));
            groups.len() - 1
        });
        groups[i].1.push(e);
    }
    let mut out = Sequenced::default();
    for (key, mut events) in groups {
        events.sort_by_key(|e| (e.version.unwrap_or(i64::MIN), e.seq));
        let known = applied.get(&key);
        // Counted in i128: after version i64::MAX the next is one past every version a
        // producer can send, so whatever follows it is a duplicate, not an overflow.
        let start = known.map_or(i128::from(first), |&v| i128::from(v) + 1);
        let mut next = start;
        let mut blocked = false;
        for e in events {
            let v = i128::from(e.version.unwrap_or(i64::MIN));
            if known.is_none() && v < i128::from(first) {
                out.below_first.push(e);
            } else if v < next {
                out.duplicates.push(e);
            } else if v == next && !blocked {
                out.apply.push(e);
                next += 1;
            } else {
                blocked = true;
                out.waiting.push(e);
            }
        }
        let version = |n: i128| i64::try_from(n).unwrap_or(i64::MAX);
        if next > start {
            out.advanced.push((key.clone(), version(next - 1)));
        }
        if blocked {
            // Blocked only by a version above `next`, so `next` is at most i64::MAX.
            out.needs.push((key, version(next)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: i64, aggregate: &str, version: i64) -> Event {
        Event {
            seq,
            claim_seq: seq,
            id: uuid::Uuid::from_u64_pair(0, seq as u64),
            aggregate_type: "account".into(),
            aggregate_id: aggregate.into(),
            event_type: "Credited".into(),
            version: Some(version),
            payload: serde_json::json!({}).into(),
            headers: None,
            occurred_at: None,
            source_lsn: walfold_event::Lsn(0),
            committed_at: None,
            source: "default".into(),
        }
    }

    fn versions(events: &[&Event]) -> Vec<(String, i64)> {
        events
            .iter()
            .map(|e| (e.aggregate_id.clone(), e.version.unwrap()))
            .collect()
    }

    #[test]
    fn versions_apply_once_in_order_and_gaps_wait() {
        let a1 = event(1, "a", 1);
        let a3 = event(2, "a", 3);
        let b2 = event(3, "b", 2);
        let a2 = event(4, "a", 2);
        let a5 = event(5, "a", 5);
        let b1 = event(6, "b", 1);
        let b1_again = event(7, "b", 1);
        let all = [&a1, &a3, &b2, &a2, &a5, &b1, &b1_again];
        let s = sequence(&all, &HashMap::new(), 1);
        assert_eq!(
            versions(&s.apply),
            [
                ("a".into(), 1),
                ("a".into(), 2),
                ("a".into(), 3),
                ("b".into(), 1),
                ("b".into(), 2)
            ]
        );
        assert_eq!(versions(&s.waiting), [("a".into(), 5)]);
        assert_eq!(versions(&s.duplicates), [("b".into(), 1)]);
        assert_eq!(
            s.duplicates[0].seq, 7,
            "the later of two equal versions is the duplicate"
        );
        assert_eq!(s.needs, [(Aggregate::new("account", "a"), 4)]);
        let mut advanced = s.advanced.clone();
        advanced.sort();
        assert_eq!(
            advanced,
            [
                (Aggregate::new("account", "a"), 3),
                (Aggregate::new("account", "b"), 2)
            ]
        );
    }

    #[test]
    fn a_version_below_first_version_of_a_new_aggregate_is_set_apart() {
        let a0 = event(1, "a", 0);
        let a1 = event(2, "a", 1);
        let s = sequence(&[&a0, &a1], &HashMap::new(), 1);
        assert_eq!(versions(&s.below_first), [("a".into(), 0)]);
        assert_eq!(versions(&s.apply), [("a".into(), 1)]);
        assert!(s.duplicates.is_empty());
    }

    #[test]
    fn applied_versions_and_first_version_decide_the_next_one() {
        let a4 = event(1, "a", 4);
        let a6 = event(2, "a", 6);
        let c0 = event(3, "c", 0);
        let mut applied = HashMap::new();
        applied.insert(Aggregate::new("account", "a"), 4);
        let s = sequence(&[&a4, &a6, &c0], &applied, 0);
        assert_eq!(versions(&s.duplicates), [("a".into(), 4)]);
        assert_eq!(versions(&s.waiting), [("a".into(), 6)]);
        assert_eq!(versions(&s.apply), [("c".into(), 0)]);
        assert_eq!(s.needs, [(Aggregate::new("account", "a"), 5)]);
    }

    #[test]
    fn the_last_version_a_producer_can_send_applies_once_and_nothing_follows_it() {
        let last = event(1, "a", i64::MAX);
        let again = event(2, "a", i64::MAX);
        let lower = event(3, "a", 7);
        let applied = HashMap::from([(Aggregate::new("account", "a"), i64::MAX - 1)]);
        let s = sequence(&[&last, &again], &applied, 1);
        assert_eq!(versions(&s.apply), [("a".to_owned(), i64::MAX)]);
        assert_eq!(versions(&s.duplicates), [("a".to_owned(), i64::MAX)]);
        assert_eq!(s.advanced, [(Aggregate::new("account", "a"), i64::MAX)]);
        assert!(s.needs.is_empty() && s.waiting.is_empty());

        let applied = HashMap::from([(Aggregate::new("account", "a"), i64::MAX)]);
        let s = sequence(&[&again, &lower], &applied, 1);
        assert_eq!(s.duplicates.len(), 2, "{s:?}");
        assert!(s.apply.is_empty() && s.waiting.is_empty() && s.needs.is_empty());

        let applied = HashMap::new();
        let s = sequence(&[&last], &applied, i64::MIN);
        assert_eq!(versions(&s.waiting), [("a".to_owned(), i64::MAX)]);
        assert_eq!(s.needs, [(Aggregate::new("account", "a"), i64::MIN)]);
    }
}

//! Who runs which work unit: one pure function of the units and the live instances,
//! which every instance computes alike and acts on for its own part (it takes what is
//! its and free, and gives back what is another's), so no coordinator hands work out.
//!
//! Rendezvous hashing with bounded loads: each unit goes to the instance that scores it
//! highest among those that may run its projection, unless that one has its fair share
//! (the units over the instances, rounded up) already, then to the next. Units keep
//! their instance as others join or leave unless the scores or the shares say otherwise,
//! so a joining instance takes about its share and nothing else moves.

use std::collections::HashMap;

use uuid::Uuid;

/// A unit to place: where it lives and its name, and the projection it runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Place {
    pub target: String,
    pub subscriber: String,
    pub partition: u32,
}

/// An instance that may take work, and the projections it may run.
pub(crate) struct Worker {
    pub id: Uuid,
    pub projections: Vec<String>,
}

/// The instance each unit goes to; a unit no worker may run has none.
pub(crate) fn assign(units: &[(Place, &str)], workers: &[Worker]) -> HashMap<Place, Uuid> {
    let placeable: Vec<(&Place, Vec<usize>)> = units
        .iter()
        .map(|(place, projection)| {
            let may: Vec<usize> = (0..workers.len())
                .filter(|&w| workers[w].projections.iter().any(|p| p == projection))
                .collect();
            (place, may)
        })
        .filter(|(_, may)| !may.is_empty())
        .collect();
    let active = {
        let mut any = vec![false; workers.len()];
        for (_, may) in &placeable {
            for &w in may {
                any[w] = true;
            }
        }
        any.iter().filter(|a| **a).count().max(1)
    };
    let share = placeable.len().div_ceil(active);
    // The units fewest instances may run first (a pinned projection's take their
    // instances' shares before units that could go anywhere), then in an order of their
    // own hash, so no instance is favoured by names.
    let mut order: Vec<&(&Place, Vec<usize>)> = placeable.iter().collect();
    order.sort_by_key(|(place, may)| (may.len(), score(place, &Uuid::nil())));
    let mut load = vec![0usize; workers.len()];
    let mut placed = HashMap::new();
    for (place, may) in order {
        let mut ranked = may.clone();
        ranked.sort_by_key(|&w| std::cmp::Reverse(score(place, &workers[w].id)));
        let chosen = ranked
            .iter()
            .copied()
            .find(|&w| load[w] < share)
            .unwrap_or_else(|| {
                *ranked
                    .iter()
                    .min_by_key(|&&w| load[w])
                    .expect("a placeable unit has a worker")
            });
        load[chosen] += 1;
        placed.insert((*place).clone(), workers[chosen].id);
    }
    placed
}

/// A unit's score for an instance: FNV-1a over both names, the same in every build.
fn score(place: &Place, id: &Uuid) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    eat(place.target.as_bytes());
    eat(place.subscriber.as_bytes());
    eat(&place.partition.to_be_bytes());
    eat(id.as_bytes());
    // A final mix, so close inputs spread.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(projections: usize, partitions: u32) -> Vec<(Place, String)> {
        (0..projections)
            .flat_map(|p| {
                (0..partitions).map(move |k| {
                    (
                        Place {
                            target: "main".into(),
                            subscriber: format!("projection{p}.v1"),
                            partition: k,
                        },
                        format!("projection{p}"),
                    )
                })
            })
            .collect()
    }

    fn ids(n: u128) -> Vec<Uuid> {
        (1..=n)
            .map(|i| Uuid::from_u128(i * 0x9e37_79b9_7f4a_7c15))
            .collect()
    }

    fn run(
        units: &[(Place, String)],
        ids: &[Uuid],
        runs: &dyn Fn(&str) -> bool,
    ) -> HashMap<Place, Uuid> {
        let mut names: Vec<String> = units.iter().map(|(_, n)| n.clone()).collect();
        names.dedup();
        names.retain(|n| runs(n));
        let workers: Vec<Worker> = ids
            .iter()
            .map(|&id| Worker {
                id,
                projections: names.clone(),
            })
            .collect();
        let refs: Vec<(Place, &str)> = units.iter().map(|(p, n)| (p.clone(), n.as_str())).collect();
        assign(&refs, &workers)
    }

    fn loads(placed: &HashMap<Place, Uuid>, ids: &[Uuid]) -> Vec<usize> {
        ids.iter()
            .map(|id| placed.values().filter(|v| *v == id).count())
            .collect()
    }

    #[test]
    fn forty_units_spread_over_three_instances_within_one_of_each_other() {
        let u = units(10, 4);
        let i = ids(3);
        let placed = run(&u, &i, &|_| true);
        assert_eq!(placed.len(), 40);
        let l = loads(&placed, &i);
        assert!(l.iter().all(|&n| (13..=14).contains(&n)), "{l:?}");
        assert_eq!(
            placed,
            run(&u, &i, &|_| true),
            "the same inputs, the same answer"
        );
    }

    #[test]
    fn a_joining_instance_takes_about_its_share_and_little_else_moves() {
        let u = units(10, 4);
        let three = ids(3);
        let four = ids(4);
        let before = run(&u, &three, &|_| true);
        let after = run(&u, &four, &|_| true);
        let l = loads(&after, &four);
        assert!(l.iter().all(|&n| n == 10), "{l:?}");
        let moved = before.iter().filter(|(k, v)| after[*k] != **v).count();
        // The newcomer's ten, and a few the shares shifted.
        assert!(moved <= 16, "{moved} of 40 moved");
    }

    #[test]
    fn a_leaving_instance_s_units_go_to_the_others_and_little_else_moves() {
        let u = units(10, 4);
        let three = ids(3);
        let before = run(&u, &three, &|_| true);
        let after = run(&u, &three[..2], &|_| true);
        // A share filled by the leaver's units may push one or two of its own on.
        let stayed_moved = before
            .iter()
            .filter(|(k, v)| **v != three[2] && after[*k] != **v)
            .count();
        assert!(
            stayed_moved <= 4,
            "{stayed_moved} units moved though their instance stayed"
        );
        assert_eq!(loads(&after, &three[..2]), vec![20, 20]);
    }

    #[test]
    fn pinned_projections_go_only_where_they_may_run() {
        let u = units(4, 4);
        let i = ids(3);
        // The first instance runs only projection0; the last runs nothing.
        let names: Vec<String> = (0..4).map(|p| format!("projection{p}")).collect();
        let ws = [
            Worker {
                id: i[0],
                projections: vec!["projection0".into()],
            },
            Worker {
                id: i[1],
                projections: names.clone(),
            },
            Worker {
                id: i[2],
                projections: Vec::new(),
            },
        ];
        let refs: Vec<(Place, &str)> = u.iter().map(|(p, n)| (p.clone(), n.as_str())).collect();
        let placed = assign(&refs, &ws);
        assert_eq!(placed.len(), 16);
        for ((place, projection), _) in u.iter().zip(0..) {
            let owner = placed[place];
            assert_ne!(owner, i[2], "the instance that runs nothing got {place:?}");
            if owner == i[0] {
                assert_eq!(projection, "projection0");
            }
        }
    }

    #[test]
    fn a_unit_no_instance_may_run_has_no_owner() {
        let u = units(1, 2);
        assert!(run(&u, &ids(2), &|_| false).is_empty());
        assert!(run(&u, &[], &|_| true).is_empty());
    }
}

//! Choosing victims: which candidates' freed capacity makes enough nodes
//! fit, greedily by cost per newly fitting node.

use std::collections::BTreeMap;

use super::VictimCost;
use crate::sm::{NodeSlot, Resources, State, Usage, fits};

/// A candidate with what it would free on eligible nodes.
pub(super) struct Candidate {
    pub(super) cost: VictimCost,
    /// Eligible nodes it holds, with what it holds there.
    pub(super) frees: Vec<(NodeSlot, Usage)>,
}

/// Free capacity of the nodes that could take a task once victims leave
/// (ready, unheld, big enough, not fitting now), by slot; `None` elsewhere.
pub(super) type Eligible = [Option<Usage>];

/// What the chosen candidates free, per node.
pub(super) fn freed_by(candidates: &[Candidate], chosen: &[usize]) -> BTreeMap<NodeSlot, Usage> {
    let mut freed: BTreeMap<NodeSlot, Usage> = BTreeMap::new();
    for &i in chosen {
        for (slot, u) in &candidates[i].frees {
            let f = freed.entry(*slot).or_default();
            *f = f.plus(u);
        }
    }
    freed
}

pub(super) fn fits_with(
    state: &State,
    need: &Resources,
    slot: NodeSlot,
    free: &Usage,
    freed: &BTreeMap<NodeSlot, Usage>,
) -> bool {
    let extra = freed.get(&slot).copied().unwrap_or_default();
    fits(need, &state.node(slot).resources, &free.plus(&extra))
}

/// The sum of the `k` largest values.
pub(in crate::policy) fn top_sum(values: impl Iterator<Item = u64>, k: usize) -> u64 {
    const SMALL: usize = 8;
    if k > SMALL {
        let mut all: Vec<u64> = values.collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        return all.iter().take(k).fold(0, |s, v| s.saturating_add(*v));
    }
    let mut top = [0u64; SMALL];
    for v in values {
        // Insert into the descending top-k.
        let mut i = k;
        while i > 0 && top[i - 1] < v {
            if i < k {
                top[i] = top[i - 1];
            }
            i -= 1;
        }
        if i < k {
            top[i] = v;
        }
    }
    top[..k].iter().fold(0, |s, v| s.saturating_add(*v))
}

/// Eligible nodes (not fitting now) that fit with `freed`.
fn count_fitting(state: &State, need: &Resources, eligible: &Eligible, freed: &BTreeMap<NodeSlot, Usage>) -> usize {
    freed
        .keys()
        .filter(|slot| eligible[slot.0 as usize].is_some_and(|free| fits_with(state, need, **slot, &free, freed)))
        .count()
}

/// (nodes newly fitting, non-fitting nodes touched) if `c` joins `freed`.
fn gain(
    state: &State,
    need: &Resources,
    eligible: &Eligible,
    freed: &BTreeMap<NodeSlot, Usage>,
    c: &Candidate,
) -> (usize, usize) {
    let mut newly = 0;
    let mut touched = 0;
    for (slot, u) in &c.frees {
        let free = &eligible[slot.0 as usize].expect("a candidate frees eligible nodes only");
        if fits_with(state, need, *slot, free, freed) {
            continue;
        }
        touched += 1;
        let extra = freed.get(slot).copied().unwrap_or_default().plus(u);
        if fits(need, &state.node(*slot).resources, &free.plus(&extra)) {
            newly += 1;
        }
    }
    (newly, touched)
}

/// The seed's greedy choice; indexes into `candidates`, or `None` if no set
/// of at most `max_victims` frees `deficit` nodes.
pub(super) fn choose(
    state: &State,
    need: &Resources,
    eligible: &Eligible,
    candidates: &[Candidate],
    deficit: usize,
    max_victims: usize,
) -> Option<Vec<usize>> {
    if max_victims == 0 {
        return None;
    }
    let empty = BTreeMap::new();
    // Fewest victims first: one that frees enough alone, the cheapest.
    let single =
        candidates.iter().enumerate().filter(|(_, c)| gain(state, need, eligible, &empty, c).0 >= deficit).min_by_key(
            |(_, c)| (c.cost.total(), c.cost.checkpoint_gpu_s, std::cmp::Reverse(c.cost.gpus), c.cost.alloc),
        );
    if let Some((i, _)) = single {
        return Some(vec![i]);
    }
    // Greedy: the lowest cost per newly fitting node; when none makes a node
    // fit alone, the cheapest that makes progress on a node.
    let mut chosen: Vec<usize> = Vec::new();
    let mut freed: BTreeMap<NodeSlot, Usage> = BTreeMap::new();
    while count_fitting(state, need, eligible, &freed) < deficit {
        if chosen.len() == max_victims {
            return None;
        }
        let mut best: Option<(usize, (usize, usize))> = None;
        for (i, c) in candidates.iter().enumerate() {
            if chosen.contains(&i) {
                continue;
            }
            let g = gain(state, need, eligible, &freed, c);
            if g.1 == 0 {
                continue;
            }
            best = match best {
                None => Some((i, g)),
                Some((j, h)) => Some(if better(c, g, &candidates[j], h) { (i, g) } else { (j, h) }),
            };
        }
        let (i, _) = best?;
        chosen.push(i);
        for (slot, u) in &candidates[i].frees {
            let f = freed.entry(*slot).or_default();
            *f = f.plus(u);
        }
    }
    // Drop victims the rest make unneeded, the latest chosen first.
    let mut k = chosen.len();
    while k > 0 {
        k -= 1;
        let without: Vec<usize> = chosen.iter().copied().filter(|&j| j != chosen[k]).collect();
        if count_fitting(state, need, eligible, &freed_by(candidates, &without)) >= deficit {
            chosen = without;
        }
    }
    Some(chosen)
}

/// Whether candidate `a` (gain `ga`) beats `b` (gain `gb`) in a greedy step.
fn better(a: &Candidate, ga: (usize, usize), b: &Candidate, gb: (usize, usize)) -> bool {
    let key = |c: &Candidate, g: (usize, usize)| (g.0 > 0, c.cost.total(), g.0, c.cost.checkpoint_gpu_s, c.cost.alloc);
    let (ka, kb) = (key(a, ga), key(b, gb));
    if ka.0 != kb.0 {
        return ka.0;
    }
    if ka.0 {
        // Cost per newly fitting node, compared without division.
        let lhs = u128::from(ka.1) * gb.0 as u128;
        let rhs = u128::from(kb.1) * ga.0 as u128;
        if lhs != rhs {
            return lhs < rhs;
        }
        if ka.2 != kb.2 {
            return ka.2 > kb.2;
        }
    } else if ka.1 != kb.1 {
        return ka.1 < kb.1;
    }
    (ka.3, ka.4) < (kb.3, kb.4)
}

/// How many nodes the greedy reaches with `max_victims` (for explanations).
pub(super) fn best_reach(
    state: &State,
    need: &Resources,
    eligible: &Eligible,
    candidates: &[Candidate],
    max_victims: usize,
) -> usize {
    let mut chosen: Vec<usize> = Vec::new();
    let mut freed = BTreeMap::new();
    while chosen.len() < max_victims {
        let best = candidates
            .iter()
            .enumerate()
            .filter(|(i, _)| !chosen.contains(i))
            .map(|(i, c)| (i, gain(state, need, eligible, &freed, c)))
            .filter(|(_, g)| g.1 > 0)
            .reduce(|(j, h), (i, g)| if better(&candidates[i], g, &candidates[j], h) { (i, g) } else { (j, h) });
        let Some((i, _)) = best else { break };
        chosen.push(i);
        freed = freed_by(candidates, &chosen);
    }
    count_fitting(state, need, eligible, &freed)
}

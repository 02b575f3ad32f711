//! Job-array index sets: which indices `muster submit --array` names, as
//! Slurm writes them, kept as ranges so that a pending array costs its
//! ranges, never one record per element.
//!
//! ```text
//!   0-9999%64      indices 0..=9999, at most 64 elements running at once
//!   1,3,5-11:2     1, 3, 5, 7, 9, 11
//!   7              one element, index 7
//! ```
//!
//! Ranges are sorted by their first index and must not overlap (each starts
//! after the one before it ends), so the k-th element, in ascending index
//! order, is found by a binary search over the ranges' running counts.

use super::*;

/// The most elements one array may have (Slurm's default `MaxArraySize`
/// allows 1,001).
pub const MAX_ARRAY_ELEMENTS: u64 = 1_000_000;

/// The highest index an element may have.
pub const MAX_ARRAY_INDEX: u32 = 9_999_999;

/// The most ranges (a single index counts as one) an expression may list.
pub const MAX_ARRAY_RANGES: usize = 256;

/// The longest expression accepted, in bytes.
pub const MAX_ARRAY_EXPR_BYTES: usize = 4096;

/// Indices `first`, `first + step`, … up to `last` (which is one of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ArrayRange {
    /// The lowest index.
    pub first: u32,
    /// The highest index (`first + k * step` for some k).
    pub last: u32,
    /// The distance between indices (at least 1).
    pub step: u32,
}

impl ArrayRange {
    /// How many indices it holds.
    pub fn count(&self) -> u64 {
        u64::from((self.last - self.first) / self.step) + 1
    }

    /// Its k-th index (0-based), if it has one.
    fn index_at(&self, k: u64) -> Option<u32> {
        (k < self.count()).then(|| self.first + (k as u32) * self.step)
    }

    /// Where `index` stands in it (0-based), if it holds it.
    fn position_of(&self, index: u32) -> Option<u64> {
        (index >= self.first && index <= self.last && (index - self.first).is_multiple_of(self.step))
            .then(|| u64::from((index - self.first) / self.step))
    }
}

impl fmt::Display for ArrayRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.first == self.last, self.step) {
            (true, _) => write!(f, "{}", self.first),
            (false, 1) => write!(f, "{}-{}", self.first, self.last),
            (false, step) => write!(f, "{}-{}:{step}", self.first, self.last),
        }
    }
}

/// The indices of a job array and its throttle.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArrayIndices {
    /// Sorted by first index; none overlaps the next.
    pub ranges: Vec<ArrayRange>,
    /// The most elements running at once (0: no limit).
    pub throttle: u32,
}

impl ArrayIndices {
    /// Parses Slurm's `--array` syntax: comma-separated indices `N`,
    /// ranges `A-B` and stepped ranges `A-B:S`, then an optional `%N`
    /// throttle. Ranges may be listed in any order but must not overlap; a
    /// range's end is lowered to the last index its step reaches.
    pub fn parse(expr: &str) -> Result<ArrayIndices, String> {
        if expr.len() > MAX_ARRAY_EXPR_BYTES {
            return Err(format!("the array expression is {} bytes; the most is {MAX_ARRAY_EXPR_BYTES}", expr.len()));
        }
        let (list, throttle) = match expr.split_once('%') {
            Some((list, t)) => {
                let t: u32 = t
                    .parse()
                    .map_err(|_| format!("the throttle {t:?} in {expr:?} is not a whole number (write %64)"))?;
                if t == 0 {
                    return Err(format!("the throttle in {expr:?} is 0; leave %N out for no limit"));
                }
                (list, t)
            }
            None => (expr, 0),
        };
        if list.trim().is_empty() {
            return Err("the array expression names no index (write 0-9, 1,3,5 or 0-99:2)".to_string());
        }
        let mut ranges = Vec::new();
        for part in list.split(',') {
            ranges.push(parse_range(part.trim(), expr)?);
            if ranges.len() > MAX_ARRAY_RANGES {
                return Err(format!("{expr:?} lists more than {MAX_ARRAY_RANGES} indices and ranges"));
            }
        }
        let indices = ArrayIndices { ranges, throttle }.sorted();
        indices.validate()?;
        Ok(indices)
    }

    /// The same indices, ranges sorted by first index.
    fn sorted(mut self) -> ArrayIndices {
        self.ranges.sort();
        self
    }

    /// Checks what a parse guarantees (for indices that arrive already
    /// structured, from the API): ranges well formed, sorted, apart, and
    /// within the limits.
    pub fn validate(&self) -> Result<(), String> {
        if self.ranges.is_empty() {
            return Err("the array names no index".to_string());
        }
        if self.ranges.len() > MAX_ARRAY_RANGES {
            return Err(format!("the array lists {} ranges; the most is {MAX_ARRAY_RANGES}", self.ranges.len()));
        }
        for r in &self.ranges {
            if r.step == 0 {
                return Err(format!("range {}-{} has step 0", r.first, r.last));
            }
            if r.last < r.first || (r.last - r.first) % r.step != 0 {
                return Err(format!("range {}-{}:{} does not end on one of its indices", r.first, r.last, r.step));
            }
            if r.last > MAX_ARRAY_INDEX {
                return Err(format!("index {} is over the highest, {MAX_ARRAY_INDEX}", r.last));
            }
        }
        for pair in self.ranges.windows(2) {
            if pair[1].first <= pair[0].last {
                return Err(format!(
                    "{} and {} overlap; list them so that each starts after the one before it ends",
                    pair[0], pair[1]
                ));
            }
        }
        let count = self.count();
        if count > MAX_ARRAY_ELEMENTS {
            return Err(format!("the array has {count} elements; the most is {MAX_ARRAY_ELEMENTS}"));
        }
        if u64::from(self.throttle) > count {
            return Err(format!("the throttle %{} is more than the array's {count} elements", self.throttle));
        }
        Ok(())
    }

    /// How many elements it has.
    pub fn count(&self) -> u64 {
        self.ranges.iter().map(ArrayRange::count).sum()
    }

    /// The most of `remaining` elements that may be live (materialised and
    /// not ended) at once: the throttle, if it is lower.
    pub fn most_live(&self, remaining: u64) -> u64 {
        if self.throttle > 0 { remaining.min(u64::from(self.throttle)) } else { remaining }
    }

    /// The index of the k-th element (0-based, ascending), if there is one.
    pub fn index_at(&self, k: u64) -> Option<u32> {
        let mut before = 0;
        for r in &self.ranges {
            let n = r.count();
            if k < before + n {
                return r.index_at(k - before);
            }
            before += n;
        }
        None
    }

    /// Where `index` stands among the elements (0-based), if it is one.
    pub fn position_of(&self, index: u32) -> Option<u64> {
        let at = self.ranges.partition_point(|r| r.last < index);
        let r = self.ranges.get(at)?;
        let within = r.position_of(index)?;
        Some(self.ranges[..at].iter().map(ArrayRange::count).sum::<u64>() + within)
    }

    /// Every index, ascending (lazily).
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ranges.iter().flat_map(|r| (0..r.count()).map(move |k| r.first + (k as u32) * r.step))
    }
}

impl fmt::Display for ArrayIndices {
    /// The canonical Slurm form: `0-9999%64`, `1,3,5-11:2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        if self.throttle > 0 {
            write!(f, "%{}", self.throttle)?;
        }
        Ok(())
    }
}

/// The most elements of one array that are materialised and not yet
/// placed at once: the rest wait as positions in its ranges. Admission
/// sees this many of an array per pass; each one placed or ended
/// materialises the next.
pub const ARRAY_WINDOW: u64 = 1024;

/// A job array (`muster submit --array`): one spec, many elements. Element
/// `k` (the k-th index, ascending) is allocation `id + 1 + k`, an ordinary
/// allocation once materialised; until then it costs nothing but its
/// place in the ranges. The array's own id names it to `cancel`, `--after`
/// and reads; no allocation has it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobArray {
    /// Its id; its elements' ids follow it.
    pub id: AllocId,
    /// The spec every element is made from (an element has no idempotency
    /// key of its own: the array holds it).
    pub spec: AllocSpec,
    /// Its indices and throttle.
    pub indices: ArrayIndices,
    /// `--after-corr`: element k waits for element k of this array.
    pub corr: Option<AllocId>,
    /// Entry time of the submit (every element's submit time: they queue
    /// together, in index order).
    pub submit_time_ms: u64,
    /// Positions below this are materialised or were cancelled before.
    pub next: u64,
    /// Positions cancelled before they were materialised, as sorted,
    /// disjoint, half-open ranges `[from, to)`.
    pub skipped: Vec<(u64, u64)>,
    /// Elements that ended done.
    pub done: u64,
    /// Elements that ended failed.
    pub failed: u64,
    /// Elements that ended cancelled (those never materialised included).
    pub cancelled: u64,
    /// Whether a task of an element ever started.
    pub started: bool,
    /// Set once every element has ended.
    pub finished_at_ms: Option<u64>,
}

impl JobArray {
    /// How many elements it has.
    pub fn count(&self) -> u64 {
        self.indices.count()
    }

    /// The id of the element at `position`.
    pub fn element_id(&self, position: u64) -> AllocId {
        self.id + 1 + position
    }

    /// The position of element `alloc`, if it is one of this array's.
    pub fn position_of_element(&self, alloc: AllocId) -> Option<u64> {
        (alloc > self.id && alloc - self.id <= self.count()).then(|| alloc - self.id - 1)
    }

    /// Whether the element at `position` was cancelled before it was
    /// materialised.
    pub fn is_skipped(&self, position: u64) -> bool {
        let at = self.skipped.partition_point(|&(_, to)| to <= position);
        self.skipped.get(at).is_some_and(|&(from, _)| from <= position)
    }

    /// Marks the positions of `ranges` (half-open, any order, may
    /// overlap each other or those already marked) cancelled before
    /// materialisation; how many were not already marked.
    pub fn skip(&mut self, ranges: &[(u64, u64)]) -> u64 {
        let total = |v: &[(u64, u64)]| v.iter().map(|&(f, t)| t - f).sum::<u64>();
        let before = total(&self.skipped);
        let mut all: Vec<(u64, u64)> = self.skipped.iter().chain(ranges).copied().filter(|&(f, t)| f < t).collect();
        all.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(all.len());
        for (from, to) in all {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(to),
                _ => merged.push((from, to)),
            }
        }
        self.skipped = merged;
        total(&self.skipped) - before
    }

    /// Elements never materialised and not cancelled: still to come.
    pub fn unmaterialised(&self) -> u64 {
        let skipped_ahead: u64 = self.skipped.iter().map(|&(from, to)| to.saturating_sub(from.max(self.next))).sum();
        self.count() - self.next - skipped_ahead
    }

    /// How it stands as one allocation would: done when every element was
    /// done, failed when one failed, cancelled otherwise; `None` while an
    /// element is yet to end.
    pub fn final_status(&self) -> Option<AllocStatus> {
        self.finished_at_ms?;
        Some(if self.failed > 0 {
            AllocStatus::Failed
        } else if self.cancelled > 0 {
            AllocStatus::Cancelled
        } else {
            AllocStatus::Done
        })
    }

    /// The environment its element at `position` runs with: Muster's names
    /// and the Slurm names existing scripts read.
    pub fn element_env(&self, position: u64) -> Vec<(String, String)> {
        let index = self.indices.index_at(position).unwrap_or_default();
        let first = self.indices.ranges.first().map_or(0, |r| r.first);
        let last = self.indices.ranges.last().map_or(0, |r| r.last);
        let mut env = vec![
            ("MUSTER_ARRAY_ID".to_string(), self.id.to_string()),
            ("MUSTER_ARRAY_INDEX".to_string(), index.to_string()),
            ("MUSTER_ARRAY_COUNT".to_string(), self.count().to_string()),
            ("SLURM_ARRAY_JOB_ID".to_string(), self.id.to_string()),
            ("SLURM_ARRAY_TASK_ID".to_string(), index.to_string()),
            ("SLURM_ARRAY_TASK_COUNT".to_string(), self.count().to_string()),
            ("SLURM_ARRAY_TASK_MIN".to_string(), first.to_string()),
            ("SLURM_ARRAY_TASK_MAX".to_string(), last.to_string()),
        ];
        if let [r] = self.indices.ranges.as_slice() {
            env.push(("SLURM_ARRAY_TASK_STEP".to_string(), r.step.to_string()));
        }
        env
    }
}

/// One comma-separated part: `N`, `A-B` or `A-B:S`.
fn parse_range(part: &str, expr: &str) -> Result<ArrayRange, String> {
    let index = |s: &str| -> Result<u32, String> {
        let n: u64 = s.trim().parse().map_err(|_| format!("{s:?} in {expr:?} is not an index (a whole number)"))?;
        if n > u64::from(MAX_ARRAY_INDEX) {
            return Err(format!("index {n} in {expr:?} is over the highest, {MAX_ARRAY_INDEX}"));
        }
        Ok(n as u32)
    };
    if part.is_empty() {
        return Err(format!("{expr:?} has an empty part between commas"));
    }
    let (span, step) = match part.split_once(':') {
        Some((span, s)) => {
            let step: u32 = s.trim().parse().map_err(|_| format!("step {s:?} in {expr:?} is not a whole number"))?;
            if step == 0 {
                return Err(format!("step 0 in {expr:?}; a step is at least 1"));
            }
            (span, step)
        }
        None => (part, 1),
    };
    let Some((a, b)) = span.split_once('-') else {
        if step != 1 {
            return Err(format!("{part:?} in {expr:?} has a step but no range (write A-B:{step})"));
        }
        let n = index(span)?;
        return Ok(ArrayRange { first: n, last: n, step: 1 });
    };
    let (first, last) = (index(a)?, index(b)?);
    if last < first {
        return Err(format!("range {part:?} in {expr:?} ends before it starts"));
    }
    let last = first + (last - first) / step * step;
    // One index is one index, whatever step reached it.
    let step = if last == first { 1 } else { step };
    Ok(ArrayRange { first, last, step })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn indices(expr: &str) -> Vec<u32> {
        ArrayIndices::parse(expr).unwrap().iter().collect()
    }

    #[test]
    fn slurm_forms_parse_to_their_indices_and_print_canonically() {
        assert_eq!(indices("7"), [7]);
        assert_eq!(indices("1,3,5-11:2"), [1, 3, 5, 7, 9, 11]);
        assert_eq!(indices("0-10:4"), [0, 4, 8]);
        let a = ArrayIndices::parse("0-9999%64").unwrap();
        assert_eq!((a.count(), a.throttle), (10_000, 64));
        assert_eq!(a.to_string(), "0-9999%64");
        // Listed out of order, an end the step does not reach: canonical form.
        let b = ArrayIndices::parse("20-25, 1-10:3").unwrap();
        assert_eq!(b.to_string(), "1-10:3,20-25");
        assert_eq!(b.iter().collect::<Vec<_>>(), [1, 4, 7, 10, 20, 21, 22, 23, 24, 25]);
        assert_eq!(ArrayIndices::parse(&b.to_string()).unwrap(), b);
    }

    #[test]
    fn each_mistake_is_refused_naming_what_is_wrong() {
        let cases = [
            ("", "names no index"),
            ("%4", "names no index"),
            ("1,,2", "empty part"),
            ("x", "not an index"),
            ("5-1", "ends before it starts"),
            ("0-9:0", "step 0"),
            ("3:2", "has a step but no range"),
            ("0-10,5-20", "overlap"),
            ("0-10:2,1-11:2", "overlap"),
            ("4,4", "overlap"),
            ("0-9%0", "throttle in"),
            ("0-9%x", "not a whole number"),
            ("0-9%11", "more than the array's 10 elements"),
            ("0-10000000", "over the highest"),
            ("0-1000000", "the most is 1000000"),
        ];
        for (expr, want) in cases {
            let e = ArrayIndices::parse(expr).unwrap_err();
            assert!(e.contains(want), "{expr:?}: {e}");
        }
        let many = (0..=MAX_ARRAY_RANGES).map(|i| (i * 2).to_string()).collect::<Vec<_>>().join(",");
        assert!(ArrayIndices::parse(&many).unwrap_err().contains("more than 256"));
        let long = format!("1{}", " ".repeat(MAX_ARRAY_EXPR_BYTES));
        assert!(ArrayIndices::parse(&long).unwrap_err().contains("bytes"));
    }

    #[test]
    fn structured_indices_from_the_api_are_checked_like_parsed_ones() {
        let bad = |ranges: Vec<ArrayRange>| ArrayIndices { ranges, throttle: 0 }.validate().unwrap_err();
        assert!(bad(vec![]).contains("no index"));
        assert!(bad(vec![ArrayRange { first: 0, last: 4, step: 0 }]).contains("step 0"));
        assert!(bad(vec![ArrayRange { first: 0, last: 5, step: 2 }]).contains("does not end"));
        let (a, b) = (ArrayRange { first: 5, last: 5, step: 1 }, ArrayRange { first: 1, last: 1, step: 1 });
        assert!(bad(vec![a, b]).contains("overlap"), "unsorted ranges are refused");
    }

    #[test]
    fn the_largest_array_costs_its_ranges_not_its_elements() {
        let a = ArrayIndices::parse("0-999999%64").unwrap();
        assert_eq!(a.count(), MAX_ARRAY_ELEMENTS);
        assert_eq!(postcard::to_stdvec(&a).unwrap().len(), 7, "one range and a throttle");
        assert_eq!(a.index_at(999_999), Some(999_999));
        assert_eq!(a.position_of(123_456), Some(123_456));
    }

    /// Up to 8 ranges within 0..200, as Slurm text.
    fn expr() -> impl Strategy<Value = String> {
        prop::collection::vec((0u32..200, 0u32..40, 1u32..6), 1..8).prop_map(|parts| {
            parts
                .into_iter()
                .map(|(a, len, step)| match len {
                    0 => a.to_string(),
                    _ if step == 1 => format!("{a}-{}", a + len),
                    _ => format!("{a}-{}:{step}", a + len),
                })
                .collect::<Vec<_>>()
                .join(",")
        })
    }

    /// The reference: every index each part names, materialised.
    fn materialised(expr: &str) -> Vec<Vec<u32>> {
        expr.split(',')
            .map(|part| {
                let (span, step) = part.split_once(':').map_or((part, 1), |(s, t)| (s, t.parse().unwrap()));
                let (a, b) = span.split_once('-').map_or((span, span), |(a, b)| (a, b));
                let (a, b): (u32, u32) = (a.parse().unwrap(), b.parse().unwrap());
                (a..=b).step_by(step as usize).collect()
            })
            .collect()
    }

    proptest! {
        /// Against the materialised reference: parsing accepts exactly the
        /// expressions whose parts' spans do not overlap, and then every
        /// index, count, k-th element, position and the canonical text
        /// agree with it.
        #[test]
        fn indices_match_a_materialised_reference(e in expr(), probe in 0u32..260) {
            let parts = materialised(&e);
            let mut spans: Vec<(u32, u32)> = parts.iter().map(|p| (p[0], *p.last().unwrap())).collect();
            spans.sort();
            let apart = spans.windows(2).all(|w| w[1].0 > w[0].1);
            match ArrayIndices::parse(&e) {
                Err(err) => prop_assert!(!apart && err.contains("overlap"), "{e}: {err}"),
                Ok(a) => {
                    prop_assert!(apart, "{e} overlaps but parsed");
                    let mut want: Vec<u32> = parts.concat();
                    want.sort();
                    prop_assert_eq!(a.iter().collect::<Vec<_>>(), want.clone());
                    prop_assert_eq!(a.count(), want.len() as u64);
                    for (k, &i) in want.iter().enumerate() {
                        prop_assert_eq!(a.index_at(k as u64), Some(i));
                    }
                    prop_assert_eq!(a.index_at(want.len() as u64), None);
                    prop_assert_eq!(a.position_of(probe), want.iter().position(|&i| i == probe).map(|k| k as u64));
                    prop_assert_eq!(ArrayIndices::parse(&a.to_string()).unwrap(), a);
                }
            }
        }
    }
}

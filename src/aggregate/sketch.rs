//! Quantiles that merge: a log-bucketed histogram with DDSketch's mapping, kept per series in
//! the window and added into Redis hashes, so that any quantile can be read back over any
//! number of windows, hours and agents, within a stated relative accuracy.
//!
//! A value `v > 0` goes to bucket `ceil(ln v / ln γ)`, `γ = (1 + α) / (1 − α)`, `α` the relative
//! accuracy; a negative value to the bucket of `|v|` among the negatives; values within
//! [`MIN_INDEXABLE`] of zero to the zero bucket. Every value in bucket `i` lies in
//! `(γ^(i−1), γ^i]`, so the estimate `2γ^i / (γ + 1)` is within `α` of each of them (relative).
//! Counts are weighted `1 / rate`, like the statistics' count.
//!
//! In Redis a bucket is a hash field: `<i>` for a positive value's bucket, `n<i>` for a
//! negative's, `z` for zero; the field `a` holds `α`, so a reader knows `γ` and a writer of
//! another accuracy is refused instead of mixing buckets.

/// Values closer to zero than this count as zero: their estimate is 0, an absolute error of at
/// most this much. (Below it the bucket indexes would run past a thousand.)
pub const MIN_INDEXABLE: f64 = 1e-9;

/// Buckets a histogram holds at most, in the agent and in Redis, as DDSketch bounds its stores:
/// past it the buckets nearest zero are collapsed (those values lose accuracy first; see
/// [`Buckets::collapse`]). At `α` = 1 % 2048 buckets span 17 orders of magnitude.
pub const MAX_BUCKETS: usize = 2048;

/// The map from values to buckets for one relative accuracy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mapping {
    alpha: f64,
    gamma: f64,
    ln_gamma: f64,
}

impl Default for Mapping {
    fn default() -> Self {
        Mapping::new(0.01)
    }
}

impl Mapping {
    /// `alpha` in `(0, 1)`; the configuration checks it.
    pub fn new(alpha: f64) -> Mapping {
        let gamma = (1.0 + alpha) / (1.0 - alpha);
        Mapping {
            alpha,
            gamma,
            ln_gamma: gamma.ln(),
        }
    }

    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    pub fn bucket(&self, v: f64) -> Bucket {
        if v > MIN_INDEXABLE {
            Bucket::Positive(self.index(v))
        } else if v < -MIN_INDEXABLE {
            Bucket::Negative(self.index(-v))
        } else {
            Bucket::Zero
        }
    }

    fn index(&self, v: f64) -> i32 {
        // Finite and within ±2^63 (the parser's bound): |index| stays far inside i32.
        (v.ln() / self.ln_gamma).ceil() as i32
    }

    /// The value that stands for a bucket: within `α` of every value in it.
    pub fn value(&self, bucket: Bucket) -> f64 {
        let of = |i: i32| 2.0 * (f64::from(i) * self.ln_gamma).exp() / (self.gamma + 1.0);
        match bucket {
            Bucket::Positive(i) => of(i),
            Bucket::Negative(i) => -of(i),
            Bucket::Zero => 0.0,
        }
    }
}

/// A bucket; ordered as its values are (negatives from the largest magnitude, zero, positives).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bucket {
    /// The bucket of `|v|` for a negative `v`.
    Negative(i32),
    Zero,
    Positive(i32),
}

impl Bucket {
    fn order(self) -> (u8, i32) {
        match self {
            Bucket::Negative(i) => (0, -i),
            Bucket::Zero => (1, 0),
            Bucket::Positive(i) => (2, i),
        }
    }

    /// Its hash field in Redis.
    pub fn field(self) -> String {
        match self {
            Bucket::Positive(i) => i.to_string(),
            Bucket::Negative(i) => format!("n{i}"),
            Bucket::Zero => "z".to_string(),
        }
    }

    /// A hash field back to its bucket; `None` for `a` and anything not written by us.
    pub fn parse(field: &str) -> Option<Bucket> {
        match field {
            "z" => Some(Bucket::Zero),
            f => match f.strip_prefix('n') {
                Some(i) => i.parse().ok().map(Bucket::Negative),
                None => f.parse().ok().map(Bucket::Positive),
            },
        }
    }
}

impl PartialOrd for Bucket {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bucket {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.order().cmp(&other.order())
    }
}

/// Weighted counts per bucket, in value order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Buckets(Vec<(Bucket, f64)>);

impl Buckets {
    /// Room for `n` buckets before the first is added.
    pub fn with_capacity(n: usize) -> Buckets {
        Buckets(Vec::with_capacity(n))
    }

    /// Buckets listed in value order without repeats (a block's, as they are decoded), at
    /// most [`MAX_BUCKETS`] of them, taken as they are.
    pub(crate) fn from_ordered(list: Vec<(Bucket, f64)>) -> Buckets {
        debug_assert!(list.len() <= MAX_BUCKETS && list.windows(2).all(|w| w[0].0 < w[1].0));
        Buckets(list)
    }

    /// Its list, emptied, to be filled again (a decoder's buffer, used slice after slice).
    pub(crate) fn into_empty_list(self) -> Vec<(Bucket, f64)> {
        let mut list = self.0;
        list.clear();
        list
    }

    pub fn add(&mut self, bucket: Bucket, weight: f64) {
        // Buckets that come in value order (a block's, a hash's once sorted) go on the end.
        match self.0.last_mut().map(|(b, w)| ((*b).cmp(&bucket), w)) {
            None | Some((std::cmp::Ordering::Less, _)) => {
                self.0.push((bucket, weight));
                if self.0.len() > MAX_BUCKETS {
                    self.collapse();
                }
                return;
            }
            Some((std::cmp::Ordering::Equal, w)) => {
                *w += weight;
                return;
            }
            Some((std::cmp::Ordering::Greater, _)) => {}
        }
        match self.0.binary_search_by(|(b, _)| b.cmp(&bucket)) {
            Ok(at) => self.0[at].1 += weight,
            Err(at) => {
                self.0.insert(at, (bucket, weight));
                self.collapse();
            }
        }
    }

    /// Adds every count of `other` (a merge of two sorted lists), then bounds the result.
    pub fn merge(&mut self, other: &Buckets) {
        let mut merged = Vec::with_capacity(self.0.len() + other.0.len());
        let (mut mine, mut theirs) = (self.0.iter().peekable(), other.0.iter().peekable());
        loop {
            let next = match (mine.peek(), theirs.peek()) {
                (Some(&&(a, x)), Some(&&(b, y))) => match a.cmp(&b) {
                    std::cmp::Ordering::Less => mine.next().map(|_| (a, x)),
                    std::cmp::Ordering::Greater => theirs.next().map(|_| (b, y)),
                    std::cmp::Ordering::Equal => {
                        mine.next();
                        theirs.next();
                        Some((a, x + y))
                    }
                },
                (Some(_), None) => mine.next().copied(),
                (None, Some(_)) => theirs.next().copied(),
                (None, None) => None,
            };
            match next {
                Some(entry) => merged.push(entry),
                None => break,
            }
        }
        self.0 = merged;
        self.collapse();
    }

    /// Down to [`MAX_BUCKETS`] as DDSketch collapses its stores, and as the flush script does:
    /// the side (negative or positive values) with more buckets folds those of the smallest
    /// magnitudes, next to zero, into the next one out, keeping at least one; the other side
    /// gives the rest. The values nearest zero lose accuracy; the high quantiles and every
    /// value's sign stay right, and no count is lost.
    fn collapse(&mut self) {
        let Some(excess) = self.0.len().checked_sub(MAX_BUCKETS).filter(|&e| e > 0) else {
            return;
        };
        let negatives = self
            .0
            .iter()
            .take_while(|(b, _)| matches!(b, Bucket::Negative(_)))
            .count();
        let zero = usize::from(
            self.0
                .get(negatives)
                .is_some_and(|(b, _)| *b == Bucket::Zero),
        );
        let positives = self.0.len() - negatives - zero;
        let from_positives = if positives >= negatives {
            excess.min(positives.saturating_sub(1))
        } else {
            excess - excess.min(negatives.saturating_sub(1))
        };
        let from_negatives = excess - from_positives;
        // Positives run from the smallest magnitude up: fold the first ones into the next.
        let first = negatives + zero;
        if from_positives > 0 {
            let folded: f64 = self.0[first..first + from_positives]
                .iter()
                .map(|(_, w)| w)
                .sum();
            self.0[first + from_positives].1 += folded;
            self.0.drain(first..first + from_positives);
        }
        // Negatives run from the largest magnitude down: fold the last ones into the one before.
        if from_negatives > 0 {
            let from = negatives - from_negatives;
            let folded: f64 = self.0[from..negatives].iter().map(|(_, w)| w).sum();
            self.0[from - 1].1 += folded;
            self.0.drain(from..negatives);
        }
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (Bucket, f64)> + '_ {
        self.0.iter().copied()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn total(&self) -> f64 {
        self.0.iter().map(|(_, w)| w).sum()
    }

    /// The `q`-quantile (`0 ≤ q ≤ 1`) of the counted values: the estimate of the bucket that
    /// holds the value of rank `q · (n − 1)` in value order, so within `α` of that value.
    /// `None` when nothing was counted.
    pub fn quantile(&self, mapping: &Mapping, q: f64) -> Option<f64> {
        let total = self.total();
        if total <= 0.0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * (total - 1.0).max(0.0);
        let mut seen = 0.0;
        for &(b, w) in &self.0 {
            seen += w;
            if seen > rank {
                return Some(mapping.value(b));
            }
        }
        self.0.last().map(|&(b, _)| mapping.value(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every value is within α of its bucket's estimate, at several accuracies.
        #[test]
        fn a_bucket_stands_for_its_values_within_alpha(
            v in prop_oneof![1e-9f64..1e-3, 1e-3f64..1e3, 1e3f64..9.2e18],
            negative in any::<bool>(),
            alpha in prop_oneof![Just(0.001), Just(0.01), Just(0.05), 0.001f64..0.2],
        ) {
            let m = Mapping::new(alpha);
            let v = if negative { -v } else { v };
            let estimate = m.value(m.bucket(v));
            prop_assert!((estimate - v).abs() <= alpha * v.abs() * (1.0 + 1e-12),
                "{v} -> {estimate} at {alpha}");
        }

        /// Quantiles of any weighted sample are within α of the exact weighted quantile.
        #[test]
        fn quantiles_are_within_alpha_of_the_exact_ones(
            values in proptest::collection::vec(prop_oneof![-1e6f64..-1e-3, 1e-3f64..1e6], 1..400),
            q in 0.0f64..=1.0,
        ) {
            let m = Mapping::default();
            let mut buckets = Buckets::default();
            for &v in &values {
                buckets.add(m.bucket(v), 1.0);
            }
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            let exact = sorted[(q * (sorted.len() - 1) as f64).floor() as usize];
            let got = buckets.quantile(&m, q).unwrap();
            prop_assert!((got - exact).abs() <= 0.01 * exact.abs() * (1.0 + 1e-12), "{got} vs {exact}");
        }
    }

    /// Many buckets of both signs (mostly past the bound), in pieces of 100 to 400: (negative?, index, weight).
    fn wide_samples() -> impl Strategy<Value = Vec<Vec<(bool, i32, f64)>>> {
        let bucket = (any::<bool>(), -2000i32..2000, 1u8..4).prop_map(|(n, i, w)| (n, i, w as f64));
        proptest::collection::vec(proptest::collection::vec(bucket, 100..400), 5..30)
    }

    fn to_bucket(&(negative, i, _): &(bool, i32, f64)) -> Bucket {
        match (negative, i) {
            (_, 0) => Bucket::Zero,
            (true, i) => Bucket::Negative(i),
            (false, i) => Bucket::Positive(i),
        }
    }

    /// What a collapse must keep: the bound, every count, every count's sign, the extremes.
    fn check_bounded(b: &Buckets, all: &[(bool, i32, f64)]) -> Result<(), TestCaseError> {
        let sum = |keep: &dyn Fn(Bucket) -> bool| -> f64 {
            all.iter().filter(|s| keep(to_bucket(s))).map(|s| s.2).sum()
        };
        let held = |keep: &dyn Fn(Bucket) -> bool| -> f64 {
            b.iter().filter(|&(x, _)| keep(x)).map(|(_, w)| w).sum()
        };
        let negative = |x: Bucket| matches!(x, Bucket::Negative(_));
        let positive = |x: Bucket| matches!(x, Bucket::Positive(_));
        prop_assert!(b.len() <= MAX_BUCKETS);
        prop_assert!(
            b.0.windows(2).all(|w| w[0].0 < w[1].0),
            "sorted, no duplicates"
        );
        prop_assert_eq!(held(&negative), sum(&negative));
        prop_assert_eq!(held(&positive), sum(&positive));
        prop_assert_eq!(b.total(), sum(&|_| true));
        let lowest = all.iter().map(to_bucket).min();
        let highest = all.iter().map(to_bucket).max();
        prop_assert_eq!(b.iter().next().map(|(x, _)| x), lowest);
        prop_assert_eq!(b.iter().last().map(|(x, _)| x), highest);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Past the bound, one bucket at a time (the window) or many at once (merging slices),
        /// negatives never fold into positives and nothing is lost.
        #[test]
        fn a_collapse_keeps_signs_counts_and_extremes(pieces in wide_samples()) {
            let all: Vec<_> = pieces.iter().flatten().copied().collect();
            let mut one_by_one = Buckets::default();
            let mut merged = Buckets::default();
            for piece in &pieces {
                let mut b = Buckets::default();
                for s in piece {
                    b.add(to_bucket(s), s.2);
                    one_by_one.add(to_bucket(s), s.2);
                }
                merged.merge(&b);
            }
            check_bounded(&one_by_one, &all)?;
            check_bounded(&merged, &all)?;
        }
    }

    #[test]
    fn fields_read_back() {
        for b in [
            Bucket::Positive(-34),
            Bucket::Positive(7),
            Bucket::Negative(3),
            Bucket::Zero,
        ] {
            assert_eq!(Bucket::parse(&b.field()), Some(b));
        }
        assert_eq!(Bucket::parse("a"), None);
    }

    #[test]
    fn buckets_sort_as_their_values() {
        let m = Mapping::default();
        let mut values = [-5.0, -0.5, 0.0, 1e-12, 0.5, 5.0, 500.0];
        values.sort_by(f64::total_cmp);
        let buckets: Vec<Bucket> = values.iter().map(|&v| m.bucket(v)).collect();
        assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    }

    /// Buckets added in value order (the end's fast path), in reverse and shuffled, repeats
    /// included, make the same counts.
    #[test]
    fn the_order_buckets_come_in_does_not_matter() {
        let mut list: Vec<(Bucket, f64)> = (-20..20)
            .flat_map(|i| {
                let b = match i {
                    0 => Bucket::Zero,
                    i if i < 0 => Bucket::Negative(-i),
                    i => Bucket::Positive(i),
                };
                [(b, 1.0), (b, 0.5)]
            })
            .collect();
        list.sort_by_key(|(b, _)| *b);
        let made = |list: &[(Bucket, f64)]| {
            let mut b = Buckets::default();
            for &(bucket, w) in list {
                b.add(bucket, w);
            }
            b
        };
        let ordered = made(&list);
        assert_eq!(ordered.len(), 40);
        assert!(ordered.iter().all(|(_, w)| w == 1.5));
        list.reverse();
        assert_eq!(made(&list), ordered);
        let mut state = 7u64;
        for i in (1..list.len()).rev() {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            list.swap(i, (state >> 33) as usize % (i + 1));
        }
        assert_eq!(made(&list), ordered);
    }

    #[test]
    fn past_the_bound_the_lowest_buckets_collapse() {
        let m = Mapping::default();
        let mut b = Buckets::default();
        for i in 0..MAX_BUCKETS + 10 {
            b.add(Bucket::Positive(i as i32), 1.0);
        }
        assert_eq!(b.len(), MAX_BUCKETS);
        assert_eq!(b.total(), (MAX_BUCKETS + 10) as f64);
        assert_eq!(b.iter().next(), Some((Bucket::Positive(10), 11.0)));
        assert_eq!(
            b.quantile(&m, 1.0),
            Some(m.value(Bucket::Positive(MAX_BUCKETS as i32 + 9)))
        );
    }

    #[test]
    fn the_larger_side_collapses_and_negatives_stay_negative() {
        let mut b = Buckets::default();
        for i in 0..1500 {
            b.add(Bucket::Negative(i), 1.0);
        }
        let mut positives = Buckets::default();
        for i in 0..1000 {
            positives.add(Bucket::Positive(i), 1.0);
        }
        b.merge(&positives);
        assert_eq!(b.len(), MAX_BUCKETS);
        // 452 too many; the negatives (more of them) fold n0..n451 into n452.
        assert!(b.iter().any(|x| x == (Bucket::Negative(452), 453.0)));
        assert!(!b.iter().any(|(x, _)| x == Bucket::Negative(451)));
        assert_eq!(b.iter().next(), Some((Bucket::Negative(1499), 1.0)));
        assert_eq!(b.iter().nth(1048), Some((Bucket::Positive(0), 1.0)));
    }
}

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
/// past it the lowest buckets are collapsed into one (the lowest values lose accuracy first). At
/// `α` = 1 % 2048 buckets span 17 orders of magnitude.
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
    pub fn add(&mut self, bucket: Bucket, weight: f64) {
        match self.0.binary_search_by(|(b, _)| b.cmp(&bucket)) {
            Ok(at) => self.0[at].1 += weight,
            Err(at) => {
                self.0.insert(at, (bucket, weight));
                if self.0.len() > MAX_BUCKETS {
                    self.collapse();
                }
            }
        }
    }

    pub fn merge(&mut self, other: &Buckets) {
        for &(b, w) in &other.0 {
            self.add(b, w);
        }
    }

    /// The lowest buckets folded into the lowest one kept, down to [`MAX_BUCKETS`].
    fn collapse(&mut self) {
        let excess = self.0.len() - MAX_BUCKETS;
        let folded: f64 = self.0[..excess].iter().map(|(_, w)| w).sum();
        self.0.drain(..excess);
        self.0[0].1 += folded;
    }

    pub fn iter(&self) -> impl Iterator<Item = (Bucket, f64)> + '_ {
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
}

//! The mergeable histogram of callers' peak rates: per bucket of peak rate, how many callers
//! peaked there and how many requests they sent in all. Buckets are log-linear: a peak below
//! [`EXACT`] is its own bucket; above, every power of two is cut into [`SUB`] equal buckets, so
//! a bucket's upper bound is at most `1 + 1/SUB` (6.25 %) times its lower bound
//! ([`MAX_RELATIVE_ERROR`]). A percentile is reported as the upper bound of the bucket holding
//! it: never below the true value, and above it by at most that factor.
//!
//! Merging is adding bucket by bucket (replicas' histograms, hours' histograms), so the order
//! of merges never matters. Stored sparse: at most [`BUCKETS`] entries whatever is recorded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Peaks below this are counted exactly.
pub const EXACT: u32 = 32;
/// Buckets per power of two above [`EXACT`].
pub const SUB: u32 = 16;
/// A reported value is at most this much above the truth, relatively (`1 / SUB`).
pub const MAX_RELATIVE_ERROR: f64 = 1.0 / SUB as f64;
/// Buckets a histogram can hold: every `u32` peak has one.
pub const BUCKETS: usize = (EXACT + (32 - 5) * SUB) as usize;

/// The bucket of peak `v` (`EXACT` = 2^5).
pub fn bucket(v: u32) -> u16 {
    if v < EXACT {
        return v as u16;
    }
    let e = 31 - v.leading_zeros(); // floor(log2 v), at least 5
    let sub = (v >> (e - 4)) & (SUB - 1);
    (EXACT + (e - 5) * SUB + sub) as u16
}

/// The smallest and largest peak in bucket `b`.
pub fn bounds(b: u16) -> (u32, u32) {
    let b = b as u32;
    if b < EXACT {
        return (b, b);
    }
    let e = (b - EXACT) / SUB + 5;
    let sub = (b - EXACT) % SUB;
    let width = 1u64 << (e - 4);
    let lo = (1u64 << e) + sub as u64 * width;
    (lo as u32, (lo + width - 1).min(u32::MAX as u64) as u32)
}

/// One bucket's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    pub callers: u64,
    pub requests: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    /// Bucket → totals; JSON keys are the bucket numbers.
    buckets: BTreeMap<u16, Cell>,
}

/// What a limit would have refused, read from a histogram.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Refused {
    /// Callers whose peak was above the limit: exact when the limit is a bucket's upper bound
    /// (every suggestion's), otherwise an upper bound (a straddling bucket counts whole).
    pub callers: u64,
    /// Requests refused, estimated as if each such caller had sent at its peak rate throughout:
    /// `requests × (1 − limit / peak)`.
    pub requests: f64,
}

impl Histogram {
    /// One caller whose peak was `peak` and who sent `requests` in all.
    pub fn add(&mut self, peak: u32, requests: u64) {
        let cell = self.buckets.entry(bucket(peak)).or_default();
        cell.callers += 1;
        cell.requests += requests;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (b, cell) in &other.buckets {
            let mine = self.buckets.entry(*b).or_default();
            mine.callers += cell.callers;
            mine.requests += cell.requests;
        }
    }

    pub fn callers(&self) -> u64 {
        self.buckets.values().map(|c| c.callers).sum()
    }

    pub fn requests(&self) -> u64 {
        self.buckets.values().map(|c| c.requests).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The `q` quantile (0 < q ≤ 1) of callers' peaks: the upper bound of the bucket holding
    /// the caller of rank ⌈q·n⌉. 0 when empty.
    pub fn quantile(&self, q: f64) -> u32 {
        let n = self.callers();
        if n == 0 {
            return 0;
        }
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (b, cell) in &self.buckets {
            seen += cell.callers;
            if seen >= rank {
                return bounds(*b).1;
            }
        }
        self.max()
    }

    /// The largest peak's bucket's upper bound.
    pub fn max(&self) -> u32 {
        self.buckets.keys().next_back().map_or(0, |b| bounds(*b).1)
    }

    /// What a limit of `limit` per window would have refused.
    pub fn refused_at(&self, limit: u32) -> Refused {
        let mut refused = Refused {
            callers: 0,
            requests: 0.0,
        };
        for (b, cell) in self.buckets.range(bucket(limit)..) {
            let (_, hi) = bounds(*b);
            if hi <= limit {
                continue;
            }
            refused.callers += cell.callers;
            refused.requests += cell.requests as f64 * (1.0 - limit as f64 / hi as f64);
        }
        refused
    }

    /// The smallest limit (a bucket's upper bound, at least `floor`) that refuses at most
    /// `share` of the callers.
    pub fn limit_for(&self, share: f64, floor: u32) -> u32 {
        let n = self.callers();
        let allowed = (share * n as f64).floor() as u64;
        // Walk down from the top: refused callers grow as the limit goes down.
        let mut above = 0u64;
        let mut limit = self.max();
        for (b, cell) in self.buckets.iter().rev() {
            if above + cell.callers > allowed {
                limit = bounds(*b).1;
                break;
            }
            above += cell.callers;
            limit = bounds(*b).0.saturating_sub(1);
        }
        limit.max(floor).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_lands_in_a_bucket_that_holds_it_and_buckets_are_narrow() {
        let mut v: u64 = 0;
        while v <= u32::MAX as u64 {
            let b = bucket(v as u32);
            let (lo, hi) = bounds(b);
            assert!(lo as u64 <= v && v <= hi as u64, "{v} in {b}: {lo}..={hi}");
            assert!((b as usize) < BUCKETS);
            assert!(
                (hi as f64) <= lo as f64 * (1.0 + MAX_RELATIVE_ERROR),
                "{b}: {lo}..={hi}"
            );
            // Contiguous: the next bucket starts right after.
            if hi < u32::MAX {
                assert_eq!(bounds(b + 1).0, hi + 1);
            }
            v = v * 9 / 8 + 1;
        }
        assert_eq!(bucket(u32::MAX) as usize, BUCKETS - 1);
    }

    /// Percentiles are never below the truth and above it by at most the stated error; a
    /// merge of two halves answers as the whole.
    #[test]
    fn percentiles_are_within_the_stated_error_and_merging_is_adding() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut peaks: Vec<u32> = (0..20_000)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                // Log-spread over 1..100,000.
                (10f64.powf((rng % 5_000) as f64 / 1_000.0)) as u32 + 1
            })
            .collect();
        let (mut whole, mut one, mut two) = Default::default();
        let _: &Histogram = &whole;
        for (i, p) in peaks.iter().enumerate() {
            Histogram::add(&mut whole, *p, 2);
            if i % 3 == 0 {
                Histogram::add(&mut one, *p, 2);
            } else {
                Histogram::add(&mut two, *p, 2);
            }
        }
        let mut merged: Histogram = one;
        merged.merge(&two);
        assert_eq!(merged, whole);
        assert_eq!(whole.callers(), 20_000);
        assert_eq!(whole.requests(), 40_000);
        peaks.sort_unstable();
        for q in [0.5, 0.9, 0.99, 0.999, 1.0] {
            let truth = peaks[((q * peaks.len() as f64).ceil() as usize).clamp(1, peaks.len()) - 1];
            let got = whole.quantile(q);
            assert!(got >= truth, "q{q}: {got} < {truth}");
            assert!(
                got as f64 <= truth as f64 * (1.0 + MAX_RELATIVE_ERROR),
                "q{q}: {got} vs {truth}"
            );
        }
        assert_eq!(whole.quantile(1.0), whole.max());
    }

    #[test]
    fn the_limit_for_a_share_refuses_at_most_that_share_and_counts_exactly() {
        let mut h = Histogram::default();
        // 990 callers at 1..=10, 10 at 500.
        for i in 0..990u32 {
            h.add(i % 10 + 1, (i % 10 + 1) as u64);
        }
        for _ in 0..10 {
            h.add(500, 500);
        }
        // 1 %: the 10 at 500 may be refused, nobody else.
        let limit = h.limit_for(0.01, 1);
        assert_eq!(limit, 10);
        assert_eq!(h.refused_at(limit).callers, 10);
        // 0.1 %: one caller at most, so nobody at 500 may be: the limit covers them.
        let limit = h.limit_for(0.001, 1);
        assert!(limit >= 500 && limit as f64 <= 500.0 * (1.0 + MAX_RELATIVE_ERROR));
        assert_eq!(h.refused_at(limit).callers, 0);
        // A limit of 5 refuses those at 6..=10 (99 each) and the 10 heavy ones.
        let refused = h.refused_at(5);
        assert_eq!(refused.callers, 5 * 99 + 10);
        assert!(refused.requests > 10.0 * 490.0);
        // Round trip through the published form.
        let text = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<Histogram>(&text).unwrap(), h);
    }
}

//! How many containers a warm pool should hold, and what it should do about it now — pure
//! bookkeeping with the clock passed in, so the rules are tested without Docker or time. The
//! `WarmPool` actor feeds it its takes and carries out its [`Step`]s.
//!
//! Rules:
//! - demand is the busiest [`BUCKET`] of takes remembered within `window` (a bucket starts at
//!   the first take after the previous one ended, so a burst shorter than a bucket is counted
//!   whole, never split over two);
//! - the target is `max(floor, demand)`, capped at `max`: a burst of N new sessions grows the
//!   pool to N, so the next burst of that size finds every container warm;
//! - at most [`REFILL_PARALLEL`] starts are in flight: a container's start (and its
//!   interpreters' first runs) costs dockerd, runc and the CPU what running work needs too;
//! - once the busiest bucket is forgotten the surplus goes, at most [`REFILL_PARALLEL`]
//!   ready containers a step, so a shrinking pool does not burst either.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The span whose takes count as one burst.
pub const BUCKET: Duration = Duration::from_secs(10);
/// Container starts in flight at most, and ready containers removed per [`Step`] at most.
pub const REFILL_PARALLEL: usize = 2;

/// A pool's sizing settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// Containers kept warm whatever the demand.
    pub floor: usize,
    /// Containers kept warm at most, whatever the demand.
    pub max: usize,
    /// How long a busy bucket is remembered.
    pub window: Duration,
}

/// What the pool should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Step {
    /// Containers to start.
    pub start: usize,
    /// Ready containers to remove.
    pub remove: usize,
}

/// Takes per bucket within the window, and the target they make.
#[derive(Debug)]
pub struct Demand {
    sizing: Sizing,
    /// A bucket never outlasts the window, or a take would be remembered beyond it.
    bucket: Duration,
    /// `(start, takes)` of the buckets still remembered, oldest first; only those with takes.
    buckets: VecDeque<(Instant, usize)>,
}

impl Demand {
    pub fn new(sizing: Sizing) -> Self {
        Self {
            sizing,
            bucket: BUCKET.min(sizing.window),
            buckets: VecDeque::new(),
        }
    }

    /// Counts one container handed out (or asked for while the pool was empty: a miss is
    /// demand too).
    pub fn take(&mut self, now: Instant) {
        self.forget(now);
        match self.buckets.back_mut() {
            Some((start, takes)) if now < *start + self.bucket => *takes += 1,
            _ => self.buckets.push_back((now, 1)),
        }
    }

    /// Forgets the buckets that started a window or more before `now`.
    pub fn forget(&mut self, now: Instant) {
        while let Some(&(start, _)) = self.buckets.front() {
            if now < start + self.sizing.window {
                break;
            }
            self.buckets.pop_front();
        }
    }

    /// How many containers the pool should hold (call [`Demand::forget`] first).
    pub fn target(&self) -> usize {
        let peak = self.buckets.iter().map(|&(_, n)| n).max().unwrap_or(0);
        self.sizing.floor.max(peak).min(self.sizing.max)
    }

    /// Whether any take is still remembered: the target may yet fall.
    pub fn remembers(&self) -> bool {
        !self.buckets.is_empty()
    }

    /// What to do with `ready` containers in the pool and `starting` on their way.
    pub fn step(&self, ready: usize, starting: usize) -> Step {
        let target = self.target();
        let held = ready + starting;
        Step {
            start: target
                .saturating_sub(held)
                .min(REFILL_PARALLEL.saturating_sub(starting)),
            remove: held.saturating_sub(target).min(ready).min(REFILL_PARALLEL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn demand(floor: usize, max: usize, window: Duration) -> Demand {
        Demand::new(Sizing { floor, max, window })
    }

    fn takes(d: &mut Demand, at: Instant, n: usize) {
        for _ in 0..n {
            d.take(at);
        }
    }

    #[test]
    fn without_takes_the_pool_holds_its_floor() {
        let d = demand(2, 64, 600 * S);
        assert_eq!(d.target(), 2);
        assert!(!d.remembers());
        assert_eq!(
            d.step(0, 0),
            Step {
                start: 2,
                remove: 0
            }
        );
        assert_eq!(d.step(2, 0), Step::default());
    }

    #[test]
    fn a_burst_grows_the_target_to_its_size_and_the_busiest_bucket_wins() {
        let t0 = Instant::now();
        let mut d = demand(2, 64, 600 * S);
        takes(&mut d, t0, 30);
        takes(&mut d, t0 + 9 * S, 20);
        assert_eq!(d.target(), 50, "one bucket: 10 s from its first take");
        takes(&mut d, t0 + 10 * S, 5);
        takes(&mut d, t0 + 60 * S, 12);
        assert_eq!(d.target(), 50, "later, smaller buckets do not lower it");
        assert!(d.remembers());
    }

    #[test]
    fn the_target_is_capped_and_never_below_the_floor() {
        let t0 = Instant::now();
        let mut d = demand(3, 8, 600 * S);
        takes(&mut d, t0, 1);
        assert_eq!(d.target(), 3);
        takes(&mut d, t0, 49);
        assert_eq!(d.target(), 8);
    }

    #[test]
    fn a_bucket_is_forgotten_a_window_after_it_started() {
        let t0 = Instant::now();
        let mut d = demand(2, 64, 60 * S);
        takes(&mut d, t0, 50);
        takes(&mut d, t0 + 30 * S, 10);
        d.forget(t0 + 59 * S);
        assert_eq!(d.target(), 50);
        d.forget(t0 + 60 * S);
        assert_eq!(d.target(), 10, "the burst went, the later bucket stays");
        d.forget(t0 + 90 * S);
        assert_eq!(d.target(), 2);
        assert!(!d.remembers());
    }

    #[test]
    fn a_window_shorter_than_a_bucket_shortens_the_bucket() {
        let t0 = Instant::now();
        let mut d = demand(1, 64, 2 * S);
        takes(&mut d, t0, 4);
        takes(&mut d, t0 + 2 * S, 1);
        assert_eq!(
            d.target(),
            1,
            "the first bucket ended and was forgotten at 2 s"
        );
    }

    #[test]
    fn refills_run_at_most_two_at_a_time() {
        let t0 = Instant::now();
        let mut d = demand(2, 64, 600 * S);
        takes(&mut d, t0, 50);
        assert_eq!(
            d.step(0, 0),
            Step {
                start: 2,
                remove: 0
            }
        );
        assert_eq!(
            d.step(10, 1),
            Step {
                start: 1,
                remove: 0
            }
        );
        assert_eq!(d.step(10, 2), Step::default());
        assert_eq!(
            d.step(49, 0),
            Step {
                start: 1,
                remove: 0
            }
        );
        assert_eq!(d.step(49, 1), Step::default());
    }

    #[test]
    fn the_surplus_goes_two_ready_containers_a_step() {
        let t0 = Instant::now();
        let mut d = demand(2, 64, 60 * S);
        takes(&mut d, t0, 50);
        d.forget(t0 + 60 * S);
        assert_eq!(
            d.step(50, 0),
            Step {
                start: 0,
                remove: 2
            }
        );
        assert_eq!(
            d.step(3, 0),
            Step {
                start: 0,
                remove: 1
            }
        );
        // Starts in flight count: they land as surplus and go in a later step.
        assert_eq!(
            d.step(1, 2),
            Step {
                start: 0,
                remove: 1
            }
        );
        assert_eq!(d.step(0, 2), Step::default());
    }

    proptest::proptest! {
        /// Whatever the takes: the target stays within floor and cap, a step never starts and
        /// removes at once nor exceeds the refill bound, and stepping reaches the target.
        #[test]
        fn steps_stay_in_bounds_and_reach_the_target(
            floor in 0usize..8,
            extra in 0usize..64,
            window_ms in 1u64..30_000,
            takes in proptest::collection::vec((0u64..20_000, 0usize..80), 0..20),
            ready in 0usize..100,
            starting in 0usize..=REFILL_PARALLEL,
        ) {
            let t0 = Instant::now();
            let max = floor + extra;
            let mut d = demand(floor, max, Duration::from_millis(window_ms));
            let mut at = t0;
            for (gap, n) in takes {
                at += Duration::from_millis(gap);
                for _ in 0..n {
                    d.take(at);
                }
                let target = d.target();
                proptest::prop_assert!(floor <= target && target <= max);
            }
            let target = d.target();
            let (mut ready, mut starting) = (ready, starting);
            for _ in 0..200 {
                let step = d.step(ready, starting);
                proptest::prop_assert!(step.start == 0 || step.remove == 0, "{step:?}");
                proptest::prop_assert!(starting + step.start <= REFILL_PARALLEL);
                proptest::prop_assert!(step.remove <= ready.min(REFILL_PARALLEL));
                // Starts in flight land, the new ones begin, the surplus goes.
                ready = ready + starting - step.remove;
                starting = step.start;
            }
            proptest::prop_assert_eq!(ready + starting, target);
        }
    }
}

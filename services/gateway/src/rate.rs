//! A token bucket per API key: `burst` requests at once, refilled at `rate` per second.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

struct Bucket {
    tokens: f64,
    at: Instant,
}

pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    pub fn new(rate_per_second: f64, burst: u32) -> Self {
        Self {
            rate: rate_per_second,
            burst: f64::from(burst),
            buckets: Mutex::default(),
        }
    }

    /// Takes one token of `key`'s bucket, or says how long until one is there.
    pub fn take(&self, key: &str) -> Result<(), Duration> {
        self.take_at(key, Instant::now())
    }

    fn take_at(&self, key: &str, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().expect("rate lock");
        let bucket = buckets.entry(key.to_string()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / self.rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let limiter = RateLimiter::new(2.0, 3);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(limiter.take_at("k", t0), Ok(()));
        }
        let wait = limiter.take_at("k", t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        // Another key has its own bucket.
        assert_eq!(limiter.take_at("other", t0), Ok(()));
        assert_eq!(
            limiter.take_at("k", t0 + Duration::from_millis(500)),
            Ok(())
        );
        assert!(limiter
            .take_at("k", t0 + Duration::from_millis(500))
            .is_err());
        // Never more than the burst, however long the quiet spell.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert_eq!(limiter.take_at("k", later), Ok(()));
        }
        assert!(limiter.take_at("k", later).is_err());
    }
}

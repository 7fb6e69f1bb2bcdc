//! Retry policy: exponential backoff with jitter, honouring the provider's `retry-after`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use crate::error::Error;

/// When and how long to wait before sending a request again.
///
/// Only errors whose [`Error::is_retryable`] is true are retried (429, 529/overloaded, 408,
/// 409, 5xx, timeouts and connection failures before any part of the answer arrived).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (0 disables retrying).
    pub max_retries: u32,
    /// The backoff before the first retry; it doubles on each further retry.
    pub initial_backoff: Duration,
    /// The longest computed backoff.
    pub max_backoff: Duration,
    /// The longest `retry-after` honoured; a provider asking for more gets this much.
    pub max_retry_after: Duration,
    /// Randomise each backoff within its upper half, so that clients do not retry in step.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    /// The delay before retry number `retry` (0-based) after `error`, or `None` when the
    /// error is not retryable or the retries are used up.
    pub fn delay(&self, retry: u32, error: &Error) -> Option<Duration> {
        if !error.is_retryable() || retry >= self.max_retries {
            return None;
        }
        if let Some(after) = error.retry_after() {
            return Some(after.min(self.max_retry_after));
        }
        let factor = 2u32.saturating_pow(retry.min(16));
        let backoff = self
            .initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff);
        Some(if self.jitter {
            backoff.mul_f64(0.5 + 0.5 * random_fraction())
        } else {
            backoff
        })
    }
}

/// A number in `[0, 1)` from the standard library's randomly keyed hasher.
fn random_fraction() -> f64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Parses `retry-after` (seconds, or an HTTP-date) or `retry-after-ms` header values.
pub(crate) fn parse_retry_after(seconds: Option<&str>, millis: Option<&str>) -> Option<Duration> {
    // A negative or NaN value is no answer; one too large for a `Duration` (a hostile
    // `retry-after: 1e300`, which must not panic) is the longest wait, which the policy caps
    // like any long one — never less than a moderate request gets.
    let secs = |s: f64| match Duration::try_from_secs_f64(s) {
        Ok(d) => Some(d),
        Err(_) if s > 0.0 => Some(Duration::MAX),
        Err(_) => None,
    };
    let number = |v: &str| v.trim().parse::<f64>().ok();
    if let Some(d) = millis.and_then(number).and_then(|ms| secs(ms / 1000.0)) {
        return Some(d);
    }
    let value = seconds?;
    match number(value) {
        Some(s) => secs(s),
        // `retry-after: Wed, 21 Oct 2026 07:28:00 GMT`: the time left until then. One that
        // has passed (or a server clock behind this one) asks for nothing: the backoff
        // applies, not an instant retry.
        None => httpdate::parse_http_date(value.trim())
            .ok()
            .and_then(|at| at.duration_since(std::time::SystemTime::now()).ok())
            .filter(|left| !left.is_zero()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable() -> Error {
        Error::from_status(503, "down".into(), None)
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_without_jitter() {
        let p = RetryPolicy {
            max_retries: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(500),
            jitter: false,
            ..RetryPolicy::default()
        };
        let delays: Vec<_> = (0..5)
            .map(|r| p.delay(r, &unavailable()).unwrap())
            .collect();
        assert_eq!(delays, [100, 200, 400, 500, 500].map(Duration::from_millis));
        assert_eq!(p.delay(10, &unavailable()), None, "retries used up");
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let p = RetryPolicy::default();
        for _ in 0..100 {
            let d = p.delay(1, &unavailable()).unwrap();
            assert!(
                d >= Duration::from_millis(500) && d <= Duration::from_millis(1000),
                "{d:?}"
            );
        }
    }

    #[test]
    fn retry_after_wins_and_is_capped() {
        let p = RetryPolicy::default();
        let e = Error::from_status(429, "slow".into(), Some(Duration::from_secs(3)));
        assert_eq!(p.delay(0, &e), Some(Duration::from_secs(3)));
        let e = Error::from_status(429, "slow".into(), Some(Duration::from_secs(600)));
        assert_eq!(p.delay(0, &e), Some(Duration::from_secs(60)));
        let e = Error::from_status(400, "bad".into(), None);
        assert_eq!(p.delay(0, &e), None, "not retryable");
    }

    #[test]
    fn retry_after_headers_parse() {
        assert_eq!(
            parse_retry_after(Some("2"), None),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            parse_retry_after(Some("2"), Some("150")),
            Some(Duration::from_millis(150))
        );
        // An HTTP-date: the time left until then; one that has passed asks for nothing (the
        // backoff applies, not an instant retry).
        assert_eq!(
            parse_retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT"), None),
            None
        );
        let later = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(30));
        let left = parse_retry_after(Some(&later), None).unwrap();
        assert!(
            left > Duration::from_secs(27) && left <= Duration::from_secs(30),
            "{left:?}"
        );
        assert_eq!(parse_retry_after(Some("soon"), None), None);
        assert_eq!(parse_retry_after(Some("-1"), None), None);
        // Too large for a `Duration`: the longest wait, which the policy caps, never less
        // than a moderate value gets.
        assert_eq!(parse_retry_after(Some("1e300"), None), Some(Duration::MAX));
        assert_eq!(
            parse_retry_after(Some("NaN"), Some("1e300")),
            Some(Duration::MAX)
        );
        assert_eq!(parse_retry_after(Some("NaN"), None), None);
        let p = RetryPolicy::default();
        let huge = Error::from_status(429, "slow".into(), parse_retry_after(Some("1e300"), None));
        assert_eq!(p.delay(0, &huge), Some(p.max_retry_after));
        assert_eq!(
            parse_retry_after(Some("1e9"), None),
            Some(Duration::from_secs(1_000_000_000))
        );
        assert_eq!(parse_retry_after(None, None), None);
    }
}

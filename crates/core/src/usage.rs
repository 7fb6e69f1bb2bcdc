//! Token and tool accounting for one model call, one agent, or a whole tree of agents.

use std::iter::Sum;
use std::ops::{Add, AddAssign};

use serde::{Deserialize, Serialize};

use crate::notification::NotificationUsage;

/// What some work cost: tokens by kind (as the provider reported them), tool calls, time.
///
/// `input_tokens` counts only uncached input; the provider's total input is
/// `input_tokens + cache_write_tokens + cache_read_tokens`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens neither written to nor read from the cache.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens written to the prompt cache (all TTLs).
    pub cache_write_tokens: u64,
    /// The part of `cache_write_tokens` written with the 1-hour TTL.
    #[serde(default)]
    pub cache_write_1h_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read_tokens: u64,
    /// Tool calls made.
    #[serde(default)]
    pub tool_uses: u64,
    /// Wall-clock duration in milliseconds.
    #[serde(default)]
    pub duration_ms: u64,
}

impl Usage {
    /// All input tokens: uncached, cache-written and cache-read.
    pub fn total_input_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.cache_write_tokens)
            .saturating_add(self.cache_read_tokens)
    }

    /// All tokens: input of every kind plus output.
    pub fn total_tokens(&self) -> u64 {
        self.total_input_tokens().saturating_add(self.output_tokens)
    }

    /// The share of input tokens served from the cache, in `0.0..=1.0` (0 when there was no
    /// input).
    pub fn cache_hit_ratio(&self) -> f64 {
        let total = self.total_input_tokens();
        if total == 0 {
            0.0
        } else {
            self.cache_read_tokens as f64 / total as f64
        }
    }

    /// The usage block of a task notification.
    pub fn to_notification(&self) -> NotificationUsage {
        NotificationUsage {
            total_tokens: self.total_tokens(),
            tool_uses: self.tool_uses,
            duration_ms: self.duration_ms,
        }
    }
}

impl Add for Usage {
    type Output = Usage;
    fn add(mut self, rhs: Usage) -> Usage {
        self += rhs;
        self
    }
}

impl AddAssign for Usage {
    /// Field-wise saturating addition.
    fn add_assign(&mut self, rhs: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(rhs.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(rhs.output_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(rhs.cache_write_tokens);
        self.cache_write_1h_tokens = self
            .cache_write_1h_tokens
            .saturating_add(rhs.cache_write_1h_tokens);
        self.cache_read_tokens = self.cache_read_tokens.saturating_add(rhs.cache_read_tokens);
        self.tool_uses = self.tool_uses.saturating_add(rhs.tool_uses);
        self.duration_ms = self.duration_ms.saturating_add(rhs.duration_ms);
    }
}

impl Sum for Usage {
    fn sum<I: Iterator<Item = Usage>>(iter: I) -> Usage {
        iter.fold(Usage::default(), Add::add)
    }
}

impl<'a> Sum<&'a Usage> for Usage {
    fn sum<I: Iterator<Item = &'a Usage>>(iter: I) -> Usage {
        iter.copied().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addition_and_totals() {
        let a = Usage {
            input_tokens: 10,
            output_tokens: 5,
            cache_write_tokens: 100,
            cache_read_tokens: 0,
            tool_uses: 1,
            duration_ms: 7,
            ..Usage::default()
        };
        let b = Usage {
            input_tokens: 2,
            output_tokens: 1,
            cache_read_tokens: 100,
            tool_uses: 2,
            duration_ms: 3,
            ..Usage::default()
        };
        let s = a + b;
        assert_eq!(s.total_input_tokens(), 212);
        assert_eq!(s.total_tokens(), 218);
        assert_eq!([a, b].iter().sum::<Usage>(), s);
        assert!((b.cache_hit_ratio() - 100.0 / 102.0).abs() < 1e-12);
        assert_eq!(Usage::default().cache_hit_ratio(), 0.0);
        assert_eq!(
            s.to_notification(),
            NotificationUsage {
                total_tokens: 218,
                tool_uses: 3,
                duration_ms: 10
            }
        );
        let max = Usage {
            output_tokens: u64::MAX,
            ..Usage::default()
        };
        assert_eq!((max + max).output_tokens, u64::MAX);
        let huge = Usage {
            input_tokens: u64::MAX,
            cache_read_tokens: 5,
            ..Usage::default()
        };
        assert_eq!(huge.total_tokens(), u64::MAX);
    }
}

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
    /// Wall-clock duration in milliseconds: for a child (its notification, its registry
    /// record, its parent's report of it), from its start to its end. A run's own usage
    /// (`AgentRun::usage`, a turn's) leaves it 0. Summed usage adds durations: a tree's is the
    /// time its agents spent (children side by side count each), and a record of a task
    /// revived for a message adds each run's.
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

    /// What these tokens cost at `prices`, in the prices' currency: uncached input at the
    /// input price, cache writes at the 5-minute or 1-hour write price, cache reads at the
    /// read price, output at the output price.
    ///
    /// ```
    /// use forkhive_core::{PriceTable, Usage};
    /// let usage = Usage { input_tokens: 1_000, cache_read_tokens: 9_000, output_tokens: 500, ..Usage::default() };
    /// let sonnet = PriceTable::published().get("claude-sonnet-4-5").unwrap();
    /// // 1,000 × $3 + 9,000 × $0.30 + 500 × $15, per million tokens:
    /// assert!((usage.cost(&sonnet) - 0.0132).abs() < 1e-12);
    /// ```
    pub fn cost(&self, prices: &Prices) -> f64 {
        let m = |tokens: u64, per_million: f64| tokens as f64 * per_million / 1_000_000.0;
        let write_1h = self.cache_write_1h_tokens.min(self.cache_write_tokens);
        m(self.input_tokens, prices.input)
            + m(self.cache_write_tokens - write_1h, prices.cache_write_5m)
            + m(write_1h, prices.cache_write_1h)
            + m(self.cache_read_tokens, prices.cache_read)
            + m(self.output_tokens, prices.output)
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

/// One model's prices per million tokens (in US dollars for [`PriceTable::published`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Prices {
    /// Uncached input.
    pub input: f64,
    /// Input written to the cache with the 5-minute TTL.
    pub cache_write_5m: f64,
    /// Input written to the cache with the 1-hour TTL.
    pub cache_write_1h: f64,
    /// Input read from the cache.
    pub cache_read: f64,
    /// Output.
    pub output: f64,
}

impl Prices {
    /// Prices from an input and an output price, with the cache priced as Anthropic publishes
    /// it relative to input: a 5-minute write 1.25×, a 1-hour write 2×, a read 0.1× ("Prompt caching", the provider's documentation).
    pub fn from_input_output(input: f64, output: f64) -> Self {
        Self {
            input,
            cache_write_5m: input * 1.25,
            cache_write_1h: input * 2.0,
            cache_read: input * 0.1,
            output,
        }
    }
}

/// The Anthropic model id a Claude Code model alias stands for: `haiku`, `sonnet` and `opus`
/// (in any case), which agent definitions name and the built-in `Explore` agent runs on, are
/// the newest of their family in [`PriceTable::published`]; any other name is returned as it
/// is. Anthropic's API takes ids, not aliases, so its backend sends what this returns, and a
/// price table looks aliases up by it. A host that wants another id names it in its
/// definitions.
///
/// ```
/// use forkhive_core::usage::anthropic_model_id;
/// assert_eq!(anthropic_model_id("haiku"), "claude-haiku-4-5");
/// assert_eq!(anthropic_model_id("claude-sonnet-4-5"), "claude-sonnet-4-5");
/// ```
pub fn anthropic_model_id(model: &str) -> &str {
    const ALIASES: [(&str, &str); 3] = [
        ("haiku", "claude-haiku-4-5"),
        ("sonnet", "claude-sonnet-5"),
        ("opus", "claude-opus-5"),
    ];
    ALIASES
        .iter()
        .find(|(alias, _)| alias.eq_ignore_ascii_case(model))
        .map_or(model, |(_, id)| id)
}

/// Prices by model, matched by the longest prefix of the model id (so
/// `claude-sonnet-4-5-20250929` finds `claude-sonnet-4-5`). Hosts replace entries or start
/// from [`PriceTable::new`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PriceTable {
    entries: Vec<(String, Prices)>,
}

impl PriceTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Anthropic's published list prices in US dollars per million tokens, as read from its
    /// pricing page in November 2026 (`docs/references.md`, key PRICES). Prices change:
    /// a host that bills from them should keep its own table.
    pub fn published() -> Self {
        let mut t = Self::new();
        for (model, input, output) in [
            ("claude-opus-5", 5.0, 25.0),
            ("claude-opus-4-5", 5.0, 25.0),
            ("claude-opus-4-1", 15.0, 75.0),
            ("claude-sonnet-5", 2.0, 10.0),
            ("claude-sonnet-4-5", 3.0, 15.0),
            ("claude-haiku-4-5", 1.0, 5.0),
        ] {
            t.insert(model, Prices::from_input_output(input, output));
        }
        t
    }

    /// Sets the prices of `model` (a model id or a prefix of ids), replacing any.
    pub fn insert(&mut self, model: impl Into<String>, prices: Prices) -> &mut Self {
        let model = model.into();
        match self.entries.iter_mut().find(|(m, _)| *m == model) {
            Some(entry) => entry.1 = prices,
            None => self.entries.push((model, prices)),
        }
        self
    }

    /// The prices of `model`: the entry that is the longest prefix of it, or else of the id
    /// its alias stands for ([`anthropic_model_id`]: `haiku` finds `claude-haiku-4-5`, on
    /// any backend — a table does not know which one answered), if any.
    pub fn get(&self, model: &str) -> Option<Prices> {
        let longest = |model: &str| {
            self.entries
                .iter()
                .filter(|(m, _)| model.starts_with(m.as_str()))
                .max_by_key(|(m, _)| m.len())
                .map(|(_, p)| *p)
        };
        longest(model).or_else(|| {
            let id = anthropic_model_id(model);
            (id != model).then(|| longest(id)).flatten()
        })
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

    /// An alias is priced as the id it stands for, unless the table prices the alias itself.
    #[test]
    fn an_alias_is_priced_as_its_id() {
        let mut t = PriceTable::published();
        assert_eq!(t.get("haiku"), t.get("claude-haiku-4-5"));
        assert!(t.get("HAIKU").is_some());
        assert_eq!(t.get("local-model"), None);
        t.insert("haiku", Prices::from_input_output(9.0, 9.0));
        assert_eq!(t.get("haiku"), Some(Prices::from_input_output(9.0, 9.0)));
        assert_eq!(anthropic_model_id("opus"), "claude-opus-5");
        assert_eq!(anthropic_model_id("haiku-4"), "haiku-4");
    }

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

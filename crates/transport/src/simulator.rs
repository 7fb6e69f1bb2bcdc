//! [`PromptCacheSimulator`]: a backend wrapper that applies a provider's prompt-caching rules
//! to the exact bytes of each request and reports cache-write and cache-read tokens.
//!
//! It lets every example and test show its cache economics offline, and lets a user assert
//! them in CI. The rules, with sources, are in `docs/cache-economics.md`; in short, for
//! [`SimulatedProvider::Anthropic`]:
//!
//! - the cache key of a position is everything rendered before it, byte for byte, in render
//!   order: tools, then system, then messages (the thinking config and `tool_choice` count at
//!   the message level, so changing them keeps tool and system entries valid);
//! - entries are **written only at `cache_control` breakpoints** (at most 4 per request; more is
//!   an `invalid_request` error, as is a 1-hour breakpoint after a 5-minute one);
//! - a breakpoint **reads** the latest entry found among the 20 block positions ending at it
//!   (its own included); beyond that it misses;
//! - below the model's **minimum cacheable length** nothing is written or read;
//! - an entry lives for its TTL (5 minutes or 1 hour) on an injectable [`Clock`], refreshed on
//!   every hit;
//! - an entry becomes readable only once the request that wrote it has **started answering**:
//!   requests sent in parallel with the writer miss.
//!
//! [`SimulatedProvider::OpenAi`] models automatic prefix caching: no breakpoints, every prompt
//! of at least 1,024 tokens is cached, and hits grow in 128-token steps.
//!
//! Approximations: tokens are estimated as one per four bytes of each block's JSON (a
//! deterministic stand-in for the provider's tokenizer); the cache is per simulator (a real
//! provider's is per organisation and may evict earlier); OpenAI's routing by the first ~256
//! tokens and `prompt_cache_key` is not modelled.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use sha2::{Digest as _, Sha256};

use forkhive_core::Digest;

use crate::backend::{Backend, EventStream};
use crate::codec::{AnthropicCodec, CacheTtl, Codec, OpenAiCodec};
use crate::error::{Error, Result};
use crate::request::{PartialUsage, Request, Response, StreamEvent};

/// Deterministic token estimate: one token per four bytes, rounded up.
pub fn estimate_tokens(bytes: usize) -> u64 {
    bytes.div_ceil(4) as u64
}

/// The minimum cacheable prompt length of an Anthropic model, in tokens.
///
/// From the provider's prompt-caching documentation: 1,024 for most models, 2,048 for the
/// Haiku 3 family, 4,096 for Opus 4.5 and Haiku 4.5. Newer models may differ: override with
/// [`SimulatorConfig::min_cacheable_tokens`].
pub fn anthropic_min_cacheable_tokens(model: &str) -> u64 {
    let m = forkhive_core::usage::anthropic_model_id(model).to_ascii_lowercase();
    if m.contains("opus-4-5") || m.contains("haiku-4-5") {
        4096
    } else if m.contains("3-haiku") || m.contains("3-5-haiku") {
        2048
    } else {
        1024
    }
}

/// A source of time for cache TTLs.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time since an arbitrary fixed origin.
    fn now(&self) -> Duration;
}

/// The machine's monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed()
    }
}

/// A clock that moves only when told to: for tests of TTLs.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let n = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(n, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
}

/// Whose caching rules to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SimulatedProvider {
    /// Anthropic Messages: explicit breakpoints, lookback, minimum length, TTLs.
    Anthropic,
    /// OpenAI-compatible: automatic prefix caching in 128-token steps.
    OpenAi,
}

/// Settings of a [`PromptCacheSimulator`].
#[derive(Debug, Clone)]
pub struct SimulatorConfig {
    /// Whose rules (and wire format) to use.
    pub provider: SimulatedProvider,
    /// Overrides the per-model minimum cacheable length.
    pub min_cacheable_tokens: Option<u64>,
    /// Block positions a breakpoint looks back over, its own included (Anthropic: 20).
    pub lookback: usize,
    /// Most breakpoints a request may carry (Anthropic: 4).
    pub max_breakpoints: usize,
}

impl SimulatorConfig {
    /// The provider's documented values.
    pub fn new(provider: SimulatedProvider) -> Self {
        Self {
            provider,
            min_cacheable_tokens: None,
            lookback: 20,
            max_breakpoints: 4,
        }
    }
}

/// A snapshot of the simulated cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Entries that can be read now.
    pub live: usize,
    /// Entries whose writers have not started answering yet.
    pub pending: usize,
}

/// What the simulator decided for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheReport {
    /// 1-based request number.
    pub request: u64,
    /// The request's label, if any.
    pub label: Option<String>,
    /// All input tokens of the request.
    pub total_input_tokens: u64,
    /// Tokens read from the cache.
    pub cache_read_tokens: u64,
    /// Tokens written to the cache.
    pub cache_write_tokens: u64,
    /// Of those, written with the 1-hour TTL.
    pub cache_write_1h_tokens: u64,
    /// Tokens neither read nor written.
    pub input_tokens: u64,
    /// Block positions carrying a breakpoint (Anthropic), in render order.
    pub breakpoints: Vec<usize>,
    /// The block position the read ended at, if it hit.
    pub hit_at: Option<usize>,
}

impl CacheReport {
    /// The usage fields this report decides.
    pub fn partial_usage(&self) -> PartialUsage {
        PartialUsage {
            input_tokens: Some(self.input_tokens),
            output_tokens: None,
            cache_write_tokens: Some(self.cache_write_tokens),
            cache_write_1h_tokens: Some(self.cache_write_1h_tokens),
            cache_read_tokens: Some(self.cache_read_tokens),
        }
    }
}

#[derive(Debug)]
struct Entry {
    ttl: Duration,
    expires_at: Duration,
    /// Whether some writer's answer has begun (only then can the entry be read).
    ready: bool,
    /// Requests writing this entry whose answers have not begun yet.
    writers: Vec<u64>,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<Digest, Entry>,
    requests: u64,
    reports: Vec<CacheReport>,
}

impl State {
    /// Records that request `id` writes `key`. A live entry is left alone; a pending one gains
    /// a writer (parallel requests each pay for their write); an expired one is replaced.
    fn write(&mut self, key: Digest, ttl: Duration, id: u64, now: Duration) {
        let fresh = Entry {
            ttl,
            expires_at: now + ttl,
            ready: false,
            writers: vec![id],
        };
        match self.entries.get_mut(&key) {
            Some(e) if e.ready && e.expires_at > now => {}
            Some(e) if !e.ready => e.writers.push(id),
            Some(e) => *e = fresh,
            None => {
                self.entries.insert(key, fresh);
            }
        }
    }

    /// Request `id` began answering: its entries become readable from now.
    fn ready(&mut self, id: u64, now: Duration) {
        for e in self.entries.values_mut() {
            if let Some(i) = e.writers.iter().position(|&w| w == id) {
                e.writers.swap_remove(i);
                e.ready = true;
                e.expires_at = now + e.ttl;
            }
        }
    }

    /// Request `id` failed or was dropped: it writes nothing.
    fn abort(&mut self, id: u64) {
        self.entries.retain(|_, e| {
            e.writers.retain(|&w| w != id);
            e.ready || !e.writers.is_empty()
        });
    }

    /// Forgets expired entries.
    fn purge(&mut self, now: Duration) {
        self.entries
            .retain(|_, e| !e.writers.is_empty() || (e.ready && e.expires_at > now));
    }

    /// A hit restarts the entry's TTL.
    fn refresh(&mut self, key: &Digest, now: Duration) {
        if let Some(e) = self.entries.get_mut(key) {
            e.expires_at = now + e.ttl;
        }
    }

    fn live(&self, key: &Digest, now: Duration) -> bool {
        self.entries
            .get(key)
            .is_some_and(|e| e.ready && e.expires_at > now)
    }
}

/// Settles one request's pending writes: `ready` when its answer begins, `abort` if it is
/// dropped or fails first (a cancelled request writes nothing and leaves nothing pending).
struct Pending {
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
    id: u64,
    settled: bool,
}

impl Pending {
    fn settle(&mut self, ok: bool) {
        if self.settled {
            return;
        }
        self.settled = true;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if ok {
            state.ready(self.id, self.clock.now());
        } else {
            state.abort(self.id);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.settle(false);
    }
}

/// One position a cache entry can end at.
#[derive(Debug, Clone)]
struct Position {
    key: Digest,
    /// Tokens up to and including this position.
    tokens: u64,
    breakpoint: Option<CacheTtl>,
}

/// Wraps a backend and reports cache usage by the provider's rules; see the module docs.
///
/// ```
/// use forkhive_transport::simulator::PromptCacheSimulator;
/// use forkhive_transport::{Backend, Request, ScriptedBackend};
/// use forkhive_core::{CacheSafeParams, Message};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let params = CacheSafeParams::builder("claude-sonnet-4-5")
///     .system_block("x".repeat(8000)) // ~2,000 tokens: above the 1,024 minimum
///     .build();
/// let sim = PromptCacheSimulator::anthropic(ScriptedBackend::from_texts(["a", "b"]));
/// let first = sim.send(&Request::new(params.clone(), vec![Message::user_text("one")])).await?;
/// let second = sim.send(&Request::new(params, vec![Message::user_text("two")])).await?;
/// assert!(first.usage.cache_write_tokens > 2000 && first.usage.cache_read_tokens == 0);
/// assert_eq!(second.usage.cache_read_tokens, first.usage.cache_write_tokens);
/// # Ok::<(), forkhive_transport::Error>(()) }).unwrap();
/// ```
pub struct PromptCacheSimulator<B> {
    inner: B,
    codec: Box<dyn Codec>,
    config: SimulatorConfig,
    clock: Arc<dyn Clock>,
    state: Arc<Mutex<State>>,
}

impl<B: Backend> PromptCacheSimulator<B> {
    /// Anthropic rules on the default Anthropic encoding, on the system clock.
    pub fn anthropic(inner: B) -> Self {
        Self::new(
            inner,
            SimulatorConfig::new(SimulatedProvider::Anthropic),
            Box::new(AnthropicCodec::default()),
            Arc::new(SystemClock),
        )
    }

    /// OpenAI automatic-caching rules on the Chat Completions encoding, on the system clock.
    pub fn openai(inner: B) -> Self {
        Self::new(
            inner,
            SimulatorConfig::new(SimulatedProvider::OpenAi),
            Box::new(OpenAiCodec::default()),
            Arc::new(SystemClock),
        )
    }

    /// A simulator with every part chosen; `codec` must speak the provider's wire format.
    pub fn new(
        inner: B,
        config: SimulatorConfig,
        codec: Box<dyn Codec>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            inner,
            codec,
            config,
            clock,
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    /// Replaces the clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Replaces the configuration.
    pub fn with_config(mut self, config: SimulatorConfig) -> Self {
        self.config = config;
        self
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// A report per request so far.
    pub fn reports(&self) -> Vec<CacheReport> {
        self.lock().reports.clone()
    }

    /// How many cache entries are live, and how many wait for their writer's answer to begin.
    pub fn stats(&self) -> CacheStats {
        let now = self.clock.now();
        let state = self.lock();
        CacheStats {
            live: state.entries.keys().filter(|k| state.live(k, now)).count(),
            pending: state
                .entries
                .values()
                .filter(|e| !e.writers.is_empty() && !e.ready)
                .count(),
        }
    }

    /// Forgets every cache entry (as if the TTLs had all run out).
    pub fn clear(&self) {
        self.lock().entries.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Analyses `body` (the exact bytes of the request) and records pending writes.
    fn begin(&self, request: &Request, body: &[u8]) -> Result<CacheReport> {
        let now = self.clock.now();
        let analysis = match self.config.provider {
            SimulatedProvider::Anthropic => anthropic_positions(body)?,
            SimulatedProvider::OpenAi => openai_positions(body)?,
        };
        let min = self
            .config
            .min_cacheable_tokens
            .unwrap_or_else(|| match self.config.provider {
                SimulatedProvider::Anthropic => anthropic_min_cacheable_tokens(&analysis.model),
                SimulatedProvider::OpenAi => 1024,
            });
        let mut state = self.lock();
        state.purge(now);
        state.requests += 1;
        let id = state.requests;
        let report = match self.config.provider {
            SimulatedProvider::Anthropic => {
                self.decide_anthropic(&mut state, id, &analysis, min, now)?
            }
            SimulatedProvider::OpenAi => decide_openai(&mut state, id, &analysis, min, now),
        };
        let report = CacheReport {
            label: request.label.clone(),
            ..report
        };
        state.reports.push(report.clone());
        Ok(report)
    }

    fn decide_anthropic(
        &self,
        state: &mut State,
        id: u64,
        analysis: &Analysis,
        min: u64,
        now: Duration,
    ) -> Result<CacheReport> {
        let positions = &analysis.positions;
        let breakpoints: Vec<usize> = positions
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.breakpoint.map(|_| i))
            .collect();
        if breakpoints.len() > self.config.max_breakpoints {
            return Err(Error::InvalidRequest {
                status: 400,
                message: format!(
                    "A maximum of {} blocks with cache_control may be provided. Found {}.",
                    self.config.max_breakpoints,
                    breakpoints.len()
                ),
            });
        }
        let mut seen_5m = false;
        for &b in &breakpoints {
            match positions[b].breakpoint {
                Some(CacheTtl::FiveMinutes) => seen_5m = true,
                Some(CacheTtl::OneHour) if seen_5m => {
                    return Err(Error::InvalidRequest {
                        status: 400,
                        message: format!(
                            "a cache_control breakpoint with ttl 1h (block {b}) comes after one with ttl 5m: longer TTLs must come first"
                        ),
                    });
                }
                _ => {}
            }
        }
        let total = analysis.total;

        // Reads: each breakpoint looks back over `lookback` positions, its own included.
        let mut hit: Option<usize> = None;
        for &b in &breakpoints {
            if positions[b].tokens < min {
                continue;
            }
            let from = b.saturating_sub(self.config.lookback.saturating_sub(1));
            if let Some(j) = (from..=b)
                .rev()
                .find(|&j| positions[j].tokens >= min && state.live(&positions[j].key, now))
            {
                hit = hit.max(Some(j));
            }
        }
        let read = hit.map_or(0, |j| positions[j].tokens);
        if let Some(j) = hit {
            state.refresh(&positions[j].key, now);
        }

        // Writes: every eligible breakpoint after the hit.
        let mut cached = read;
        let (mut write, mut write_1h) = (0, 0);
        for &b in &breakpoints {
            let p = &positions[b];
            if p.tokens < min || hit.is_some_and(|j| b <= j) {
                continue;
            }
            let ttl = p.breakpoint.unwrap_or_default();
            let segment = p.tokens.saturating_sub(cached);
            write += segment;
            if ttl == CacheTtl::OneHour {
                write_1h += segment;
            }
            cached = p.tokens;
            state.write(p.key, ttl.duration(), id, now);
        }
        Ok(CacheReport {
            request: id,
            label: None,
            total_input_tokens: total,
            cache_read_tokens: read,
            cache_write_tokens: write,
            cache_write_1h_tokens: write_1h,
            input_tokens: total.saturating_sub(read + write),
            breakpoints,
            hit_at: hit,
        })
    }

    fn pending(&self, id: u64) -> Pending {
        Pending {
            state: Arc::clone(&self.state),
            clock: Arc::clone(&self.clock),
            id,
            settled: false,
        }
    }
}

fn decide_openai(
    state: &mut State,
    id: u64,
    analysis: &Analysis,
    min: u64,
    now: Duration,
) -> CacheReport {
    let (positions, total) = (&analysis.positions, analysis.total);
    let hit = positions
        .iter()
        .rposition(|p| p.tokens >= min && state.live(&p.key, now));
    let read = hit.map_or(0, |j| positions[j].tokens);
    if let Some(j) = hit {
        state.refresh(&positions[j].key, now);
    }
    if total >= min {
        let ttl = CacheTtl::FiveMinutes.duration();
        for p in positions.iter().filter(|p| p.tokens >= min) {
            state.write(p.key, ttl, id, now);
        }
    }
    CacheReport {
        request: id,
        label: None,
        total_input_tokens: total,
        cache_read_tokens: read,
        cache_write_tokens: 0,
        cache_write_1h_tokens: 0,
        input_tokens: total - read,
        breakpoints: Vec::new(),
        hit_at: hit,
    }
}

struct Analysis {
    model: String,
    positions: Vec<Position>,
    /// All input tokens of the request.
    total: u64,
}

/// A JSON object as its keys and exact raw values, in order.
struct RawObject(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawObject;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<RawObject, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
                    out.push((k, v));
                }
                Ok(RawObject(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A `system` or `content` field: a string or an array of blocks.
enum Blocks {
    Text(String),
    List(Vec<Box<RawValue>>),
}

// Hand-written: an untagged enum would buffer the blocks and lose their raw bytes.
impl<'de> Deserialize<'de> for Blocks {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Blocks;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of blocks")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Blocks, E> {
                Ok(Blocks::Text(v.to_owned()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Blocks, A::Error> {
                let mut out = Vec::new();
                while let Some(b) = seq.next_element::<Box<RawValue>>()? {
                    out.push(b);
                }
                Ok(Blocks::List(out))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
struct AnthropicBody {
    model: String,
    #[serde(default)]
    tools: Vec<Box<RawValue>>,
    system: Option<Blocks>,
    messages: Vec<AnthropicMessage>,
    thinking: Option<Box<RawValue>>,
    tool_choice: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct AnthropicMessage {
    role: String,
    content: Blocks,
}

fn decode_error(e: serde_json::Error) -> Error {
    Error::InvalidRequest {
        status: 400,
        message: format!("the request body is not a valid request: {e}"),
    }
}

/// Feeds `bytes` with its length first, so that no two sequences of fields hash alike.
fn frame(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

/// Feeds one block to the running key and returns its breakpoint TTL, if it carries one.
fn feed_block(hasher: &mut Sha256, raw: &RawValue) -> Result<(usize, Option<CacheTtl>)> {
    #[derive(Deserialize)]
    struct Marker {
        ttl: Option<String>,
    }
    let obj: RawObject = serde_json::from_str(raw.get()).map_err(decode_error)?;
    let mut len = 0;
    let mut ttl = None;
    hasher.update(b"\x1eblock");
    for (k, v) in &obj.0 {
        if k == "cache_control" {
            let m: Marker = serde_json::from_str(v.get()).map_err(decode_error)?;
            ttl = Some(match m.ttl.as_deref() {
                Some("1h") => CacheTtl::OneHour,
                None | Some("5m") => CacheTtl::FiveMinutes,
                Some(other) => {
                    return Err(Error::InvalidRequest {
                        status: 400,
                        message: format!(
                            "cache_control.ttl must be \"5m\" or \"1h\", found {other:?}"
                        ),
                    });
                }
            });
            continue;
        }
        frame(hasher, k.as_bytes());
        frame(hasher, v.get().as_bytes());
        len += k.len() + v.get().len() + 4;
    }
    Ok((len, ttl))
}

fn anthropic_positions(body: &[u8]) -> Result<Analysis> {
    let b: AnthropicBody = serde_json::from_slice(body).map_err(decode_error)?;
    let mut hasher = Sha256::new_with_prefix(b"anthropic\x1f");
    frame(&mut hasher, b.model.as_bytes());
    let mut positions = Vec::new();
    let mut tokens = 0;
    let mut push = |hasher: &mut Sha256, len: usize, ttl: Option<CacheTtl>| {
        tokens += estimate_tokens(len);
        positions.push(Position {
            key: Digest::from(<[u8; 32]>::from(hasher.clone().finalize())),
            tokens,
            breakpoint: ttl,
        });
    };
    hasher.update(b"\x1etools");
    for t in &b.tools {
        let (len, ttl) = feed_block(&mut hasher, t)?;
        push(&mut hasher, len, ttl);
    }
    hasher.update(b"\x1esystem");
    match &b.system {
        Some(Blocks::Text(s)) => {
            frame(&mut hasher, s.as_bytes());
            push(&mut hasher, s.len(), None);
        }
        Some(Blocks::List(list)) => {
            for block in list {
                let (len, ttl) = feed_block(&mut hasher, block)?;
                push(&mut hasher, len, ttl);
            }
        }
        None => {}
    }
    // Thinking and tool_choice invalidate the message cache only.
    hasher.update(b"\x1emessages");
    frame(
        &mut hasher,
        b.thinking.as_ref().map_or("", |r| r.get()).as_bytes(),
    );
    frame(
        &mut hasher,
        b.tool_choice.as_ref().map_or("", |r| r.get()).as_bytes(),
    );
    for m in &b.messages {
        hasher.update(b"\x1erole");
        frame(&mut hasher, m.role.as_bytes());
        match &m.content {
            Blocks::Text(s) => {
                frame(&mut hasher, s.as_bytes());
                push(&mut hasher, s.len(), None);
            }
            Blocks::List(list) => {
                for block in list {
                    let (len, ttl) = feed_block(&mut hasher, block)?;
                    push(&mut hasher, len, ttl);
                }
            }
        }
    }
    let total = positions.last().map_or(0, |p| p.tokens);
    Ok(Analysis {
        model: b.model,
        positions,
        total,
    })
}

/// OpenAI caches in 128-token steps: one position every 512 bytes of the prompt.
const OPENAI_STEP_BYTES: usize = 512;

fn openai_positions(body: &[u8]) -> Result<Analysis> {
    #[derive(Deserialize)]
    struct Body {
        model: String,
        tools: Option<Box<RawValue>>,
        messages: Vec<Box<RawValue>>,
    }
    let b: Body = serde_json::from_slice(body).map_err(decode_error)?;
    let mut prompt = Vec::with_capacity(body.len());
    if let Some(t) = &b.tools {
        prompt.extend_from_slice(t.get().as_bytes());
    }
    for m in &b.messages {
        prompt.push(0x1e);
        prompt.extend_from_slice(m.get().as_bytes());
    }
    let mut hasher = Sha256::new_with_prefix(b"openai\x1f");
    frame(&mut hasher, b.model.as_bytes());
    hasher.update(b"\x1e");
    let positions = prompt
        .chunks(OPENAI_STEP_BYTES)
        .filter(|c| c.len() == OPENAI_STEP_BYTES)
        .scan(0usize, |done, chunk| {
            hasher.update(chunk);
            *done += chunk.len();
            Some(Position {
                key: Digest::from(<[u8; 32]>::from(hasher.clone().finalize())),
                tokens: estimate_tokens(*done),
                breakpoint: None,
            })
        })
        .collect::<Vec<_>>();
    Ok(Analysis {
        model: b.model,
        positions,
        total: estimate_tokens(prompt.len()),
    })
}

impl<B> fmt::Debug for PromptCacheSimulator<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PromptCacheSimulator")
            .field("provider", &self.config.provider)
            .field("clock", &self.clock)
            .finish()
    }
}

#[async_trait]
impl<B: Backend> Backend for PromptCacheSimulator<B> {
    async fn send(&self, request: &Request) -> Result<Response> {
        let body = self.codec.encode(request, false).to_bytes();
        let report = self.begin(request, &body)?;
        let mut pending = self.pending(report.request);
        let mut response = self.inner.send(request).await?;
        pending.settle(true);
        report.partial_usage().apply_to(&mut response.usage);
        Ok(response)
    }

    async fn stream(&self, request: &Request) -> Result<EventStream> {
        let body = self.codec.encode(request, true).to_bytes();
        let report = self.begin(request, &body)?;
        // Dropped (and so aborted) if `inner.stream` fails, or if the stream ends or is
        // dropped before its first event.
        let mut pending = self.pending(report.request);
        let inner = self.inner.stream(request).await?;
        let usage = report.partial_usage();
        Ok(Box::pin(inner.map(move |item| {
            let mut event = item?;
            pending.settle(true);
            match &mut event {
                StreamEvent::MessageStart { usage: u, .. } => {
                    *u = PartialUsage {
                        output_tokens: u.output_tokens,
                        ..usage
                    };
                }
                StreamEvent::MessageDelta { usage: u, .. } => {
                    // Keep output counts; cumulative input fields follow the simulation.
                    if u.input_tokens.is_some() {
                        u.input_tokens = usage.input_tokens;
                    }
                    if u.cache_read_tokens.is_some() {
                        u.cache_read_tokens = usage.cache_read_tokens;
                    }
                    if u.cache_write_tokens.is_some() {
                        u.cache_write_tokens = usage.cache_write_tokens;
                        u.cache_write_1h_tokens = usage.cache_write_1h_tokens;
                    }
                }
                _ => {}
            }
            Ok(event)
        })))
    }

    fn answers_whole(&self) -> bool {
        self.inner.answers_whole()
    }
}

//! A picture of a run: from a directory of transcripts, one self-contained HTML file (no
//! network, no script it fetches) with one lane per agent in tree order, each model request a
//! bar coloured by the share of its input read from the prompt cache, and tool calls, spawns,
//! notifications, messages and stops as marks; hovering any of them gives its details.
//!
//! Transcripts record when each request was sent and answered and when each message was
//! written (see `docs/transcripts.md`); the timeline is read from those alone, so it can be
//! drawn for any run that kept its transcripts — while it runs, after it ended, or after a
//! crash (a transcript that cannot be read is listed at the top, not fatal).
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let dir = tempfile::tempdir()?;
//! let timeline = forkhive_spawn::timeline::Timeline::load(dir.path()).await?;
//! assert!(timeline.lanes.is_empty());
//! let html = timeline.to_html("an empty run");
//! assert!(html.starts_with("<!DOCTYPE html>"));
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use forkhive_core::notification::find_notifications;
use forkhive_core::{ContentBlock, Role, Usage};

use crate::error::{Error, Result};
use crate::transcript::{self, Transcript};

/// A run's timeline: its agents' lanes, in tree order.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Timeline {
    /// One per agent: each root, then its children depth first, siblings by start.
    pub lanes: Vec<Lane>,
    /// The earliest time any lane shows (ms since the Unix epoch).
    pub start_ms: u64,
    /// The latest.
    pub end_ms: u64,
    /// Transcripts that could not be read, and why.
    pub skipped: Vec<(PathBuf, String)>,
}

/// One agent's lane.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Lane {
    /// Its task id.
    pub id: String,
    /// Its parent's task id.
    pub parent: Option<String>,
    /// How deep it is among the lanes (a root is 0).
    pub depth: usize,
    /// Its agent type (or kind).
    pub label: String,
    /// The name its parent gave it (an `Agent` call's `name`: a named worker, a teammate),
    /// read from the parent's transcript; `None` when it has none or its parent's transcript
    /// is not among the lanes.
    pub name: Option<String>,
    /// When its transcript was created.
    pub start_ms: u64,
    /// Its model requests, in order.
    pub requests: Vec<Bar>,
    /// What happened in it, in order.
    pub marks: Vec<Mark>,
    /// Its usage over all requests.
    pub usage: Usage,
}

/// One model request.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Bar {
    /// The turn.
    pub turn: u32,
    /// Sent.
    pub start_ms: u64,
    /// Answered.
    pub end_ms: u64,
    /// Its tokens.
    pub usage: Usage,
}

impl Bar {
    /// The share of its input read from the cache, 0 to 1.
    pub fn cache_read_share(&self) -> f64 {
        self.usage.cache_hit_ratio()
    }
}

/// Something that happened in a lane.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Mark {
    /// When.
    pub at_ms: u64,
    /// What.
    pub kind: MarkKind,
    /// Its details (a tool's name and input, a notification's summary, …).
    pub detail: String,
}

/// What a [`Mark`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MarkKind {
    /// A tool call.
    ToolCall,
    /// An `Agent` call: a child was started.
    Spawn,
    /// A `<task-notification>` arrived.
    Notification,
    /// A `<message>` from another agent arrived.
    Message,
    /// A run ended.
    Stop,
}

impl MarkKind {
    fn name(self) -> &'static str {
        match self {
            MarkKind::ToolCall => "tool call",
            MarkKind::Spawn => "spawn",
            MarkKind::Notification => "notification",
            MarkKind::Message => "message",
            MarkKind::Stop => "stop",
        }
    }
}

/// The longest detail kept per mark.
const DETAIL: usize = 300;

fn clip(s: &str) -> String {
    match s.char_indices().nth(DETAIL) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

impl Timeline {
    /// Reads every transcript (`*.jsonl`) directly in `dir`.
    ///
    /// Errors: only a directory that cannot be listed ([`Error::Io`]); a transcript that
    /// cannot be read is put in [`skipped`](Self::skipped).
    pub async fn load(dir: &Path) -> Result<Self> {
        let io = |source| Error::Io {
            action: "listing transcripts",
            path: dir.to_path_buf(),
            source,
        };
        let mut entries = tokio::fs::read_dir(dir).await.map_err(io)?;
        let mut paths = Vec::new();
        let mut skipped = Vec::new();
        while let Some(e) = entries.next_entry().await.map_err(io)? {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "jsonl") {
                // The caller chose the directory, not a file a link there points at.
                if e.file_type().await.is_ok_and(|t| t.is_symlink()) {
                    skipped.push((
                        p,
                        "a symlink: a timeline reads only the directory's own files".to_owned(),
                    ));
                } else {
                    paths.push(p);
                }
            }
        }
        paths.sort();
        let mut read = Vec::new();
        for p in paths {
            match transcript::read(&p).await {
                Ok(t) => read.push(t),
                Err(e) => skipped.push((p, forkhive_core::error::chain(&e))),
            }
        }
        skipped.sort();
        Ok(Self::from_transcripts(&read, skipped))
    }

    /// The timeline of transcripts already read.
    pub fn from_transcripts(transcripts: &[Transcript], skipped: Vec<(PathBuf, String)>) -> Self {
        let mut lanes: Vec<Lane> = transcripts.iter().map(lane).collect();
        let names: HashMap<String, String> = transcripts.iter().flat_map(names_given).collect();
        for l in &mut lanes {
            l.name = names.get(&l.id).cloned();
        }
        // Tree order: roots first (a parent that is not among the lanes counts as none),
        // children after their parent, siblings by start, then id (the same bytes every time).
        lanes.sort_by(|a, b| (a.start_ms, &a.id).cmp(&(b.start_ms, &b.id)));
        let ids: HashMap<String, usize> = lanes
            .iter()
            .enumerate()
            .map(|(i, l)| (l.id.clone(), i))
            .collect();
        let mut children: HashMap<Option<usize>, Vec<usize>> = HashMap::new();
        for (i, l) in lanes.iter().enumerate() {
            let parent = l
                .parent
                .as_ref()
                .and_then(|p| ids.get(p).copied())
                .filter(|p| *p != i);
            children.entry(parent).or_default().push(i);
        }
        let mut order = Vec::with_capacity(lanes.len());
        let mut stack: Vec<(usize, usize)> = children
            .get(&None)
            .map(|r| r.iter().rev().map(|i| (*i, 0)).collect())
            .unwrap_or_default();
        let mut seen = vec![false; lanes.len()];
        while let Some((i, depth)) = stack.pop() {
            if std::mem::replace(&mut seen[i], true) {
                continue;
            }
            order.push((i, depth));
            if let Some(kids) = children.get(&Some(i)) {
                stack.extend(kids.iter().rev().map(|k| (*k, depth + 1)));
            }
        }
        // A cycle of parents (a damaged set of files) still shows every lane.
        order.extend((0..lanes.len()).filter(|i| !seen[*i]).map(|i| (i, 0)));
        let mut slots: Vec<Option<Lane>> = lanes.into_iter().map(Some).collect();
        let lanes: Vec<Lane> = order
            .into_iter()
            .filter_map(|(i, depth)| {
                let mut l = slots[i].take()?;
                l.depth = depth;
                Some(l)
            })
            .collect();
        let times = lanes.iter().flat_map(|l| {
            std::iter::once(l.start_ms)
                .chain(l.requests.iter().flat_map(|b| [b.start_ms, b.end_ms]))
                .chain(l.marks.iter().map(|m| m.at_ms))
        });
        let (start_ms, end_ms) = times.fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)));
        Self {
            start_ms: if lanes.is_empty() { 0 } else { start_ms },
            end_ms,
            lanes,
            skipped,
        }
    }

    /// The timeline as one self-contained HTML page titled `title`.
    pub fn to_html(&self, title: &str) -> String {
        render(self, title)
    }
}

/// One transcript's lane.
fn lane(t: &Transcript) -> Lane {
    let h = &t.header;
    let label = h
        .definition
        .clone()
        .unwrap_or_else(|| format!("{:?}", h.kind).to_lowercase());
    let mut marks = Vec::new();
    let own = t.messages.get(t.inherited..).unwrap_or_default();
    for (m, at) in own.iter().zip(&t.message_at) {
        let Some(at) = *at else { continue };
        match m.role {
            Role::Assistant => {
                for (_, name, input) in m.tool_uses() {
                    let kind = if name == "Agent" {
                        MarkKind::Spawn
                    } else {
                        MarkKind::ToolCall
                    };
                    marks.push(Mark {
                        at_ms: at,
                        kind,
                        detail: clip(&format!("{name} {input}")),
                    });
                }
            }
            Role::User => {
                for n in find_notifications(m).unwrap_or_default() {
                    marks.push(Mark {
                        at_ms: at,
                        kind: MarkKind::Notification,
                        detail: clip(&format!(
                            "{} {}: {}",
                            n.task_id,
                            n.status.as_str(),
                            n.summary
                        )),
                    });
                }
                for b in &m.content {
                    // A message from another agent (`SendMessage`), or a letter of a team (a
                    // teammate's, the lead's, an idle notice, a shutdown answer).
                    if let ContentBlock::Text { text } = b
                        && (text.starts_with("<message from=")
                            || text.starts_with("<teammate-message"))
                    {
                        marks.push(Mark {
                            at_ms: at,
                            kind: MarkKind::Message,
                            detail: clip(text),
                        });
                    }
                }
            }
        }
    }
    for s in &t.stops {
        if let Some(at) = s.at {
            marks.push(Mark {
                at_ms: at,
                kind: MarkKind::Stop,
                detail: match &s.error {
                    Some(e) => clip(&format!("{}: {e}", s.stop)),
                    None => s.stop.to_string(),
                },
            });
        }
    }
    marks.sort_by_key(|m| m.at_ms);
    let requests: Vec<Bar> = t
        .turns
        .iter()
        .filter_map(|u| {
            Some(Bar {
                turn: u.turn,
                start_ms: u.sent_at?,
                end_ms: u.at?,
                usage: u.usage,
            })
        })
        .collect();
    let usage = t.turns.iter().fold(Usage::default(), |mut a, u| {
        a += u.usage;
        a
    });
    let first = requests.first().map(|b| b.start_ms);
    Lane {
        id: h.agent_id.clone(),
        parent: h.parent_id.clone(),
        depth: 0,
        label,
        name: None,
        start_ms: h.at.or(first).unwrap_or(0),
        requests,
        marks,
        usage,
    }
}

/// The names `t`'s agent gave the children it started, by their task ids: each `Agent` call
/// with a `name` whose result says the task it started (`… as task <id>`).
fn names_given(t: &Transcript) -> Vec<(String, String)> {
    let mut asked: HashMap<&str, String> = HashMap::new();
    let mut out = Vec::new();
    // Its own messages: a fork child's inherited ones are its parent's calls.
    for m in t.messages.get(t.inherited..).unwrap_or_default() {
        for b in &m.content {
            match b {
                ContentBlock::ToolUse { id, name, input } if name.as_str() == "Agent" => {
                    let given = input.to_value().ok().and_then(|v: serde_json::Value| {
                        v.get("name")?.as_str().map(str::to_owned)
                    });
                    if let Some(given) = given {
                        asked.insert(id.as_str(), given);
                    }
                }
                ContentBlock::ToolResult {
                    tool_use_id,
                    content,
                    is_error: false,
                } => {
                    let Some(given) = asked.get(tool_use_id.as_str()) else {
                        continue;
                    };
                    // A background start's words (in this process or on a pool), else a
                    // teammate's (`… as task <id>.`); the last occurrence, as the model's
                    // description comes before it.
                    let text = content.text();
                    let task = crate::base::launched::background_task(&text).or_else(|| {
                        let (_, rest) = text.rsplit_once(" as task ")?;
                        rest.get(..forkhive_core::TaskId::LEN)?.parse().ok()
                    });
                    if let Some(task) = task {
                        out.push((task.to_string(), given.clone()));
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// `&`, `<`, `>`, `"` and `'` escaped for HTML text and attributes.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Red (nothing from the cache) through amber to green (all of it).
fn cache_colour(share: f64) -> String {
    let hue = (share.clamp(0.0, 1.0) * 120.0).round();
    format!("hsl({hue},70%,45%)")
}

const LABEL_W: f64 = 260.0;
const PLOT_W: f64 = 900.0;
const LANE_H: f64 = 30.0;
const TOP: f64 = 30.0;

fn render(t: &Timeline, title: &str) -> String {
    let span = (t.end_ms.saturating_sub(t.start_ms)).max(1) as f64;
    let x = |ms: u64| LABEL_W + PLOT_W * (ms.saturating_sub(t.start_ms) as f64) / span;
    let height = TOP + LANE_H * t.lanes.len() as f64 + 10.0;
    let width = LABEL_W + PLOT_W + 40.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">"#
    );
    // The time axis: five ticks.
    for i in 0..=4u64 {
        // In u128: hostile timestamps near u64::MAX must not overflow.
        let ms = u64::try_from(
            u128::from(t.start_ms)
                + u128::from(t.end_ms.saturating_sub(t.start_ms)) * u128::from(i) / 4,
        )
        .unwrap_or(t.end_ms);
        let _ = write!(
            svg,
            r##"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{height}" class="tick"/><text x="{0:.1}" y="{2}" class="axis" text-anchor="middle">{3:.2} s</text>"##,
            x(ms),
            TOP - 8.0,
            TOP - 12.0,
            ms.saturating_sub(t.start_ms) as f64 / 1000.0
        );
    }
    let row: HashMap<&str, usize> = t
        .lanes
        .iter()
        .enumerate()
        .map(|(i, l)| (l.id.as_str(), i))
        .collect();
    for (i, l) in t.lanes.iter().enumerate() {
        let y = TOP + LANE_H * i as f64;
        let mid = y + LANE_H / 2.0;
        let _ = write!(
            svg,
            r#"<g class="lane" data-agent="{}"><rect x="0" y="{y}" width="{width}" height="{LANE_H}" class="band{}"/>"#,
            esc(&l.id),
            if i % 2 == 0 { " even" } else { "" }
        );
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" class="label">{}<title>{}&#10;{} request(s), {} input tokens ({:.0}% from cache), {} output</title></text>"#,
            8.0 + 14.0 * l.depth as f64,
            mid + 4.0,
            esc(&match &l.name {
                Some(name) => format!("{} {name} {}", l.label, l.id),
                None => format!("{} {}", l.label, l.id),
            }),
            esc(&l.id),
            l.requests.len(),
            l.usage.total_input_tokens(),
            100.0 * l.usage.cache_hit_ratio(),
            l.usage.output_tokens
        );
        // The child's lane starts at its parent's spawn: a connector from the parent's row.
        if let Some(p) = l.parent.as_deref().and_then(|p| row.get(p)) {
            let py = TOP + LANE_H * *p as f64 + LANE_H / 2.0;
            let _ = write!(
                svg,
                r#"<line x1="{0:.1}" y1="{py:.1}" x2="{0:.1}" y2="{mid:.1}" class="link"/>"#,
                x(l.start_ms)
            );
        }
        for b in &l.requests {
            let (x0, x1) = (x(b.start_ms), x(b.end_ms));
            let _ = write!(
                svg,
                r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}" class="req"><title>turn {}: {} ms&#10;{} input tokens, {:.0}% read from cache ({} read, {} written, {} uncached)&#10;{} output tokens</title></rect>"#,
                y + 7.0,
                (x1 - x0).max(2.0),
                LANE_H - 14.0,
                cache_colour(b.cache_read_share()),
                b.turn,
                b.end_ms.saturating_sub(b.start_ms),
                b.usage.total_input_tokens(),
                100.0 * b.cache_read_share(),
                b.usage.cache_read_tokens,
                b.usage.cache_write_tokens,
                b.usage.input_tokens,
                b.usage.output_tokens
            );
        }
        for m in &l.marks {
            let mx = x(m.at_ms);
            let (tag, attrs) = match m.kind {
                MarkKind::ToolCall => ("circle", format!(r#"cx="{mx:.1}" cy="{mid:.1}" r="3.5""#)),
                MarkKind::Spawn => (
                    "path",
                    format!(r#"d="M{mx:.1} {:.1} l5 7 h-10 z""#, mid - 4.0),
                ),
                MarkKind::Notification => (
                    "rect",
                    format!(
                        r#"x="{:.1}" y="{:.1}" width="8" height="8""#,
                        mx - 4.0,
                        mid - 4.0
                    ),
                ),
                MarkKind::Message => (
                    "path",
                    format!(r#"d="M{mx:.1} {:.1} l5 5 l-5 5 l-5 -5 z""#, mid - 5.0),
                ),
                MarkKind::Stop => (
                    "rect",
                    format!(
                        r#"x="{:.1}" y="{:.1}" width="3" height="{:.1}""#,
                        mx - 1.5,
                        y + 4.0,
                        LANE_H - 8.0
                    ),
                ),
            };
            let kind = m.kind.name();
            let _ = write!(
                svg,
                r#"<{tag} {attrs} class="mark {}"><title>{kind}: {}</title></{tag}>"#,
                kind.replace(' ', "-"),
                esc(&m.detail)
            );
        }
        svg.push_str("</g>");
    }
    svg.push_str("</svg>");
    let mut skipped = String::new();
    for (p, why) in &t.skipped {
        let _ = write!(
            skipped,
            "<li>{}: {}</li>",
            esc(&p.display().to_string()),
            esc(why)
        );
    }
    if !skipped.is_empty() {
        skipped = format!("<p>Transcripts that could not be read:</p><ul>{skipped}</ul>");
    }
    let total = t.lanes.iter().fold(Usage::default(), |mut a, l| {
        a += l.usage;
        a
    });
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 13px system-ui, sans-serif; margin: 16px; color: #222; }}
.band {{ fill: #fff; }} .band.even {{ fill: #f4f5f7; }}
.label {{ font: 12px ui-monospace, monospace; fill: #222; }}
.axis {{ font-size: 11px; fill: #666; }} .tick {{ stroke: #ddd; }}
.link {{ stroke: #999; stroke-dasharray: 2 2; }}
.req {{ stroke: #333; stroke-width: 0.5; }}
.mark.tool-call {{ fill: #1f6feb; }} .mark.spawn {{ fill: #8250df; }}
.mark.notification {{ fill: #bf8700; }} .mark.message {{ fill: #cf222e; }}
.mark.stop {{ fill: #222; }}
.legend span {{ margin-right: 14px; }}
</style></head>
<body>
<h1>{title}</h1>
<p>{lanes} agent(s) over {secs:.2} s; {input} input tokens, {read:.0}% read from the prompt cache; {output} output tokens. Hover a bar or mark for its details.</p>
<p class="legend"><span>bars: model requests, coloured by the share of input read from the cache (red 0%, green 100%)</span><span style="color:#1f6feb">● tool call</span><span style="color:#8250df">▲ spawn</span><span style="color:#bf8700">■ notification</span><span style="color:#cf222e">◆ message</span><span>▮ run ended</span></p>
{skipped}
{svg}
<script>
// For a headless check: how many lanes the browser laid out.
window.addEventListener("load", function () {{
  var n = 0;
  document.querySelectorAll("g.lane").forEach(function (g) {{
    var r = g.getBoundingClientRect();
    if (r.width > 0 && r.height > 0) n++;
  }});
  document.body.setAttribute("data-lanes-rendered", String(n));
}});
</script>
</body></html>
"#,
        title = esc(title),
        lanes = t.lanes.len(),
        secs = (t.end_ms.saturating_sub(t.start_ms)) as f64 / 1000.0,
        input = total.total_input_tokens(),
        read = 100.0 * total.cache_hit_ratio(),
        output = total.output_tokens,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Timestamps a hostile transcript could carry do not overflow the drawing.
    #[test]
    fn extreme_times_render_without_overflow() {
        let lane = Lane {
            id: "a1".into(),
            parent: None,
            depth: 0,
            label: "main".into(),
            name: None,
            start_ms: 0,
            requests: vec![Bar {
                turn: 1,
                start_ms: u64::MAX - 1,
                end_ms: u64::MAX,
                usage: Usage::default(),
            }],
            marks: vec![Mark {
                at_ms: u64::MAX,
                kind: MarkKind::Stop,
                detail: "x".into(),
            }],
            usage: Usage::default(),
        };
        let t = Timeline {
            lanes: vec![lane],
            start_ms: 0,
            end_ms: u64::MAX,
            skipped: Vec::new(),
        };
        assert!(t.to_html("t").contains(r#"<g class="lane""#));
    }
}

//! The one suite every [`TaskRegistry`] passes, unchanged: records kept as given, an id taken
//! once, the lifecycle's allowed moves and no move out of an end — exactly one of many racing
//! callers ends a task, and exactly one revives it — usage rolled up through every ancestor
//! (registered or not), children in creation order, stalls, and unknown ids.
//!
//! `open` makes a new handle on the same store each time it is called — what another host
//! would open. Call [`run`] from a test with a fresh store:
//!
//! ```
//! use std::sync::Arc;
//! use forkhive_spawn::task::{MemoryTaskRegistry, TaskRegistry, conformance};
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! let store = Arc::new(MemoryTaskRegistry::new());
//! conformance::run(|| Arc::clone(&store) as Arc<dyn TaskRegistry>).await?;
//! # Ok::<(), conformance::ConformanceError>(()) }).unwrap();
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use forkhive_core::{TaskId, TaskKind, Usage};

use super::{TaskRecord, TaskRegistry, TaskState};

pub use crate::base::conformance::ConformanceError;
use crate::base::conformance::Suite;

/// This suite, named in its errors.
const S: Suite = Suite("task registry");

/// Fresh ids for one run: stores shared between runs (a Redis) never see the same id twice.
struct Ids(u64);

impl Ids {
    fn new() -> Self {
        let mut seed = [0u8; 8];
        // Without entropy the time still separates runs.
        if getrandom::fill(&mut seed).is_err() {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            seed = (nanos as u64).to_le_bytes();
        }
        Self(u64::from_le_bytes(seed) & 0x00ff_ffff_ffff_0000)
    }

    fn next(&mut self) -> TaskId {
        self.0 += 1;
        TaskId::from_entropy(TaskKind::Agent, self.0)
    }
}

fn tokens(output: u64, input: u64) -> Usage {
    Usage {
        output_tokens: output,
        input_tokens: input,
        ..Usage::default()
    }
}

/// Runs every check (each on tasks of its own). Needs a multi-threaded runtime for the racing
/// callers to race (it passes on one thread too).
pub async fn run<F>(open: F) -> Result<(), ConformanceError>
where
    F: Fn() -> Arc<dyn TaskRegistry>,
{
    let mut ids = Ids::new();
    records_are_kept(open(), &mut ids).await?;
    lifecycle_moves(open(), &mut ids).await?;
    one_end_among_racers(&open, &mut ids).await?;
    one_revival_among_racers(&open, &mut ids).await?;
    usage_rolls_up(open(), &mut ids).await?;
    children_in_order(open(), &mut ids).await?;
    unknown_ids(open(), &mut ids).await?;
    Ok(())
}

async fn records_are_kept(r: Arc<dyn TaskRegistry>, ids: &mut Ids) -> Result<(), ConformanceError> {
    let (id, parent) = (ids.next(), ids.next());
    let mut record = TaskRecord::new(id, parent, "audit the \"auth\" module — ünïcode");
    record.agent_type = "Explore".into();
    record.transcript = Some(PathBuf::from("/t/agent-1.jsonl"));
    record.output = Some(PathBuf::from("/t/tasks/1.output"));
    S.op(r.create(record.clone()).await, "create")?;
    let got = r.get(&id).await;
    S.check(got.as_ref() == Some(&record), || {
        format!("get returned {got:?} for the record created as {record:?}")
    })?;
    S.check(
        r.create(TaskRecord::new(id, parent, "again"))
            .await
            .is_err(),
        || "a second create with a taken id succeeded".into(),
    )?;
    S.op(r.mark_stalled(&id).await, "mark_stalled")?;
    let stalled = r.get(&id).await.is_some_and(|t| t.stalled);
    S.check(stalled, || "mark_stalled did not mark the task".into())
}

async fn lifecycle_moves(r: Arc<dyn TaskRegistry>, ids: &mut Ids) -> Result<(), ConformanceError> {
    let (id, parent) = (ids.next(), ids.next());
    S.op(r.create(TaskRecord::new(id, parent, "t")).await, "create")?;
    let from = S.op(
        r.transition(&id, TaskState::Running).await,
        "created → running",
    )?;
    S.check(from == TaskState::Created, || {
        format!("created → running returned {from}")
    })?;
    S.check(r.transition(&id, TaskState::Created).await.is_err(), || {
        "running → created succeeded".into()
    })?;
    let from = S.op(
        r.transition(&id, TaskState::Completed).await,
        "running → completed",
    )?;
    S.check(from == TaskState::Running, || {
        format!("running → completed returned {from}")
    })?;
    for to in [
        TaskState::Running,
        TaskState::Failed,
        TaskState::Killed,
        TaskState::Completed,
    ] {
        S.check(r.transition(&id, to).await.is_err(), || {
            format!("completed → {to} succeeded: an end must be final")
        })?;
    }
    let state = r.get(&id).await.map(|t| t.state);
    S.check(state == Some(TaskState::Completed), || {
        format!("the task is {state:?} after refused moves")
    })?;
    // Created may end without running (a spawn that failed to start).
    let other = ids.next();
    S.op(
        r.create(TaskRecord::new(other, parent, "t")).await,
        "create",
    )?;
    let from = S.op(
        r.transition(&other, TaskState::Killed).await,
        "created → killed",
    )?;
    S.check(from == TaskState::Created, || {
        format!("created → killed returned {from}")
    })?;
    // Reopen: only an ended task, back to running and no longer stalled.
    let live = ids.next();
    S.op(r.create(TaskRecord::new(live, parent, "t")).await, "create")?;
    S.check(r.reopen(&live).await.is_err(), || {
        "reopen of a created task succeeded".into()
    })?;
    S.op(r.mark_stalled(&id).await, "mark_stalled")?;
    let from = S.op(r.reopen(&id).await, "reopen")?;
    S.check(from == TaskState::Completed, || {
        format!("reopen returned {from}")
    })?;
    let t = r.get(&id).await;
    S.check(
        t.as_ref()
            .is_some_and(|t| t.state == TaskState::Running && !t.stalled),
        || format!("after reopen the task is {t:?}"),
    )?;
    let from = S.op(
        r.transition(&id, TaskState::Failed).await,
        "reopened → failed",
    )?;
    S.check(from == TaskState::Running, || {
        format!("reopened → failed returned {from}")
    })
}

async fn one_end_among_racers<F>(open: &F, ids: &mut Ids) -> Result<(), ConformanceError>
where
    F: Fn() -> Arc<dyn TaskRegistry>,
{
    for round in 0..5 {
        let (id, parent) = (ids.next(), ids.next());
        let r = open();
        S.op(r.create(TaskRecord::new(id, parent, "t")).await, "create")?;
        S.op(r.transition(&id, TaskState::Running).await, "start")?;
        let ends = [TaskState::Completed, TaskState::Failed, TaskState::Killed];
        let racers: Vec<_> = (0..16)
            .map(|i| {
                let r = open();
                let to = ends[i % 3];
                tokio::spawn(async move { r.transition(&id, to).await.is_ok() })
            })
            .collect();
        let mut won = 0;
        for racer in racers {
            if racer
                .await
                .map_err(|e| S.fail(format!("a racer panicked: {e}")))?
            {
                won += 1;
            }
        }
        S.check(won == 1, || {
            format!("round {round}: {won} of 16 racing ends succeeded; exactly one must")
        })?;
    }
    Ok(())
}

async fn one_revival_among_racers<F>(open: &F, ids: &mut Ids) -> Result<(), ConformanceError>
where
    F: Fn() -> Arc<dyn TaskRegistry>,
{
    let (id, parent) = (ids.next(), ids.next());
    let r = open();
    S.op(r.create(TaskRecord::new(id, parent, "t")).await, "create")?;
    S.op(r.transition(&id, TaskState::Completed).await, "end")?;
    let racers: Vec<_> = (0..16)
        .map(|_| {
            let r = open();
            tokio::spawn(async move { r.reopen(&id).await.is_ok() })
        })
        .collect();
    let mut won = 0;
    for racer in racers {
        if racer
            .await
            .map_err(|e| S.fail(format!("a racer panicked: {e}")))?
        {
            won += 1;
        }
    }
    S.check(won == 1, || {
        format!("{won} of 16 racing reopens succeeded; exactly one may revive a task")
    })
}

async fn usage_rolls_up(r: Arc<dyn TaskRegistry>, ids: &mut Ids) -> Result<(), ConformanceError> {
    // root (not registered) → parent → child → grandchild.
    let (root, parent, child, grandchild) = (ids.next(), ids.next(), ids.next(), ids.next());
    S.op(r.create(TaskRecord::new(parent, root, "p")).await, "create")?;
    S.op(
        r.create(TaskRecord::new(child, parent, "c")).await,
        "create",
    )?;
    S.op(
        r.create(TaskRecord::new(grandchild, child, "g")).await,
        "create",
    )?;
    S.op(r.roll_up(&grandchild, tokens(5, 1)).await, "roll_up")?;
    S.op(r.roll_up(&child, tokens(3, 0)).await, "roll_up")?;
    S.op(r.roll_up(&parent, tokens(2, 0)).await, "roll_up")?;
    let usage =
        |t: Option<TaskRecord>| t.map(|t| (t.usage.output_tokens, t.tree_usage.output_tokens));
    let g = usage(r.get(&grandchild).await);
    S.check(g == Some((5, 5)), || {
        format!("grandchild (own, tree) = {g:?}, want (5, 5)")
    })?;
    let c = usage(r.get(&child).await);
    S.check(c == Some((3, 8)), || {
        format!("child (own, tree) = {c:?}, want (3, 8)")
    })?;
    let p = usage(r.get(&parent).await);
    S.check(p == Some((2, 10)), || {
        format!("parent (own, tree) = {p:?}, want (2, 10)")
    })?;
    let below = r.descendants_usage(&root).await;
    S.check(below.output_tokens == 10 && below.input_tokens == 1, || {
        format!("the unregistered root's descendants' usage is {below:?}, want 10 out, 1 in")
    })?;
    let below = r.descendants_usage(&parent).await;
    S.check(below.output_tokens == 8, || {
        format!("the parent's descendants' usage is {below:?}, want 8")
    })?;
    // A resumed task's next run adds to what it had.
    S.op(r.transition(&child, TaskState::Completed).await, "end")?;
    S.op(r.reopen(&child).await, "reopen")?;
    S.op(r.roll_up(&child, tokens(4, 0)).await, "roll_up")?;
    let c = usage(r.get(&child).await);
    S.check(c == Some((7, 12)), || {
        format!("after a second run the child is {c:?}, want (7, 12)")
    })?;
    let every = Usage {
        input_tokens: 1,
        output_tokens: 2,
        cache_write_tokens: 3,
        cache_write_1h_tokens: 4,
        cache_read_tokens: 5,
        tool_uses: 6,
        duration_ms: 7,
    };
    let solo = ids.next();
    S.op(r.create(TaskRecord::new(solo, root, "s")).await, "create")?;
    S.op(r.roll_up(&solo, every).await, "roll_up")?;
    let got = r.get(&solo).await.map(|t| t.usage);
    S.check(got == Some(every), || {
        format!("every usage field kept: {got:?}, want {every:?}")
    })
}

async fn children_in_order(
    r: Arc<dyn TaskRegistry>,
    ids: &mut Ids,
) -> Result<(), ConformanceError> {
    let parent = ids.next();
    let mut made = Vec::new();
    for i in 0..5 {
        let id = ids.next();
        S.op(
            r.create(TaskRecord::new(id, parent, format!("child {i}")))
                .await,
            "create",
        )?;
        made.push(id);
    }
    let got: Vec<TaskId> = r.children(&parent).await.iter().map(|t| t.id).collect();
    S.check(got == made, || {
        format!("children {got:?}, want creation order {made:?}")
    })?;
    let none = r.children(&ids.next()).await;
    S.check(none.is_empty(), || {
        format!("an unknown parent has children {none:?}")
    })
}

async fn unknown_ids(r: Arc<dyn TaskRegistry>, ids: &mut Ids) -> Result<(), ConformanceError> {
    let id = ids.next();
    S.check(r.get(&id).await.is_none(), || {
        "get of an unknown id found a task".into()
    })?;
    S.check(r.transition(&id, TaskState::Running).await.is_err(), || {
        "transition of an unknown id succeeded".into()
    })?;
    S.check(r.reopen(&id).await.is_err(), || {
        "reopen of an unknown id succeeded".into()
    })?;
    S.check(r.roll_up(&id, tokens(1, 0)).await.is_err(), || {
        "roll_up of an unknown id succeeded".into()
    })?;
    S.check(r.mark_stalled(&id).await.is_err(), || {
        "mark_stalled of an unknown id succeeded".into()
    })?;
    let below = r.descendants_usage(&id).await;
    S.check(below == Usage::default(), || {
        format!("an unknown id's descendants' usage is {below:?}")
    })
}

//! The children an agent started, as its runs report them ([`AgentRun::children`]).
//!
//! [`AgentRun::children`]: crate::runtime::AgentRun::children

use std::sync::{Arc, Mutex};

use forkhive_core::{PriceTable, TaskId, TaskStatus, Usage};

use super::ids::IdMap;

/// One child an agent started: who it is, how it ran, what it cost.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ChildReport {
    /// Its task id.
    pub id: TaskId,
    /// Its agent type (`fork` for a fork).
    pub agent_type: String,
    /// The model it runs on.
    pub model: String,
    /// The `description` it was started with.
    pub description: String,
    /// Whether it ran in the background.
    pub background: bool,
    /// How it ended; `None` while it runs (in a run that returned without waiting for its
    /// background children: a later run reports its end, see
    /// [`AgentRun::children`](crate::runtime::AgentRun::children)).
    pub status: Option<TaskStatus>,
    /// Its own usage, cache figures included (zero while it runs); its descendants' is in
    /// the task registry's `tree_usage`.
    pub usage: Usage,
}

impl ChildReport {
    /// The share of its input read from the prompt cache, in `0.0..=1.0`.
    pub fn cache_hit_ratio(&self) -> f64 {
        self.usage.cache_hit_ratio()
    }

    /// What its usage cost at its model's prices in `table` (`None`: the model is not
    /// listed).
    pub fn cost(&self, table: &PriceTable) -> Option<f64> {
        table.get(&self.model).map(|p| self.usage.cost(&p))
    }
}

impl std::fmt::Display for ChildReport {
    /// `counter a1b2c3d4e completed: 175 tokens, 0% from cache` (`running` while it runs).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.status.map_or("running", TaskStatus::as_str);
        write!(
            f,
            "{} {} {status}: {} tokens, {:.0}% from cache",
            self.agent_type,
            self.id,
            self.usage.total_tokens(),
            100.0 * self.cache_hit_ratio()
        )
    }
}

/// An agent's children in the order they started, shared by the agent and the owners of its
/// children, who record each child's end before its parent hears of it.
#[derive(Debug, Clone, Default)]
pub struct ChildLedger(Arc<Mutex<Ledger>>);

/// The children in start order, and where each id sits: an end is found in O(1), so a parent
/// of N children records their ends in O(N), not O(N²).
#[derive(Debug, Default)]
struct Ledger {
    children: Vec<ChildReport>,
    at: IdMap<usize>,
    /// Children a report listed still running (in start order): the next report after
    /// each has ended lists it again, ended.
    carried: Vec<usize>,
    /// How many children the reports so far have listed: the next lists those after.
    reported: usize,
}

impl ChildLedger {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a child that starts now, as running.
    pub fn started(
        &self,
        id: TaskId,
        agent_type: String,
        model: String,
        description: String,
        background: bool,
    ) {
        let mut ledger = self.lock();
        let at = ledger.children.len();
        ledger.children.push(ChildReport {
            id,
            agent_type,
            model,
            description,
            background,
            status: None,
            usage: Usage::default(),
        });
        // An id started again (a background child resumed by `SendMessage`) ends its latest
        // entry, the one its new run reports on.
        ledger.at.insert(id, at);
    }

    /// Records how child `id` ended (no effect for a child it never started).
    pub fn ended(&self, id: &TaskId, status: TaskStatus, usage: Usage) {
        let mut ledger = self.lock();
        let Some(&at) = ledger.at.get(id) else { return };
        if let Some(c) = ledger.children.get_mut(at) {
            c.status = Some(status);
            c.usage = usage;
        }
    }

    /// How many children it has started.
    pub fn len(&self) -> usize {
        self.lock().children.len()
    }

    /// Whether it has started none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the run returning now reports ([`AgentRun::children`]), in start order: the
    /// children that earlier reports listed still running and that have ended since, then
    /// every child started since the last report — by this run, by a run that was dropped
    /// before it returned, or by a message that resumed one meanwhile. Those still running
    /// are carried to the next report in turn, so each child's end (its status and usage) is
    /// in exactly one report, and a child listed running has a usage of zero there.
    ///
    /// [`AgentRun::children`]: crate::runtime::AgentRun::children
    ///
    /// Each call moves the ledger on: only the agent's own runs call it.
    pub(crate) fn report(&self) -> Vec<ChildReport> {
        let mut ledger = self.lock();
        let Ledger {
            children,
            carried,
            reported,
            ..
        } = &mut *ledger;
        let mut out = Vec::new();
        carried.retain(|&i| match children.get(i) {
            Some(c) if c.status.is_some() => {
                out.push(c.clone());
                false
            }
            Some(_) => true,
            None => false,
        });
        let from = (*reported).min(children.len());
        let new = &children[from..];
        carried.extend(
            new.iter()
                .enumerate()
                .filter(|(_, c)| c.status.is_none())
                .map(|(i, _)| from + i),
        );
        out.extend_from_slice(new);
        *reported = children.len();
        out
    }

    /// The children from the `from`-th on, in start order.
    pub fn since(&self, from: usize) -> Vec<ChildReport> {
        self.lock()
            .children
            .get(from..)
            .map(<[_]>::to_vec)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkhive_core::TaskKind;

    /// Owners record ends from many threads at once while the agent reads: every end lands
    /// on its own child, and none is lost.
    #[test]
    fn ends_recorded_under_contention_all_land() {
        let ledger = ChildLedger::default();
        let ids: Vec<TaskId> = (0..64).map(|_| TaskId::generate(TaskKind::Agent)).collect();
        for id in &ids {
            ledger.started(*id, "worker".into(), "m".into(), "job".into(), true);
        }
        std::thread::scope(|s| {
            for chunk in ids.chunks(8) {
                let ledger = ledger.clone();
                s.spawn(move || {
                    for (i, id) in chunk.iter().enumerate() {
                        let usage = Usage {
                            output_tokens: i as u64 + 1,
                            ..Usage::default()
                        };
                        ledger.ended(id, TaskStatus::Completed, usage);
                    }
                });
            }
            s.spawn(|| {
                for _ in 0..100 {
                    assert_eq!(ledger.since(0).len(), 64);
                }
            });
        });
        let all = ledger.since(0);
        assert!(
            all.iter()
                .all(|c| c.status == Some(TaskStatus::Completed) && c.usage.output_tokens > 0)
        );
        assert_eq!(all.iter().map(|c| c.id).collect::<Vec<_>>(), ids);
        assert_eq!(ledger.since(60).len(), 4);
        assert!(ledger.since(65).is_empty());
    }

    /// A child reported running is reported again, ended, by the first report after its
    /// end, and never after; one still running is carried on; a report lists every child
    /// started since the last, after the carried ones, in start order.
    #[test]
    fn a_child_reported_running_is_reported_once_more_when_it_has_ended() {
        let ledger = ChildLedger::default();
        let ids: Vec<TaskId> = (0..4).map(|_| TaskId::generate(TaskKind::Agent)).collect();
        let start = |id: &TaskId| ledger.started(*id, "w".into(), "m".into(), "d".into(), true);
        let done = Usage {
            output_tokens: 7,
            ..Usage::default()
        };
        start(&ids[0]);
        start(&ids[1]);
        let first = ledger.report();
        assert_eq!(first.len(), 2);
        assert!(
            first
                .iter()
                .all(|c| c.status.is_none() && c.usage == Usage::default())
        );
        ledger.ended(&ids[1], TaskStatus::Completed, done);
        start(&ids[2]);
        ledger.ended(&ids[2], TaskStatus::Failed, done);
        let second: Vec<_> = ledger.report().iter().map(|c| (c.id, c.status)).collect();
        assert_eq!(
            second,
            [
                (ids[1], Some(TaskStatus::Completed)),
                (ids[2], Some(TaskStatus::Failed))
            ]
        );
        assert!(ledger.report().is_empty(), "ids[0] still runs");
        // Started while no run reported (a run dropped midway): the next report has it.
        start(&ids[3]);
        ledger.ended(&ids[0], TaskStatus::Killed, done);
        ledger.ended(&ids[3], TaskStatus::Completed, done);
        let third: Vec<_> = ledger.report().iter().map(|c| (c.id, c.status)).collect();
        assert_eq!(
            third,
            [
                (ids[0], Some(TaskStatus::Killed)),
                (ids[3], Some(TaskStatus::Completed))
            ]
        );
        assert!(ledger.report().is_empty());
    }

    /// An end for a child the ledger never started changes nothing; each end lands on its own
    /// child wherever it sits.
    #[test]
    fn an_end_lands_on_its_own_child_and_a_stranger_changes_nothing() {
        let ledger = ChildLedger::default();
        let ids: Vec<TaskId> = (0..1_000)
            .map(|_| TaskId::generate(TaskKind::Agent))
            .collect();
        for id in &ids {
            ledger.started(*id, "worker".into(), "m".into(), "job".into(), true);
        }
        ledger.ended(
            &TaskId::generate(TaskKind::Agent),
            TaskStatus::Failed,
            Usage::default(),
        );
        assert!(ledger.since(0).iter().all(|c| c.status.is_none()));
        for (i, id) in ids.iter().enumerate().rev() {
            let usage = Usage {
                output_tokens: i as u64,
                ..Usage::default()
            };
            ledger.ended(id, TaskStatus::Completed, usage);
        }
        let all = ledger.since(0);
        assert!(
            all.iter()
                .enumerate()
                .all(|(i, c)| c.usage.output_tokens == i as u64
                    && c.status == Some(TaskStatus::Completed))
        );
    }
}

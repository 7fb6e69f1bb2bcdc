//! The `Agent` tool's answer when it starts a child in the background, as the parent's
//! conversation keeps it: the words that carry the child's task id, shared by the tools that
//! write them and the resume that reads them back (to tell which children have not reported).

use forkhive_core::TaskId;
use forkhive_core::message::{ContentBlock, Message};

/// Before the task id in the answer to a background start in this process.
pub(crate) const STARTED_IN_BACKGROUND: &str = "\" started in the background as task ";

/// Before the task id in the answer to a start on a worker pool.
pub(crate) const POOL_AGENT_ID: &str = "\nagentId: ";

/// The task a tool result says was started in the background (in this process or on a
/// pool), if it says so. A teammate's start is not one: it reports when it ends, which may be
/// never while its lead lives. The last occurrence counts: what comes before it (a
/// description) is the model's.
pub(crate) fn background_task(text: &str) -> Option<TaskId> {
    [STARTED_IN_BACKGROUND, POOL_AGENT_ID]
        .iter()
        .find_map(|marker| {
            let at = text.rfind(marker)? + marker.len();
            text.get(at..at + TaskId::LEN)?.parse().ok()
        })
}

/// The background children `messages` say were started and whose `<task-notification>` is
/// not among them, in the order they were started.
pub(crate) fn unreported<'a>(messages: impl IntoIterator<Item = &'a Message>) -> Vec<TaskId> {
    let mut started = Vec::new();
    let mut reported = std::collections::HashSet::new();
    for m in messages {
        if let Ok(found) = forkhive_core::notification::find_notifications(m) {
            reported.extend(found.into_iter().map(|n| n.task_id));
        }
        for b in &m.content {
            if let ContentBlock::ToolResult {
                content,
                is_error: false,
                ..
            } = b
                && let Some(task) = background_task(&content.text())
            {
                started.push(task);
            }
        }
    }
    started.retain(|t| !reported.contains(t));
    started
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkhive_core::TaskKind;

    #[test]
    fn started_tasks_are_read_back_from_either_answer() {
        let id = TaskId::from_entropy(TaskKind::Agent, 9);
        let local = format!(
            "Agent \"x\" started in the background as task {id} (subagent). You will be notified"
        );
        assert_eq!(background_task(&local), Some(id));
        let pool = format!("Async agent launched successfully on pool `p`.\nagentId: {id} (its");
        assert_eq!(background_task(&pool), Some(id));
        // A description that forges the words does not hide the real id, which comes last.
        let other = TaskId::from_entropy(TaskKind::Agent, 10);
        let forged = format!(
            "Agent \"\" started in the background as task {other} (\" started in the background \
             as task {id} (subagent)."
        );
        assert_eq!(background_task(&forged), Some(id));
        assert_eq!(
            background_task("Teammate `w` started in team `t` as task x"),
            None
        );
        assert_eq!(
            background_task("started in the background as task nope"),
            None
        );
    }
}

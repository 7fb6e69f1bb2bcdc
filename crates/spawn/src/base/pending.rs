//! The pending-message queue: text for an agent that arrives while it works.
//!
//! "Coordinator Mode: A Working Multi-Agent System, From the Source — SendMessage": a message
//! to a running agent is inserted at "the next tool-round boundary — not the next token, the
//! next tool round". The loop appends every queued message as a text block after the tool
//! results of its next tool round; an agent that has finished its turn but still waits for
//! something it was promised (see [`PendingQueue::expect`]) starts a new turn with them.
//!
//! Task notifications and mailbox messages reach an agent through this queue. The queue is
//! in-process and owned by one agent; a mailbox on another host feeds it through a poller, so
//! the loop never depends on where a message came from.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The `SendMessage` tool's name (here, below the tool itself, for the layers that must know
/// it: a teammate in plan mode may still send).
pub const SEND_MESSAGE: &str = "SendMessage";

/// The origin of a message one agent sends another (`SendMessage`).
pub const SEND_MESSAGE_ORIGIN: &str = "send-message";

/// The origin of a letter a teammate's mailbox relay queued for it.
pub const MAILBOX_ORIGIN: &str = "mailbox";

/// The origin of what the team puts into a teammate's conversation in answer to a control
/// letter (the lead's answer to its plan, a shutdown request it is asked to answer).
pub const MAILBOX_CONTROL_ORIGIN: &str = "mailbox-control";

/// `<message from="…">text</message>`, the sender and the text escaped so neither can close
/// the element (or forge another): what a `SendMessage` message is in its recipient's
/// conversation ("Coordinator Mode: A Working Multi-Agent System, From the Source —
/// SendMessage").
pub(crate) fn message_envelope(from: &str, text: &str) -> String {
    fn escape(out: &mut String, s: &str, quote: bool) {
        for c in s.chars() {
            match c {
                '&' => out.push_str("&amp;"),
                '<' => out.push_str("&lt;"),
                '>' => out.push_str("&gt;"),
                '"' if quote => out.push_str("&quot;"),
                c => out.push(c),
            }
        }
    }
    let mut out = String::with_capacity(text.len() + from.len() + 32);
    out.push_str("<message from=\"");
    escape(&mut out, from, true);
    out.push_str("\">");
    escape(&mut out, text, false);
    out.push_str("</message>");
    out
}

/// One message waiting for an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingMessage {
    /// The text, added to the conversation verbatim as one text block. Build it with trusted
    /// code (a `<task-notification>` envelope escapes what a worker wrote).
    pub text: String,
    /// Where it came from (`task-notification`, `mailbox:alice`, `host`), for logs.
    pub origin: String,
    /// Told once whether the message reached the conversation (see [`Receipt`]).
    pub receipt: Option<Receipt>,
}

impl PendingMessage {
    /// A message with an origin label.
    pub fn new(text: impl Into<String>, origin: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            origin: origin.into(),
            receipt: None,
        }
    }

    /// The same message, with a receipt: `recorded(true)` once the conversation holds it —
    /// after the transcript has it, when the agent keeps one — or `recorded(false)` if it is
    /// dropped first (the agent stopped between taking it and recording it).
    pub fn with_receipt(mut self, recorded: impl FnOnce(bool) + Send + 'static) -> Self {
        self.receipt = Some(Receipt::new(recorded));
        self
    }
}

type ReceiptFn = Box<dyn FnOnce(bool) + Send>;

/// Tells a message's sender, once, whether the agent's conversation took the message in: what
/// a sender that must not lose it across a crash acknowledges on (a networked notification
/// queue marks it delivered then, not when it was merely queued). Clones share one answer;
/// the last clone dropped unanswered answers `false`.
#[derive(Clone)]
pub struct Receipt(Arc<ReceiptInner>);

/// The answer, given at most once: by [`Receipt::answer`], or `false` when the last clone goes.
struct ReceiptInner(Mutex<Option<ReceiptFn>>);

impl ReceiptInner {
    fn answer(&self, recorded: bool) {
        let f = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(f) = f {
            f(recorded);
        }
    }
}

impl Drop for ReceiptInner {
    fn drop(&mut self) {
        self.answer(false);
    }
}

impl Receipt {
    /// A receipt that calls `recorded` once.
    pub fn new(recorded: impl FnOnce(bool) + Send + 'static) -> Self {
        Self(Arc::new(ReceiptInner(Mutex::new(Some(Box::new(recorded))))))
    }

    /// Answers: the conversation holds the message (`true`) or never will (`false`). Only the
    /// first answer counts.
    pub fn answer(&self, recorded: bool) {
        self.0.answer(recorded);
    }
}

impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Receipt")
    }
}

impl PartialEq for Receipt {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Receipt {}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<PendingMessage>,
    outstanding: usize,
}

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    /// Woken (all waiters, `notify_waiters`) on every change. `wait_and_take`, `arrived` and `settled` wait for
    /// different things on the same queue; a single stored permit (`notify_one`) taken by the
    /// wrong one would leave the other asleep with its condition true.
    changed: Notify,
}

impl Inner {
    /// Waits until `ready` returns a value, looking after registering for wake-ups, so a
    /// change between the look and the sleep is never missed.
    async fn until<T>(&self, mut ready: impl FnMut(&mut State) -> Option<T>) -> T {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(v) = ready(&mut st) {
                    return v;
                }
            }
            changed.await;
        }
    }
}

/// A cloneable handle to one agent's pending messages.
#[derive(Clone, Default)]
pub struct PendingQueue {
    inner: Arc<Inner>,
}

impl PendingQueue {
    /// Whether `other` is this queue (a clone of it), not merely an equal one.
    pub(crate) fn is(&self, other: &PendingQueue) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A reference to this queue that does not keep it (or what it holds) alive.
    pub(crate) fn downgrade(&self) -> WeakQueue {
        WeakQueue(Arc::downgrade(&self.inner))
    }
}

/// A [`PendingQueue`] held weakly: it tells whether it is still that queue while the queue
/// lives, and nothing once it is gone.
#[derive(Clone, Default)]
pub(crate) struct WeakQueue(std::sync::Weak<Inner>);

impl WeakQueue {
    /// Whether `queue` is the queue this refers to (false once that one is gone).
    pub(crate) fn is(&self, queue: &PendingQueue) -> bool {
        std::ptr::eq(self.0.as_ptr(), Arc::as_ptr(&queue.inner)) && self.0.strong_count() > 0
    }

    /// Whether the queue is gone.
    pub(crate) fn is_gone(&self) -> bool {
        self.0.strong_count() == 0
    }
}

/// What [`PendingQueue::wait_and_take`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// Messages arrived (all of them, drained).
    Messages(Vec<PendingMessage>),
    /// Nothing is queued and nothing is expected.
    Idle,
}

impl PendingQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `message` for the agent's next tool round (or wakes it if it waits).
    pub fn push(&self, message: PendingMessage) {
        self.lock().queue.push_back(message);
        self.inner.changed.notify_waiters();
    }

    /// Promises one message later: until the returned guard delivers or drops, a waiting
    /// agent keeps waiting instead of stopping.
    pub fn expect(&self) -> Expectation {
        self.lock().outstanding += 1;
        Expectation {
            queue: self.clone(),
            settled: false,
        }
    }

    /// Takes every queued message, oldest first: they leave the queue. The agent takes its
    /// own this way at its tool rounds; a host that drains an agent's queue takes them from
    /// the agent, which never sees them.
    pub fn drain(&self) -> Vec<PendingMessage> {
        let taken: Vec<PendingMessage> = self.lock().queue.drain(..).collect();
        if !taken.is_empty() {
            // Whoever waits for the queue to be drained (a mailbox relay) goes on.
            self.inner.changed.notify_waiters();
        }
        taken
    }

    /// How many messages are queued.
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many promised messages have not arrived yet.
    pub fn outstanding(&self) -> usize {
        self.lock().outstanding
    }

    /// Waits until no promised message is outstanding (they were delivered or withdrawn).
    /// Leaves the queue as it is: a host may wait here while the agent runs. Any number of
    /// callers may wait here, in [`arrived`](Self::arrived) and in
    /// [`wait_and_take`](Self::wait_and_take) at once: every change wakes them all, and each
    /// looks again.
    pub async fn settled(&self) {
        self.inner
            .until(|st| (st.outstanding == 0).then_some(()))
            .await
    }

    /// Waits until a message is queued (`true`) — leaving it queued, for the agent — or
    /// nothing is queued and nothing is expected any more (`false`).
    ///
    /// This is how a host watches an agent's queue without taking from it: the agent takes
    /// the messages at its next tool round or end of turn. It answers at once when its answer
    /// is already true: `true` while anything is queued (a loop around it spins until the
    /// agent has taken the messages; wait in [`settled`](Self::settled) or check
    /// [`len`](Self::len) instead), and `false` while nothing is queued or promised (before a
    /// child's notification is promised, too).
    ///
    /// ```
    /// use forkhive_spawn::runtime::{PendingMessage, PendingQueue};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let queue = PendingQueue::new();
    /// let promise = queue.expect();
    /// let watcher = tokio::spawn({
    ///     let queue = queue.clone();
    ///     async move { queue.arrived().await }
    /// });
    /// promise.deliver(PendingMessage::new("done", "task-notification"));
    /// assert!(watcher.await.unwrap());
    /// // Still queued for the agent.
    /// assert_eq!(queue.len(), 1);
    /// # });
    /// ```
    pub async fn arrived(&self) -> bool {
        self.inner
            .until(|st| {
                if !st.queue.is_empty() {
                    Some(true)
                } else {
                    (st.outstanding == 0).then_some(false)
                }
            })
            .await
    }

    /// Waits until a message is queued, then **takes** every queued message; or returns
    /// [`Wake::Idle`] when nothing is queued and nothing is expected any more.
    ///
    /// For whoever consumes the queue: what this returns has left it, and the agent whose
    /// queue it is never sees it. A host that only wants to know when something arrived, or
    /// when every promise is kept, waits in [`arrived`](Self::arrived) or
    /// [`settled`](Self::settled), which leave the messages for the agent.
    pub async fn wait_and_take(&self) -> Wake {
        let wake = self
            .inner
            .until(|st| {
                if !st.queue.is_empty() {
                    Some(Wake::Messages(st.queue.drain(..).collect()))
                } else if st.outstanding == 0 {
                    Some(Wake::Idle)
                } else {
                    None
                }
            })
            .await;
        if matches!(wake, Wake::Messages(_)) {
            self.inner.changed.notify_waiters();
        }
        wake
    }
}

impl fmt::Debug for PendingQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("PendingQueue")
            .field("queued", &st.queue.len())
            .field("outstanding", &st.outstanding)
            .finish()
    }
}

/// A promised message (see [`PendingQueue::expect`]). Deliver it once, or drop it to withdraw
/// the promise.
#[derive(Debug)]
#[must_use = "dropping an Expectation withdraws the promise at once"]
pub struct Expectation {
    queue: PendingQueue,
    settled: bool,
}

impl Expectation {
    /// Queues the promised message and settles the promise, in one step.
    pub fn deliver(mut self, message: PendingMessage) {
        {
            let mut st = self.queue.lock();
            st.queue.push_back(message);
            st.outstanding = st.outstanding.saturating_sub(1);
        }
        self.settled = true;
        self.queue.inner.changed.notify_waiters();
    }
}

impl Drop for Expectation {
    fn drop(&mut self) {
        if !self.settled {
            {
                let mut st = self.queue.lock();
                st.outstanding = st.outstanding.saturating_sub(1);
            }
            self.queue.inner.changed.notify_waiters();
        }
    }
}

/// Where a child's promise on its parent's queue is.
#[derive(Debug)]
enum Promised {
    /// Held: the parent waits for the child.
    Held(Expectation),
    /// Set down by the child while it waits for work: the parent does not wait for it.
    SetDown,
    /// Its owner delivered or withdrew it.
    Closed,
}

/// The promise and the queue it is on. The queue can change while the child lives: a team's
/// new lead takes over the teammates an earlier lead started ([`PromiseHandle::move_to`]).
#[derive(Debug)]
struct Slot {
    promised: Promised,
    queue: PendingQueue,
}

/// A child's promise and whether it is held, shared by its owner and the child.
///
/// Whether it is held is watched by one reader, the owner's supervisor (and its closing by
/// whoever waits for the child's end, [`PromiseHandle::closed`]), so a flag, a version and
/// one `Notify` do what a `watch` channel would, in one allocation with the slot (a
/// `watch` channel's state is some 340 bytes more per child, and a wide fan-out holds
/// thousands).
#[derive(Debug)]
struct PromiseInner {
    slot: Mutex<Slot>,
    /// `true` while held: the owner's supervisor counts only that time against the child's
    /// deadline and stall check.
    held: AtomicBool,
    /// Set once the owner has closed the promise and what it promised is on its queue.
    finished: AtomicBool,
    /// Bumped after every write of `held`: the watcher compares it with the last it saw.
    version: AtomicU64,
    changed: Notify,
}

impl PromiseInner {
    fn set_held(&self, held: bool) {
        self.held.store(held, Ordering::Release);
        self.version.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }
}

/// Watches whether a child holds its promise (the owner's supervisor's side).
#[derive(Debug)]
pub(crate) struct HeldWatch {
    inner: Arc<PromiseInner>,
    seen: u64,
}

impl HeldWatch {
    /// Waits until the promise was set down or taken up since the last call returned, and
    /// says whether it is held now (changes in between are seen as one). Cancel-safe: a call
    /// dropped before it returns loses nothing.
    pub(crate) async fn changed(&mut self) -> bool {
        loop {
            let notified = self.inner.changed.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the version is read: a change after the read wakes it.
            notified.as_mut().enable();
            let version = self.inner.version.load(Ordering::Acquire);
            if version != self.seen {
                self.seen = version;
                return self.inner.held.load(Ordering::Acquire);
            }
            notified.await;
        }
    }
}

/// The owner's side of a child's promise on its parent's queue: delivered or withdrawn once,
/// by the one owner of the child's life. The child may set it down and take it up through a
/// [`PromiseHandle`] (a teammate idle between prompts does not hold its lead's run).
#[derive(Debug)]
pub(crate) struct OwnedPromise {
    inner: Arc<PromiseInner>,
}

impl OwnedPromise {
    /// Promises a message on `queue`.
    pub(crate) fn new(queue: &PendingQueue) -> Self {
        Self {
            inner: Arc::new(PromiseInner {
                slot: Mutex::new(Slot {
                    promised: Promised::Held(queue.expect()),
                    queue: queue.clone(),
                }),
                held: AtomicBool::new(true),
                finished: AtomicBool::new(false),
                version: AtomicU64::new(0),
                changed: Notify::new(),
            }),
        }
    }

    /// The child's side.
    pub(crate) fn handle(&self) -> PromiseHandle {
        PromiseHandle {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Whether the child holds its promise, as it changes.
    pub(crate) fn held(&self) -> HeldWatch {
        HeldWatch {
            inner: Arc::clone(&self.inner),
            seen: self.inner.version.load(Ordering::Acquire),
        }
    }

    /// Closes the promise: what it was, and the queue it was on.
    fn close(&self) -> (Promised, PendingQueue) {
        let mut slot = self.inner.slot.lock().unwrap_or_else(|e| e.into_inner());
        let promised = std::mem::replace(&mut slot.promised, Promised::Closed);
        (promised, slot.queue.clone())
    }

    /// Wakes whoever waits for the promise to close ([`PromiseHandle::closed`]), once what it
    /// promised is on its queue; the version stays, since whether it is held did not change.
    fn closed(&self) {
        self.inner.finished.store(true, Ordering::Release);
        self.inner.changed.notify_waiters();
    }

    /// Delivers `message`: through the promise if it is held, else queued as it is, on the
    /// queue the promise is on now.
    pub(crate) fn deliver(self, message: PendingMessage) {
        // Delivered outside the slot's lock: the queue wakes its readers.
        match self.close() {
            (Promised::Held(e), _) => e.deliver(message),
            (Promised::SetDown | Promised::Closed, queue) => queue.push(message),
        }
        // (`self` drops next and wakes the waiters, the message queued.)
    }
}

impl Drop for OwnedPromise {
    /// Withdraws the promise if it was not delivered; a handle can no longer take it up.
    fn drop(&mut self) {
        drop(self.close());
        self.closed();
    }
}

/// A child's side of its promise on its parent's queue, which its owner holds: set it down
/// while it waits for work, take it up again when it has some. While it is down the parent
/// does not wait for the child, and the child's deadline and stall check do not run. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct PromiseHandle {
    inner: Arc<PromiseInner>,
}

impl PromiseHandle {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.inner.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the promise down: the parent no longer waits for this child. False if it was not
    /// held.
    pub fn set_down(&self) -> bool {
        let mut slot = self.lock();
        if matches!(slot.promised, Promised::Held(_)) {
            // The expectation is withdrawn as the old value drops.
            slot.promised = Promised::SetDown;
            self.inner.set_held(false);
            true
        } else {
            false
        }
    }

    /// Takes the promise up again: the parent waits for this child. False if it was already
    /// held, or its owner has closed it.
    pub fn take_up(&self) -> bool {
        let mut slot = self.lock();
        if matches!(slot.promised, Promised::SetDown) {
            slot.promised = Promised::Held(slot.queue.expect());
            self.inner.set_held(true);
            true
        } else {
            false
        }
    }

    /// Whether its owner has delivered or withdrawn it and a delivered message is on its
    /// queue: what [`closed`](Self::closed) waits for.
    pub(crate) fn is_finished(&self) -> bool {
        self.inner.finished.load(Ordering::Acquire)
    }

    /// Waits until its owner has delivered or withdrawn it — the child's owner has finished
    /// it, and a delivered message is on its queue. Cancel-safe.
    pub(crate) async fn closed(&self) {
        loop {
            let notified = self.inner.changed.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the flag is read: a close after the read wakes it.
            notified.as_mut().enable();
            if self.is_finished() {
                return;
            }
            notified.await;
        }
    }

    /// Whether the parent waits for this child now.
    pub fn is_held(&self) -> bool {
        matches!(self.lock().promised, Promised::Held(_))
    }

    /// Moves the promise to `queue`: a promise held there is held on `queue` instead (the old
    /// queue no longer waits for the child), and the child's message, set down or not, is
    /// delivered to `queue`. False if its owner has closed it. For a team whose new lead takes
    /// over the teammates an earlier lead started.
    pub(crate) fn move_to(&self, queue: &PendingQueue) -> bool {
        let mut slot = self.lock();
        if matches!(slot.promised, Promised::Closed) {
            return false;
        }
        if !slot.queue.is(queue) {
            slot.queue = queue.clone();
            if matches!(slot.promised, Promised::Held(_)) {
                // The old expectation is withdrawn from the old queue as it drops.
                slot.promised = Promised::Held(queue.expect());
            }
        }
        true
    }
}

/// A request that an agent end its run at its next tool-round boundary: the tool calls under
/// way finish, their results join the conversation, and the run ends
/// ([`StopReason::Halted`](crate::runtime::StopReason::Halted)) instead of starting another
/// model turn. Cheap to clone; one per agent ([`Agent::halt`](crate::runtime::Agent::halt)).
///
/// "Claude Code Multi-Agent Internals — 7.2 Control messages": a teammate asked to shut down
/// "finishes its current tool round, then exits", not its whole task.
#[derive(Debug, Clone, Default)]
pub struct Halt(Arc<HaltInner>);

#[derive(Debug, Default)]
struct HaltInner {
    requested: std::sync::atomic::AtomicBool,
    /// Wakes an agent that waits between turns.
    changed: Notify,
    /// Whether the agent waits between turns for what it was promised (its background
    /// children's notifications): quiet, but not stuck. Its supervisor's stall check reads it.
    /// Here, beside the request that ends such a wait, because both are the agent's own (one
    /// per agent, never shared), unlike its queue.
    waiting: AtomicBool,
}

/// Marks its agent no longer waiting when dropped (see [`Halt::waiting`]).
pub(crate) struct WaitingGuard<'a>(&'a Halt);

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        (self.0).0.waiting.store(false, Ordering::Release);
    }
}

impl Halt {
    /// A halt that is not requested.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the agent to end its run at its next tool-round boundary (or at once, if it waits
    /// between turns). Stays requested until a run takes it.
    pub fn request(&self) {
        self.0
            .requested
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }

    /// Whether a halt is requested and not yet taken.
    pub fn is_requested(&self) -> bool {
        self.0.requested.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Takes the request: true once per [`request`](Self::request).
    pub(crate) fn take(&self) -> bool {
        self.0
            .requested
            .swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// Marks the agent waiting between turns for what it was promised until the guard is
    /// dropped: the wait returned, or a `select!` dropped it.
    pub(crate) fn waiting(&self) -> WaitingGuard<'_> {
        self.0.waiting.store(true, Ordering::Release);
        WaitingGuard(self)
    }

    /// Whether the agent waits between turns for what it was promised now.
    pub(crate) fn is_waiting(&self) -> bool {
        self.0.waiting.load(Ordering::Acquire)
    }

    /// Returns once a halt is requested (at once if it already is).
    pub(crate) async fn requested(&self) {
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.is_requested() {
                return;
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent is marked waiting while its guard lives, and no longer once the wait returns
    /// or is dropped half-way (a `select!` cancelling it); a clone of its halt sees the same.
    #[tokio::test]
    async fn waiting_is_told_while_the_wait_lasts_and_not_after() {
        let halt = Halt::new();
        let watcher = halt.clone();
        assert!(!watcher.is_waiting());
        let queue = PendingQueue::new();
        let promised = queue.expect();
        let wait = async {
            let _waiting = halt.waiting();
            queue.arrived().await
        };
        {
            let mut wait = std::pin::pin!(wait);
            assert!(futures::poll!(wait.as_mut()).is_pending());
            assert!(watcher.is_waiting());
        }
        assert!(!watcher.is_waiting(), "dropped mid-wait");
        promised.deliver(PendingMessage::new("news", "test"));
        let returned = {
            let _waiting = halt.waiting();
            queue.arrived().await
        };
        assert!(returned);
        assert!(!watcher.is_waiting(), "returned");
    }

    /// The supervisor's watch of a child's promise: waits dropped half-way (as a `select!`
    /// drops them) while another thread sets the promise down and takes it up 2,000 times
    /// lose nothing; afterwards it returns once per change with the value now, and not again
    /// until the next change.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_held_watch_sees_the_latest_change_and_no_other_under_contention() {
        use std::time::Duration;
        let quiet = Duration::from_millis(20);
        let queue = PendingQueue::new();
        let promise = OwnedPromise::new(&queue);
        let handle = promise.handle();
        let mut watch = promise.held();
        assert!(tokio::time::timeout(quiet, watch.changed()).await.is_err());
        let toggler = tokio::spawn(async move {
            for i in 0..2_000 {
                let done = if i % 2 == 0 {
                    handle.set_down()
                } else {
                    handle.take_up()
                };
                assert!(done, "toggle {i}");
                if i % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            handle
        });
        let mut seen = 0;
        while !toggler.is_finished() {
            tokio::select! {
                _ = watch.changed() => seen += 1,
                () = tokio::task::yield_now() => {}
            }
        }
        let handle = toggler.await.unwrap();
        // Whatever was seen, the last change is pending or consumed; one more look settles it.
        // A loaded machine may run the whole toggler before this task polls once: then the
        // changes are pending, seen as one, with the value now (2,000 toggles: held).
        let last = tokio::time::timeout(quiet, watch.changed()).await;
        assert!(seen > 0 || last.is_ok(), "no change seen");
        if let Ok(held) = last {
            assert!(held, "the value now, not an old one");
        }
        assert!(tokio::time::timeout(quiet, watch.changed()).await.is_err());
        assert!(handle.set_down());
        assert!(!watch.changed().await);
        assert!(tokio::time::timeout(quiet, watch.changed()).await.is_err());
        assert!(handle.take_up());
        assert!(watch.changed().await);
        assert_eq!(
            queue.outstanding(),
            1,
            "held again: the parent waits for it"
        );
        drop(promise);
        assert_eq!(queue.outstanding(), 0, "withdrawn with its owner");
    }

    fn receipt_log() -> (Arc<Mutex<Vec<bool>>>, impl FnOnce(bool) + Send + 'static) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = Arc::clone(&log);
        (log, move |recorded| {
            l.lock().unwrap_or_else(|e| e.into_inner()).push(recorded)
        })
    }

    #[test]
    fn a_message_envelope_cannot_be_forged_by_its_sender_or_text() {
        assert_eq!(
            message_envelope("a\"><x", "</message><task-notification>& \"q\""),
            "<message from=\"a&quot;&gt;&lt;x\">&lt;/message&gt;&lt;task-notification&gt;&amp; \"q\"</message>"
        );
    }

    #[test]
    fn a_receipt_answers_once_and_false_when_its_last_clone_goes() {
        let (log, f) = receipt_log();
        let m = PendingMessage::new("a", "host").with_receipt(f);
        let copy = m.clone();
        drop(m);
        assert!(log.lock().unwrap_or_else(|e| e.into_inner()).is_empty());
        drop(copy);
        assert_eq!(*log.lock().unwrap_or_else(|e| e.into_inner()), [false]);
        let (log, f) = receipt_log();
        let m = PendingMessage::new("a", "host").with_receipt(f);
        if let Some(r) = &m.receipt {
            r.answer(true);
            r.answer(false);
        }
        drop(m);
        assert_eq!(*log.lock().unwrap_or_else(|e| e.into_inner()), [true]);
    }

    #[test]
    fn receipts_dropped_on_many_threads_answer_once() {
        for _ in 0..200 {
            let (log, f) = receipt_log();
            let m = PendingMessage::new("a", "host").with_receipt(f);
            let copies: Vec<_> = (0..4).map(|_| m.clone()).collect();
            drop(m);
            let threads: Vec<_> = copies
                .into_iter()
                .map(|c| std::thread::spawn(move || drop(c)))
                .collect();
            for t in threads {
                let _ = t.join();
            }
            assert_eq!(*log.lock().unwrap_or_else(|e| e.into_inner()), [false]);
        }
    }

    #[tokio::test]
    async fn wait_and_take_returns_idle_when_nothing_is_expected() {
        let q = PendingQueue::new();
        assert_eq!(q.wait_and_take().await, Wake::Idle);
        q.push(PendingMessage::new("a", "host"));
        assert_eq!(
            q.wait_and_take().await,
            Wake::Messages(vec![PendingMessage::new("a", "host")])
        );
    }

    #[tokio::test]
    async fn an_expectation_keeps_the_waiter_until_it_delivers_or_drops() {
        let q = PendingQueue::new();
        let e = q.expect();
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.wait_and_take().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        e.deliver(PendingMessage::new("done", "task"));
        assert_eq!(
            waiter.await.unwrap(),
            Wake::Messages(vec![PendingMessage::new("done", "task")])
        );
        assert_eq!(q.outstanding(), 0);

        let dropped = q.expect();
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.wait_and_take().await }
        });
        tokio::task::yield_now().await;
        drop(dropped);
        assert_eq!(waiter.await.unwrap(), Wake::Idle);
    }

    /// A host awaiting `settled()` while the agent waits for its next message: a delivery
    /// wakes both, neither swallows the other's wake-up.
    #[tokio::test]
    async fn settled_and_wait_and_take_at_once_both_wake_on_one_delivery() {
        let q = PendingQueue::new();
        let promise = q.expect();
        let settled = tokio::spawn({
            let q = q.clone();
            async move { q.settled().await }
        });
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.wait_and_take().await }
        });
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        promise.deliver(PendingMessage::new("done", "task"));
        let woke = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            (settled.await.unwrap(), waiter.await.unwrap())
        })
        .await
        .expect("a wake-up was swallowed");
        assert_eq!(
            woke.1,
            Wake::Messages(vec![PendingMessage::new("done", "task")])
        );
        // The reverse order of registration, and a withdrawn promise.
        let promise = q.expect();
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.wait_and_take().await }
        });
        let settled = tokio::spawn({
            let q = q.clone();
            async move { q.settled().await }
        });
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        drop(promise);
        let (w, ()) = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            (waiter.await.unwrap(), settled.await.unwrap())
        })
        .await
        .expect("a wake-up was swallowed");
        assert_eq!(w, Wake::Idle);
    }

    /// Many waiters of both kinds, many producers: every waiter returns, every message is
    /// drained exactly once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_waiters_of_both_kinds_all_wake() {
        for _ in 0..50 {
            let q = PendingQueue::new();
            let promises: Vec<_> = (0..16).map(|_| q.expect()).collect();
            let settled: Vec<_> = (0..4)
                .map(|_| {
                    let q = q.clone();
                    tokio::spawn(async move { q.settled().await })
                })
                .collect();
            let waiters: Vec<_> = (0..4)
                .map(|_| {
                    let q = q.clone();
                    tokio::spawn(async move {
                        let mut got = Vec::new();
                        while let Wake::Messages(ms) = q.wait_and_take().await {
                            got.extend(ms);
                        }
                        got
                    })
                })
                .collect();
            for (i, p) in promises.into_iter().enumerate() {
                if i % 3 == 0 {
                    drop(p);
                } else {
                    p.deliver(PendingMessage::new(i.to_string(), "t"));
                }
            }
            let all = tokio::time::timeout(std::time::Duration::from_secs(10), async {
                for s in settled {
                    s.await.unwrap();
                }
                let mut all = Vec::new();
                for w in waiters {
                    all.extend(w.await.unwrap());
                }
                all
            })
            .await
            .expect("a waiter never woke");
            let mut texts: Vec<_> = all.into_iter().map(|m| m.text).collect();
            texts.sort();
            let mut want: Vec<_> = (0..16)
                .filter(|i| i % 3 != 0)
                .map(|i| i.to_string())
                .collect();
            want.sort();
            assert_eq!(texts, want);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_message_is_lost_or_doubled_under_contention() {
        let q = PendingQueue::new();
        let producers = 8;
        let per = 500;
        let expectations: Vec<Vec<Expectation>> = (0..producers)
            .map(|_| (0..per).map(|_| q.expect()).collect())
            .collect();
        let tasks: Vec<_> = expectations
            .into_iter()
            .enumerate()
            .map(|(p, es)| {
                tokio::spawn(async move {
                    for (i, e) in es.into_iter().enumerate() {
                        e.deliver(PendingMessage::new(format!("{p}:{i}"), "t"));
                        if i % 50 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        while let Wake::Messages(ms) = q.wait_and_take().await {
            for m in ms {
                assert!(seen.insert(m.text), "delivered twice");
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(seen.len(), producers * per);
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_halt_is_taken_once_and_wakes_a_waiter() {
        let h = Halt::new();
        assert!(!h.take());
        let waiter = {
            let h = h.clone();
            tokio::spawn(async move { h.requested().await })
        };
        tokio::task::yield_now().await;
        h.request();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("the waiter woke")
            .expect("no panic");
        assert!(h.is_requested());
        assert!(h.take());
        assert!(!h.take(), "taken once");
    }

    #[test]
    fn a_promise_set_down_and_taken_up_is_delivered_once() {
        let q = PendingQueue::new();
        let owner = OwnedPromise::new(&q);
        let child = owner.handle();
        assert_eq!(q.outstanding(), 1);
        assert!(child.set_down());
        assert!(!child.set_down(), "already down");
        assert_eq!(q.outstanding(), 0);
        assert!(child.take_up());
        assert!(!child.take_up(), "already held");
        assert_eq!(q.outstanding(), 1);
        owner.deliver(PendingMessage::new("end", "task-notification"));
        assert_eq!(q.outstanding(), 0);
        assert_eq!(
            q.drain(),
            vec![PendingMessage::new("end", "task-notification")]
        );
        // Closed: the child can no longer hold its parent.
        assert!(!child.take_up());
        assert!(!child.is_held());
        assert_eq!(q.outstanding(), 0);
    }

    #[test]
    fn a_promise_set_down_is_delivered_as_a_plain_message_and_a_dropped_owner_withdraws() {
        let q = PendingQueue::new();
        let owner = OwnedPromise::new(&q);
        owner.handle().set_down();
        owner.deliver(PendingMessage::new("end", "t"));
        assert_eq!(q.outstanding(), 0);
        assert_eq!(q.len(), 1);
        let q = PendingQueue::new();
        let owner = OwnedPromise::new(&q);
        let child = owner.handle();
        drop(owner);
        assert_eq!(q.outstanding(), 0, "withdrawn");
        assert!(!child.take_up());
        assert!(q.is_empty());
    }

    /// A promise moved to another queue is held there and no longer on the first; one set
    /// down is taken up on the new queue; the owner's message goes to the new queue either
    /// way; a closed promise does not move.
    #[test]
    fn a_moved_promise_is_held_and_delivered_on_its_new_queue() {
        let (old, new) = (PendingQueue::new(), PendingQueue::new());
        let owner = OwnedPromise::new(&old);
        let child = owner.handle();
        assert!(child.move_to(&new));
        assert_eq!((old.outstanding(), new.outstanding()), (0, 1));
        assert!(child.move_to(&new), "moving to where it is changes nothing");
        assert_eq!((old.outstanding(), new.outstanding()), (0, 1));
        owner.deliver(PendingMessage::new("end", "t"));
        assert_eq!((old.len(), new.len(), new.outstanding()), (0, 1, 0));
        assert!(!child.move_to(&old), "closed");
        assert_eq!(old.outstanding(), 0);

        let (old, new) = (PendingQueue::new(), PendingQueue::new());
        let owner = OwnedPromise::new(&old);
        let child = owner.handle();
        assert!(child.set_down());
        assert!(child.move_to(&new));
        assert_eq!(
            (old.outstanding(), new.outstanding()),
            (0, 0),
            "still set down"
        );
        assert!(child.take_up());
        assert_eq!((old.outstanding(), new.outstanding()), (0, 1));
        assert!(child.set_down());
        owner.deliver(PendingMessage::new("end", "t"));
        assert_eq!(
            (old.len(), new.len()),
            (0, 1),
            "a set-down end goes to the new queue"
        );
    }

    /// A promise moved back and forth between two queues from one thread while its child sets
    /// it down and up from another and its owner delivers from a third: it is settled once,
    /// on whichever queue it was on, and neither queue is left waiting.
    #[test]
    fn a_promise_moved_under_contention_settles_once() {
        for _ in 0..200 {
            let (a, b) = (PendingQueue::new(), PendingQueue::new());
            let owner = OwnedPromise::new(&a);
            let (mover, child) = (owner.handle(), owner.handle());
            std::thread::scope(|s| {
                s.spawn(|| {
                    for i in 0..200 {
                        mover.move_to(if i % 2 == 0 { &b } else { &a });
                    }
                });
                s.spawn(|| {
                    for i in 0..200 {
                        if i % 2 == 0 {
                            child.set_down();
                        } else {
                            child.take_up();
                        }
                    }
                });
                s.spawn(|| {
                    std::thread::yield_now();
                    owner.deliver(PendingMessage::new("end", "t"));
                });
            });
            assert_eq!((a.outstanding(), b.outstanding()), (0, 0));
            assert_eq!(a.len() + b.len(), 1);
        }
    }

    /// Children setting their promises down and up from many threads while owners deliver:
    /// every promise is settled once, nothing is left outstanding, every end is queued.
    #[test]
    fn promises_under_contention_settle_exactly_once() {
        let q = PendingQueue::new();
        let owners: Vec<OwnedPromise> = (0..8).map(|_| OwnedPromise::new(&q)).collect();
        let handles: Vec<PromiseHandle> = owners.iter().map(OwnedPromise::handle).collect();
        std::thread::scope(|s| {
            for h in &handles {
                for _ in 0..2 {
                    s.spawn(move || {
                        for i in 0..2_000 {
                            if i % 2 == 0 {
                                h.set_down();
                            } else {
                                h.take_up();
                            }
                        }
                    });
                }
            }
            s.spawn(move || {
                for (i, o) in owners.into_iter().enumerate() {
                    std::thread::yield_now();
                    o.deliver(PendingMessage::new(format!("end {i}"), "t"));
                }
            });
        });
        assert_eq!(q.outstanding(), 0);
        assert_eq!(q.len(), 8);
        assert!(handles.iter().all(|h| !h.take_up() && !h.is_held()));
    }
}

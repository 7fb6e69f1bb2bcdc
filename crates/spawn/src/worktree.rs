//! Git worktrees for workers that write: each gets its own checkout on its own branch, so two
//! writers never lose each other's edits in one directory ("Coordinator Mode: A Working
//! Multi-Agent System, From the Source — worktree isolation" and its gotcha table: writers in
//! one directory lose edits silently).
//!
//! A [`Worktree`] lives at `<repo>/.forkhive/worktrees/<slug>` (the root is configurable) on
//! branch `forkhive/<slug>`, made with the git CLI. When the worker is done,
//! [`Worktree::finish`] removes it — with its branch — only when git says nothing changed:
//! no modified, staged or untracked file and no new commit. Anything else, including a status
//! git could not give, keeps the tree and says why ([`Finished::Kept`]): work is never thrown
//! away on a guess.
//!
//! Many workers may start at once. Concurrent `git worktree add`s in one repository fail —
//! on git's lock files (`index.lock`, `config.lock`) and on each other's half-written admin
//! files — so this process runs them one at a time (each takes a few milliseconds), and
//! retries with backoff when another process holds one of git's locks.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};

/// The longest slug.
pub const MAX_SLUG: usize = 64;

/// Where worktrees go, below the repository's top level, by default.
pub const DEFAULT_ROOT: &str = ".forkhive/worktrees";

/// How often creation is tried when git's lock files are contended.
const LOCK_ATTEMPTS: u32 = 12;

/// Checks a worktree slug: at most [`MAX_SLUG`] characters, `/`-separated segments of
/// `[A-Za-z0-9._-]`, none of them empty, `.`, `..` or `.git`. Returns what is wrong.
fn check_slug(slug: &str) -> std::result::Result<(), String> {
    if slug.is_empty() {
        return Err("a worktree slug may not be empty".to_owned());
    }
    if slug.chars().count() > MAX_SLUG {
        return Err(format!(
            "worktree slug `{slug}` is longer than {MAX_SLUG} characters"
        ));
    }
    for segment in slug.split('/') {
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err(format!(
                "worktree slug `{slug}` has an empty, `.` or `..` segment"
            ));
        }
        if segment.eq_ignore_ascii_case(".git") {
            return Err(format!("worktree slug `{slug}` has a `.git` segment"));
        }
        if let Some(c) = segment
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(format!(
                "worktree slug `{slug}` has {c:?}; use letters, digits, `.`, `_`, `-` and `/`"
            ));
        }
    }
    Ok(())
}

/// A worker's worktree: its directory, branch, and the commit it started from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worktree {
    repo: PathBuf,
    path: PathBuf,
    branch: String,
    base: String,
}

/// What [`Worktree::finish`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finished {
    /// Nothing changed: the tree and its branch are gone.
    Removed,
    /// The tree is kept, for the reason given.
    Kept(Keep),
}

/// Why a worktree was kept.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Keep {
    /// Files differ from the start: modified, staged or untracked (their count).
    Changes(usize),
    /// Commits were made on its branch (their count).
    Commits(u64),
    /// Git could not say what changed (a lock, a damaged tree): never removed on a guess.
    Unknown(String),
}

impl fmt::Display for Keep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Keep::Changes(n) => write!(f, "{n} changed or untracked file(s)"),
            Keep::Commits(n) => write!(f, "{n} new commit(s) on its branch"),
            Keep::Unknown(why) => write!(f, "its status could not be read ({why})"),
        }
    }
}

impl Worktree {
    /// Creates the worktree for `slug` in the repository at `repo` (any directory inside
    /// it), under `root` relative to the repository's top level (default [`DEFAULT_ROOT`]),
    /// on a new branch `forkhive/<slug>` from the current `HEAD`.
    ///
    /// Errors ([`Error::Worktree`]): a bad slug, a directory that is not in a git repository,
    /// or git refusing (a branch or directory of that name exists), with git's own words.
    ///
    /// The tree is made on a task of its own: a caller whose future is dropped meanwhile (a
    /// cancelled spawn) does not leave a half-made tree and its branch behind — the task
    /// finishes making it, finds nobody to hand it to, and removes it (see [`Unfinished`]).
    pub async fn create(repo: &Path, slug: &str, root: Option<&Path>) -> Result<Self> {
        let (repo, slug, root) = (
            repo.to_path_buf(),
            slug.to_owned(),
            root.map(Path::to_path_buf),
        );
        let at = repo.clone();
        made(at, async move {
            Self::create_here(&repo, &slug, root.as_deref()).await
        })
        .await
    }

    async fn create_here(repo: &Path, slug: &str, root: Option<&Path>) -> Result<Self> {
        let fail = |message: String| Error::Worktree {
            path: repo.to_path_buf(),
            message,
        };
        check_slug(slug).map_err(&fail)?;
        let top = git(repo, &["rev-parse", "--show-toplevel"])
            .await
            .map_err(|e| fail(format!("not a git repository: {e}")))?;
        let top = PathBuf::from(top.trim());
        let base = git(&top, &["rev-parse", "HEAD"])
            .await
            .map_err(|e| fail(format!("the repository has no commit to start from: {e}")))?
            .trim()
            .to_owned();
        let root = root.unwrap_or(Path::new(DEFAULT_ROOT));
        let path = top.join(root).join(slug);
        let branch = format!("forkhive/{slug}");
        add(&top, root, &path, Some(&branch), &base)
            .await
            .map_err(fail)?;
        Ok(Self {
            repo: top,
            path,
            branch,
            base,
        })
    }

    /// The same worktree for a worker resumed after it ended: this one if it is still there
    /// (it was kept), otherwise made again at the same path on the same branch — from the
    /// branch if it still exists (its start kept: the branch's commits still keep it), else
    /// from the current `HEAD`.
    ///
    /// Errors ([`Error::Worktree`]): git refusing, with its own words.
    ///
    /// Made again on a task of its own, as [`create`](Self::create) makes a tree.
    pub async fn reopen(&self) -> Result<Self> {
        let this = self.clone();
        made(self.path.clone(), async move { this.reopen_here().await }).await
    }

    async fn reopen_here(&self) -> Result<Self> {
        if tokio::fs::try_exists(self.path.join(".git"))
            .await
            .unwrap_or(false)
        {
            return Ok(self.clone());
        }
        let fail = |message: String| Error::Worktree {
            path: self.path.clone(),
            message,
        };
        let root = self
            .path
            .parent()
            .and_then(|p| p.strip_prefix(&self.repo).ok())
            .map(Path::to_path_buf)
            .ok_or_else(|| fail("the worktree is not below its repository".to_owned()))?;
        let branch_ref = format!("refs/heads/{}", self.branch);
        let (new_branch, base) = match git(&self.repo, &["rev-parse", "--verify", &branch_ref])
            .await
        {
            // The branch survived its tree (removed by hand, say): made again from it, with
            // the first start kept, so the commits a previous run made on it still keep it.
            // From its tip, they would count as nothing new, and `finish` would delete the
            // branch that holds them.
            Ok(_) => (None, self.base.clone()),
            Err(_) => (
                Some(self.branch.as_str()),
                git(&self.repo, &["rev-parse", "HEAD"])
                    .await
                    .map_err(|e| fail(format!("the repository has no commit to start from: {e}")))?
                    .trim()
                    .to_owned(),
            ),
        };
        let start = if new_branch.is_some() {
            &base
        } else {
            &self.branch
        };
        add(&self.repo, &root, &self.path, new_branch, start)
            .await
            .map_err(fail)?;
        Ok(Self {
            repo: self.repo.clone(),
            path: self.path.clone(),
            branch: self.branch.clone(),
            base,
        })
    }

    /// The worktree's directory: the worker's tools take it as their root.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its branch (`forkhive/<slug>`).
    pub fn branch(&self) -> &str {
        &self.branch
    }

    /// The commit it started from.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Removes the worktree and its branch when nothing changed; otherwise keeps both and says
    /// why. A status git cannot give keeps the tree.
    pub async fn finish(&self) -> Finished {
        // Git is pointed at the tree's admin directory, never led there by the tree's own
        // `.git` file: whoever worked in the tree may have rewritten that file to lead to a
        // repository of their own, whose config (`core.fsmonitor`) git would run.
        let admin = match admin_dir(&self.repo, &self.path).await {
            Ok(a) => a,
            Err(e) => return Finished::Kept(Keep::Unknown(e)),
        };
        // Another git holds its index (still running there, or died there): what it is in the
        // middle of is not in the status yet, and `worktree remove` would delete the lock
        // with the tree. Kept, saying so (a tree removed after an `index.lock` failure is how
        // users of other tools have lost work).
        let lock = admin.join("index.lock");
        if tokio::fs::symlink_metadata(&lock).await.is_ok() {
            return Finished::Kept(Keep::Unknown(format!(
                "its index is locked ({}): another git is working in it, or one died there; \
                 remove the lock if no git is running there, then finish it again",
                lock.display()
            )));
        }
        // Ignored files count too: `worktree remove` would delete them (a `.env`, a log).
        let status = match git_in(
            &admin,
            &self.path,
            &[
                "status",
                "--porcelain=v1",
                "--untracked-files=all",
                "--ignored=matching",
            ],
        )
        .await
        {
            Ok(s) => s,
            Err(e) => return Finished::Kept(Keep::Unknown(e)),
        };
        let changed = status.lines().filter(|l| !l.trim().is_empty()).count();
        if changed > 0 {
            return Finished::Kept(Keep::Changes(changed));
        }
        // New commits on HEAD or on the branch (a worker may have moved HEAD away from it).
        let mut commits = 0;
        for tip in ["HEAD".to_owned(), format!("refs/heads/{}", self.branch)] {
            let range = format!("{}..{tip}", self.base);
            match git_in(&admin, &self.path, &["rev-list", "--count", &range]).await {
                Ok(n) => match n.trim().parse::<u64>() {
                    Ok(n) => commits = commits.max(n),
                    Err(_) => {
                        return Finished::Kept(Keep::Unknown(format!("rev-list said {n:?}")));
                    }
                },
                Err(e) => return Finished::Kept(Keep::Unknown(e)),
            }
        }
        if commits > 0 {
            return Finished::Kept(Keep::Commits(commits));
        }
        let path = self.path.to_string_lossy().into_owned();
        // Without --force: should anything have appeared since the status, git refuses and
        // the tree is kept.
        if let Err(e) = git(&self.repo, &["worktree", "remove", &path]).await {
            return Finished::Kept(Keep::Unknown(e));
        }
        // Only while it still points at the start: a commit made since is never deleted.
        let branch_ref = format!("refs/heads/{}", self.branch);
        if let Err(e) = git(&self.repo, &["update-ref", "-d", &branch_ref, &self.base]).await {
            tracing::warn!(branch = %self.branch, "worktree removed, its branch kept: {e}");
        }
        Finished::Removed
    }
}

/// A stale worktree [`Worktree::prune`] looked at: removed, or kept and why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stale {
    /// Its directory.
    pub path: PathBuf,
    /// Its branch.
    pub branch: String,
    /// What became of it.
    pub outcome: Finished,
}

impl Worktree {
    /// Cleans up after workers whose process is gone: each worktree of the repository at
    /// `repo` under `root` (default [`DEFAULT_ROOT`]) on a `forkhive/` branch, untouched for
    /// `older_than`, whose owner is gone (`live(slug)` is false: a host passes whether the
    /// task named by the slug still runs), is removed with its branch when it is clean — no
    /// changed, untracked or ignored file, and no commit that only its branch holds. Any other
    /// is kept, and the result says why; a tree that is too young or live is not listed.
    ///
    /// Errors ([`Error::Worktree`]): a directory that is not in a git repository, or git
    /// failing to list the worktrees.
    pub async fn prune(
        repo: &Path,
        root: Option<&Path>,
        older_than: Duration,
        live: impl Fn(&str) -> bool,
    ) -> Result<Vec<Stale>> {
        let fail = |message: String| Error::Worktree {
            path: repo.to_path_buf(),
            message,
        };
        let top = PathBuf::from(
            git(repo, &["rev-parse", "--show-toplevel"])
                .await
                .map_err(|e| fail(format!("not a git repository: {e}")))?
                .trim(),
        );
        let under = top.join(root.unwrap_or(Path::new(DEFAULT_ROOT)));
        let listing = git(&top, &["worktree", "list", "--porcelain"])
            .await
            .map_err(|e| fail(format!("git worktree list failed: {e}")))?;
        let mut out = Vec::new();
        for block in listing.split("\n\n") {
            let field = |key: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(key).map(str::to_owned))
            };
            let Some(path) = field("worktree ").map(PathBuf::from) else {
                continue;
            };
            let Ok(slug) = path
                .strip_prefix(&under)
                .map(|s| s.to_string_lossy().into_owned())
            else {
                continue;
            };
            let Some(branch) = field("branch refs/heads/").filter(|b| b.starts_with("forkhive/"))
            else {
                continue;
            };
            if live(&slug) {
                continue;
            }
            // A tree git does not know the admin directory of is not one to judge.
            let admin = match admin_dir(&top, &path).await {
                Ok(a) => a,
                Err(_) => continue,
            };
            if !untouched_for(&path, &admin, older_than).await {
                continue;
            }
            let branch_ref = format!("refs/heads/{branch}");
            let only_here = git(
                &top,
                &[
                    "rev-list",
                    "--count",
                    &branch_ref,
                    "--not",
                    // `--exclude` before `--branches` takes the name without `refs/heads/`.
                    &format!("--exclude={branch}"),
                    "--branches",
                ],
            )
            .await
            .map(|n| n.trim().parse::<u64>());
            let outcome = match only_here {
                Ok(Ok(0)) => match git(&top, &["rev-parse", &branch_ref]).await {
                    // Made by a process that died before the tree was checked out (git may
                    // still hold it locked, "initializing"): nobody ever worked in it, though
                    // git would call its every file deleted.
                    Ok(tip)
                        if untouched_for(&path, &admin, older_than.max(UNBORN_AFTER)).await
                            && never_checked_out(&path, &admin).await =>
                    {
                        remove_unborn(&top, &path, &branch_ref, tip.trim()).await
                    }
                    // Its start is its tip: `finish` removes it only if nothing else changed.
                    Ok(tip) => {
                        Worktree {
                            repo: top.clone(),
                            path: path.clone(),
                            branch: branch.clone(),
                            base: tip.trim().to_owned(),
                        }
                        .finish()
                        .await
                    }
                    Err(e) => Finished::Kept(Keep::Unknown(e)),
                },
                Ok(Ok(n)) => Finished::Kept(Keep::Commits(n)),
                Ok(Err(_)) => Finished::Kept(Keep::Unknown("rev-list gave no count".to_owned())),
                Err(e) => Finished::Kept(Keep::Unknown(e)),
            };
            out.push(Stale {
                path,
                branch,
                outcome,
            });
        }
        Ok(out)
    }
}

/// How long a tree must have stood unchecked-out before [`Worktree::prune`] takes its maker
/// for dead, whatever `older_than` it is given: making one takes milliseconds, and another
/// process may be making it right now.
const UNBORN_AFTER: Duration = Duration::from_secs(10 * 60);

/// Whether the tree at `path` was never checked out: its directory holds nothing but its
/// `.git` file, and it has no index in its admin directory `admin` (which `git worktree add
/// --no-checkout` leaves, and the checkout writes; a tree whose files were all removed with
/// `git rm` still has one).
async fn never_checked_out(path: &Path, admin: &Path) -> bool {
    let Ok(mut entries) = tokio::fs::read_dir(path).await else {
        return false;
    };
    let mut names = Vec::new();
    while let Ok(Some(e)) = entries.next_entry().await {
        names.push(e.file_name());
        if names.len() > 1 {
            return false;
        }
    }
    if names.len() != 1 || names[0] != ".git" {
        return false;
    }
    matches!(
        tokio::fs::symlink_metadata(admin.join("index")).await,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound
    )
}

/// Removes a tree that was never checked out (see [`never_checked_out`]), lock and all, and its
/// branch while it still points at `tip`.
async fn remove_unborn(top: &Path, path: &Path, branch_ref: &str, tip: &str) -> Finished {
    let path = path.to_string_lossy().into_owned();
    // Twice forced: once for the "deleted" files it never had, once for the lock of the
    // `git worktree add` that died.
    if let Err(e) = git(top, &["worktree", "remove", "--force", "--force", &path]).await {
        return Finished::Kept(Keep::Unknown(e));
    }
    if let Err(e) = git(top, &["update-ref", "-d", branch_ref, tip]).await {
        tracing::warn!(branch = %branch_ref, "worktree removed, its branch kept: {e}");
    }
    Finished::Removed
}

/// Whether nothing in the tree's directory or its index (in its admin directory `admin`)
/// changed for `age` (a tree that cannot be looked at counts as touched: it is left alone).
async fn untouched_for(path: &Path, admin: &Path, age: Duration) -> bool {
    let index = admin.join("index");
    let now = std::time::SystemTime::now();
    for (p, needed) in [(path.to_path_buf(), true), (index, false)] {
        match tokio::fs::metadata(&p).await.and_then(|m| m.modified()) {
            Ok(t) if now.duration_since(t).unwrap_or_default() >= age => {}
            // A tree never checked out has no index yet.
            Err(e) if !needed && e.kind() == std::io::ErrorKind::NotFound => {}
            _ => return false,
        }
    }
    true
}

/// `git worktree add` of `path` at `start` (on a new `branch`, or checking out the existing
/// branch `start` when `branch` is `None`), then its files checked out.
/// Whether a failed `worktree add -b` says the branch already existed (so it did not make
/// it): `fatal: a branch named '…' already exists`.
fn branch_was_there(error: &str) -> bool {
    error.contains("a branch named")
}

async fn add(
    top: &Path,
    root: &Path,
    path: &Path,
    branch: Option<&str>,
    start: &str,
) -> std::result::Result<(), String> {
    let path_arg = path.to_string_lossy().into_owned();
    let mut args = vec!["worktree", "add", "--no-checkout"];
    if let Some(b) = branch {
        // `--no-track` only with a new branch: git refuses it for an existing one.
        args.extend(["--no-track", "-b", b]);
    }
    args.extend([path_arg.as_str(), start]);
    {
        // One `worktree add` at a time in this process: concurrent ones do not only contend
        // for git's lock files, git also reads the other trees' half-written admin files
        // ("failed to read .git/worktrees/<name>/commondir") and fails. Other processes are
        // met with retries on both ("Coordinator Mode — gotchas": parallel adds race; peers'
        // users report them failing on git's lock files). Only the registration is serialised
        // (`--no-checkout`); each tree's files are written below, in parallel.
        static CREATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let _one_at_a_time = CREATING.lock().await;
        // The trees live inside the checkout: keep them out of the main checkout's status
        // (and out of a `git add -A`) through the repository's own exclude file.
        exclude(top, root)
            .await
            .map_err(|e| format!("could not exclude the worktrees directory: {e}"))?;
        // `worktree add -b` makes the branch before it looks at the path: a failed add can
        // leave a branch behind, which every later add of the name then meets. One this add
        // made is taken away again (only while it still points where it started); one that
        // was there before is never touched.
        let made_here = match branch {
            Some(b) => git(
                top,
                &[
                    "rev-parse",
                    "--verify",
                    "--quiet",
                    &format!("refs/heads/{b}"),
                ],
            )
            .await
            .is_err(),
            None => false,
        };
        let mut delay = Duration::from_millis(10);
        let mut attempt = 1;
        loop {
            match git(top, &args).await {
                Ok(_) => break,
                // Another process holds one of git's lock files, or is half-way through adding
                // a tree of its own: wait and try again.
                Err(e) if contended(&e) && attempt < LOCK_ATTEMPTS => {
                    // The failed add may have made the new branch already; the retry makes it
                    // again (taken away only while it still points where it started).
                    if let Some(b) = branch.filter(|_| made_here && !branch_was_there(&e)) {
                        let _ = git(
                            top,
                            &["update-ref", "-d", &format!("refs/heads/{b}"), start],
                        )
                        .await;
                    }
                    tokio::time::sleep(delay + jitter(attempt)).await;
                    delay = (delay * 2).min(Duration::from_millis(500));
                    attempt += 1;
                }
                Err(e) => {
                    // Whatever the failure (another add to the last, a path already there),
                    // the branch this add made goes too — not when git says the branch was
                    // there: another process made it between the look above and this add.
                    if let Some(b) = branch.filter(|_| made_here && !branch_was_there(&e)) {
                        let _ = git(
                            top,
                            &["update-ref", "-d", &format!("refs/heads/{b}"), start],
                        )
                        .await;
                    }
                    return Err(format!("git worktree add failed: {e}"));
                }
            }
        }
    }
    // The tree's own index and files: nothing shared with the other trees is locked.
    let checked_out = match admin_dir(top, path).await {
        Ok(admin) => git_in(&admin, path, &["reset", "--hard", "--quiet"]).await,
        Err(e) => Err(e),
    };
    if let Err(e) = checked_out {
        // Nobody has worked in it: take the half-made tree away again, and the branch made
        // for it (only while it still points where it started).
        let _ = git(top, &["worktree", "remove", "--force", &path_arg]).await;
        if let Some(b) = branch {
            let _ = git(
                top,
                &["update-ref", "-d", &format!("refs/heads/{b}"), start],
            )
            .await;
        }
        return Err(format!("checking out the worktree failed: {e}"));
    }
    Ok(())
}

/// Whether a failed `git worktree add` met another process's add rather than a real problem:
/// one of git's lock files held (`….lock`, "could not lock config file"), or another tree's
/// admin files read half-written ("failed to read .git/worktrees/<name>/commondir").
fn contended(stderr: &str) -> bool {
    stderr.contains(".lock")
        || stderr.contains("could not lock")
        || (stderr.contains("failed to read") && stderr.contains("worktrees"))
}

/// Adds `/<root>/` to the repository's `info/exclude` unless it is there.
async fn exclude(top: &Path, root: &Path) -> std::result::Result<(), String> {
    let common = git(top, &["rev-parse", "--git-common-dir"]).await?;
    let common = top.join(common.trim());
    let file = common.join("info").join("exclude");
    let line = format!("/{}/", root.display());
    let current = match tokio::fs::read_to_string(&file).await {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("reading {}: {e}", file.display())),
    };
    if current.lines().any(|l| l.trim() == line) {
        return Ok(());
    }
    tokio::fs::create_dir_all(common.join("info"))
        .await
        .map_err(|e| format!("creating {}: {e}", common.join("info").display()))?;
    let mut text = current;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&line);
    text.push('\n');
    tokio::fs::write(&file, text)
        .await
        .map_err(|e| format!("writing {}: {e}", file.display()))
}

/// A worktree between its creation and the owner that finishes it (a child's supervisor):
/// if it is dropped before [`take`](Self::take) — the spawn failed, or the future making it
/// was dropped — it finishes the tree in a task of its own (removed, since nobody worked in
/// it), so no path leaves a tree behind without an owner.
#[derive(Debug)]
pub struct Unfinished(Option<Worktree>);

impl Unfinished {
    /// Guards `worktree`.
    pub fn new(worktree: Worktree) -> Self {
        Self(Some(worktree))
    }

    /// The worktree, for its owner to finish.
    pub fn take(mut self) -> Option<Worktree> {
        self.0.take()
    }

    /// The worktree, while guarded.
    pub fn get(&self) -> Option<&Worktree> {
        self.0.as_ref()
    }

    /// Finishes the tree now ([`Worktree::finish`]: removed when nobody worked in it), on a
    /// task of its own, and waits for it: dropping this future does not stop the finish
    /// halfway.
    pub async fn finish(mut self) -> Finished {
        let Some(wt) = self.0.take() else {
            return Finished::Removed;
        };
        match tokio::spawn(async move { wt.finish().await }).await {
            Ok(done) => done,
            Err(e) => Finished::Kept(Keep::Unknown(format!("finishing it failed: {e}"))),
        }
    }
}

/// Runs `making` (a tree being made) on a task of its own and waits for the tree. If this
/// future is dropped first, the task goes on, and the tree it makes — held by an
/// [`Unfinished`] nobody takes — is finished when the task's output is dropped.
async fn made(
    at: PathBuf,
    making: impl Future<Output = Result<Worktree>> + Send + 'static,
) -> Result<Worktree> {
    let task = tokio::spawn(async move { making.await.map(Unfinished::new) });
    match task.await {
        Ok(Ok(guard)) => guard.take().ok_or_else(|| Error::Worktree {
            path: at,
            message: "the tree was taken before it was handed over".to_owned(),
        }),
        Ok(Err(e)) => Err(e),
        Err(e) => Err(Error::Worktree {
            path: at,
            message: format!("making the worktree failed: {e}"),
        }),
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        let Some(wt) = self.0.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let _ = wt.finish().await;
                });
            }
            // No runtime to ask git with: kept, never removed on a guess.
            Err(_) => tracing::warn!(path = %wt.path().display(), "worktree left unfinished"),
        }
    }
}

/// A little spread, so workers that collided do not retry in step.
fn jitter(attempt: u32) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    Duration::from_millis(u64::from(
        (nanos ^ attempt.wrapping_mul(2_654_435_761)) % 10,
    ))
}

/// Runs `git -C dir args…`; its stdout, or what it said on stderr (or why it could not run).
///
/// Only for directories the host owns (the repository's checkout): in a worker's tree, git
/// would take the tree's `.git` file for the way to its repository. Use [`git_in`] there.
async fn git(dir: &Path, args: &[&str]) -> std::result::Result<String, String> {
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("-C").arg(dir).args(args);
    run_git(cmd).await
}

/// Runs git on the worker's tree at `path` with its admin directory `admin` named outright
/// (`--git-dir`, `--work-tree`), so nothing written in the tree chooses the repository or its
/// config; the file system monitor is off besides (a config that names one runs it as a
/// command). Git still reads the host's own config: a filter the worker's `.gitattributes`
/// names runs only if the host's config defines it.
async fn git_in(admin: &Path, path: &Path, args: &[&str]) -> std::result::Result<String, String> {
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("-C")
        .arg(path)
        .arg("--git-dir")
        .arg(admin)
        .arg("--work-tree")
        .arg(path)
        // A status takes the index's lock to refresh it, unless told not to: one killed at
        // its time limit (or dropped) would leave the lock, and the tree would be kept for it
        // from then on (see `finish`).
        .arg("--no-optional-locks")
        .args(["-c", "core.fsmonitor=false"])
        .args(args);
    run_git(cmd).await
}

/// How long one git command may take.
const GIT_LIMIT: Duration = Duration::from_secs(300);

async fn run_git(mut cmd: tokio::process::Command) -> std::result::Result<String, String> {
    // The repository is named by the arguments alone: a host run from inside a git hook has
    // these set for its own repository, and git would take them over `-C` and `--git-dir`.
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_COMMON_DIR",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_NAMESPACE",
    ] {
        cmd.env_remove(var);
    }
    // Git's messages in English whatever the host's locale: what a failure was (a lock held,
    // a branch already there) is read from them.
    let what = cmd
        .as_std()
        .get_args()
        .map(|a| a.to_string_lossy())
        .filter(|a| !a.starts_with('-') && !a.contains('/') && !a.contains('='))
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    // Bounded: worktrees are made one at a time (under a lock), and one git that never ends
    // (a hook waiting on input, a file system that stopped answering) would hold every later
    // one. The child is killed when its future goes.
    let out = tokio::time::timeout(
        GIT_LIMIT,
        cmd.env("GIT_TERMINAL_PROMPT", "0")
            .env("LC_ALL", "C")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| {
        format!(
            "`git {what}` did not finish within {} minutes; it was stopped",
            GIT_LIMIT.as_secs() / 60
        )
    })?
    .map_err(|e| format!("could not run git: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// The admin directory git keeps for the tree at `path` (`<common dir>/worktrees/<name>`),
/// found from the repository's side — each admin directory's `gitdir` file names its tree's
/// `.git` — and never through the tree's own `.git` file, which whoever works in the tree can
/// rewrite ("Coordinator Mode", gotchas: "assume the worker is hostile").
async fn admin_dir(top: &Path, path: &Path) -> std::result::Result<PathBuf, String> {
    let common = git(top, &["rev-parse", "--git-common-dir"]).await?;
    // Relative to `top` when git gives it relative (`.git`); `join` keeps an absolute one.
    let worktrees = top.join(common.trim()).join("worktrees");
    let want = tokio::fs::canonicalize(path)
        .await
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut entries = tokio::fs::read_dir(&worktrees)
        .await
        .map_err(|e| format!("{}: {e}", worktrees.display()))?;
    while let Ok(Some(entry)) = entries.next_entry().await {
        let Ok(gitdir) = tokio::fs::read_to_string(entry.path().join("gitdir")).await else {
            continue;
        };
        // Relative to the admin directory when git writes relative paths
        // (`worktree.useRelativePaths`); `join` keeps an absolute one as it is.
        let dotgit = entry.path().join(gitdir.trim());
        let Some(tree) = dotgit.parent() else {
            continue;
        };
        if tokio::fs::canonicalize(tree).await.is_ok_and(|t| t == want) {
            return Ok(entry.path());
        }
    }
    Err(format!(
        "git has no worktree registered at {}",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What git prints when another process's `worktree add` is in the way (seen with six
    /// processes adding at once), and what it prints for a real refusal.
    #[test]
    fn another_processs_add_is_told_from_a_real_failure() {
        for met in [
            "fatal: failed to read .git/worktrees/p6-4/commondir: Success",
            "fatal: Unable to create '/r/.git/index.lock': File exists.",
            "error: could not lock config file .git/config: File exists",
        ] {
            assert!(contended(met), "{met}");
        }
        for real in [
            "fatal: a branch named 'forkhive/a' already exists",
            "fatal: '/r/.forkhive/worktrees/a' already exists",
            "fatal: invalid reference: HEAD",
        ] {
            assert!(!contended(real), "{real}");
        }
    }

    /// The admin directory is found whether git wrote the tree's path into it absolute (the
    /// default) or relative to it (`worktree.useRelativePaths`, git 2.48 on).
    #[tokio::test]
    async fn the_admin_directory_is_found_from_an_absolute_or_a_relative_gitdir() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path();
        let sh = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .arg("-C")
                .arg(top)
                .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "{args:?}: {out:?}");
        };
        sh(&["init", "-q", "-b", "main"]);
        sh(&["commit", "-q", "--allow-empty", "-m", "start"]);
        let path = top.join("trees/a");
        sh(&["worktree", "add", "-q", "-b", "t", path.to_str().unwrap()]);
        let admin = std::fs::canonicalize(top.join(".git/worktrees/a")).unwrap();
        let found = admin_dir(top, &path).await.unwrap();
        assert_eq!(std::fs::canonicalize(&found).unwrap(), admin);
        std::fs::write(admin.join("gitdir"), "../../../trees/a/.git\n").unwrap();
        let found = admin_dir(top, &path).await.unwrap();
        assert_eq!(std::fs::canonicalize(&found).unwrap(), admin);
        let other = top.join("trees/b");
        std::fs::create_dir_all(&other).unwrap();
        assert_eq!(
            admin_dir(top, &other).await.unwrap_err(),
            format!("git has no worktree registered at {}", other.display())
        );
    }

    #[test]
    fn slugs_are_checked() {
        assert_eq!(check_slug("fix-auth_2.1"), Ok(()));
        assert_eq!(check_slug("team/fix-auth"), Ok(()));
        for (slug, want) in [
            ("", "a worktree slug may not be empty"),
            ("..", "worktree slug `..` has an empty, `.` or `..` segment"),
            (
                "a/../b",
                "worktree slug `a/../b` has an empty, `.` or `..` segment",
            ),
            (
                "a//b",
                "worktree slug `a//b` has an empty, `.` or `..` segment",
            ),
            (
                "/abs",
                "worktree slug `/abs` has an empty, `.` or `..` segment",
            ),
            ("a/.git", "worktree slug `a/.git` has a `.git` segment"),
            (".GIT", "worktree slug `.GIT` has a `.git` segment"),
            (
                "a b",
                "worktree slug `a b` has ' '; use letters, digits, `.`, `_`, `-` and `/`",
            ),
        ] {
            assert_eq!(check_slug(slug), Err(want.to_owned()), "{slug:?}");
        }
        let long = "a".repeat(MAX_SLUG + 1);
        assert_eq!(
            check_slug(&long),
            Err(format!(
                "worktree slug `{long}` is longer than 64 characters"
            ))
        );
        assert_eq!(check_slug(&"a".repeat(MAX_SLUG)), Ok(()));
    }

    /// A git that never ends is stopped at [`GIT_LIMIT`], and the error names the command.
    #[tokio::test(start_paused = true)]
    async fn a_git_that_never_ends_is_stopped() {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", "sleep 3600", "worktree", "add"]);
        let begun = tokio::time::Instant::now();
        let err = run_git(cmd).await.unwrap_err();
        assert_eq!(
            err,
            "`git sleep 3600 worktree` did not finish within 5 minutes; it was stopped"
        );
        assert_eq!(begun.elapsed(), GIT_LIMIT);
    }
}

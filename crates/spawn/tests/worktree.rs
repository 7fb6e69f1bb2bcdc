//! Worktree isolation against the real git CLI: creation, the keep-or-remove rule on every
//! kind of change, a status git cannot give, a directory that is no repository, and sixteen
//! workers creating theirs at once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

use forkhive_spawn::Error;
use forkhive_spawn::worktree::{Finished, Keep, Worktree};

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A repository with one commit.
fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    git(dir.path(), &["init", "-q", "-b", "main"]);
    std::fs::write(dir.path().join("lib.rs"), "fn a() {}\n").unwrap();
    git(dir.path(), &["add", "."]);
    git(dir.path(), &["commit", "-q", "-m", "start"]);
    dir
}

fn branches(dir: &Path) -> String {
    git(dir, &["branch", "--list", "forkhive/*"])
}

#[tokio::test]
async fn an_untouched_worktree_is_removed_with_its_branch() {
    let repo = repo();
    let wt = Worktree::create(repo.path(), "audit", None).await.unwrap();
    assert!(wt.path().ends_with(".forkhive/worktrees/audit"));
    assert!(wt.path().join("lib.rs").is_file());
    assert_eq!(wt.branch(), "forkhive/audit");
    assert_eq!(branches(repo.path()).trim(), "+ forkhive/audit");
    // The worktrees directory stays out of the main checkout's status.
    assert_eq!(git(repo.path(), &["status", "--porcelain"]), "");
    assert_eq!(wt.finish().await, Finished::Removed);
    assert!(!wt.path().exists());
    assert_eq!(branches(repo.path()), "");
}

/// A resumed worker works in its worktree again: a kept one as it was (same base, so its
/// commits still keep it), a removed one made again at the same path on the same branch.
#[tokio::test]
async fn a_worktree_reopens_as_kept_or_is_made_again_at_its_path() {
    let repo = repo();
    let wt = Worktree::create(repo.path(), "again", None).await.unwrap();
    std::fs::write(wt.path().join("new.rs"), "fn b() {}\n").unwrap();
    git(wt.path(), &["add", "."]);
    git(wt.path(), &["commit", "-q", "-m", "work"]);
    assert_eq!(wt.finish().await, Finished::Kept(Keep::Commits(1)));
    let kept = wt.reopen().await.unwrap();
    assert_eq!(kept, wt);
    assert!(kept.path().join("new.rs").is_file());
    assert_eq!(kept.finish().await, Finished::Kept(Keep::Commits(1)));
    // Removed (merged by hand, tree and branch deleted): made again, from HEAD.
    git(repo.path(), &["merge", "-q", "forkhive/again"]);
    git(
        repo.path(),
        &["worktree", "remove", &wt.path().to_string_lossy()],
    );
    git(repo.path(), &["branch", "-q", "-D", "forkhive/again"]);
    let made = wt.reopen().await.unwrap();
    assert_eq!(made.path(), wt.path());
    assert_eq!(made.branch(), "forkhive/again");
    assert!(
        made.path().join("new.rs").is_file(),
        "from the current HEAD"
    );
    assert_eq!(made.finish().await, Finished::Removed);
    assert_eq!(branches(repo.path()), "");
}

/// A tree removed by hand while its branch, with a run's commit, stays: made again from the
/// branch with the first start, so the commit still keeps it and its branch is never deleted.
/// (Started from the branch's tip, the commit counted as nothing new, and finishing deleted the
/// branch that held it.)
#[tokio::test]
async fn a_tree_made_again_from_its_surviving_branch_keeps_the_branchs_commits() {
    let repo = repo();
    let wt = Worktree::create(repo.path(), "kept", None).await.unwrap();
    std::fs::write(wt.path().join("new.rs"), "fn b() {}\n").unwrap();
    git(wt.path(), &["add", "."]);
    git(wt.path(), &["commit", "-q", "-m", "work"]);
    git(
        repo.path(),
        &["worktree", "remove", &wt.path().to_string_lossy()],
    );
    let made = wt.reopen().await.unwrap();
    assert_eq!(made.base(), wt.base());
    assert!(made.path().join("new.rs").is_file(), "from the branch");
    assert_eq!(made.finish().await, Finished::Kept(Keep::Commits(1)));
    assert_eq!(branches(repo.path()).trim(), "+ forkhive/kept");
}

/// Stale trees of a process that is gone: a clean one is removed with its branch; one with a
/// commit only its branch holds, or an untracked file, is kept and says why; a live or young
/// one is left alone and not listed.
#[tokio::test]
async fn stale_trees_are_pruned_only_when_clean_and_their_owner_is_gone() {
    use std::time::Duration;
    let repo = repo();
    let clean = Worktree::create(repo.path(), "clean", None).await.unwrap();
    let committed = Worktree::create(repo.path(), "committed", None)
        .await
        .unwrap();
    let untracked = Worktree::create(repo.path(), "untracked", None)
        .await
        .unwrap();
    let live = Worktree::create(repo.path(), "live", None).await.unwrap();
    std::fs::write(committed.path().join("new.rs"), "x").unwrap();
    git(committed.path(), &["add", "."]);
    git(committed.path(), &["commit", "-q", "-m", "work"]);
    std::fs::write(untracked.path().join("notes.txt"), "x").unwrap();
    // Young trees are not touched.
    let young = Worktree::prune(repo.path(), None, Duration::from_secs(3600), |_| false)
        .await
        .unwrap();
    assert!(young.is_empty(), "{young:?}");
    let mut pruned = Worktree::prune(repo.path(), None, Duration::ZERO, |slug| slug == "live")
        .await
        .unwrap();
    pruned.sort_by(|a, b| a.branch.cmp(&b.branch));
    let got: Vec<(&str, &Finished)> = pruned
        .iter()
        .map(|s| (s.branch.as_str(), &s.outcome))
        .collect();
    assert_eq!(
        got,
        [
            ("forkhive/clean", &Finished::Removed),
            ("forkhive/committed", &Finished::Kept(Keep::Commits(1))),
            ("forkhive/untracked", &Finished::Kept(Keep::Changes(1))),
        ]
    );
    assert!(!clean.path().exists());
    assert!(committed.path().exists() && untracked.path().exists() && live.path().exists());
    assert!(!branches(repo.path()).contains("forkhive/clean"));
    let outside = tempfile::tempdir().unwrap();
    let e = Worktree::prune(outside.path(), None, Duration::ZERO, |_| false)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not a git repository"), "{e}");
}

/// Trees whose maker died before it checked them out — one still locked by the `git worktree
/// add` that was killed ("initializing"), one registered but never checked out — hold no one's
/// work, though git calls their every file deleted and refuses to remove a locked tree: once
/// they have stood so for ten minutes (another process may be making one right now), they are
/// removed with their branches. A tree whose files its worker removed with `git rm` is kept.
#[tokio::test]
async fn trees_whose_maker_died_before_checkout_are_pruned() {
    use std::time::Duration;
    let repo = repo();
    let root = repo.path().join(".forkhive/worktrees");
    for slug in ["locked", "unchecked"] {
        let at = root.join(slug).to_string_lossy().into_owned();
        git(
            repo.path(),
            &[
                "worktree",
                "add",
                "-q",
                "--no-checkout",
                "--no-track",
                "-b",
                &format!("forkhive/{slug}"),
                &at,
                "HEAD",
            ],
        );
    }
    let locked = root.join("locked").to_string_lossy().into_owned();
    git(
        repo.path(),
        &["worktree", "lock", "--reason", "initializing", &locked],
    );
    let emptied = Worktree::create(repo.path(), "emptied", None)
        .await
        .unwrap();
    git(emptied.path(), &["rm", "-q", "lib.rs"]);
    let outcomes = |pruned: Vec<forkhive_spawn::worktree::Stale>| {
        let mut got: Vec<(String, Finished)> =
            pruned.into_iter().map(|s| (s.branch, s.outcome)).collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        got
    };
    // Just made: perhaps by a process still making them. Nothing is removed.
    let young = Worktree::prune(repo.path(), None, Duration::ZERO, |_| false)
        .await
        .unwrap();
    assert!(
        outcomes(young)
            .iter()
            .all(|(_, o)| matches!(o, Finished::Kept(_))),
    );
    assert!(root.join("locked").exists() && root.join("unchecked").exists());
    // Ten minutes on.
    let then = std::time::SystemTime::now() - Duration::from_secs(11 * 60);
    for slug in ["locked", "unchecked", "emptied"] {
        std::fs::File::open(root.join(slug))
            .unwrap()
            .set_modified(then)
            .unwrap();
    }
    let index = root
        .join("emptied")
        .join(git(&root.join("emptied"), &["rev-parse", "--git-path", "index"]).trim());
    std::fs::File::options()
        .write(true)
        .open(&index)
        .unwrap()
        .set_modified(then)
        .unwrap();
    let got = outcomes(
        Worktree::prune(repo.path(), None, Duration::ZERO, |_| false)
            .await
            .unwrap(),
    );
    assert_eq!(
        got,
        [
            (
                "forkhive/emptied".to_owned(),
                Finished::Kept(Keep::Changes(1))
            ),
            ("forkhive/locked".to_owned(), Finished::Removed),
            ("forkhive/unchecked".to_owned(), Finished::Removed),
        ]
    );
    assert!(!root.join("locked").exists() && !root.join("unchecked").exists());
    assert_eq!(branches(repo.path()).trim(), "+ forkhive/emptied");
    let listed = git(repo.path(), &["worktree", "list"]);
    assert_eq!(listed.lines().count(), 2, "{listed}");
}

/// A worktree dropped before any owner took it (a spawn that failed or was dropped) is
/// finished anyway: untouched, it is removed with its branch.
#[tokio::test]
async fn an_unowned_worktree_is_finished_when_dropped() {
    use forkhive_spawn::worktree::Unfinished;
    let repo = repo();
    let wt = Worktree::create(repo.path(), "orphan", None).await.unwrap();
    let path = wt.path().to_path_buf();
    drop(Unfinished::new(wt));
    let gone = async {
        while path.exists() || !branches(repo.path()).is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), gone)
        .await
        .expect("the dropped worktree was never finished");
    // Taken by an owner, it is the owner's: nothing happens on drop.
    let kept = Worktree::create(repo.path(), "owned", None).await.unwrap();
    let owned = Unfinished::new(kept).take().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(owned.path().exists());
}

/// A creation whose future is dropped at any point (a spawn cancelled while git writes the
/// tree) leaves neither the tree nor its branch: the tree is made on a task of its own, which
/// removes it when nobody is left to take it. Before, git was killed with the dropped future
/// and the registered tree and its branch stayed, with no owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_dropped_at_any_point_leaves_nothing_behind() {
    let repo = repo();
    // Enough files that writing the tree takes a while.
    for i in 0..200 {
        std::fs::write(
            repo.path().join(format!("f{i}.rs")),
            "fn f() {}\n".repeat(50),
        )
        .unwrap();
    }
    git(repo.path(), &["add", "."]);
    git(repo.path(), &["commit", "-q", "-m", "files"]);
    let mut made_after_drop = 0;
    for (round, wait_ms) in [0u64, 2, 5, 10, 20, 40, 80].into_iter().enumerate() {
        let slug = format!("cut-{round}");
        let create = Worktree::create(repo.path(), &slug, None);
        if let Ok(made) =
            tokio::time::timeout(std::time::Duration::from_millis(wait_ms), create).await
        {
            // Made in time: the caller owns it, and finishes it.
            assert_eq!(made.unwrap().finish().await, Finished::Removed);
        }
        // Settles: made and removed, or never made.
        let tree = repo.path().join(".forkhive/worktrees").join(&slug);
        let mut settled = false;
        // Asked while a tree is being registered, git may fail to read its half-written admin
        // files (`git branch` reads them too): not settled yet.
        let ask = |args: &[&str]| {
            Command::new("git")
                .arg("-C")
                .arg(repo.path())
                .args(args)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        };
        for _ in 0..400 {
            let listed = ask(&["worktree", "list", "--porcelain"]);
            if listed.is_some_and(|l| !l.contains(&slug))
                && ask(&["branch", "--list", "forkhive/*"]).is_some_and(|b| b.is_empty())
                && !tree.exists()
            {
                settled = true;
                break;
            }
            made_after_drop += 1;
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        assert!(
            settled,
            "after a drop at {wait_ms} ms: {} / {}",
            git(repo.path(), &["worktree", "list"]),
            branches(repo.path())
        );
    }
    assert!(
        made_after_drop > 0,
        "no drop came while the tree was being made"
    );
}

/// Ignored files and commits moved off HEAD are work too: the tree is kept.
#[tokio::test]
async fn ignored_files_and_commits_off_head_keep_the_tree() {
    let repo = repo();
    std::fs::write(repo.path().join(".gitignore"), "*.log\n").unwrap();
    git(repo.path(), &["add", ".gitignore"]);
    git(repo.path(), &["commit", "-q", "-m", "ignore logs"]);
    let ignored = Worktree::create(repo.path(), "logs", None).await.unwrap();
    std::fs::write(ignored.path().join("build.log"), "hours of output").unwrap();
    assert_eq!(ignored.finish().await, Finished::Kept(Keep::Changes(1)));
    assert!(ignored.path().join("build.log").exists());

    let detached = Worktree::create(repo.path(), "detached", None)
        .await
        .unwrap();
    std::fs::write(detached.path().join("lib.rs"), "fn d() {}\n").unwrap();
    git(detached.path(), &["commit", "-q", "-am", "work"]);
    git(
        detached.path(),
        &["checkout", "-q", "--detach", detached.base()],
    );
    assert_eq!(detached.finish().await, Finished::Kept(Keep::Commits(1)));
    assert!(branches(repo.path()).contains("forkhive/detached"));
}

#[tokio::test]
async fn any_change_keeps_the_worktree_and_says_which() {
    let repo = repo();
    // Untracked, modified, staged, committed: each keeps the tree and its branch.
    let untracked = Worktree::create(repo.path(), "new-file", None)
        .await
        .unwrap();
    std::fs::write(untracked.path().join("notes.txt"), "x").unwrap();
    assert_eq!(untracked.finish().await, Finished::Kept(Keep::Changes(1)));

    let modified = Worktree::create(repo.path(), "edit", None).await.unwrap();
    std::fs::write(modified.path().join("lib.rs"), "fn b() {}\n").unwrap();
    assert_eq!(modified.finish().await, Finished::Kept(Keep::Changes(1)));

    let staged = Worktree::create(repo.path(), "staged", None).await.unwrap();
    std::fs::write(staged.path().join("new.rs"), "").unwrap();
    git(staged.path(), &["add", "new.rs"]);
    assert_eq!(staged.finish().await, Finished::Kept(Keep::Changes(1)));

    let committed = Worktree::create(repo.path(), "team/commit", None)
        .await
        .unwrap();
    std::fs::write(committed.path().join("lib.rs"), "fn c() {}\n").unwrap();
    git(committed.path(), &["commit", "-q", "-am", "work"]);
    let kept = committed.finish().await;
    assert_eq!(kept, Finished::Kept(Keep::Commits(1)));
    let Finished::Kept(why) = kept else {
        unreachable!()
    };
    assert_eq!(why.to_string(), "1 new commit(s) on its branch");

    for wt in [&untracked, &modified, &staged, &committed] {
        assert!(wt.path().exists(), "{}", wt.branch());
        assert!(branches(repo.path()).contains(wt.branch()));
    }
    // Each worker's commit went to its own branch only.
    assert_eq!(
        git(repo.path(), &["log", "--oneline", "main"])
            .lines()
            .count(),
        1
    );
}

/// A tree whose status git cannot give is kept, never removed on a guess: its index is
/// damaged, or the link from the tree to its repository is broken.
#[tokio::test]
async fn an_unreadable_status_keeps_the_tree() {
    let repo = repo();
    let wt = Worktree::create(repo.path(), "broken", None).await.unwrap();
    let index = git(
        wt.path(),
        &["rev-parse", "--path-format=absolute", "--git-path", "index"],
    );
    std::fs::write(index.trim(), "not an index").unwrap();
    match wt.finish().await {
        Finished::Kept(Keep::Unknown(why)) => assert!(why.contains("index"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(wt.path().join("lib.rs").exists());
    let cut = Worktree::create(repo.path(), "cut", None).await.unwrap();
    std::fs::write(cut.path().join(".git"), "gitdir: /nonexistent/forkhive\n").unwrap();
    match cut.finish().await {
        Finished::Kept(Keep::Unknown(why)) => {
            assert!(why.contains("validation failed"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert!(cut.path().join("lib.rs").exists());
}

/// A tree whose index another git holds (`index.lock`: a git still running there, or one
/// that died) is never removed under the lock, with a change in it or without: it is kept,
/// saying why; once the lock is gone, an untouched tree is removed as any is.
#[tokio::test]
async fn a_tree_whose_index_is_locked_is_never_removed_under_the_lock() {
    let repo = repo();
    let lock_of = |wt: &Worktree| {
        let index = git(
            wt.path(),
            &["rev-parse", "--path-format=absolute", "--git-path", "index"],
        );
        std::path::PathBuf::from(format!("{}.lock", index.trim()))
    };
    let locked = |finished: Finished, lock: &Path| match finished {
        Finished::Kept(Keep::Unknown(why)) => assert_eq!(
            why,
            format!(
                "its index is locked ({}): another git is working in it, or one died there; \
                 remove the lock if no git is running there, then finish it again",
                lock.display()
            )
        ),
        other => panic!("{other:?}"),
    };
    // Work in it, and the index locked.
    let busy = Worktree::create(repo.path(), "busy", None).await.unwrap();
    std::fs::write(busy.path().join("lib.rs"), "changed\n").unwrap();
    let lock = lock_of(&busy);
    std::fs::write(&lock, "").unwrap();
    locked(busy.finish().await, &lock);
    assert_eq!(
        std::fs::read_to_string(busy.path().join("lib.rs")).unwrap(),
        "changed\n"
    );
    // Nothing in it (to the status), the index locked: kept too.
    let idle = Worktree::create(repo.path(), "idle", None).await.unwrap();
    let lock = lock_of(&idle);
    std::fs::write(&lock, "").unwrap();
    locked(idle.finish().await, &lock);
    assert!(idle.path().join("lib.rs").exists());
    // The lock gone: removed.
    std::fs::remove_file(&lock).unwrap();
    assert!(matches!(idle.finish().await, Finished::Removed));
    assert!(!idle.path().exists());
}

/// A worker that rewrites its tree's `.git` file to lead to a repository of its own, whose
/// config names a file system monitor, does not get git to run it in the owner's process when
/// its tree is finished or pruned: git is pointed at the tree's admin directory, not led by
/// the tree. The tree is kept (it holds the worker's files).
#[tokio::test]
async fn a_tree_whose_git_file_was_rewritten_runs_nothing_it_names() {
    use std::time::Duration;
    let repo = repo();
    let wt = Worktree::create(repo.path(), "hostile", None)
        .await
        .unwrap();
    let marker = repo.path().join("ran");
    let plant = |at: &Path| {
        let own = at.join(".x");
        git(at, &["init", "-q", "--bare", own.to_str().unwrap()]);
        let config = own.join("config");
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str(&format!(
            "[core]\n\tbare = false\n\tfsmonitor = \"touch {}; false\"\n",
            marker.display()
        ));
        std::fs::write(&config, text).unwrap();
        std::fs::write(at.join(".git"), "gitdir: .x\n").unwrap();
    };
    plant(wt.path());
    // What a git led by the tree does: the monitor runs (the check that the plant works).
    let led = Command::new("git")
        .arg("-C")
        .arg(wt.path())
        .args(["status", "--porcelain"])
        .output()
        .unwrap();
    assert!(led.status.success());
    assert!(
        marker.exists(),
        "the planted monitor should run under a plain `git status`"
    );
    std::fs::remove_file(&marker).unwrap();
    match wt.finish().await {
        Finished::Kept(Keep::Changes(n)) => assert!(n > 0),
        other => panic!("{other:?}"),
    }
    assert!(
        !marker.exists(),
        "finishing the tree ran the worker's monitor"
    );
    let pruned = Worktree::prune(repo.path(), None, Duration::ZERO, |_| false)
        .await
        .unwrap();
    assert_eq!(pruned.len(), 1, "{pruned:?}");
    assert!(
        matches!(pruned[0].outcome, Finished::Kept(Keep::Changes(_))),
        "{pruned:?}"
    );
    assert!(
        !marker.exists(),
        "pruning the tree ran the worker's monitor"
    );
    assert!(wt.path().join("lib.rs").exists());
}

#[tokio::test]
async fn a_directory_outside_git_and_a_bad_slug_are_refused() {
    let plain = tempfile::tempdir().unwrap();
    let err = Worktree::create(plain.path(), "x", None).await.unwrap_err();
    assert!(matches!(err, Error::Worktree { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "worktree in {}: not a git repository: fatal: not a git repository",
            plain.path().display()
        )),
        "{text}"
    );
    let repo = repo();
    let err = Worktree::create(repo.path(), "../escape", None)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "worktree in {}: worktree slug `../escape` has an empty, `.` or `..` segment",
            repo.path().display()
        )
    );
    // The same slug twice: git refuses, in its own words.
    Worktree::create(repo.path(), "twice", None).await.unwrap();
    let err = Worktree::create(repo.path(), "twice", None)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("fatal: a branch named 'forkhive/twice' already exists"),
        "{err}"
    );
    // The branch that was there before is untouched.
    assert!(branches(repo.path()).contains("forkhive/twice"));
    // A path already there: git makes the branch before it looks at the path, and the
    // failed creation takes it away again, so a later one of the name is not refused for it;
    // what was at the path is left as it was.
    let taken = repo.path().join(".forkhive/worktrees/pre");
    std::fs::create_dir_all(&taken).unwrap();
    std::fs::write(taken.join("keep.txt"), "mine").unwrap();
    let err = Worktree::create(repo.path(), "pre", None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert!(
        !branches(repo.path()).contains("forkhive/pre"),
        "{}",
        branches(repo.path())
    );
    assert_eq!(
        std::fs::read_to_string(taken.join("keep.txt")).unwrap(),
        "mine"
    );
    std::fs::remove_dir_all(&taken).unwrap();
    let wt = Worktree::create(repo.path(), "pre", None).await.unwrap();
    assert_eq!(wt.branch(), "forkhive/pre");
}

/// Sixteen workers start together: git's lock files are contended, and every creation still
/// succeeds, each on its own branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_worktrees_created_at_once_all_succeed() {
    let repo = repo();
    let root = repo.path().to_path_buf();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let root = root.clone();
            tokio::spawn(async move { Worktree::create(&root, &format!("w{i}"), None).await })
        })
        .collect();
    let mut made = Vec::new();
    for t in tasks {
        made.push(t.await.unwrap().unwrap());
    }
    assert_eq!(branches(repo.path()).lines().count(), 16);
    for wt in &made {
        assert_eq!(wt.finish().await, Finished::Removed);
    }
    assert_eq!(branches(repo.path()), "");
}

/// Run as a child process by the test below: creates `FORKHIVE_WT_EACH` worktrees, one after
/// another, named after writer `FORKHIVE_WT_WRITER`.
#[tokio::test]
#[ignore = "a process for worktrees_created_by_six_processes_at_once_all_succeed"]
async fn worktree_creator_process() {
    let (Ok(repo), Ok(n), Ok(each)) = (
        std::env::var("FORKHIVE_WT_REPO"),
        std::env::var("FORKHIVE_WT_WRITER"),
        std::env::var("FORKHIVE_WT_EACH"),
    ) else {
        return;
    };
    for i in 0..each.parse::<usize>().unwrap() {
        if let Err(e) = Worktree::create(Path::new(&repo), &format!("p{n}-{i}"), None).await {
            panic!("process {n}, tree {i}: {e}");
        }
    }
}

/// Two workers committing in their trees at the same time each commit to their own branch:
/// neither branch holds the other's commits, and the main branch holds neither (a peer's users
/// report agents committing to each other's branches).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_in_two_trees_at_once_stay_on_their_own_branches() {
    let repo = repo();
    let a = Worktree::create(repo.path(), "a", None).await.unwrap();
    let b = Worktree::create(repo.path(), "b", None).await.unwrap();
    let commit = |dir: std::path::PathBuf, who: &'static str| {
        std::thread::spawn(move || {
            for i in 0..5 {
                std::fs::write(dir.join(format!("{who}{i}.txt")), "x").unwrap();
                git(&dir, &["add", "."]);
                git(&dir, &["commit", "-q", "-m", &format!("{who} {i}")]);
            }
        })
    };
    let (ta, tb) = (
        commit(a.path().to_path_buf(), "a"),
        commit(b.path().to_path_buf(), "b"),
    );
    ta.join().unwrap();
    tb.join().unwrap();
    let log = |range: &str| git(repo.path(), &["log", "--format=%s", range]);
    let (on_a, on_b) = (log("main..forkhive/a"), log("main..forkhive/b"));
    assert_eq!(on_a.lines().count(), 5, "{on_a}");
    assert!(on_a.lines().all(|l| l.starts_with("a ")), "{on_a}");
    assert_eq!(on_b.lines().count(), 5, "{on_b}");
    assert!(on_b.lines().all(|l| l.starts_with("b ")), "{on_b}");
    assert_eq!(log("main").trim(), "start");
    assert_eq!(a.finish().await, Finished::Kept(Keep::Commits(5)));
    assert_eq!(b.finish().await, Finished::Kept(Keep::Commits(5)));
}

/// Six processes create ten worktrees each in one repository at the same time (hosts sharing
/// a checkout): each process serialises its own adds, so they meet only through git, whose
/// lock files and half-written admin files fail an add now and then. Every tree is made, on
/// its own branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worktrees_created_by_six_processes_at_once_all_succeed() {
    let repo = repo();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..6)
        .map(|n| {
            tokio::process::Command::new(&exe)
                .args(["--exact", "worktree_creator_process", "--ignored"])
                .env("FORKHIVE_WT_REPO", repo.path())
                .env("FORKHIVE_WT_WRITER", n.to_string())
                .env("FORKHIVE_WT_EACH", "10")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().await.unwrap();
        assert!(
            out.status.success(),
            "a creator failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(branches(repo.path()).lines().count(), 60);
    let listed = git(repo.path(), &["worktree", "list"]);
    assert_eq!(listed.lines().count(), 61, "{listed}");
}

mod support;

/// A worker started with `isolation: "worktree"` works in its own checkout: its `LS` sees the
/// worktree, not the main one; untouched, the tree is gone at the end; with a new file, it is
/// kept and the notification names it.
#[tokio::test]
async fn a_worker_in_a_worktree_sees_it_and_its_owner_keeps_or_removes_it() {
    use forkhive_core::notification::find_notifications;
    use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
    use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
    use forkhive_spawn::runtime::{Agent, AgentContext, StopReason};
    use forkhive_spawn::tool::{ListDir, Tool, ToolPool};
    use std::sync::Arc;
    use support::*;

    let repo = repo();
    // Something only the main checkout has: the worktrees' own directory appears there.
    let root = repo.path().to_path_buf();
    // The children's user context: the host's `cwd` entry names a directory they do not work in.
    type Contexts = Arc<std::sync::Mutex<Vec<Vec<(String, String)>>>>;
    let contexts: Contexts = Arc::default();
    let seen = Arc::clone(&contexts);
    let b = brain(move |r| {
        if !is_parent(r) {
            let me = AgentContext::current().unwrap();
            if r.all_messages().len() == 1 {
                seen.lock().unwrap().push(r.prefix.user_context().to_vec());
                return Plan::Reply(calls(&[("l1", "LS", "{}")]));
            }
            let (_, listing, is_error) = results(r).pop().unwrap();
            assert!(!is_error, "{listing}");
            assert!(listing.contains("lib.rs"), "{listing}");
            assert!(
                !listing.contains(".forkhive"),
                "the worker saw the main checkout: {listing}"
            );
            {
                // The "keep" worker leaves a file behind.
                let prompt = r.all_messages()[0].text();
                if prompt.contains("leave a note") {
                    let wt = root
                        .join(".forkhive/worktrees")
                        .join(format!("agent-{}", me.id()));
                    std::fs::write(wt.join("NOTE.md"), "found it").unwrap();
                }
            }
            return Plan::Reply(say("done"));
        }
        match r.all_messages().len() {
            1 => Plan::Reply(calls(&[
                (
                    "a1",
                    "Agent",
                    r#"{"description":"look","prompt":"look around","subagent_type":"worker","isolation":"worktree","run_in_background":true}"#,
                ),
                (
                    "a2",
                    "Agent",
                    r#"{"description":"note","prompt":"leave a note","subagent_type":"worker","isolation":"worktree","run_in_background":true}"#,
                ),
                (
                    "a3",
                    "Agent",
                    r#"{"description":"bad","prompt":"p","subagent_type":"worker","isolation":"docker"}"#,
                ),
                // In the foreground: its result says where its kept worktree is.
                (
                    "a4",
                    "Agent",
                    r#"{"description":"fg","prompt":"leave a note","subagent_type":"worker","isolation":"worktree"}"#,
                ),
            ])),
            _ => Plan::Reply(say("all done")),
        }
    });
    let mut w = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([w]))
        .with_isolation_enabled(true)
        .with_worktree_repo(Some(repo.path().to_path_buf()))
        .with_subagent_user_context(vec![("cwd".to_owned(), "/the/host/dir".to_owned())]);
    let tools = ToolPool::new([
        AgentTool::new(config).unwrap().arc(),
        Arc::new(ListDir::new(repo.path()).await.unwrap()) as Arc<dyn Tool>,
    ])
    .unwrap();
    // The main checkout has the worktrees directory once a worktree exists.
    let mut parent = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .build()
        .await
        .unwrap();
    let run = parent.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let msgs = parent.params().messages().to_vec();
    let refused = message_results(&msgs[2]);
    assert_eq!(
        (refused[2].1.as_str(), refused[2].2),
        (
            "invalid input for tool `Agent`:\nat /isolation: \"docker\" is not one of \"worktree\" or \"none\"",
            true
        )
    );
    let ns: Vec<_> = msgs
        .iter()
        .flat_map(|m| find_notifications(m).unwrap())
        .collect();
    assert_eq!(ns.len(), 2);
    let look = ns.iter().find(|n| n.summary.contains("look")).unwrap();
    let note = ns.iter().find(|n| n.summary.contains("note")).unwrap();
    assert_eq!(look.worktree, None, "an untouched worktree is removed");
    let kept = note.worktree.as_ref().expect("a changed worktree is kept");
    assert!(kept.path.ends_with(&format!("agent-{}", note.task_id)));
    assert_eq!(kept.branch, format!("forkhive/agent-{}", note.task_id));
    assert_eq!(
        note.note.as_deref(),
        Some("worktree kept: 1 changed or untracked file(s)")
    );
    assert!(std::path::Path::new(&kept.path).join("NOTE.md").exists());
    let all = branches(repo.path());
    assert!(
        all.contains(&format!("+ forkhive/agent-{}", note.task_id)),
        "{all}"
    );
    // The foreground worker's result names its kept tree and branch.
    let fg = &refused[3].1;
    let (_, kept_line) = fg
        .split_once("\n[its worktree was kept, with its changes: ")
        .unwrap_or_else(|| panic!("{fg}"));
    let (path, branch) = kept_line
        .strip_suffix(']')
        .and_then(|l| l.split_once(" on branch "))
        .unwrap_or_else(|| panic!("{fg}"));
    assert!(std::path::Path::new(path).join("NOTE.md").exists(), "{fg}");
    assert!(!fg.contains("[worktree kept:"), "said once: {fg}");
    assert!(all.contains(&format!("+ {branch}")), "{all} / {fg}");
    assert_eq!(all.lines().count(), 2, "{all}");
    let contexts = contexts.lock().unwrap();
    assert_eq!(contexts.len(), 3);
    for context in contexts.iter() {
        let keys: Vec<&str> = context.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["worktree"], "{context:?}");
    }
}

/// Teammates started with `isolation: "worktree"` each work in a worktree of their own, not
/// in the lead's checkout: each one's listing shows its own tree, each writes only there, and
/// each tree is kept on its own branch when its teammate shuts down (a peer's users report
/// teammates' isolation ignored, and agents committing to each other's branches).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teammates_in_worktrees_each_work_in_their_own() {
    use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
    use forkhive_spawn::control::SendMessageTool;
    use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
    use forkhive_spawn::mailbox::MemoryMailbox;
    use forkhive_spawn::runtime::{Agent, AgentContext, StopReason};
    use forkhive_spawn::team::{MemberState, Team};
    use forkhive_spawn::tool::{ListDir, Tool, ToolFilter, ToolPool};
    use std::sync::{Arc, Mutex};
    use support::*;

    let repo = repo();
    let listings: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let seen = Arc::clone(&listings);
    let asked = std::sync::atomic::AtomicBool::new(false);
    let b = brain(move |r| {
        if !is_parent(r) {
            let me = AgentContext::current().unwrap();
            // Its definition lists two tools; a teammate keeps `SendMessage` all the same.
            let tools: Vec<&str> = r.prefix.tools().iter().map(|t| t.name.as_str()).collect();
            assert!(tools.contains(&"SendMessage"), "{tools:?}");
            return match r.all_messages().len() {
                1 => Plan::Reply(calls(&[("l", "LS", "{}"), ("t", "Touch", "{}")])),
                _ => {
                    if let Some((_, listing, _)) =
                        results(r).into_iter().find(|(id, _, _)| id == "l")
                    {
                        seen.lock().unwrap().push((me.id().to_string(), listing));
                    }
                    Plan::Reply(say("done"))
                }
            };
        }
        let teammate = |name: &str| {
            format!(
                r#"{{"description":"{name}","prompt":"task for {name}","subagent_type":"worker","name":"{name}","team_name":"review","isolation":"worktree"}}"#
            )
        };
        match r.all_messages().len() {
            1 => Plan::Reply(calls(&[
                ("a1", "Agent", &teammate("alice")),
                ("a2", "Agent", &teammate("bob")),
            ])),
            // Both idle: both are told to stop.
            _ if r
                .all_messages()
                .iter()
                .map(|m| m.text().matches(r#""type":"idle_notification""#).count())
                .sum::<usize>()
                >= 2
                && !asked.swap(true, std::sync::atomic::Ordering::SeqCst) =>
            {
                Plan::Reply(calls(&[
                    (
                        "s1",
                        "SendMessage",
                        r#"{"to":"alice","message":{"type":"shutdown_request","reason":"done"}}"#,
                    ),
                    (
                        "s2",
                        "SendMessage",
                        r#"{"to":"bob","message":{"type":"shutdown_request","reason":"done"}}"#,
                    ),
                ]))
            }
            _ => Plan::Reply(say("ok")),
        }
    });
    let mut w = AgentDefinition::new("worker", "a teammate", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    w.tools = Some(vec!["LS".into(), "Touch".into()]);
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([w]))
        .with_teams_enabled(true)
        .with_isolation_enabled(true)
        .with_worktree_repo(Some(repo.path().to_path_buf()))
        .with_warm_fanout(None)
        .with_filter(ToolFilter::default());
    let tools = ToolPool::new([
        AgentTool::new(config).unwrap().arc(),
        Arc::new(SendMessageTool::new().unwrap()) as Arc<dyn Tool>,
        Arc::new(ListDir::new(repo.path()).await.unwrap()) as Arc<dyn Tool>,
        Arc::new(Touch(repo.path().to_path_buf(), touch_definition())) as Arc<dyn Tool>,
    ])
    .unwrap();
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let mut lead = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .extension(Arc::clone(&team))
        .limits(forkhive_spawn::runtime::Limits::default().with_max_turns(Some(20)))
        .build()
        .await
        .unwrap();
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(team.member("alice").unwrap().state, MemberState::Stopped);
    assert_eq!(team.member("bob").unwrap().state, MemberState::Stopped);
    // Nothing was written in the lead's checkout.
    assert!(!repo.path().join("TOUCHED").exists());
    let listings = listings.lock().unwrap().clone();
    assert_eq!(
        listings.len(),
        2,
        "{listings:?} {:?}",
        lead.params().messages()
    );
    for (id, listing) in &listings {
        assert!(listing.contains("lib.rs"), "{listing}");
        assert!(
            !listing.contains(".forkhive"),
            "{id} saw the lead's checkout: {listing}"
        );
    }
    // Each tree is kept (its teammate touched a file), on its own branch, at its own path.
    let ns = notifications(&lead);
    assert_eq!(ns.len(), 2, "{ns:?}");
    let kept: Vec<_> = ns
        .iter()
        .map(|n| n.worktree.clone().expect("a kept tree"))
        .collect();
    assert_ne!(kept[0].path, kept[1].path);
    assert_ne!(kept[0].branch, kept[1].branch);
    for k in &kept {
        assert!(Path::new(&k.path).join("TOUCHED").exists(), "{k:?}");
    }
    let all = branches(repo.path());
    assert_eq!(all.lines().count(), 2, "{all}");
}

/// A worker in a worktree ends at its turn limit while a background child it started is still
/// writing in its tree, through the rooted tool the child inherited. The worker's owner stops
/// the child and waits for it before asking git, so the file the child wrote keeps the tree and
/// the worker's result names it. (Removed first, the tree took the child's write with it: a
/// peer's users report trees removed under a nested child.)
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_worktree_is_not_finished_under_a_child_still_writing_in_it() {
    use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
    use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
    use forkhive_spawn::runtime::{Agent, AgentContext, StopReason};
    use forkhive_spawn::tool::{Tool, ToolFilter, ToolPool};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use support::*;

    let repo = repo();
    let late = Arc::new(LateWrite {
        root: repo.path().to_path_buf(),
        started: Arc::new(AtomicBool::new(false)),
        wrote: Arc::default(),
    });
    let started = Arc::clone(&late.started);
    let b = brain(move |r| {
        let me = AgentContext::current().unwrap();
        match (me.depth(), has_tool_result(r)) {
            (0, false) => Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"build","prompt":"build it","subagent_type":"worker","isolation":"worktree"}"#,
            )])),
            (0, true) => Plan::Reply(say("all done")),
            (1, false) => Plan::Reply(calls(&[(
                "b1",
                "Agent",
                r#"{"description":"write","prompt":"write it","subagent_type":"helper","run_in_background":true}"#,
            )])),
            // Its last turn, once the child is writing: a call, so the limit ends the run.
            (1, true) => {
                // Off the worker, whose queue holds the child just started.
                tokio::task::block_in_place(|| {
                    for _ in 0..1000 {
                        if started.load(Ordering::SeqCst) {
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                });
                assert!(
                    started.load(Ordering::SeqCst),
                    "the child never wrote: {:?}",
                    results(r)
                );
                Plan::Reply(calls(&[("a2", "Agent", "{}")]))
            }
            (_, false) => Plan::Reply(calls(&[("c1", "LateWrite", "{}")])),
            (_, true) => Plan::Reply(say("wrote")),
        }
    });
    let mut worker = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    worker.system_prompt = "You are a worker.".into();
    worker.max_turns = Some(2);
    let mut helper = AgentDefinition::new("helper", "helps", DefinitionSource::Project);
    helper.system_prompt = "You are a helper.".into();
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([worker, helper]))
        .with_isolation_enabled(true)
        .with_worktree_repo(Some(repo.path().to_path_buf()))
        // The worker may start a child of its own, in the background.
        .with_filter(ToolFilter {
            global_disallow: Vec::new(),
            background_allow: vec!["*".into()],
            ..ToolFilter::default()
        });
    let tools = ToolPool::new([
        Arc::new(Spawner(AgentTool::new(config).unwrap().arc())) as Arc<dyn Tool>,
        Arc::clone(&late) as Arc<dyn Tool>,
    ])
    .unwrap();
    let mut parent = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .build()
        .await
        .unwrap();
    let run = parent.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let msgs = parent.params().messages().to_vec();
    let result = &support::message_results(&msgs[2])[0].1;
    let (_, kept_line) = result
        .split_once("\n[its worktree was kept, with its changes: ")
        .unwrap_or_else(|| panic!("the tree was not kept: {result}"));
    let (path, _) = kept_line
        .strip_suffix(']')
        .and_then(|l| l.split_once(" on branch "))
        .unwrap_or_else(|| panic!("{result}"));
    assert_eq!(
        std::fs::read_to_string(Path::new(path).join("LATE.md"))
            .ok()
            .as_deref(),
        Some("late"),
        "{result}"
    );
    assert_eq!(
        late.wrote.lock().unwrap().clone(),
        Some(Ok(path.to_owned())),
        "the child's write"
    );
}

/// The `Agent` tool as a host may wrap it so that a worker in a worktree can start children
/// (`AgentTool` does not move into a worktree on its own): its children work where their
/// parent's tools do.
#[derive(Debug)]
struct Spawner(std::sync::Arc<dyn forkhive_spawn::tool::Tool>);

#[async_trait::async_trait]
impl forkhive_spawn::tool::Tool for Spawner {
    fn definition(&self) -> &forkhive_core::ToolDefinition {
        self.0.definition()
    }
    fn is_concurrency_safe(&self, input: &serde_json::Value) -> bool {
        self.0.is_concurrency_safe(input)
    }
    fn is_read_only(&self) -> bool {
        self.0.is_read_only()
    }
    fn timeout(&self) -> Option<std::time::Duration> {
        self.0.timeout()
    }
    fn in_background(&self) -> forkhive_spawn::tool::InBackground {
        self.0.in_background()
    }
    fn check_tree(&self, tree: &forkhive_spawn::runtime::TreeState) -> Result<(), String> {
        self.0.check_tree(tree)
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        self.0.as_any()
    }
    async fn rooted(&self, _: &Path) -> Option<std::sync::Arc<dyn forkhive_spawn::tool::Tool>> {
        Some(std::sync::Arc::new(Spawner(std::sync::Arc::clone(&self.0))))
    }
    async fn call(
        &self,
        input: serde_json::Value,
        cx: &forkhive_spawn::tool::ToolContext,
    ) -> forkhive_spawn::tool::ToolOutput {
        self.0.call(input, cx).await
    }
}

/// A rooted tool that, once started, blocks its thread a while before it writes `LATE.md` (as
/// a subprocess outlives a cancelled call): it says when it has started and what the write
/// gave.
#[derive(Debug)]
struct LateWrite {
    root: std::path::PathBuf,
    started: std::sync::Arc<std::sync::atomic::AtomicBool>,
    wrote: std::sync::Arc<std::sync::Mutex<Option<Result<String, String>>>>,
}

#[async_trait::async_trait]
impl forkhive_spawn::tool::Tool for LateWrite {
    fn definition(&self) -> &forkhive_core::ToolDefinition {
        static DEF: std::sync::LazyLock<forkhive_core::ToolDefinition> =
            std::sync::LazyLock::new(|| {
                forkhive_core::ToolDefinition::new(
                    "LateWrite",
                    "writes late",
                    r#"{"type":"object"}"#,
                )
                .unwrap()
            });
        &DEF
    }
    fn is_concurrency_safe(&self, _: &serde_json::Value) -> bool {
        false
    }
    fn is_read_only(&self) -> bool {
        false
    }
    async fn rooted(&self, root: &Path) -> Option<std::sync::Arc<dyn forkhive_spawn::tool::Tool>> {
        Some(std::sync::Arc::new(LateWrite {
            root: root.to_path_buf(),
            started: std::sync::Arc::clone(&self.started),
            wrote: std::sync::Arc::clone(&self.wrote),
        }))
    }
    async fn call(
        &self,
        _: serde_json::Value,
        _: &forkhive_spawn::tool::ToolContext,
    ) -> forkhive_spawn::tool::ToolOutput {
        self.started
            .store(true, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(400));
        let wrote = std::fs::write(self.root.join("LATE.md"), "late")
            .map(|()| self.root.display().to_string())
            .map_err(|e| e.to_string());
        *self.wrote.lock().unwrap() = Some(wrote);
        forkhive_spawn::tool::ToolOutput::text("wrote")
    }
}

/// In coordinator mode a worker that can write gets a worktree without asking, unless the
/// call says `isolation: "none"`; a worker that only reads works in the shared checkout.
#[tokio::test]
async fn coordinator_workers_that_write_get_a_worktree_by_default() {
    use forkhive_core::notification::find_notifications;
    use forkhive_spawn::agent_tool::AgentToolConfig;
    use forkhive_spawn::coordinator::{COORDINATOR_PROMPT, CoordinatorConfig, coordinator};
    use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
    use forkhive_spawn::runtime::{Agent, AgentContext, StopReason};
    use forkhive_spawn::tool::{ListDir, Tool, ToolPool};
    use std::sync::Arc;
    use support::*;

    let repo = repo();
    let root = repo.path().to_path_buf();
    let b = brain(move |r| {
        let coordinating = r
            .prefix
            .system_prompt()
            .first()
            .is_some_and(|s| s == COORDINATOR_PROMPT);
        if !coordinating {
            // Every worker leaves a file in its worktree, if it has one.
            let me = AgentContext::current().unwrap();
            let wt = root
                .join(".forkhive/worktrees")
                .join(format!("agent-{}", me.id()));
            if wt.is_dir() {
                std::fs::write(wt.join("NOTE.md"), "x").unwrap();
            }
            return Plan::Reply(say("done"));
        }
        match r.all_messages().len() {
            1 => Plan::Reply(calls(&[
                (
                    "a1",
                    "Agent",
                    r#"{"description":"write","prompt":"p","subagent_type":"writer"}"#,
                ),
                (
                    "a2",
                    "Agent",
                    r#"{"description":"read","prompt":"p","subagent_type":"reader"}"#,
                ),
                (
                    "a3",
                    "Agent",
                    r#"{"description":"shared","prompt":"p","subagent_type":"writer","isolation":"none"}"#,
                ),
                // A writing tool that cannot move: no worktree by default...
                (
                    "a4",
                    "Agent",
                    r#"{"description":"shell","prompt":"p","subagent_type":"shell"}"#,
                ),
                // ...and asking for one is refused, naming the tool.
                (
                    "a5",
                    "Agent",
                    r#"{"description":"shell2","prompt":"p","subagent_type":"shell","isolation":"worktree"}"#,
                ),
                // ...and so is a type whose definition asks for one.
                (
                    "a6",
                    "Agent",
                    r#"{"description":"shell3","prompt":"p","subagent_type":"isolated-shell"}"#,
                ),
            ])),
            _ => Plan::Reply(say("all done")),
        }
    });
    let def = |name: &str, tools: &[&str]| {
        let mut d = AgentDefinition::new(name, "works", DefinitionSource::Host);
        d.tools = Some(tools.iter().map(|t| (*t).to_owned()).collect());
        d
    };
    let workers = ToolPool::new([
        Arc::new(ListDir::new(repo.path()).await.unwrap()) as Arc<dyn Tool>,
        Arc::new(Touch(repo.path().to_path_buf(), touch_definition())),
        TestTool::sleeper("Shell", false, 0).arc(),
    ])
    .unwrap();
    let config = CoordinatorConfig::new(workers).with_agent_tool(
        AgentToolConfig::default()
            .with_registry(AgentRegistry::from_definitions([
                def("writer", &["LS", "Touch"]),
                def("reader", &["LS"]),
                def("shell", &["LS", "Shell"]),
                {
                    let mut d = def("isolated-shell", &["LS", "Shell"]);
                    d.isolation = Some("worktree".into());
                    d
                },
            ]))
            .with_isolation_enabled(true)
            .with_worktree_repo(Some(repo.path().to_path_buf())),
    );
    let events = Arc::new(Events::default());
    let transcripts = tempfile::tempdir().unwrap();
    let mut c = coordinator(
        Agent::builder(b)
            .model("m")
            .transcript_dir(transcripts.path())
            .events(Arc::clone(&events) as _),
        config,
    )
    .unwrap()
    .build()
    .await
    .unwrap();
    let run = c.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    // The host hears which worker shares the checkout, and why, not only `tracing`.
    let warnings = events.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("no worktree for worker ")
            && warnings[0].ends_with(
                " (\"shell\"), which works in the shared checkout: tool \"Shell\": it changes \
                 things but cannot work in a worktree (it does not implement `Tool::rooted`)"
            ),
        "{warnings:?}"
    );
    let ns: Vec<_> = c
        .params()
        .messages()
        .iter()
        .flat_map(|m| find_notifications(m).unwrap())
        .collect();
    let kept = |what: &str| {
        ns.iter()
            .find(|n| n.summary.contains(&format!("\"{what}\"")))
            .unwrap_or_else(|| panic!("no notification for {what}: {:?}", c.params().messages()))
            .worktree
            .is_some()
    };
    assert!(
        kept("write"),
        "the writer worked in a worktree (kept: it left a file)"
    );
    assert!(!kept("read"), "the reader worked in the shared checkout");
    assert!(!kept("shared"), "isolation: none is honoured");
    assert!(
        !kept("shell"),
        "a writer that cannot move works where it would have"
    );
    let refused = message_results(&c.params().messages()[2]);
    assert_eq!(
        (refused[4].1.as_str(), refused[4].2),
        (
            "tool \"Shell\": it changes things but cannot work in a worktree (it does not \
             implement `Tool::rooted`)",
            true
        )
    );
    assert_eq!(
        (refused[5].1.as_str(), refused[5].2),
        (
            "agent type `isolated-shell` asks for a worktree (`isolation: worktree`), but tool \
             \"Shell\": it changes things but cannot work in a worktree (it does not implement \
             `Tool::rooted`)",
            true
        )
    );
    // The main checkout's status does not show the worktrees directory.
    assert_eq!(git(repo.path(), &["status", "--porcelain"]), "");
}

/// A writing tool with a directory of its own: it moves into a worktree.
#[derive(Debug)]
struct Touch(std::path::PathBuf, forkhive_core::ToolDefinition);

fn touch_definition() -> forkhive_core::ToolDefinition {
    forkhive_core::ToolDefinition::new("Touch", "creates a file", r#"{"type":"object"}"#).unwrap()
}

#[async_trait::async_trait]
impl forkhive_spawn::tool::Tool for Touch {
    fn definition(&self) -> &forkhive_core::ToolDefinition {
        &self.1
    }
    fn is_concurrency_safe(&self, _: &serde_json::Value) -> bool {
        false
    }
    fn is_read_only(&self) -> bool {
        false
    }
    async fn rooted(&self, root: &Path) -> Option<std::sync::Arc<dyn forkhive_spawn::tool::Tool>> {
        Some(std::sync::Arc::new(Touch(
            root.to_path_buf(),
            touch_definition(),
        )))
    }
    async fn call(
        &self,
        _: serde_json::Value,
        _: &forkhive_spawn::tool::ToolContext,
    ) -> forkhive_spawn::tool::ToolOutput {
        std::fs::write(self.0.join("TOUCHED"), "").unwrap();
        forkhive_spawn::tool::ToolOutput::text("touched")
    }
}

/// The runtime shuts down while a worker's owner asks git whether its worktree changed (the
/// worker has left a file there): the guard finishes the rest on the spot, and — as it does
/// for an owner dropped before finishing — keeps the worktree and names it in the
/// notification, so the parent hears where the worker's changes are.
#[test]
fn a_runtime_shutting_down_while_git_is_asked_still_names_the_kept_worktree() {
    use forkhive_spawn::runtime::{Agent, PendingQueue};
    use forkhive_spawn::task::{FirstInput, Launch, MemoryTaskRegistry, TaskConfig, TaskService};
    use forkhive_spawn::worktree::Unfinished;
    use std::sync::Arc;
    use std::time::Duration;
    use support::*;

    let repo = repo();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let queue = PendingQueue::new();
    let parent = forkhive_core::TaskId::generate(forkhive_core::TaskKind::Agent);
    let path = rt.block_on(async {
        let service = TaskService::new(
            Arc::new(MemoryTaskRegistry::new()),
            TaskConfig::default()
                .with_deadline(None)
                .with_stall_after(None)
                .with_kill_grace(Duration::from_secs(1)),
        );
        let wt = Worktree::create(repo.path(), "drop", None).await.unwrap();
        let path = wt.path().to_path_buf();
        let at = path.clone();
        let child = Agent::builder(brain(move |_| {
            std::fs::write(at.join("NOTE.md"), "x").unwrap();
            Plan::Reply(say("done"))
        }))
        .model("m")
        .build()
        .await
        .unwrap();
        service
            .launch(Launch {
                agent: child,
                first: FirstInput::Prompt("work".into()),
                description: "child".into(),
                tool_use_id: None,
                parent_queue: queue.clone(),
                progress: Arc::default(),
                output: None,
                slot: service.acquire(parent).unwrap(),
                gate: None,
                events: None,
                ledger: None,
                parent_turn: 0,
                deadline: None,
                name: None,
                worktree: Some(Unfinished::new(wt)),
            })
            .await
            .unwrap();
        // Until its owner has begun finishing it (the slot is freed just before it asks git).
        while service.live() > 0 {
            tokio::task::yield_now().await;
        }
        path
    });
    drop(rt);
    assert!(
        path.join("NOTE.md").exists(),
        "the worker's change is still there"
    );
    let notes = queue.drain();
    assert_eq!(notes.len(), 1, "the child's one notification");
    let n = forkhive_core::TaskNotification::parse(&notes[0].text).unwrap();
    let kept = n.worktree.as_ref().unwrap_or_else(|| {
        panic!(
            "the notification does not name the worktree left at {}: {n:?}",
            path.display()
        )
    });
    assert_eq!(std::path::Path::new(&kept.path), path);
}

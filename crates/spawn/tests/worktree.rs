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
    assert_eq!(wt.finish().await, Finished::Removed);
    assert!(!wt.path().exists());
    assert_eq!(branches(repo.path()), "");
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

/// A tree whose status git cannot give is kept, never removed on a guess.
#[tokio::test]
async fn an_unreadable_status_keeps_the_tree() {
    let repo = repo();
    let wt = Worktree::create(repo.path(), "broken", None).await.unwrap();
    // Break the link from the worktree to its repository.
    std::fs::write(wt.path().join(".git"), "gitdir: /nonexistent/forkhive\n").unwrap();
    match wt.finish().await {
        Finished::Kept(Keep::Unknown(why)) => {
            assert!(why.contains("not a git repository"), "{why}")
        }
        other => panic!("{other:?}"),
    }
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

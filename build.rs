//! Build script: the commit tollgate is built from, for `tollgate_build_info{commit}` on
//! `/metrics`. `TOLLGATE_COMMIT` in the build's environment wins (an image built from a
//! source tree without `.git` passes it); otherwise `git rev-parse` asks the checkout; a tree
//! with neither says `unknown`. The commit is the short form (12 hex digits), what people paste.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TOLLGATE_COMMIT");
    let from_env = std::env::var("TOLLGATE_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty());
    let commit = from_env
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TOLLGATE_COMMIT={}", commit.trim());
}

/// The checkout's HEAD commit, asking cargo to run this again when HEAD moves (a commit, a
/// checkout); None without git or outside a repository.
fn git_commit() -> Option<String> {
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // HEAD names the branch; the branch's ref file (or packed-refs) moves on a commit. In a
    // worktree HEAD lives in its own git dir and the refs in the common one.
    // Only files that exist: cargo runs a script again on every build while a path it was
    // told to watch is missing, and that would rebuild the crate every time.
    let watch = |path: std::path::PathBuf| {
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    };
    if let (Some(dir), Some(common)) = (
        git(&["rev-parse", "--git-dir"]),
        git(&["rev-parse", "--git-common-dir"]),
    ) {
        watch(Path::new(&dir).join("HEAD"));
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(Path::new(&common).join(branch));
        }
        watch(Path::new(&common).join("packed-refs"));
    }
    Some(commit)
}

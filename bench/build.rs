//! Embeds the commit the bench is built from (`BENCH_COMMIT`: `git rev-parse --short=12 HEAD`,
//! `unknown` without git or outside a checkout) for the `meta` object of `--json` reports.
//! Uncommitted changes are not marked.

use std::path::PathBuf;
use std::process::Command;

/// `git ARGS` in this crate's directory: its trimmed stdout, or `None` if git failed.
fn git_output(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The files whose change moves HEAD: HEAD itself, the branch it names and packed-refs
/// (`--git-path` resolves each in a worktree too). Only existing ones: cargo reruns a build
/// script on every build when a watched path is missing.
fn head_files() -> Vec<PathBuf> {
    let mut names = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git_output(&["symbolic-ref", "-q", "HEAD"]) {
        names.push(branch);
    }
    names
        .iter()
        .filter_map(|n| git_output(&["rev-parse", "--git-path", n]))
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect()
}

fn main() {
    let commit =
        git_output(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=BENCH_COMMIT={commit}");
    for path in head_files() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-changed=build.rs");
}

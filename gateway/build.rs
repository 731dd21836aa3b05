//! Embeds the commit the gateway is built from (`GATEWAY_COMMIT`: `git rev-parse --short=12
//! HEAD`, or `unknown` outside a git checkout; uncommitted changes are not marked)
//! for `--version`, the start line and `gateway_build_info`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=GATEWAY_COMMIT={commit}");
    // Rebuilt when HEAD moves (a commit, a checkout); the paths exist in a checkout and its
    // worktrees alike (a path that does not exist would rerun this on every build).
    for (flag, file) in [
        ("--git-dir", "HEAD"),
        ("--git-common-dir", "refs/heads"),
        ("--git-common-dir", "packed-refs"),
    ] {
        if let Some(dir) = git(&["rev-parse", flag]) {
            let path = std::path::Path::new(&dir).join(file);
            if path.exists() {
                let path = std::fs::canonicalize(&path).unwrap_or(path);
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}

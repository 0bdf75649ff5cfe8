//! Puts the commit the binary is built from into `STATSD_REDIS_COMMIT` (the `build_info`
//! metric's `commit` label and `--version`); `unknown` outside a git checkout.

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=STATSD_REDIS_COMMIT={commit}");
    // Built again when HEAD moves: the file names the branch, whose ref file names the commit.
    println!("cargo:rerun-if-changed=.git/HEAD");
    if let Ok(head) = std::fs::read_to_string(".git/HEAD")
        && let Some(branch) = head.trim().strip_prefix("ref: ")
    {
        println!("cargo:rerun-if-changed=.git/{branch}");
    }
}

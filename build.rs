//! Builds the in-sandbox helper (`helper/`) as a static executable and hands it to the crate, which
//! embeds it (`helper_binary`) and installs it read-only into every sandbox. The helper must run in
//! any image, glibc or not, hence `+crt-static`.
//!
//! When the helper cannot be built (another target, no toolchain for it), the server is built
//! without it and falls back to plain `docker exec`; set `AGENT_SANDBOX_REQUIRE_HELPER=1` to make
//! that an error instead (CI does).

use std::env;
use std::path::PathBuf;
use std::process::Command;

const TARGET: &str = "x86_64-unknown-linux-gnu";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(agent_sandbox_helper)");
    println!("cargo::rerun-if-changed=helper/src");
    println!("cargo::rerun-if-changed=helper/Cargo.toml");
    println!("cargo::rerun-if-changed=helper/Cargo.lock");
    println!("cargo::rerun-if-changed=crates/helper-protocol/src");
    println!("cargo::rerun-if-changed=crates/helper-protocol/Cargo.toml");
    println!("cargo::rerun-if-env-changed=AGENT_SANDBOX_REQUIRE_HELPER");
    let required = env::var("AGENT_SANDBOX_REQUIRE_HELPER").is_ok_and(|v| v == "1");
    match build_helper() {
        Ok(path) => {
            println!("cargo::rustc-cfg=agent_sandbox_helper");
            println!(
                "cargo::rustc-env=AGENT_SANDBOX_HELPER_PATH={}",
                path.display()
            );
        }
        Err(why) if required => panic!("cannot build the in-sandbox helper: {why}"),
        Err(why) => println!("cargo::warning=building without the in-sandbox helper: {why}"),
    }
}

fn build_helper() -> Result<PathBuf, String> {
    let host = env::var("HOST").unwrap_or_default();
    let target = env::var("TARGET").unwrap_or_default();
    if host != TARGET || target != TARGET {
        return Err(format!(
            "the helper is built for {TARGET} only (host {host}, target {target})"
        ));
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target_dir = out_dir.join("helper-target");
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            TARGET,
            "--manifest-path",
        ])
        .arg(manifest_dir.join("helper/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        // The outer build's flags and wrappers are for the server, not for the helper.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build of helper/ failed with {status}"));
    }
    let binary = target_dir
        .join(TARGET)
        .join("release")
        .join("agent-sandbox-helper");
    if !binary.is_file() {
        return Err(format!("{} was not produced", binary.display()));
    }
    Ok(binary)
}

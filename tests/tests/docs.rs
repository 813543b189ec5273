//! The README is the front door, so its commands must run: every `sh` block is run by bash
//! (`-euo pipefail`, `curl -f`) against the local gateway (`local::gateway`, what
//! `cycles-local` serves) on a Redis of its own, and what it did is checked in the ledger.
//! The `shell` block holds the two commands (start `cycles-local`, run `scripts/test`): CI runs
//! the second and the lambda smoke run starts the first, so here they are checked to exist.

use cycles_shared::local::EmbeddedRedis;
use cycles_shared::model::Unit;
use cycles_tests::*;

const README: &str = include_str!("../../README.md");

/// The fenced blocks of `text` whose info string is `lang`.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let mut out = vec![];
    let mut current: Option<Vec<&str>> = None;
    for line in text.lines() {
        match &mut current {
            None if line.trim_end() == format!("```{lang}") => current = Some(vec![]),
            Some(_) if line.trim_end() == "```" => out.push(current.take().unwrap().join("\n")),
            Some(lines) => lines.push(line),
            None => {}
        }
    }
    out
}

#[test]
fn the_readme_is_one_page_and_its_two_commands_exist() {
    assert!(README.lines().count() <= 250, "README.md has {} lines; the rest belongs in docs/", README.lines().count());
    let two = blocks(README, "shell");
    assert_eq!(two.len(), 1, "one block with the two commands");
    assert!(two[0].contains("cargo run --release -p cycles-functions --bin cycles-local -- --seed-demo"));
    assert!(two[0].lines().any(|l| l.trim() == "scripts/test"));
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    for path in ["scripts/test", "functions/src/bin/cycles-local.rs"] {
        assert!(std::path::Path::new(&format!("{root}/{path}")).exists(), "{path}");
    }
    // every page the README sends a reader to exists, and the section where a link names one
    for link in README.split("](").skip(1).filter_map(|s| s.split(')').next()) {
        if !link.starts_with("http") {
            let (page, section) = link.split_once('#').unwrap_or((link, ""));
            let text = std::fs::read_to_string(format!("{root}/{page}"));
            assert!(text.is_ok(), "README links to {link}");
            let slugs: Vec<String> = text.unwrap().lines().filter(|l| l.starts_with('#')).map(slug).collect();
            assert!(
                section.is_empty() || slugs.iter().any(|s| s == section),
                "README links to {link}: no such section"
            );
        }
    }
}

/// A heading's anchor as GitHub spells it: lower case, spaces as `-`, punctuation dropped.
fn slug(heading: &str) -> String {
    let text = heading.trim_start_matches('#').trim().to_lowercase();
    text.chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[tokio::test]
async fn every_sh_block_of_the_readme_runs_against_the_gateway() {
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let h = Harness::start_with_redis(redis, |_| {}).await;
    let scripts = blocks(README, "sh");
    assert!(!scripts.is_empty(), "the README has commands to run");
    let mut output = String::new();
    for script in &scripts {
        let out = tokio::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .env("CYCLES_URL", &h.base)
            .env("CYCLES_ADMIN_URL", &h.admin_base)
            .env("ADMIN_API_KEY", &h.admin_key)
            .output()
            .await
            .expect("bash");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "a README block failed:\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
        output.push_str(&stdout);
    }
    // what the first reserve says it does, it did
    let l = h.ledger("acme", "tenant:acme", Unit::Tokens).await;
    assert_eq!((l.allocated, l.spent, l.reserved, l.remaining), (100_000, 420, 0, 99_580));
    assert!(output.contains("DENY"), "{output}");
}

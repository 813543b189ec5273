//! Rules written in both languages agree: the scope-pattern match of policies
//! (`domain::policies::pattern_matches` in Rust, `pattern_matches` in `lua/lib/policies.lua`)
//! over every pattern and scope path of a generated grid, evaluated by the script library's own
//! helpers in Redis; and the key a script reads to tell its slot is moving. (The decimal
//! arithmetic's parity with integers is `amounts.rs`.)

use cycles_shared::domain::policies::pattern_matches;
use cycles_tests::Harness;

const BODY: &str = "local out = {}\nfor i = 1, #ARGV, 2 do out[#out + 1] = pattern_matches(ARGV[i], ARGV[i + 1]) and 1 or 0 end\nreturn out";

/// Scope paths as the handlers derive them: levels in canonical order, lower case.
fn paths() -> Vec<String> {
    let levels = ["workspace:eng", "app:x", "workflow:w", "agent:a", "toolset:t"];
    let mut out = Vec::new();
    for tenant in ["tenant:acme", "tenant:other"] {
        for mask in 0..(1 << levels.len()) {
            let mut p = vec![tenant];
            p.extend(levels.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, l)| *l));
            out.push(p.join("/"));
        }
    }
    out
}

/// Patterns a policy may carry: rooted at a tenant or not, exact segments, level wildcards
/// (`agent:*`) and `*` for any run of segments.
fn patterns() -> Vec<String> {
    let segments = ["tenant:acme", "*", "workspace:eng", "workspace:*", "app:x", "agent:*", "agent:a", "toolset:t"];
    let mut out: Vec<String> = segments.iter().map(|s| s.to_string()).collect();
    for a in segments {
        for b in segments {
            out.push(format!("{a}/{b}"));
            for c in ["*", "agent:*", "agent:a", "toolset:t"] {
                out.push(format!("{a}/{b}/{c}"));
            }
        }
    }
    out
}

#[tokio::test]
async fn policy_patterns_match_alike_in_rust_and_lua() {
    let h = Harness::start().await;
    let pairs: Vec<(String, String)> =
        patterns().into_iter().flat_map(|p| paths().into_iter().map(move |s| (p.clone(), s))).collect();
    assert!(pairs.len() > 10_000);
    let (mut matched, mut checked) = (0, 0);
    for chunk in pairs.chunks(2_000) {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(format!("{}\n{BODY}", cycles_shared::ops::helpers())).arg(0);
        for (pattern, path) in chunk {
            cmd.arg(pattern).arg(path);
        }
        let lua: Vec<i64> = cmd.query_async(&mut h.store.conn()).await.unwrap();
        for ((pattern, path), lua) in chunk.iter().zip(lua) {
            let rust = pattern_matches(pattern, path);
            assert_eq!(lua == 1, rust, "pattern {pattern} on {path}: Lua {lua}, Rust {rust}");
            matched += usize::from(rust);
            checked += 1;
        }
    }
    // the grid holds both answers in number, so agreement is not agreement on one answer
    assert!(matched > checked / 20 && matched < checked * 19 / 20, "{matched} of {checked} matched");
}

/// The key a script reads first to tell that its slot is moving (`KEY.slot_check` in the
/// library, `keys::slot_check` in Rust) is the same key, in the slot of the key it is made from,
/// for tenant keys and the sweep's alike; a key without a hash tag has none.
#[tokio::test]
async fn the_slot_check_key_is_the_same_in_rust_and_lua() {
    use cycles_shared::keys::{due_index, slot_check, TenantKeys};
    let h = Harness::start().await;
    let t = TenantKeys::new("acme:{odd}");
    let keys = [
        t.tenant(),
        t.reservation("tok"),
        t.budget_by_code("c0de"),
        due_index(7),
        "plain".to_string(),
        "a{}b".to_string(),
    ];
    let mut cmd = redis::cmd("EVAL");
    let body = "local out = {}\nfor i = 1, #ARGV do out[i] = KEY.slot_check(ARGV[i]) or '' end\nreturn out";
    cmd.arg(format!("{}\n{body}", cycles_shared::ops::helpers())).arg(0).arg(&keys);
    let lua: Vec<String> = cmd.query_async(&mut h.store.conn()).await.unwrap();
    let rust: Vec<String> = keys.iter().map(|k| slot_check(k).unwrap_or_default()).collect();
    assert_eq!(lua, rust);
    assert_eq!(rust[0], format!("{}:slot-check", t.prefix()));
    assert_eq!((rust[4].as_str(), rust[5].as_str()), ("", ""), "no hash tag, no check");
    let slot = |k: &str| redis::cmd("CLUSTER").arg("KEYSLOT").arg(k).clone();
    if h.store.is_cluster() {
        for (key, check) in keys.iter().zip(&rust).take(4) {
            let (a, b): (u16, u16) = (
                slot(key).query_async(&mut h.store.conn()).await.unwrap(),
                slot(check).query_async(&mut h.store.conn()).await.unwrap(),
            );
            assert_eq!(a, b, "{check} shares the slot of {key}");
        }
    }
}

//! The scripts' decimal arithmetic (lua/lib/decimal.lua) is exact over the whole int64 range: amounts of
//! up to 15 characters take the fast path through Lua numbers, longer ones the path in two parts
//! (the last nine digits and the rest), and both must agree with integer arithmetic at and across
//! the boundary, at the carries between the parts, and at both ends of int64.

use cycles_shared::keys::TenantKeys;
use cycles_shared::model::Unit;
use cycles_tests::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// For each pair: d_add, d_sub, d_cmp, d_pos(a), d_fits(a), d_min, d_max.
const BODY: &str = "
local out = {}
for i = 1, #ARGV, 2 do
  local a, b = ARGV[i], ARGV[i + 1]
  out[#out + 1] = d_add(a, b)
  out[#out + 1] = d_sub(a, b)
  out[#out + 1] = tostring(d_cmp(a, b))
  out[#out + 1] = tostring(d_pos(a))
  out[#out + 1] = tostring(d_fits(a))
  out[#out + 1] = d_min(a, b)
  out[#out + 1] = d_max(a, b)
end
return out";

fn expected(a: i128, b: i128) -> Vec<String> {
    let fits = i64::try_from(a).is_ok();
    vec![
        (a + b).to_string(),
        (a - b).to_string(),
        (a.cmp(&b) as i8).to_string(),
        (a > 0).to_string(),
        fits.to_string(),
        a.min(b).to_string(),
        a.max(b).to_string(),
    ]
}

#[tokio::test]
async fn decimal_arithmetic_is_exact_across_the_fast_path_boundary() {
    let h = Harness::start().await;
    let edges: Vec<i128> = vec![
        0,
        1,
        -1,
        99_999_999_999_999,    // 14 digits
        -99_999_999_999_999,   // 15 characters with the sign
        999_999_999_999_999,   // 15 digits: the largest fast-path operand
        -999_999_999_999_999,  // 16 characters: the path in two parts
        1_000_000_000_000_000, // 16 digits
        9_007_199_254_740_993, // 2^53 + 1, not a double
        1_000_000_000,         // the parts' carry: 1e9
        -1_000_000_000,
        999_999_999_999_999_999,
        -1_000_000_000_000_000_001,
        i64::MAX as i128,
        i64::MIN as i128 + 1,
        i64::MIN as i128,
        i64::MAX as i128 + 1, // one past: d_fits must say no
        i64::MIN as i128 - 1,
    ];
    let mut pairs: Vec<(i128, i128)> = edges.iter().flat_map(|a| edges.iter().map(move |b| (*a, *b))).collect();
    let mut rng = StdRng::seed_from_u64(20261203);
    for _ in 0..400 {
        let digits = |rng: &mut StdRng| -> i128 {
            let n: u32 = rng.gen_range(1..=19);
            let v: i128 = rng.gen_range(0..10i128.pow(n));
            if rng.gen_bool(0.3) {
                -v
            } else {
                v
            }
        };
        pairs.push((digits(&mut rng), digits(&mut rng)));
    }
    for chunk in pairs.chunks(100) {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(format!("{}\n{BODY}", cycles_shared::ops::helpers())).arg(0);
        for (a, b) in chunk {
            cmd.arg(a.to_string()).arg(b.to_string());
        }
        let got: Vec<String> = cmd.query_async(&mut h.store.conn()).await.unwrap();
        for ((a, b), answer) in chunk.iter().zip(got.chunks(7)) {
            assert_eq!(answer, expected(*a, *b), "a = {a}, b = {b}");
        }
    }
}

/// A settle within the estimate (X <= E) takes a commit's fast path when every amount has at
/// most 15 characters, the path in two parts otherwise: both must leave the ledger as integer
/// arithmetic does (remaining + E - X, spent + X, reserved - E, charged X).
#[tokio::test]
async fn a_settle_within_the_estimate_is_exact_on_both_paths() {
    let h = Harness::start().await;
    const SETTLE: &str = "
local out = {}
for i = 1, #ARGV, 5 do
  local b = {key = 'k', scope = 's', remaining = ARGV[i + 2], spent = ARGV[i + 3], reserved = ARGV[i + 4],
    debt = '0', overdraft_limit = '0', over = false}
  local charged = settle({b}, ARGV[i], ARGV[i + 1], 'ALLOW_IF_AVAILABLE')
  out[#out + 1] = charged .. ' ' .. b.remaining .. ' ' .. b.spent .. ' ' .. b.reserved .. ' ' .. b.grew
end
return out";
    let mut rng = StdRng::seed_from_u64(20261206);
    let mut cases: Vec<[i128; 5]> = Vec::new();
    for i in 0..300 {
        // short amounts on even cases (the fast path), up to 18 digits on odd ones
        let most = if i % 2 == 0 { 14 } else { 18 };
        let n = |rng: &mut StdRng| {
            let digits = rng.gen_range(1..=most);
            rng.gen_range(0..10i128.pow(digits))
        };
        let e = n(&mut rng);
        let x = rng.gen_range(0..=e);
        let remaining = if rng.gen_bool(0.2) { -n(&mut rng) } else { n(&mut rng) };
        cases.push([e, x, remaining, n(&mut rng), n(&mut rng)]);
    }
    for chunk in cases.chunks(100) {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(format!("{}\n{SETTLE}", cycles_shared::ops::helpers())).arg(0);
        for c in chunk {
            for v in c {
                cmd.arg(v.to_string());
            }
        }
        let got: Vec<String> = cmd.query_async(&mut h.store.conn()).await.unwrap();
        for ([e, x, remaining, spent, reserved], answer) in chunk.iter().zip(got) {
            let want = format!("{x} {} {} {} {x}", remaining + e - x, spent + x, reserved - e);
            assert_eq!(answer, want, "E = {e}, X = {x}, remaining {remaining}, spent {spent}, reserved {reserved}");
        }
    }
}

/// A write whose new amounts do not fit int64 writes no ledger at all: the check comes before
/// the first write, whichever ledger is the one that overflows.
#[tokio::test]
async fn a_write_past_int64_writes_no_ledger() {
    let h = Harness::start().await;
    const WRITE: &str = "
local function ledger(key, remaining)
  return {key = key, scope = 's', unit = 'TOKENS', status = 'ACTIVE', allocated = '1', remaining = remaining,
    reserved = '0', spent = '0', debt = '0', overdraft_limit = '0', over = false}
end
local failed = write_budgets({ledger(KEYS[1], '5'), ledger(KEYS[2], ARGV[1])}, '1')
return {failed and failed[2] or 'written', redis.call('EXISTS', KEYS[1], KEYS[2])}";
    let keys = TenantKeys::new(&unique("overflow"));
    let (a, b) = (keys.budget("tenant:a", Unit::Tokens), keys.budget("tenant:b", Unit::Tokens));
    for (remaining, want) in [((i64::MAX as i128 + 1).to_string(), "INTERNAL_ERROR"), (i64::MAX.to_string(), "written")]
    {
        let (answer, written): (String, i64) = redis::cmd("EVAL")
            .arg(format!("{}\n{WRITE}", cycles_shared::ops::helpers()))
            .arg(2)
            .arg(&a)
            .arg(&b)
            .arg(&remaining)
            .query_async(&mut h.store.conn())
            .await
            .unwrap();
        assert_eq!(answer, want, "remaining {remaining}");
        assert_eq!(written, if want == "written" { 2 } else { 0 }, "remaining {remaining}");
    }
}

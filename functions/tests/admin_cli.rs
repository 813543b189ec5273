//! `cycles-admin` as an operator runs it: export a tenant from one store to a file, import it
//! into another, refused when the tenant exists there, accepted with `--replace`.

use std::process::Command;
use std::time::Duration;

use cycles_shared::local::EmbeddedRedis;
use cycles_shared::model::Unit;
use cycles_shared::provision::{self, NewBudget, NewTenant};
use cycles_shared::store::Store;

fn admin(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cycles-admin")).args(args).env("RUST_LOG", "error").output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
}

#[tokio::test]
async fn export_then_import_moves_a_tenant_between_stores() {
    let (source, target) = (EmbeddedRedis::start(&[]).await.unwrap(), EmbeddedRedis::start(&[]).await.unwrap());
    let store = Store::connect(&source.url(), Duration::from_secs(5)).await.unwrap();
    let tenant = NewTenant { tenant_id: "moving-co".into(), name: "Moving Co".into(), ..Default::default() };
    provision::create_tenant(&store, &tenant).await.unwrap();
    provision::create_budget(&store, &NewBudget::new("moving-co", "tenant:moving-co", Unit::Tokens, 5_000))
        .await
        .unwrap();
    let file = source.dir.join("moving-co.jsonl");
    let file = file.to_str().unwrap();

    let (ok, said) = admin(&["export", "--tenant", "moving-co", "--redis-url", &source.url(), "--out", file]);
    assert!(ok, "{said}");
    assert!(said.contains("exported tenant moving-co"), "{said}");
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.lines().next().unwrap().contains("\"format\":\"cycles-tenant-export\""));

    let (ok, said) = admin(&["import", "--redis-url", &target.url(), "--in", file]);
    assert!(ok, "{said}");
    let mut conn = redis::Client::open(target.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let status: Option<String> =
        redis::cmd("HGET").arg("cy:{moving-co}:tenant").arg("status").query_async(&mut conn).await.unwrap();
    assert_eq!(status.as_deref(), Some("ACTIVE"));
    let registered: bool =
        redis::cmd("SISMEMBER").arg("cy:tenants").arg("moving-co").query_async(&mut conn).await.unwrap();
    assert!(registered, "the imported tenant is in the registry");

    let (ok, said) = admin(&["import", "--redis-url", &target.url(), "--in", file]);
    assert!(!ok && said.contains("already exists"), "{said}");
    let (ok, said) = admin(&["import", "--replace", "--redis-url", &target.url(), "--in", file]);
    assert!(ok, "{said}");
    let (ok, said) = admin(&["export", "--redis-url", &target.url()]);
    assert!(!ok && said.contains("needs --tenant") && said.contains("USAGE"), "{said}");
    let (ok, said) = admin(&["export", "--tenant", "nobody-here", "--redis-url", &target.url()]);
    assert!(!ok && said.contains("not found"), "{said}");
}

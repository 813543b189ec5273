//! The SAM template declares exactly the route table, each route on the function that serves
//! it (named by its `CYCLES_FUNCTION`), every function deploys the one shared binary, and every
//! function also has its own binary (for `cargo lambda watch`).

use std::collections::BTreeSet;

use cycles_shared::api::{Plane, ROUTES};

fn template() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml")).expect("template.yaml")
}

/// (api, binary, method, path) for every HttpApi event, read from the template's function blocks.
fn declared_routes(template: &str) -> BTreeSet<(String, String, String, String)> {
    let mut routes = BTreeSet::new();
    let mut binary = String::new();
    for line in template.lines().map(str::trim) {
        if let Some(b) = line.strip_prefix("CYCLES_FUNCTION: ") {
            binary = b.to_string();
        }
        if let Some(props) = line.strip_prefix("Properties: { ApiId: !Ref ") {
            let (api, props) = props.split_once(", ").expect("ApiId, Method, Path");
            let props = props.trim_end_matches(" }");
            let mut method = String::new();
            let mut path = String::new();
            for kv in props.split(", ") {
                match kv.split_once(": ") {
                    Some(("Method", m)) => method = m.to_string(),
                    Some(("Path", p)) => path = p.trim_matches('"').to_string(),
                    _ => panic!("unexpected route property {kv}"),
                }
            }
            routes.insert((api.to_string(), binary.clone(), method, path));
        }
    }
    routes
}

#[test]
fn template_routes_equal_the_route_table() {
    let declared = declared_routes(&template());
    let table: BTreeSet<_> = ROUTES
        .iter()
        .map(|r| {
            let api = match r.plane {
                Plane::Runtime => "RuntimeApi",
                Plane::Admin => "AdminApi",
            };
            (api.to_string(), r.function.to_string(), r.method.to_string(), r.template.to_string())
        })
        .collect();
    assert_eq!(declared, table);
}

#[test]
fn every_function_has_a_binary() {
    for r in ROUTES {
        let path = format!("{}/../functions/src/bin/{}.rs", env!("CARGO_MANIFEST_DIR"), r.function);
        assert!(std::path::Path::new(&path).exists(), "missing {path}");
    }
}

#[test]
fn every_function_deploys_the_shared_binary() {
    let t = template();
    let functions = t.matches("Type: AWS::Serverless::Function").count();
    assert_eq!(t.matches("Binary: cycles-lambda").count(), functions, "one artifact for every function");
    assert_eq!(t.matches("CYCLES_FUNCTION: ").count(), functions, "each function names itself");
    assert!(
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../functions/src/bin/cycles-lambda.rs")).exists()
    );
}

/// The created store outlives the stack: deleting the stack or replacing the cache keeps it, and
/// it takes a daily snapshot kept for a configurable number of days (issue 28, item 4).
#[test]
fn the_created_store_is_retained_and_snapshotted() {
    let t = template();
    let cache = resource(&t, "Cache");
    for line in [
        "Type: AWS::ElastiCache::ServerlessCache",
        "DeletionPolicy: Retain",
        "UpdateReplacePolicy: Retain",
        "SnapshotRetentionLimit: !Ref SnapshotRetentionDays",
        "DailySnapshotTime: !Ref DailySnapshotTime",
    ] {
        assert!(cache.contains(line), "the cache resource lacks {line}:\n{cache}");
    }
    let memorydb = resource(&t, "MemoryDb");
    for line in [
        "Type: AWS::MemoryDB::Cluster",
        "Condition: CreateMemoryDb",
        "DeletionPolicy: Retain",
        "UpdateReplacePolicy: Retain",
        "TLSEnabled: true",
        "SnapshotRetentionLimit: !Ref SnapshotRetentionDays",
        "SnapshotWindow: !Ref MemoryDbSnapshotWindow",
    ] {
        assert!(memorydb.contains(line), "the MemoryDB resource lacks {line}:\n{memorydb}");
    }
    assert!(t.contains("  SnapshotRetentionDays:\n    Type: Number\n    Default: 7"), "7 days by default");
}

/// The template passes its durability and eviction settings to every function (issue 28,
/// item 1; the eviction check of readiness).
#[test]
fn the_durability_setting_reaches_every_function() {
    let t = template();
    for var in [
        "CYCLES_DURABILITY: !Ref Durability",
        "CYCLES_DURABILITY_REPLICAS: !Ref DurabilityReplicas",
        "CYCLES_DURABILITY_TIMEOUT_MS: !Ref DurabilityTimeoutMs",
        "CYCLES_STORE_EVICTION: !Ref StoreEviction",
    ] {
        let globals = t.split("\nGlobals:\n").nth(1).and_then(|g| g.split("\nResources:\n").next()).unwrap();
        assert!(globals.contains(var), "the functions' environment lacks {var}");
    }
    assert!(t.contains("AllowedValues: [none, replica, fsync]"));
    assert!(t.contains("  StoreEviction:\n    Type: String\n    Default: refuse\n    AllowedValues: [refuse, allow]"));
}

/// The text of the resource `name` (its indented block).
fn resource(t: &str, name: &str) -> String {
    let block = t.split(&format!("\n  {name}:\n")).nth(1).unwrap_or_else(|| panic!("the {name} resource"));
    block.lines().take_while(|l| l.is_empty() || l.starts_with("    ")).collect::<Vec<_>>().join("\n")
}

//! The archive (S3) and the alert bus (EventBridge), against a real emulator (moto in server
//! mode, started per test): each event and audit entry in exactly one object across a crash
//! between the upload and the cursor's move and across overlapping invocations; retention
//! never trims what is not archived; alert events reach a bus and its rules' targets.

use std::collections::HashMap;
use std::io::Read;

use cycles_shared::config::{ExportConfig, SweepOptions};
use cycles_shared::jobs::export::{export_owner, publish_alerts, step, Kind, Stepped, Stop};
use cycles_shared::keys::TenantKeys;
use cycles_shared::local::EmbeddedRedis;
use cycles_tests::*;
use redis::AsyncCommands;
use serde_json::Value;

fn archive(bucket: &str) -> ExportConfig {
    ExportConfig { bucket: Some(bucket.into()), prefix: "cycles/".into(), alert_bus: None }
}

/// Every line of every object under `prefix`, by object.
async fn archived(moto: &Moto, bucket: &str, prefix: &str) -> HashMap<String, Vec<Value>> {
    let aws = moto.aws();
    let mut out = HashMap::new();
    for key in aws.list_keys(bucket, prefix).await.unwrap() {
        let gz = aws.get_object(bucket, &key).await.unwrap().expect("listed object");
        let mut text = String::new();
        flate2::read::GzDecoder::new(&gz[..]).read_to_string(&mut text).unwrap();
        out.insert(key, text.lines().map(|l| serde_json::from_str(l).unwrap()).collect());
    }
    out
}

/// `n` reservation.denied events (a reserve past a 10-token budget each).
async fn denials(h: &Harness, t: &Tenant, n: usize) {
    for _ in 0..n {
        h.reserve(t, 100, json!({})).await.assert_error(409, "BUDGET_EXCEEDED");
    }
}

fn ids(objects: &HashMap<String, Vec<Value>>, field: &str) -> Vec<String> {
    let mut all: Vec<String> = objects.values().flatten().map(|v| v[field].as_str().unwrap().to_string()).collect();
    all.sort();
    all
}

#[tokio::test]
async fn each_entry_is_archived_exactly_once_across_a_crash_and_overlapping_runs() {
    let (h, moto) = (Harness::start().await, Moto::start().await);
    let aws = moto.aws();
    aws.create_bucket("archive").await.unwrap();
    let cfg = archive("archive");
    let t = h.funded(10).await;
    denials(&h, &t, 4).await;
    // a crash after the upload: the batch stays pending
    let Stepped::Wrote(first) = step(&h.store, &aws, &cfg, &t.id, Kind::Events, Stop::AfterUpload).await.unwrap()
    else {
        panic!("nothing written")
    };
    assert!(first.starts_with(&format!("cycles/events/tenant={}/date=", t.id)), "{first}");
    assert!(first.ends_with(".jsonl.gz"));
    denials(&h, &t, 3).await;
    // the next run re-uploads the pending batch under the same name, then the rest; two runs at
    // once never put an entry in two objects
    let (a, b) = tokio::join!(export_owner(&h.store, &aws, &cfg, &t.id), export_owner(&h.store, &aws, &cfg, &t.id));
    assert!(a.unwrap() + b.unwrap() >= 1);
    assert_eq!(export_owner(&h.store, &aws, &cfg, &t.id).await.unwrap(), 0, "nothing left to export");

    let events = archived(&moto, "archive", &format!("cycles/events/tenant={}/", t.id)).await;
    assert!(events.contains_key(&first), "the pending batch kept its name");
    let mut want: Vec<String> =
        h.all_events(&t.id).await.iter().map(|e| e["event_id"].as_str().unwrap().to_string()).collect();
    want.sort();
    assert_eq!(ids(&events, "event_id"), want, "every event once, none twice");
    assert!(want.len() >= 8, "{want:?}");

    // audit entries too, as the audit API serves them
    let audit = archived(&moto, "archive", &format!("cycles/audit/tenant={}/", t.id)).await;
    let entries: usize = audit.values().map(Vec::len).sum();
    let stream: usize = h.store.conn().xlen(TenantKeys::new(&t.id).audit_log()).await.unwrap();
    assert_eq!(entries, stream);
    let logged = ids(&audit, "log_id");
    let mut unique = logged.clone();
    unique.dedup();
    assert_eq!(logged, unique);
}

#[tokio::test]
async fn retention_trims_only_what_the_archive_holds() {
    let (h, moto) = (Harness::start().await, Moto::start().await);
    let aws = moto.aws();
    aws.create_bucket("keep").await.unwrap();
    let t = h.funded(10).await;
    denials(&h, &t, 3).await;
    let events = TenantKeys::new(&t.id).events();
    let before: usize = h.store.conn().xlen(&events).await.unwrap();
    let opts =
        SweepOptions { event_retention: std::time::Duration::ZERO, export: archive("keep"), ..Default::default() };
    // nothing archived yet: nothing trimmed, however old
    h.sweep_tenant(&t, &opts).await;
    let kept: usize = h.store.conn().xlen(&events).await.unwrap();
    assert_eq!(kept, before);
    // archived: then trimmed (the last archived millisecond stays until a later one is archived)
    export_owner(&h.store, &aws, &archive("keep"), &t.id).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    denials(&h, &t, 1).await;
    h.sweep_tenant(&t, &opts).await;
    let left: usize = h.store.conn().xlen(&events).await.unwrap();
    assert!(left < before, "{left} of {before}");
    // and without an archive, retention is as configured (a zero retention keeps the entries
    // of the current millisecond: the sweep runs in a later one)
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let plain = SweepOptions { event_retention: std::time::Duration::ZERO, ..Default::default() };
    h.sweep_tenant(&t, &plain).await;
    let left: usize = h.store.conn().xlen(&events).await.unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn alert_events_reach_the_bus_and_its_rules_targets() {
    let (h, moto) = (Harness::start().await, Moto::start().await);
    let aws = moto.aws();
    let call = |service: &'static str, target: &'static str, version: &'static str, body: Value| {
        let aws = aws.clone();
        async move { aws.json_call(service, target, version, &body).await.unwrap() }
    };
    call("events", "AWSEvents.CreateEventBus", "1.1", json!({"Name": "alerts"})).await;
    let queue = call("sqs", "AmazonSQS.CreateQueue", "1.0", json!({"QueueName": "pager"})).await;
    let queue_url = queue["QueueUrl"].as_str().unwrap().to_string();
    let attrs = call(
        "sqs",
        "AmazonSQS.GetQueueAttributes",
        "1.0",
        json!({"QueueUrl": queue_url, "AttributeNames": ["QueueArn"]}),
    )
    .await;
    let arn = attrs["Attributes"]["QueueArn"].as_str().unwrap().to_string();
    call(
        "events",
        "AWSEvents.PutRule",
        "1.1",
        json!({"Name": "cycles", "EventBusName": "alerts", "EventPattern": "{\"source\":[\"cycles\"]}"}),
    )
    .await;
    call(
        "events",
        "AWSEvents.PutTargets",
        "1.1",
        json!({"Rule": "cycles", "EventBusName": "alerts", "Targets": [{"Id": "pager", "Arn": arn}]}),
    )
    .await;

    let t = h.funded(100).await;
    // a bus set up now starts at the latest event: budget.created is not replayed
    assert_eq!(publish_alerts(&h.store, &aws, "alerts", &t.id).await.unwrap(), 0);
    let body = json!({"idempotency_key": unique("ev"), "subject": {"tenant": t.id},
        "action": {"kind": "tool.call", "name": "x"}, "actual": {"unit": "TOKENS", "amount": 100}});
    assert_eq!(h.post(&t.key, "/v1/events", &body).await.status, 201);
    let alerts: Vec<String> = h
        .all_events(&t.id)
        .await
        .iter()
        .map(|e| e["event_type"].as_str().unwrap().to_string())
        .filter(|k| cycles_shared::jobs::export::ALERT_TYPES.contains(&k.as_str()))
        .collect();
    assert!(alerts.contains(&"budget.exhausted".to_string()), "{alerts:?}");
    assert_eq!(publish_alerts(&h.store, &aws, "alerts", &t.id).await.unwrap(), alerts.len() as u64);
    assert_eq!(publish_alerts(&h.store, &aws, "alerts", &t.id).await.unwrap(), 0, "each alert once");

    let got = call(
        "sqs",
        "AmazonSQS.ReceiveMessage",
        "1.0",
        json!({"QueueUrl": queue_url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1}),
    )
    .await;
    let kinds: Vec<String> = got["Messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let e: Value = serde_json::from_str(m["Body"].as_str().unwrap()).unwrap();
            assert_eq!(e["source"], "cycles");
            assert_eq!(e["detail"]["tenant_id"], t.id, "{e}");
            e["detail-type"].as_str().unwrap().to_string()
        })
        .collect();
    let mut kinds = kinds;
    kinds.sort();
    let mut alerts = alerts;
    alerts.sort();
    assert_eq!(kinds, alerts);
}

#[tokio::test]
async fn signed_evidence_envelopes_are_archived_once_each() {
    use cycles_shared::evidence::Signer;
    let keys = r#"[{"kid": "k1", "private_key": "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60", "nbf_ms": 0}]"#;
    let h = Harness::start_configured(|c| {
        c.evidence.mode = cycles_shared::config::EvidenceMode::On;
        c.evidence.signer = Some(Signer::from_config("https://cycles.test/v1", keys).unwrap());
        c.export = archive("receipts");
    })
    .await;
    let moto = Moto::start().await;
    let aws = moto.aws();
    aws.create_bucket("receipts").await.unwrap();
    let t = h.funded(1_000).await;
    let mut issued = Vec::new();
    for _ in 0..3 {
        let r = h.reserve(&t, 10, json!({})).await;
        let body = r.assert_ok().clone();
        issued.push(body["cycles_evidence"]["evidence_id"].as_str().unwrap().to_string());
        let rid = body["reservation_id"].as_str().unwrap();
        let c = h.commit(&t, rid, 5).await;
        issued.push(c.assert_ok()["cycles_evidence"]["evidence_id"].as_str().unwrap().to_string());
    }
    let cfg = archive("receipts");
    export_owner(&h.store, &aws, &cfg, &t.id).await.unwrap();
    export_owner(&h.store, &aws, &cfg, &t.id).await.unwrap();
    let objects = archived(&moto, "receipts", &format!("cycles/evidence/tenant={}/", t.id)).await;
    let mut got = ids(&objects, "evidence_id");
    issued.sort();
    got.dedup();
    assert_eq!(got, issued);
    assert_eq!(objects.values().map(Vec::len).sum::<usize>(), issued.len(), "each once");
    // each line is the envelope as served: signed, verifiable
    let line = &objects.values().next().unwrap()[0];
    assert!(line["signature"].is_string() && line["signer_did"].is_string(), "{line}");
}

#[tokio::test]
async fn the_sweep_archives_and_publishes_on_its_pass() {
    // (a Redis of its own: the pass crawls every tenant of it)
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let (h, moto) = (Harness::start_with_redis(redis, |_| {}).await, Moto::start().await);
    let aws = moto.aws();
    aws.create_bucket("swept").await.unwrap();
    aws.json_call("events", "AWSEvents.CreateEventBus", "1.1", &json!({"Name": "ops"})).await.unwrap();
    let opts = SweepOptions {
        export: ExportConfig { alert_bus: Some("ops".into()), ..archive("swept") },
        aws: Some(aws.clone()),
        ..Default::default()
    };
    let t = h.funded(10).await;
    // the first pass starts the bus at the latest event and archives what there is
    let first = cycles_shared::jobs::sweep::sweep(&h.store, &opts).await.unwrap();
    assert!(first.exported_objects >= 2, "{first:?}");
    denials(&h, &t, 2).await;
    let body = json!({"idempotency_key": unique("ev"), "subject": {"tenant": t.id},
        "action": {"kind": "tool.call", "name": "x"}, "actual": {"unit": "TOKENS", "amount": 10}});
    assert_eq!(h.post(&t.key, "/v1/events", &body).await.status, 201);
    let second = cycles_shared::jobs::sweep::sweep(&h.store, &opts).await.unwrap();
    assert!(second.exported_objects >= 1 && second.alerts_published >= 1, "{second:?}");
    let events = archived(&moto, "swept", &format!("cycles/events/tenant={}/", t.id)).await;
    assert_eq!(ids(&events, "event_id").len(), h.all_events(&t.id).await.len());
}

//! Binary size and cold start of the built Lambda functions (`target/lambda/<fn>/bootstrap`,
//! from `cargo lambda build --release`): each binary is started against an emulated Lambda
//! Runtime API on loopback and timed from process start to its first answered invocation.

use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

/// What the emulated Runtime API saw: when the first response (or init error) arrived.
#[derive(Default)]
struct Seen {
    answered: Option<Instant>,
}

/// An API Gateway HTTP API (v2) event for `method path`.
fn http_event(method: &str, path: &str) -> Value {
    json!({
        "version": "2.0", "routeKey": format!("{method} {path}"), "rawPath": path, "rawQueryString": "",
        "headers": {"content-type": "application/json"},
        "requestContext": {"accountId": "123456789012", "apiId": "bench", "domainName": "bench.local",
            "domainPrefix": "bench", "requestId": "bench-1", "routeKey": format!("{method} {path}"),
            "stage": "$default", "time": "02/Dec/2026:00:00:00 +0000", "timeEpoch": 0,
            "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1", "userAgent": "bench"}},
        "isBase64Encoded": false,
        "body": "{}"
    })
}

async fn runtime_api(event: Value, seen: Arc<Mutex<Seen>>) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = Arc::new(Mutex::new(false));
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let (event, seen, served) = (event.clone(), seen.clone(), served.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (event, seen, served) = (event.clone(), seen.clone(), served.clone());
                    async move {
                        let path = req.uri().path().to_string();
                        let _ = req.into_body().collect().await;
                        let res = if path.ends_with("/invocation/next") {
                            let first = !std::mem::replace(&mut *served.lock().unwrap(), true);
                            if !first {
                                // one invocation only: park the function
                                tokio::time::sleep(Duration::from_secs(3600)).await;
                            }
                            let deadline = cycles_shared::domain::now_ms() + 10_000;
                            Response::builder()
                                .header("lambda-runtime-aws-request-id", "bench-1")
                                .header("lambda-runtime-deadline-ms", deadline.to_string())
                                .header(
                                    "lambda-runtime-invoked-function-arn",
                                    "arn:aws:lambda:us-east-1:123456789012:function:bench",
                                )
                                .header("lambda-runtime-trace-id", "Root=1-00000000-000000000000000000000000")
                                .body(Full::new(Bytes::from(event.to_string())))
                                .unwrap()
                        } else {
                            seen.lock().unwrap().answered.get_or_insert_with(Instant::now);
                            Response::builder().status(202).body(Full::new(Bytes::new())).unwrap()
                        };
                        Ok::<_, Infallible>(res)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    (port, task)
}

/// Size and cold start of every HTTP function under `dir`; scheduled ones report size only.
pub async fn measure(dir: &Path, redis_url: &str) -> Value {
    let mut rows = vec![];
    let mut entries: Vec<_> = std::fs::read_dir(dir).map(|d| d.flatten().collect()).unwrap_or_default();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().to_string();
        let bin = entry.path().join("bootstrap");
        let Ok(meta) = std::fs::metadata(&bin) else { continue };
        let size_mb = meta.len() as f64 / 1_048_576.0;
        let route = cycles_shared::api::route_of(&name);
        let Some(route) = route else {
            // the scheduled functions (no HTTP event to time); cycles-local is not a function
            if name != "cycles-local" {
                rows.push(json!({"function": name, "size_mb": (size_mb * 100.0).round() / 100.0}));
            }
            continue;
        };
        let path = route.template.replace("{reservation_id}", "x.y.z").replace(['{', '}'], "");
        let mut samples = vec![];
        for _ in 0..3 {
            let seen = Arc::new(Mutex::new(Seen::default()));
            let (port, server) = runtime_api(http_event(route.method.as_str(), &path), seen.clone()).await;
            let started = Instant::now();
            let mut child = tokio::process::Command::new(&bin)
                .env("AWS_LAMBDA_RUNTIME_API", format!("127.0.0.1:{port}"))
                .env("AWS_LAMBDA_FUNCTION_NAME", &name)
                .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
                .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
                .env("AWS_LAMBDA_LOG_STREAM_NAME", "bench")
                .env("AWS_LAMBDA_LOG_GROUP_NAME", "bench")
                .env("AWS_REGION", "us-east-1")
                .env("REDIS_URL", redis_url)
                .env("CYCLES_KEY_PEPPER", "bench-pepper-bench-pepper-bench-pepper")
                .env("RUST_LOG", "error")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("start the function binary");
            let answered = loop {
                if let Some(at) = seen.lock().unwrap().answered {
                    break Some(at);
                }
                if started.elapsed() > Duration::from_secs(10) {
                    break None;
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            };
            let _ = child.kill().await;
            server.abort();
            if let Some(at) = answered {
                samples.push(at.duration_since(started).as_secs_f64() * 1000.0);
            }
        }
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let median = samples.get(samples.len() / 2).copied();
        rows.push(json!({"function": name, "size_mb": (size_mb * 100.0).round() / 100.0,
            "cold_start_ms": median.map(|m| (m * 10.0).round() / 10.0)}));
    }
    Value::Array(rows)
}

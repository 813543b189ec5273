//! Binary size and cold start of the built Lambda functions (`target/lambda/<fn>/bootstrap`,
//! from `cargo lambda build --release`): each binary is started against an emulated Lambda
//! Runtime API on loopback and timed from process start to its first answered invocation. The
//! shared artifact (`target/lambda/cycles-lambda/bootstrap`) is started once per function it
//! serves, named by `CYCLES_FUNCTION`, as the deployment runs it; `smoke` does that for a few
//! functions and checks each answered an API Gateway response that is not a server error.

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

/// What the emulated Runtime API saw: when the first response (or init error) arrived, and
/// what it said.
#[derive(Default)]
struct Seen {
    answered: Option<Instant>,
    response: Option<Value>,
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
                        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
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
                            let mut seen = seen.lock().unwrap();
                            seen.answered.get_or_insert_with(Instant::now);
                            if seen.response.is_none() {
                                seen.response =
                                    Some(serde_json::from_slice(&body).unwrap_or_else(|_| json!({"unreadable": path})));
                            }
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

/// One start of `bin` serving `function` (as `CYCLES_FUNCTION` too): the time to its first
/// answer and the answer, or None when it gave none within 10 s.
async fn start_once(
    bin: &Path,
    function: &str,
    route: &cycles_shared::api::Route,
    redis_url: &str,
) -> Option<(f64, Value)> {
    let path = route.template.replace("{reservation_id}", "x.y.z").replace(['{', '}'], "");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (port, server) = runtime_api(http_event(route.method.as_str(), &path), seen.clone()).await;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(bin)
        .env("AWS_LAMBDA_RUNTIME_API", format!("127.0.0.1:{port}"))
        .env("AWS_LAMBDA_FUNCTION_NAME", function)
        .env("CYCLES_FUNCTION", function)
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
        let got = {
            let s = seen.lock().unwrap();
            s.answered.zip(s.response.clone())
        };
        if let Some((at, answer)) = got {
            break Some((at.duration_since(started).as_secs_f64() * 1000.0, answer));
        }
        if started.elapsed() > Duration::from_secs(10) {
            break None;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    };
    let _ = child.kill().await;
    server.abort();
    answered
}

/// The median of three cold starts of `bin` serving `function`, with its last answer.
async fn cold_start(
    bin: &Path,
    function: &str,
    route: &cycles_shared::api::Route,
    redis_url: &str,
) -> (Option<f64>, Option<Value>) {
    let mut samples = vec![];
    let mut answer = None;
    for _ in 0..3 {
        if let Some((ms, a)) = start_once(bin, function, route, redis_url).await {
            samples.push(ms);
            answer = Some(a);
        }
    }
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (samples.get(samples.len() / 2).copied(), answer)
}

fn size_mb(bin: &Path) -> Option<f64> {
    std::fs::metadata(bin).ok().map(|m| (m.len() as f64 / 1_048_576.0 * 100.0).round() / 100.0)
}

/// Size and cold start of every HTTP function under `dir` (per-function binaries, and the
/// shared artifact for every route it serves); scheduled ones report size only.
pub async fn measure(dir: &Path, redis_url: &str) -> Value {
    let mut rows = vec![];
    let mut entries: Vec<_> = std::fs::read_dir(dir).map(|d| d.flatten().collect()).unwrap_or_default();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().to_string();
        let bin = entry.path().join("bootstrap");
        let Some(size) = size_mb(&bin) else { continue };
        if name == "cycles-lambda" {
            for route in cycles_shared::api::ROUTES {
                let (ms, _) = cold_start(&bin, route.function, route, redis_url).await;
                rows.push(json!({"function": format!("cycles-lambda as {}", route.function), "size_mb": size,
                    "cold_start_ms": ms.map(|m| (m * 10.0).round() / 10.0)}));
            }
            continue;
        }
        let Some(&route) = cycles_shared::api::routes_of(&name).first() else {
            // the scheduled functions (no HTTP event to time); cycles-local is not a function
            if name != "cycles-local" {
                rows.push(json!({"function": name, "size_mb": size}));
            }
            continue;
        };
        let (ms, _) = cold_start(&bin, &name, route, redis_url).await;
        rows.push(json!({"function": name, "size_mb": size, "cold_start_ms": ms.map(|m| (m * 10.0).round() / 10.0)}));
    }
    Value::Array(rows)
}

/// The deployed shape, checked: the shared artifact under `dir` started as each of `functions`
/// answers its API Gateway v2 event through the emulated Runtime API with a response that is
/// not a server error (and carries the request id). Prints a line per function; false when any
/// failed.
pub async fn smoke(dir: &Path, redis_url: &str, functions: &[&str]) -> bool {
    let bin = dir.join("cycles-lambda").join("bootstrap");
    let mut ok = size_mb(&bin).is_some();
    println!("smoke: {} ({} MB)", bin.display(), size_mb(&bin).unwrap_or(0.0));
    for name in functions {
        let Some(&route) = cycles_shared::api::routes_of(name).first() else {
            println!("smoke: {name}: no such function");
            ok = false;
            continue;
        };
        let answer = start_once(&bin, name, route, redis_url).await;
        let status = answer.as_ref().and_then(|(_, a)| a["statusCode"].as_u64());
        let request_id = answer.as_ref().is_some_and(|(_, a)| a["headers"]["x-request-id"].is_string());
        let good = status.is_some_and(|s| s < 500) && request_id;
        println!(
            "smoke: {name}: status {status:?}, cold start {:?} ms, {}",
            answer.map(|(ms, _)| ms.round()),
            if good { "ok" } else { "FAILED" }
        );
        ok &= good;
    }
    ok
}

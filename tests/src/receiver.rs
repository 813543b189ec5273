//! A webhook receiver on loopback: records every request, verifies its signature, and answers
//! with the configured status codes (or stalls, to provoke a timeout).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// One received delivery.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: Vec<(String, String)>,
    pub body: Value,
    pub signature_valid: bool,
    /// When it arrived (ms since the Unix epoch).
    pub at_ms: i64,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// What the receiver answers next: a status, or a stall longer than the sender's timeout.
#[derive(Debug, Clone, Copy)]
pub enum Reply {
    Status(u16),
    Stall(Duration),
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    script: VecDeque<Reply>,
    always: Option<Reply>,
    secret: String,
}

pub struct Receiver {
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl Receiver {
    /// Starts a receiver that answers 200 unless told otherwise.
    pub async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let state = shared.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(handle(state, req).await) }
                    });
                    let _ =
                        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        Receiver { url, state }
    }

    /// The signing secret deliveries must be signed with.
    pub fn expect_secret(&self, secret: &str) {
        self.state.lock().unwrap().secret = secret.to_string();
    }

    /// Answers every request from now on with `reply` (a tar pit, with a long stall).
    pub fn always(&self, reply: Reply) {
        self.state.lock().unwrap().always = Some(reply);
    }

    /// Answers for the next requests, in order (then 200 again).
    pub fn script(&self, replies: &[Reply]) {
        self.state.lock().unwrap().script.extend(replies.iter().copied());
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// Waits until `n` requests arrived (panics after `timeout`), driving `tick` meanwhile.
    pub async fn wait_for<F, Fut>(&self, n: usize, timeout: Duration, mut tick: F) -> Vec<Received>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            assert!(std::time::Instant::now() < deadline, "only {} of {n} deliveries arrived: {got:?}", got.len());
            tick().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn handle(state: Arc<Mutex<State>>, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let headers: Vec<(String, String)> =
        req.headers().iter().map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string())).collect();
    let raw = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let (reply, secret) = {
        let mut s = state.lock().unwrap();
        (s.script.pop_front().or(s.always).unwrap_or(Reply::Status(200)), s.secret.clone())
    };
    let given = headers.iter().find(|(k, _)| k == "x-cycles-signature").map(|(_, v)| v.clone()).unwrap_or_default();
    let signature_valid = given == cycles_shared::webhooks::signature(&secret, &raw);
    let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let at_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    state.lock().unwrap().received.push(Received { headers, body, signature_valid, at_ms });
    let status = match reply {
        Reply::Status(s) => s,
        Reply::Stall(d) => {
            tokio::time::sleep(d).await;
            200
        }
    };
    Response::builder().status(status).body(Full::new(Bytes::from_static(b"{}"))).unwrap()
}

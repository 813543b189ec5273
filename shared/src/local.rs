//! The local gateway (`cycles-local`): serves the whole route table over HTTP/1.1 in one
//! process, calling the same handlers as the Lambda functions, and an embedded `redis-server`
//! for development and tests.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

use crate::api::{self, ApiRequest, ApiResponse, App, Plane};
use crate::error::ApiError;

/// Request bodies above this size are refused with 413.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Serves one plane of `app` on an already bound listener until the task is dropped.
pub async fn serve(app: Arc<App>, listener: TcpListener, plane: Plane) -> std::io::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        // (the peer's address, written once per connection: formatting it cost each request
        // about 1% of its gateway instructions)
        let peer: Arc<str> = peer.ip().to_string().into();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let (app, peer) = (app.clone(), peer.clone());
                async move { Ok::<_, Infallible>(dispatch(&app, plane, req, &peer).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}

fn to_hyper(res: ApiResponse) -> Response<Full<Bytes>> {
    api::into_http(res, |body| Full::new(Bytes::from(body)))
}

async fn dispatch(app: &App, plane: Plane, req: Request<Incoming>, peer: &str) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = Limited::new(body, MAX_BODY_BYTES).collect().await.map(|b| b.to_bytes());
    let mut api_req = ApiRequest {
        method: parts.method,
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or_default().to_string(),
        headers: parts.headers,
        body: Bytes::new(),
        params: Default::default(),
        source_ip: Some(peer.to_string()),
        iam_principal: None,
    };
    match body {
        Ok(b) => api_req.body = b,
        Err(_) => {
            let mut res = api::not_found(&api_req);
            let err = ApiError::invalid(format!("Request body exceeds {MAX_BODY_BYTES} bytes"));
            let ids = (res.headers[1].1.clone(), res.headers[2].1.clone());
            res.status = 413;
            res.body = serde_json::to_vec(&err.body(&ids.0, &ids.1)).expect("serializable");
            return to_hyper(res);
        }
    }
    if let Some(res) = floor(app, &api_req).await {
        return res;
    }
    let origins = &app.config.cors_origins;
    if let Some(res) = api::cors::preflight(origins, plane, &api_req) {
        return to_hyper(res);
    }
    let origin = api::cors::origin_of(&api_req);
    let mut res = match api::route(plane, &api_req.method, &api_req.path) {
        Some((route, params)) => api::handle(app, route, ApiRequest { params, ..api_req }).await,
        None => api::no_route(plane, &api_req),
    };
    api::cors::decorate(origins, origin.as_ref(), &mut res);
    to_hyper(res)
}

/// Benchmark floors, outside `/v1`: no work at all, and one trivial EVALSHA.
async fn floor(app: &App, req: &ApiRequest) -> Option<Response<Full<Bytes>>> {
    let body = match req.path.as_str() {
        "/_floor/http" => "{}".to_string(),
        "/_floor/redis" => {
            let mut conn = app.store.conn();
            match crate::store::PING.key("cy:{floor}:x").invoke_async::<i64>(&mut conn).await {
                Ok(v) => format!("{{\"ok\":{v}}}"),
                Err(e) => format!("{{\"error\":{:?}}}", e.to_string()),
            }
        }
        _ => return None,
    };
    Some(Response::new(Full::new(Bytes::from(body))))
}

/// Why an embedded `redis-server` did not start.
#[derive(Debug)]
pub enum RedisStartError {
    /// The binary could not be run at all (not installed): trying again cannot help.
    Missing(String),
    /// It ran but did not serve (a port taken meanwhile, an early exit, no answer).
    Failed(String),
}

impl std::fmt::Display for RedisStartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing(m) | Self::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for RedisStartError {}

impl From<RedisStartError> for String {
    fn from(e: RedisStartError) -> String {
        e.to_string()
    }
}

/// A `redis-server` child process on a free loopback port, stopped when dropped.
pub struct EmbeddedRedis {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

impl EmbeddedRedis {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts `redis-server` (from PATH, or `REDIS_SERVER_BIN`) with the given extra arguments
    /// and waits until it answers PING. A port lost to a race with another process is retried
    /// on a fresh one.
    pub async fn start(extra_args: &[&str]) -> Result<EmbeddedRedis, RedisStartError> {
        let mut last_error = RedisStartError::Failed("no attempt made".into());
        for _ in 0..5 {
            let port = free_port().map_err(|e| RedisStartError::Failed(format!("no free port: {e}")))?;
            match Self::start_on_port(port, extra_args).await {
                Ok(redis) => return Ok(redis),
                Err(e @ RedisStartError::Missing(_)) => return Err(e),
                Err(e) => last_error = e,
            }
        }
        Err(last_error)
    }

    /// Like `start`, on a given port (e.g. to restart a server where it was).
    pub async fn start_on_port(port: u16, extra_args: &[&str]) -> Result<EmbeddedRedis, RedisStartError> {
        let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_string());
        let dir = std::env::temp_dir().join(format!("cycles-redis-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| RedisStartError::Failed(format!("cannot create {}: {e}", dir.display())))?;
        let port_s = port.to_string();
        let mut args = vec!["--port", &port_s, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
        args.extend_from_slice(&["--dir", dir.to_str().unwrap_or(".")]);
        args.extend_from_slice(extra_args);
        let child = Command::new(&bin)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                RedisStartError::Missing(format!(
                    "could not start `{bin}` ({e}). Install Redis (Debian/Ubuntu: `sudo apt-get install -y \
                     redis-server`; macOS: `brew install redis`) or point REDIS_URL at a running server."
                ))
            })?;
        let mut redis = EmbeddedRedis { child, port, dir };
        redis.wait_ready().await.map_err(RedisStartError::Failed)?;
        Ok(redis)
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        for _ in 0..400 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("redis-server on port {} exited ({status})", self.port));
            }
            if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                if redis::cmd("PING").query_async::<String>(&mut c).await.is_ok() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err(format!("redis-server on port {} did not become ready", self.port))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

impl Drop for EmbeddedRedis {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A currently free loopback port, picked at random below the kernel's ephemeral range
/// (32768+) so that no outgoing connection can take it between this check and the bind, and
/// below the test cluster's range (20000+).
pub fn free_port() -> std::io::Result<u16> {
    use std::hash::{BuildHasher, RandomState};
    let state = RandomState::new();
    for attempt in 0u32..1000 {
        let port = 10_000 + (state.hash_one(attempt) % 10_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Binds the gateway's listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

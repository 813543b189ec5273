//! Command line of `cycles-local`.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;

use crate::api::{App, Plane};
use crate::config::Config;
use crate::local::{self, EmbeddedRedis};
use crate::model::Unit;
use crate::provision::{self, NewApiKey, NewBudget, NewTenant};

const USAGE: &str = "cycles-local: the Cycles runtime and operator APIs on two local ports

USAGE: cycles-local [--port N] [--admin-port N] [--host IP] [--redis-url URL] [--seed-demo]
                    [--dev-webhooks] [--no-background]

  --port N         port of the runtime API (default 7878)
  --admin-port N   port of the operator (admin) API (default 7979)
  --host IP        address to bind (default 127.0.0.1)
  --redis-url URL  Redis to use (default: $REDIS_URL, else an embedded redis-server
                   started on a free port and stopped on exit)
  --seed-demo      create a demo tenant, API key and budget and print curl examples
  --dev-webhooks   development only: webhooks may call http:// and private or loopback
                   endpoints (e.g. a receiver on localhost); without it the deployed
                   SSRF rules apply
  --no-background  serve requests only: no embedded expiry sweep or webhook delivery loop
                   (what `cycles-bench --costs` measures)";

struct Args {
    port: u16,
    admin_port: u16,
    host: IpAddr,
    redis_url: Option<String>,
    seed_demo: bool,
    dev_webhooks: bool,
    background: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        port: 7878,
        admin_port: 7979,
        host: [127, 0, 0, 1].into(),
        redis_url: None,
        seed_demo: false,
        dev_webhooks: false,
        background: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--port" => args.port = value("--port")?.parse().map_err(|_| "--port must be a number")?,
            "--admin-port" => {
                args.admin_port = value("--admin-port")?.parse().map_err(|_| "--admin-port must be a number")?
            }
            "--host" => args.host = value("--host")?.parse().map_err(|_| "--host must be an IP address")?,
            "--redis-url" => args.redis_url = Some(value("--redis-url")?),
            "--seed-demo" => args.seed_demo = true,
            "--dev-webhooks" => args.dev_webhooks = true,
            "--no-background" => args.background = false,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

pub fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}\n");
            }
            eprintln!("{USAGE}");
            return if e.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(2) };
        }
    };
    crate::init_tracing(false);
    // One thread, like a Lambda container (`lambda::start`): no hand-offs between workers on
    // the request path; the embedded maintenance and delivery loops are I/O bound.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let configured = args.redis_url.clone().or_else(|| std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()));
    // Keep the embedded server alive for the whole run; dropping it stops the child.
    let (_embedded, url) = match configured {
        Some(url) => (None, url),
        None => {
            let redis = EmbeddedRedis::start(&[]).await?;
            let url = redis.url();
            eprintln!("started embedded redis-server at {url} (stopped on exit)");
            (Some(redis), url)
        }
    };
    let mut config = Config::from_env(Some(&url));
    config.redis_url = url.clone();
    if args.dev_webhooks {
        eprintln!(
            "--dev-webhooks: webhook endpoints may be http:// and private or loopback addresses \
             (the SSRF guard is off; never run a shared or deployed server like this)"
        );
        tracing::warn!("webhook SSRF guard relaxed for development (--dev-webhooks)");
        config.webhooks.egress = crate::egress::EgressRules {
            allowed_url_patterns: config.webhooks.egress.allowed_url_patterns.clone(),
            ..crate::egress::EgressRules::development()
        };
    }
    if config.admin_api_key.is_none() {
        // A local-only convenience: without ADMIN_API_KEY the operator API gets a fresh key.
        let key = format!("local-admin-{}", uuid::Uuid::new_v4().simple());
        eprintln!("ADMIN_API_KEY is not set; the operator API accepts X-Admin-API-Key: {key}");
        config.admin_api_key = Some(key);
    }
    let addr = SocketAddr::new(args.host, args.port);
    if let Some(keys) = config.evidence.complete_for_local(&format!("http://{addr}")) {
        // shown once on the terminal (never logged): keep it to verify these receipts later
        println!(
            "CyclesEvidence signing key generated; to keep it across restarts set\n  CYCLES_EVIDENCE_KEYS='{keys}'"
        );
    }
    config.validate()?;
    let store = config.open_store().await.map_err(|e| format!("cannot connect to {url}: {e}"))?;
    let app = Arc::new(App::new(store, config));
    let listener = local::bind(addr).await.map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let admin_addr = SocketAddr::new(args.host, args.admin_port);
    let admin_listener = local::bind(admin_addr).await.map_err(|e| format!("cannot listen on {admin_addr}: {e}"))?;
    let base = format!("http://{addr}");
    let admin_base = format!("http://{admin_addr}");
    if args.seed_demo {
        seed_demo(&app, &base, &admin_base).await?;
    }
    if args.background {
        let dispatcher =
            Arc::new(crate::jobs::dispatch::Dispatcher::new(app.store.clone(), app.config.webhooks.clone()));
        tokio::spawn(dispatcher.clone().run_loop(dispatcher.config.interval, None));
        let sweeper = app.clone();
        tokio::spawn(async move {
            let opts = sweeper.config.sweep_options();
            crate::jobs::sweep::sweep_loop(&sweeper.store, &opts, sweeper.config.sweep_interval, None).await
        });
    }
    eprintln!("cycles-local serving the runtime API on {base} and the operator API on {admin_base} (Redis: {url}); Ctrl-C stops it");
    let admin_app = app.clone();
    let admin = tokio::spawn(local::serve(admin_app, admin_listener, Plane::Admin));
    // Stop on Ctrl-C or SIGTERM; returning drops the embedded redis-server, which stops it.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot install the SIGTERM handler: {e}"))?;
    tokio::select! {
        r = local::serve(app, listener, Plane::Runtime) => r.map_err(|e| e.to_string()),
        r = admin => r.map_err(|e| e.to_string())?.map_err(|e| e.to_string()),
        _ = tokio::signal::ctrl_c() => {
            eprintln!("stopping");
            Ok(())
        }
        _ = term.recv() => {
            eprintln!("stopping");
            Ok(())
        }
    }
}

async fn seed_demo(app: &App, base: &str, admin_base: &str) -> Result<(), String> {
    let store = &app.store;
    let tenant = "demo";
    let fail = |e: crate::error::ApiError| e.message;
    provision::create_tenant(
        store,
        &NewTenant { tenant_id: tenant.into(), name: "Demo tenant".into(), ..Default::default() },
    )
    .await
    .map_err(fail)?;
    let budget = NewBudget::new(tenant, "tenant:demo", Unit::Tokens, 1_000_000);
    provision::create_budget(store, &budget).await.map_err(fail)?;
    let key = NewApiKey { tenant_id: tenant.into(), name: "demo key".into(), ..Default::default() };
    let key = provision::create_api_key(store, &app.config.key_pepper, &key).await.map_err(fail)?;
    println!(
        r#"
Demo tenant: {tenant}
Budget:      tenant:demo, 1000000 TOKENS
API key:     {secret}   (shown once)

Reserve 500 tokens:
  curl -s -X POST {base}/v1/reservations \
    -H 'Content-Type: application/json' -H 'X-Cycles-API-Key: {secret}' \
    -d '{{"idempotency_key":"demo-1","subject":{{"tenant":"demo","agent":"bot"}},"action":{{"kind":"llm.completion","name":"gpt-4o"}},"estimate":{{"unit":"TOKENS","amount":500}}}}'

Commit 420 of them (paste the reservation_id from the answer):
  curl -s -X POST {base}/v1/reservations/RESERVATION_ID/commit \
    -H 'Content-Type: application/json' -H 'X-Cycles-API-Key: {secret}' \
    -d '{{"idempotency_key":"demo-1-commit","actual":{{"unit":"TOKENS","amount":420}}}}'

Inspect the ledgers on the operator API:
  curl -s {admin_base}/v1/balances -H 'X-Cycles-API-Key: {secret}'
"#,
        secret = key.secret
    );
    Ok(())
}

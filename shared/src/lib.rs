//! Cycles budget authority: the library every Lambda function and the local gateway link.
//!
//! Layers, top down; a module uses its own layer and the ones below, never one above:
//! - front ends: `lambda` (one function per route, plus the scheduled jobs), `local` and
//!   `local_cli` (the `cycles-local` gateway), `provision` (demo and benchmark data);
//! - `api` (route table, HTTP handlers: authenticate, parse, call one op, answer) and `jobs`
//!   (the expiry/retention sweep and the webhook dispatcher);
//! - `webhooks`: secrets at rest, signing and sending to an endpoint;
//! - `ops`: the typed seam, one call type per Lua script (`lua/`) and one record type per
//!   stored object;
//! - `domain` (pure rules, defaults and messages), `keys` (the key schema), `ids`, `metrics`;
//! - `model` (wire types), `store` (Redis, the script library), `config`;
//! - leaves: `json`, `error`, `egress`.

pub mod admin_cli;
pub mod api;
pub mod aws;
pub mod config;
pub mod domain;
pub mod egress;
pub mod error;
pub mod evidence;
pub mod ids;
pub mod jobs;
pub mod json;
pub mod keys;
pub mod lambda;
pub mod local;
pub mod local_cli;
pub mod metrics;
pub mod model;
pub mod ops;
pub mod provision;
pub mod store;
pub mod webhooks;

pub use api::{ApiRequest, ApiResponse, App};

/// This server's own version (semver; CHANGELOG.md says what each release changed).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The Cycles protocol version it serves (runtime v0.1.25 with the v0.1.26 extensions).
pub const PROTOCOL_VERSION: &str = "0.1.26";

/// Logs: JSON lines (for CloudWatch) or compact text (local), filtered by `RUST_LOG`.
pub fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    let _ = if json { builder.json().flatten_event(true).try_init() } else { builder.compact().try_init() };
}

/// mimalloc for every binary that links this crate: a request allocates many small,
/// short-lived objects, and glibc's malloc/free took about a tenth of a warm request's CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

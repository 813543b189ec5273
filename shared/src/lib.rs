//! Cycles budget authority: the library every Lambda function and the local gateway link.
//!
//! Dependency direction: `api` -> `domain`/`model` (pure) and `api` -> `store` -> `lua/`.

pub mod api;
pub mod config;
pub mod domain;
pub mod egress;
pub mod error;
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

//! The embedded redis-server of `cycles-local` and the tests: a missing binary is reported as
//! missing (with how to install it), a failure of its own kind, not one of a taken port.

use cycles_shared::local::{EmbeddedRedis, RedisStartError};

#[tokio::test]
async fn a_missing_redis_server_is_reported_as_missing() {
    // The only test of this binary: the variable cannot affect another test.
    std::env::set_var("REDIS_SERVER_BIN", "/nonexistent/redis-server");
    match EmbeddedRedis::start(&[]).await {
        Err(RedisStartError::Missing(m)) => {
            assert!(m.contains("/nonexistent/redis-server") && m.contains("apt-get install"), "{m}");
        }
        Err(other) => panic!("expected Missing, got {other:?}"),
        Ok(_) => panic!("a missing binary started"),
    }
}

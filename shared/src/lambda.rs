//! AWS Lambda front end: every HTTP function's `main` is `cycles_shared::lambda::run(<function name>)`.

use std::sync::Arc;
use std::time::Duration;

pub use lambda_http::Error;
use lambda_http::{service_fn, Body, Request, RequestExt, Response};

use crate::api::{self, match_template, routes_of, ApiRequest, App, Params, Route};

/// Runs a function's main future on a single-threaded runtime. A Lambda container handles one
/// invocation at a time, so worker threads would only add cross-thread wake-ups (a parked
/// worker woken through a futex when the Redis reply arrives) to every request's latency.
pub fn start(main: impl std::future::Future<Output = Result<(), Error>>) -> Result<(), Error> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(main)
}

/// The deployed artifact: one binary for every function, told which one it is by
/// `CYCLES_FUNCTION` (each function's own environment in the template): a route's function
/// name, `maintenance` or `deliver-webhooks`. One build serves the whole deployment.
pub async fn run_named() -> Result<(), lambda_http::Error> {
    let function = std::env::var("CYCLES_FUNCTION").map_err(|_| "CYCLES_FUNCTION is not set; it names the function")?;
    match function.as_str() {
        "maintenance" => run_maintenance().await,
        "deliver-webhooks" => run_delivery().await,
        "admin-plane" => run_plane(api::Plane::Admin).await,
        route => run(route).await,
    }
}

/// Starts the Lambda function serving one route (or a route and its aliases), named as in the
/// route table. The Redis connection is made once, at init.
pub async fn run(function: &str) -> Result<(), lambda_http::Error> {
    crate::init_tracing(true);
    crate::metrics::enable();
    let routes = routes_of(function);
    let first = *routes.first().ok_or_else(|| format!("no route is served by a function named {function:?}"))?;
    let app = Arc::new(App::from_env().await?);
    lambda_http::run(service_fn(move |event: Request| {
        let app = app.clone();
        // a function with aliases picks the route its path names (one route: nothing to pick)
        let route = match routes.len() {
            1 => first,
            _ => routes.iter().copied().find(|r| path_params(r, &event).is_some()).unwrap_or(first),
        };
        async move { Ok::<_, std::convert::Infallible>(handle_event(&app, route, event).await) }
    }))
    .await
}

/// One function serving every route of a plane, each request by the route its method and path
/// name (`CYCLES_FUNCTION=admin-plane`: the operator plane's IAM entrance, `AdminIam=on`).
pub async fn run_plane(plane: api::Plane) -> Result<(), lambda_http::Error> {
    crate::init_tracing(true);
    crate::metrics::enable();
    let app = Arc::new(App::from_env().await?);
    // a path no route matches is answered 404 through any route of the plane
    let fallback = api::ROUTES.iter().find(|r| r.plane == plane).expect("every plane has routes");
    lambda_http::run(service_fn(move |event: Request| {
        let app = app.clone();
        let route = api::route(plane, event.method(), event.raw_http_path()).map_or(fallback, |(r, _)| r);
        async move { Ok::<_, std::convert::Infallible>(handle_event(&app, route, event).await) }
    }))
    .await
}

/// The scheduled maintenance function: sweeps repeatedly until shortly before the
/// invocation's deadline, so overdue holds return within seconds of a schedule tick.
pub async fn run_maintenance() -> Result<(), lambda_http::Error> {
    use lambda_http::lambda_runtime::{self, LambdaEvent};
    crate::init_tracing(true);
    crate::metrics::enable();
    let config = crate::config::Config::load(None).await?;
    let store = config.open_store().await?;
    let (store, config) = (Arc::new(store), Arc::new(config));
    lambda_runtime::run(lambda_runtime::service_fn(move |event: LambdaEvent<serde_json::Value>| {
        let (store, config) = (store.clone(), config.clone());
        async move {
            let deadline = deadline_of(&event.context);
            let total =
                crate::jobs::sweep::sweep_loop(&store, &config.sweep_options(), config.sweep_interval, Some(deadline))
                    .await;
            total.log("maintenance invocation done");
            let backlog = crate::jobs::sweep::backlog(&store).await.unwrap_or(0);
            crate::metrics::emit(
                &[("Function", "maintenance")],
                &[
                    ("Expired", total.expired as f64),
                    ("Quarantined", total.quarantined as f64),
                    ("Trimmed", (total.trimmed_index + total.trimmed_events + total.trimmed_audit) as f64),
                    ("ClosesConverged", total.closes_converged as f64),
                    ("ExpiryBacklogTenants", backlog as f64),
                ],
            );
            Ok::<_, lambda_http::Error>(serde_json::to_value(total)?)
        }
    }))
    .await
}

/// The scheduled webhook dispatcher: passes every `CYCLES_DELIVERY_INTERVAL_MS` until shortly
/// before the invocation's deadline. Overlapping invocations are safe (leased claims).
pub async fn run_delivery() -> Result<(), lambda_http::Error> {
    use lambda_http::lambda_runtime::{self, LambdaEvent};
    crate::init_tracing(true);
    crate::metrics::enable();
    let config = crate::config::Config::load(None).await?;
    let store = config.open_store().await?;
    let dispatcher = Arc::new(crate::jobs::dispatch::Dispatcher::new(store, config.webhooks.clone()));
    lambda_runtime::run(lambda_runtime::service_fn(move |event: LambdaEvent<serde_json::Value>| {
        let dispatcher = dispatcher.clone();
        async move {
            let deadline = deadline_of(&event.context);
            let interval = dispatcher.config.interval;
            let total = dispatcher.run_loop(interval, Some(deadline)).await;
            total.log("delivery invocation done");
            crate::metrics::emit(
                &[("Function", "deliver-webhooks")],
                &[
                    ("DeliveriesCreated", total.deliveries_created as f64),
                    ("Delivered", total.delivered as f64),
                    ("DeliveryRetries", total.retrying as f64),
                    ("DeliveryFailures", total.failed as f64),
                ],
            );
            Ok::<_, lambda_http::Error>(serde_json::to_value(total)?)
        }
    }))
    .await
}

const MARGIN: Duration = Duration::from_secs(5);

/// When a scheduled invocation must stop: its deadline less a margin for the last pass.
fn deadline_of(context: &lambda_http::lambda_runtime::Context) -> std::time::Instant {
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let left = Duration::from_millis(context.deadline.saturating_sub(now)).saturating_sub(MARGIN);
    std::time::Instant::now() + left
}

/// Path parameters come from API Gateway when it provides them; otherwise (e.g. under
/// `cargo lambda watch`) the route template is matched against the raw path.
pub fn path_params(route: &Route, event: &Request) -> Option<Params> {
    let template = route.template;
    let given = event.path_parameters();
    if given.iter().next().is_some() {
        return Some(given.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    }
    match_template(template, event.raw_http_path(), false)
        .or_else(|| match_template(template, event.uri().path(), false))
}

/// The caller's address and, when API Gateway verified a SigV4 signature (an `AWS_IAM` route),
/// its IAM principal: both from the request context API Gateway wrote, never from a header.
fn caller_of(event: &Request) -> (Option<String>, Option<String>) {
    match event.request_context_ref() {
        Some(lambda_http::request::RequestContext::ApiGatewayV2(c)) => (
            c.http.source_ip.clone(),
            c.authorizer.as_ref().and_then(|a| a.iam.as_ref()).and_then(|iam| iam.user_arn.clone()),
        ),
        _ => (None, None),
    }
}

pub async fn handle_event(app: &App, route: &Route, event: Request) -> Response<Body> {
    let params = path_params(route, &event);
    let (source_ip, iam_principal) = caller_of(&event);
    let (parts, body) = event.into_parts();
    let req = ApiRequest {
        method: parts.method,
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or_default().to_string(),
        headers: parts.headers,
        body: match body {
            Body::Empty => Default::default(),
            Body::Text(t) => t.into_bytes().into(),
            Body::Binary(b) => b.into(),
            _ => Default::default(),
        },
        params: Params::new(),
        source_ip,
        iam_principal,
    };
    let origins = &app.config.cors_origins;
    let origin = api::cors::origin_of(&req);
    let res = match (api::cors::preflight(origins, route.plane, &req), params) {
        (Some(preflight), _) => preflight,
        (None, params) => {
            let mut res = match params {
                Some(params) => api::handle(app, route, ApiRequest { params, ..req }).await,
                None => api::not_found(&req),
            };
            api::cors::decorate(origins, origin.as_ref(), &mut res);
            res
        }
    };
    api::into_http(res, |body| Body::Text(String::from_utf8(body).unwrap_or_default()))
}

#[cfg(test)]
mod caller_tests {
    use super::*;

    fn event(authorizer: &str, headers: &str) -> Request {
        let json = format!(
            r#"{{"version":"2.0","routeKey":"$default","rawPath":"/v1/admin/tenants","rawQueryString":"",
            "headers":{{{headers}}},"requestContext":{{"routeKey":"$default","accountId":"1","stage":"$default",
            "requestId":"r","apiId":"a","domainName":"a.example","domainPrefix":"a","time":"t","timeEpoch":0,
            {authorizer}"http":{{"method":"GET","path":"/v1/admin/tenants","protocol":"HTTP/1.1",
            "sourceIp":"203.0.113.9","userAgent":"u"}}}},"isBase64Encoded":false}}"#
        );
        lambda_http::request::from_str(&json).expect("an API Gateway v2 event")
    }

    #[test]
    fn the_iam_principal_comes_from_the_verified_request_context_only() {
        let signed = event(r#""authorizer":{"iam":{"userArn":"arn:aws:iam::1:user/Ops"}},"#, "");
        assert_eq!(caller_of(&signed), (Some("203.0.113.9".to_string()), Some("arn:aws:iam::1:user/Ops".to_string())));
        // a header claiming a principal is only a header
        let unsigned = event("", r#""x-amzn-iam-principal":"arn:aws:iam::1:user/Ops""#);
        assert_eq!(caller_of(&unsigned), (Some("203.0.113.9".to_string()), None));
    }
}

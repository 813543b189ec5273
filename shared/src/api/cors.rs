//! Cross-origin access for an operator console served from another origin. Nothing is open by
//! default: only the origins listed in `CYCLES_CORS_ORIGINS` (exact `scheme://host[:port]`)
//! get CORS headers and preflight answers; any other origin gets none, so browsers keep
//! blocking it.

use http::{HeaderValue, Method};

use super::{match_template, ApiRequest, ApiResponse, Plane, ROUTES};

/// The request headers a console may send.
const ALLOWED_HEADERS: &str = "content-type, x-cycles-api-key, x-admin-api-key, x-idempotency-key, traceparent, \
                               tracestate, x-cycles-trace-id, x-request-id";
/// The response headers a console may read.
const EXPOSED_HEADERS: &str = "x-request-id, x-cycles-trace-id, x-cycles-tenant, retry-after, x-ratelimit-reset";
/// How long a browser may cache a preflight answer (seconds).
const MAX_AGE_S: &str = "600";

/// A request's `Origin` when it is on the allow-list.
fn allowed_origin<'a>(origins: &[String], origin: Option<&'a HeaderValue>) -> Option<&'a str> {
    let origin = origin?.to_str().ok()?;
    origins.iter().any(|o| o == origin).then_some(origin)
}

/// The request's `Origin` header, kept before the request is handed on.
pub fn origin_of(req: &ApiRequest) -> Option<HeaderValue> {
    req.headers.get(http::header::ORIGIN).cloned()
}

/// Adds the CORS headers to an answer for an allowed origin (`origin`: the request's).
pub fn decorate(origins: &[String], origin: Option<&HeaderValue>, res: &mut ApiResponse) {
    if origins.is_empty() {
        return;
    }
    res.headers.push(("vary", "Origin".to_string()));
    if let Some(origin) = allowed_origin(origins, origin) {
        res.headers.push(("access-control-allow-origin", origin.to_string()));
        res.headers.push(("access-control-expose-headers", EXPOSED_HEADERS.to_string()));
    }
}

/// The answer to a preflight (`OPTIONS` with `Access-Control-Request-Method`): 204 naming the
/// methods the path serves on this plane for an allowed origin; 403 otherwise. `None` when
/// the request is not a preflight.
pub fn preflight(origins: &[String], plane: Plane, req: &ApiRequest) -> Option<ApiResponse> {
    if req.method != Method::OPTIONS || !req.headers.contains_key(http::header::ACCESS_CONTROL_REQUEST_METHOD) {
        return None;
    }
    let methods: Vec<&str> = ROUTES
        .iter()
        .filter(|r| r.plane == plane && match_template(r.template, &req.path, false).is_some())
        .map(|r| r.method.as_str())
        .collect();
    let Some(origin) = allowed_origin(origins, req.headers.get(http::header::ORIGIN)).filter(|_| !methods.is_empty())
    else {
        let why = if methods.is_empty() { "no route serves this path" } else { "this origin is not allowed" };
        let err = crate::error::ApiError::forbidden(format!("CORS preflight refused: {why}"));
        return Some(super::error_response(req, err));
    };
    let mut methods = methods;
    methods.sort_unstable();
    methods.dedup();
    let headers = vec![
        ("access-control-allow-origin", origin.to_string()),
        ("access-control-allow-methods", methods.join(", ")),
        ("access-control-allow-headers", ALLOWED_HEADERS.to_string()),
        ("access-control-max-age", MAX_AGE_S.to_string()),
        ("vary", "Origin".to_string()),
    ];
    Some(ApiResponse { status: 204, headers, body: Vec::new() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, path: &str, origin: &str, preflight: bool) -> ApiRequest {
        let mut req = ApiRequest { method, path: path.into(), ..Default::default() };
        req.headers.insert(http::header::ORIGIN, origin.parse().unwrap());
        if preflight {
            req.headers.insert(http::header::ACCESS_CONTROL_REQUEST_METHOD, "PATCH".parse().unwrap());
        }
        req
    }

    fn header<'a>(res: &'a ApiResponse, name: &str) -> Option<&'a str> {
        res.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn preflights_answer_only_allowed_origins_with_the_paths_methods() {
        let origins = vec!["https://console.example.com".to_string()];
        let ok = preflight(
            &origins,
            Plane::Admin,
            &request(Method::OPTIONS, "/v1/admin/tenants/t1", "https://console.example.com", true),
        )
        .unwrap();
        assert_eq!(ok.status, 204);
        assert_eq!(header(&ok, "access-control-allow-origin"), Some("https://console.example.com"));
        assert_eq!(header(&ok, "access-control-allow-methods"), Some("GET, PATCH"));
        assert!(header(&ok, "access-control-allow-headers").unwrap().contains("x-admin-api-key"));
        let other = preflight(
            &origins,
            Plane::Admin,
            &request(Method::OPTIONS, "/v1/admin/tenants", "https://evil.example", true),
        );
        assert_eq!(other.unwrap().status, 403);
        let nowhere = preflight(
            &origins,
            Plane::Admin,
            &request(Method::OPTIONS, "/v1/nope", "https://console.example.com", true),
        );
        assert_eq!(nowhere.unwrap().status, 403);
        // not a preflight: handled as a request
        assert!(preflight(
            &origins,
            Plane::Admin,
            &request(Method::OPTIONS, "/v1/admin/tenants", "https://console.example.com", false)
        )
        .is_none());
        // nothing is open by default
        assert_eq!(
            preflight(
                &[],
                Plane::Admin,
                &request(Method::OPTIONS, "/v1/admin/tenants", "https://console.example.com", true)
            )
            .unwrap()
            .status,
            403
        );
    }

    #[test]
    fn answers_carry_cors_headers_for_allowed_origins_only() {
        let origins = vec!["https://console.example.com".to_string()];
        let mut res = ApiResponse { status: 200, headers: vec![], body: vec![] };
        let allowed = request(Method::GET, "/v1/admin/tenants", "https://console.example.com", false);
        decorate(&origins, origin_of(&allowed).as_ref(), &mut res);
        assert_eq!(header(&res, "access-control-allow-origin"), Some("https://console.example.com"));
        assert!(header(&res, "access-control-expose-headers").unwrap().contains("x-request-id"));
        let mut res = ApiResponse { status: 200, headers: vec![], body: vec![] };
        let other = request(Method::GET, "/v1/admin/tenants", "https://evil.example", false);
        decorate(&origins, origin_of(&other).as_ref(), &mut res);
        assert_eq!(header(&res, "access-control-allow-origin"), None);
        assert_eq!(header(&res, "vary"), Some("Origin"));
        let mut res = ApiResponse { status: 200, headers: vec![], body: vec![] };
        decorate(&[], origin_of(&other).as_ref(), &mut res);
        assert!(res.headers.is_empty(), "no CORS configured: answers are unchanged");
    }
}

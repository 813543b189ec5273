//! The two AWS calls the maintenance function makes (S3 PutObject for the export,
//! EventBridge PutEvents for alerts), signed with Signature Version 4 over the HTTP client the
//! webhooks already use: no SDK on the hot path's build. Credentials come from the standard
//! variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`: what Lambda
//! gives its function role) and `AWS_REGION`; `CYCLES_AWS_ENDPOINT_URL` points both at an
//! emulator (path-style S3 addressing).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Credentials and where to send requests.
#[derive(Debug, Clone)]
pub struct Aws {
    pub access_key: String,
    pub secret_key: String,
    pub session_token: Option<String>,
    pub region: String,
    /// An emulator's base URL (`http://127.0.0.1:5000`), or None for AWS itself.
    pub endpoint: Option<String>,
    http: reqwest::Client,
}

/// One entry of EventBridge PutEvents.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct BusEntry {
    pub source: String,
    pub detail_type: String,
    pub detail: String,
    pub event_bus_name: String,
    pub time: i64,
}

impl Aws {
    /// From the environment; None when no credentials are set.
    pub fn from_env() -> Option<Aws> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Some(Aws::new(
            var("AWS_ACCESS_KEY_ID")?,
            var("AWS_SECRET_ACCESS_KEY")?,
            var("AWS_SESSION_TOKEN"),
            var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")).unwrap_or_else(|| "us-east-1".into()),
            var("CYCLES_AWS_ENDPOINT_URL"),
        ))
    }

    pub fn new(
        access_key: String,
        secret_key: String,
        session_token: Option<String>,
        region: String,
        endpoint: Option<String>,
    ) -> Aws {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client");
        Aws { access_key, secret_key, session_token, region, endpoint, http }
    }

    fn s3_url(&self, bucket: &str, key: &str) -> String {
        let key = uri_encode(key, false);
        match &self.endpoint {
            Some(e) => format!("{}/{bucket}/{key}", e.trim_end_matches('/')),
            None => format!("https://{bucket}.s3.{}.amazonaws.com/{key}", self.region),
        }
    }

    /// PutObject (replaces an object of the same key).
    pub async fn put_object(&self, bucket: &str, key: &str, body: Vec<u8>, content_type: &str) -> Result<(), String> {
        let url = self.s3_url(bucket, key);
        let res = self.send("PUT", &url, "s3", &[("content-type", content_type)], body).await?;
        expect_ok(res).await.map(|_| ())
    }

    /// GetObject: the body, or None when there is no such object.
    pub async fn get_object(&self, bucket: &str, key: &str) -> Result<Option<Vec<u8>>, String> {
        let res = self.send("GET", &self.s3_url(bucket, key), "s3", &[], Vec::new()).await?;
        if res.status() == 404 {
            return Ok(None);
        }
        expect_ok(res).await.map(Some)
    }

    /// The keys under `prefix` (ListObjectsV2, every page).
    pub async fn list_keys(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, String> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = format!("list-type=2&prefix={}", uri_encode(prefix, true));
            if let Some(t) = &token {
                query = format!("continuation-token={}&{query}", uri_encode(t, true));
            }
            let base = self.s3_url(bucket, "");
            let res = self.send("GET", &format!("{base}?{query}"), "s3", &[], Vec::new()).await?;
            let text = String::from_utf8_lossy(&expect_ok(res).await?).into_owned();
            keys.extend(xml_values(&text, "Key"));
            token = xml_values(&text, "NextContinuationToken").into_iter().next();
            if token.is_none() {
                return Ok(keys);
            }
        }
    }

    /// CreateBucket (an emulator's or a test's; the deployed bucket comes from the template).
    pub async fn create_bucket(&self, bucket: &str) -> Result<(), String> {
        let res = self.send("PUT", &self.s3_url(bucket, ""), "s3", &[], Vec::new()).await?;
        expect_ok(res).await.map(|_| ())
    }

    /// One call of an AWS JSON protocol (EventBridge `AWSEvents.*`, SQS `AmazonSQS.*`): its reply.
    pub async fn json_call(
        &self,
        service: &str,
        target: &str,
        version: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, String> {
        let url = match &self.endpoint {
            Some(e) => format!("{}/", e.trim_end_matches('/')),
            None => format!("https://{service}.{}.amazonaws.com/", self.region),
        };
        let content_type = format!("application/x-amz-json-{version}");
        let headers = [("content-type", content_type.as_str()), ("x-amz-target", target)];
        let res = self.send("POST", &url, service, &headers, serde_json::to_vec(body).expect("serializable")).await?;
        serde_json::from_slice(&expect_ok(res).await?).map_err(|e| format!("{target} reply: {e}"))
    }

    /// PutEvents (at most 10 entries); an entry EventBridge refuses is an error.
    pub async fn put_events(&self, entries: &[BusEntry]) -> Result<(), String> {
        let reply =
            self.json_call("events", "AWSEvents.PutEvents", "1.1", &serde_json::json!({"Entries": entries})).await?;
        match reply["FailedEntryCount"].as_i64() {
            Some(0) => Ok(()),
            _ => Err(format!("PutEvents refused entries: {reply}")),
        }
    }

    async fn send(
        &self,
        method: &str,
        url: &str,
        service: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<reqwest::Response, String> {
        let parsed = url::Url::parse(url).map_err(|e| format!("{url}: {e}"))?;
        let now = amz_now();
        let payload_hash = hex::encode(Sha256::digest(&body));
        let mut all: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        all.push(("host".into(), host_of(&parsed)));
        all.push(("x-amz-date".into(), now.clone()));
        all.push(("x-amz-content-sha256".into(), payload_hash.clone()));
        if let Some(t) = &self.session_token {
            all.push(("x-amz-security-token".into(), t.clone()));
        }
        let auth = authorization(self, method, &parsed, &all, &payload_hash, service, &now);
        let mut req = self.http.request(method.parse().expect("a method"), url);
        for (k, v) in all.iter().filter(|(k, _)| k != "host") {
            req = req.header(k, v);
        }
        req.header("authorization", auth).body(body).send().await.map_err(|e| format!("{service} {method}: {e}"))
    }
}

async fn expect_ok(res: reqwest::Response) -> Result<Vec<u8>, String> {
    let status = res.status();
    let body = res.bytes().await.map_err(|e| e.to_string())?.to_vec();
    if status.is_success() {
        Ok(body)
    } else {
        Err(format!("{status}: {}", String::from_utf8_lossy(&body).chars().take(300).collect::<String>()))
    }
}

fn host_of(u: &url::Url) -> String {
    match u.port() {
        Some(p) => format!("{}:{p}", u.host_str().unwrap_or_default()),
        None => u.host_str().unwrap_or_default().to_string(),
    }
}

/// The values of every `<tag>...</tag>` of an XML text (S3's listings hold no nesting that matters).
fn xml_values(text: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    text.split(&open).skip(1).filter_map(|part| part.split(&close).next()).map(xml_unescape).collect()
}

fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&")
}

/// UTC now as SigV4's `YYYYMMDD'T'HHMMSS'Z'`.
fn amz_now() -> String {
    amz_date(crate::domain::now_ms())
}

fn amz_date(ms: i64) -> String {
    let iso = crate::domain::format_rfc3339_ms(ms); // 2026-12-05T00:36:33.123Z
    format!("{}{}{}T{}{}{}Z", &iso[0..4], &iso[5..7], &iso[8..10], &iso[11..13], &iso[14..16], &iso[17..19])
}

/// SigV4's URI encoding: everything but unreserved characters, `/` kept in paths.
fn uri_encode(s: &str, encode_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') || (b == b'/' && !encode_slash) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    m.update(data.as_bytes());
    m.finalize().into_bytes().to_vec()
}

/// The Authorization header of a request (headers lower-case; `amz_date` as in x-amz-date).
fn authorization(
    aws: &Aws,
    method: &str,
    url: &url::Url,
    headers: &[(String, String)],
    payload_hash: &str,
    service: &str,
    amz_date: &str,
) -> String {
    let mut sorted: Vec<(String, String)> =
        headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string())).collect();
    sorted.sort();
    let canonical_headers: String = sorted.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed: Vec<&str> = sorted.iter().map(|(k, _)| k.as_str()).collect();
    let signed = signed.join(";");
    // the query, each name and value encoded, sorted
    let mut query: Vec<(String, String)> =
        url.query_pairs().map(|(k, v)| (uri_encode(&k, true), uri_encode(&v, true))).collect();
    query.sort();
    let query: Vec<String> = query.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    let path = if url.path().is_empty() { "/" } else { url.path() };
    let canonical = format!("{method}\n{path}\n{}\n{canonical_headers}\n{signed}\n{payload_hash}", query.join("&"));
    let date = &amz_date[..8];
    let scope = format!("{date}/{}/{service}/aws4_request", aws.region);
    let to_sign =
        format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical.as_bytes())));
    let k = hmac(format!("AWS4{}", aws.secret_key).as_bytes(), date);
    let k = hmac(&k, &aws.region);
    let k = hmac(&k, service);
    let k = hmac(&k, "aws4_request");
    let signature = hex::encode(hmac(&k, &to_sign));
    format!("AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}", aws.access_key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's worked example of Signature Version 4 (IAM ListUsers, 2015-08-30).
    #[test]
    fn signs_as_aws_documents() {
        let aws = Aws::new(
            "AKIDEXAMPLE".into(),
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            None,
            "us-east-1".into(),
            None,
        );
        let url = url::Url::parse("https://iam.amazonaws.com/?Action=ListUsers&Version=2010-05-08").unwrap();
        let headers = vec![
            ("content-type".to_string(), "application/x-www-form-urlencoded; charset=utf-8".to_string()),
            ("host".to_string(), "iam.amazonaws.com".to_string()),
            ("x-amz-date".to_string(), "20150830T123600Z".to_string()),
        ];
        let empty = hex::encode(Sha256::digest(b""));
        let auth = authorization(&aws, "GET", &url, &headers, &empty, "iam", "20150830T123600Z");
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
        assert_eq!(amz_date(1_440_938_160_000), "20150830T123600Z");
    }

    #[test]
    fn keys_are_encoded_once_with_slashes_kept() {
        assert_eq!(uri_encode("events/tenant=a b/x.jsonl.gz", false), "events/tenant%3Da%20b/x.jsonl.gz");
        assert_eq!(xml_values("<a><Key>x&amp;y</Key><Key>z</Key></a>", "Key"), vec!["x&y", "z"]);
    }
}

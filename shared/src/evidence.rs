//! CyclesEvidence (cycles-evidence-v0.2.yaml): Ed25519-signed, content-addressed receipts of
//! decide, reserve, commit, release and the denials of those operations. Pure: the signer and
//! its key set, the envelope's canonical bytes (RFC 8785 JCS), its id and signature, and the
//! verification dispositions. Where envelopes are stored and when they are made is `ops` and
//! `api`'s business.
//!
//! An envelope is identified by the sha256 of its JCS bytes with `evidence_id` and `signature`
//! both "", and signed over its JCS bytes with `evidence_id` set and `signature` "". Its
//! `signer_did` is `did:cycles:<sha256(server_id)>#<kid>`, resolvable through the key set
//! served at `{server_id}/.well-known/cycles-jwks.json`, which keeps retired keys with their
//! validity windows so an envelope signed before a rotation verifies for ever.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// The envelope wire discriminator (frozen at v0.1 by the v0.2 spec).
pub const SCHEMA_VERSION: &str = "cycles-evidence/v0.1";

/// One key of the signer, with its validity window `[nbf_ms, exp_ms)`.
#[derive(Clone)]
pub struct Key {
    pub kid: String,
    pub public: VerifyingKey,
    /// Present for a key this server may sign with.
    secret: Option<SigningKey>,
    pub nbf_ms: i64,
    pub exp_ms: Option<i64>,
}

impl std::fmt::Debug for Key {
    /// Never prints the private half.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({}, {}, [{}, {:?}))", self.kid, hex::encode(self.public.as_bytes()), self.nbf_ms, self.exp_ms)
    }
}

impl Key {
    fn covers(&self, ms: i64) -> bool {
        self.nbf_ms <= ms && self.exp_ms.is_none_or(|e| ms < e)
    }
}

/// One entry of `CYCLES_EVIDENCE_KEYS`: `private_key` (hex of the 32-byte Ed25519 seed) for a
/// key that signs, or `public_key` (hex) alone for a retired one kept for verification.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeySpec {
    kid: String,
    #[serde(default)]
    private_key: Option<String>,
    #[serde(default)]
    public_key: Option<String>,
    nbf_ms: i64,
    #[serde(default)]
    exp_ms: Option<i64>,
}

/// The signing identity of this deployment: its `server_id` and its keys.
#[derive(Debug, Clone)]
pub struct Signer {
    pub server_id: String,
    pub keys: Vec<Key>,
}

fn bytes32(hex_text: &str, what: &str) -> Result<[u8; 32], String> {
    let v = hex::decode(hex_text.trim()).map_err(|_| format!("{what} is not hex"))?;
    v.try_into().map_err(|_| format!("{what} must be 32 bytes (64 hex characters)"))
}

impl Signer {
    /// Parses and checks the key configuration: unique kids, windows that make sense, each
    /// public key matching its private key, and one signing key in force now or later.
    pub fn from_config(server_id: &str, keys_json: &str) -> Result<Signer, String> {
        let specs: Vec<KeySpec> =
            serde_json::from_str(keys_json).map_err(|e| format!("CYCLES_EVIDENCE_KEYS is not a list of keys: {e}"))?;
        let mut keys: Vec<Key> = vec![];
        for s in specs {
            let what = format!("CYCLES_EVIDENCE_KEYS key {:?}", s.kid);
            if s.kid.is_empty()
                || s.kid.len() > 64
                || !s.kid.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(format!("{what}: kid must be 1 to 64 of [A-Za-z0-9-_.]"));
            }
            if keys.iter().any(|k| k.kid == s.kid) {
                return Err(format!("{what} is listed twice (a kid is unique in a key set)"));
            }
            if s.exp_ms.is_some_and(|e| e <= s.nbf_ms) {
                return Err(format!("{what}: exp_ms must be after nbf_ms"));
            }
            let secret =
                s.private_key.as_deref().map(|p| bytes32(p, &what).map(|b| SigningKey::from_bytes(&b))).transpose()?;
            let public = match (&secret, s.public_key.as_deref()) {
                (Some(sk), Some(p)) if sk.verifying_key().as_bytes() != &bytes32(p, &what)? => {
                    return Err(format!("{what}: public_key does not belong to private_key"))
                }
                (Some(sk), _) => sk.verifying_key(),
                (None, Some(p)) => {
                    VerifyingKey::from_bytes(&bytes32(p, &what)?).map_err(|_| format!("{what}: bad public key"))?
                }
                (None, None) => return Err(format!("{what} needs private_key or public_key")),
            };
            keys.push(Key { kid: s.kid, public, secret, nbf_ms: s.nbf_ms, exp_ms: s.exp_ms });
        }
        let signer = Signer { server_id: server_id.to_string(), keys };
        if !signer.keys.iter().any(|k| k.secret.is_some() && k.exp_ms.is_none()) {
            return Err("CYCLES_EVIDENCE_KEYS needs a signing key (private_key) without exp_ms".into());
        }
        Ok(signer)
    }

    /// A signer with one fresh key (local development), and its `CYCLES_EVIDENCE_KEYS` text.
    pub fn generate(server_id: &str, now_ms: i64) -> (Signer, String) {
        let sk = SigningKey::generate(&mut rand::rngs::OsRng);
        let kid = format!("local-{now_ms}");
        let text = json!([{"kid": kid, "private_key": hex::encode(sk.to_bytes()), "nbf_ms": now_ms}]).to_string();
        let key = Key { kid, public: sk.verifying_key(), secret: Some(sk), nbf_ms: now_ms, exp_ms: None };
        (Signer { server_id: server_id.to_string(), keys: vec![key] }, text)
    }

    /// `did:cycles:<lowerhex(sha256(server_id))>#<kid>` (the server_id's exact bytes).
    pub fn did(&self, kid: &str) -> String {
        format!("did:cycles:{}#{kid}", hex::encode(Sha256::digest(self.server_id.as_bytes())))
    }

    /// The key that signs at `now`: a signing key whose window covers it (the latest starting).
    fn signing_key(&self, now_ms: i64) -> Option<&Key> {
        self.keys.iter().filter(|k| k.secret.is_some() && k.covers(now_ms)).max_by_key(|k| k.nbf_ms)
    }

    /// The JWK Set (`CyclesEvidenceJwks`): every key, retired ones included, with its window.
    pub fn jwks(&self, now_ms: i64) -> Value {
        let keys: Vec<Value> = self
            .keys
            .iter()
            .map(|k| {
                let status = if k.exp_ms.is_some_and(|e| e <= now_ms) { "retired" } else { "active" };
                json!({"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "kid": k.kid,
                    "x": URL_SAFE_NO_PAD.encode(k.public.as_bytes()), "cycles_nbf_ms": k.nbf_ms,
                    "cycles_exp_ms": k.exp_ms, "status": status})
            })
            .collect();
        json!({ "keys": keys })
    }

    /// A signed envelope of `artifact` (decide, reserve, commit, release, error) with its
    /// payload, issued at `now_ms`; None when no key signs at that time.
    ///
    /// The canonical bytes are made once, with `evidence_id` and `signature` "": JCS sorts the
    /// top-level members (artifact_type, evidence_id, issued_at_ms, payload, schema_version,
    /// server_id, signature, signer_did, trace_id), and a quote inside a string is escaped, so
    /// the first `"evidence_id":""` and the last `"signature":""` of those bytes are the
    /// envelope's own, and filling them in place gives the canonical bytes of the filled
    /// envelope (a test holds it to a full canonicalization).
    pub fn seal(&self, artifact: &str, payload: Value, now_ms: i64, trace_id: &str) -> Option<Sealed> {
        let key = self.signing_key(now_ms)?;
        let envelope = json!({
            "schema_version": SCHEMA_VERSION, "artifact_type": artifact, "server_id": self.server_id,
            "signer_did": self.did(&key.kid), "issued_at_ms": now_ms, "trace_id": trace_id,
            "payload": { artifact: payload }, "evidence_id": "", "signature": "",
        });
        let blank = canonical(&envelope);
        let id = hex::encode(Sha256::digest(&blank));
        let with_id = fill(&blank, br#""evidence_id":"""#, &id, false);
        let signature = hex::encode(key.secret.as_ref()?.sign(&with_id).to_bytes());
        let text = String::from_utf8(fill(&with_id, br#""signature":"""#, &signature, true)).ok()?;
        Some(Sealed { evidence_id: id, text })
    }
}

/// A signed envelope: its id, and its canonical JSON (what is stored and served).
#[derive(Debug, Clone)]
pub struct Sealed {
    pub evidence_id: String,
    pub text: String,
}

/// `bytes` with the first (or last) `"name":""` given `value`.
fn fill(bytes: &[u8], empty: &[u8], value: &str, last: bool) -> Vec<u8> {
    let mut at = bytes.windows(empty.len()).enumerate().filter(|(_, w)| *w == empty).map(|(i, _)| i);
    let i = if last { at.next_back() } else { at.next() }.expect("the envelope holds the member");
    let mut out = Vec::with_capacity(bytes.len() + value.len());
    out.extend_from_slice(&bytes[..i + empty.len() - 1]);
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(&bytes[i + empty.len() - 1..]);
    out
}

/// RFC 8785 canonical bytes (numbers as IEEE doubles, as JCS defines them).
pub fn canonical(v: &Value) -> Vec<u8> {
    serde_json_canonicalizer::to_vec(v).expect("a JSON value always canonicalizes")
}

/// The envelope's content id: sha256 hex of its canonical bytes with `evidence_id` and
/// `signature` both "".
pub fn content_id(envelope: &Value) -> String {
    let mut e = envelope.clone();
    e["evidence_id"] = json!("");
    e["signature"] = json!("");
    hex::encode(Sha256::digest(canonical(&e)))
}

/// The verification dispositions of the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    Authentic,
    BindingOnly,
    SignerAuthorityFailed,
    SignerResolutionFailed,
    SignatureInvalid,
}

/// Verifies an envelope against a JWK Set (`None`: none could be fetched or parsed), by the
/// spec's deterministic selection: the DID must bind to `server_id`, exactly one
/// window-covering key must match, and the signature must verify over the signing input.
pub fn verify(envelope: &Value, jwks: Option<&Value>) -> Disposition {
    use Disposition::*;
    let (Some(server_id), Some(signer), Some(issued), Some(sig)) = (
        envelope["server_id"].as_str(),
        envelope["signer_did"].as_str(),
        envelope["issued_at_ms"].as_i64(),
        envelope["signature"].as_str(),
    ) else {
        return SignatureInvalid;
    };
    if envelope["evidence_id"].as_str() != Some(content_id(envelope).as_str()) {
        return SignatureInvalid;
    }
    let check = |key: &[u8]| -> bool {
        let (Ok(k), Ok(s)) = (<[u8; 32]>::try_from(key), hex::decode(sig)) else { return false };
        let (Ok(vk), Ok(s)) = (VerifyingKey::from_bytes(&k), <[u8; 64]>::try_from(s.as_slice())) else { return false };
        let mut input = envelope.clone();
        input["signature"] = json!("");
        vk.verify(&canonical(&input), &Signature::from_bytes(&s)).is_ok()
    };
    let did = signer.strip_prefix("did:cycles:");
    let Some(set) = jwks else {
        // no key set: a raw-hex key can still be checked (binding only)
        return match did {
            Some(_) => SignerResolutionFailed,
            None => match hex::decode(signer) {
                Ok(k) if check(&k) => BindingOnly,
                _ => SignatureInvalid,
            },
        };
    };
    let Some(keys) = set["keys"].as_array() else { return SignerResolutionFailed };
    let valid = |j: &&Value| {
        j["kty"] == "OKP"
            && j["crv"] == "Ed25519"
            && (j.get("alg").is_none() || j["alg"] == "EdDSA")
            && j["cycles_nbf_ms"].is_i64()
            && j["x"].as_str().and_then(|x| URL_SAFE_NO_PAD.decode(x).ok()).is_some_and(|x| x.len() == 32)
    };
    let covers = |j: &&Value| {
        j["cycles_nbf_ms"].as_i64().is_some_and(|n| n <= issued)
            && j["cycles_exp_ms"].as_i64().is_none_or(|e| issued < e)
    };
    let x_of = |j: &Value| URL_SAFE_NO_PAD.decode(j["x"].as_str().unwrap_or_default()).unwrap_or_default();
    let candidates: Vec<&Value> = match did {
        Some(rest) => {
            let Some((hash, kid)) = rest.split_once('#') else { return SignerAuthorityFailed };
            if hash != hex::encode(Sha256::digest(server_id.as_bytes())) {
                return SignerAuthorityFailed;
            }
            let named: Vec<&Value> = keys.iter().filter(|j| j["kid"] == kid).collect();
            if named.len() != 1 {
                return SignerAuthorityFailed;
            }
            named.into_iter().filter(valid).filter(covers).collect()
        }
        None => {
            let Ok(raw) = hex::decode(signer) else { return SignatureInvalid };
            keys.iter().filter(valid).filter(covers).filter(|j| x_of(j) == raw).collect()
        }
    };
    match candidates.as_slice() {
        [one] if check(&x_of(one)) => Authentic,
        [_] => SignatureInvalid,
        _ => SignerAuthorityFailed,
    }
}

/// Keeps only the named fields of an object (the evidence mirrors are closed shapes).
pub fn project(v: &Value, fields: &[&str]) -> Value {
    let Some(o) = v.as_object() else { return v.clone() };
    Value::Object(
        o.iter()
            .filter(|(k, _)| fields.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Map<_, _>>(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The envelope of a sealed text, checked to be its own canonical form.
    fn open(sealed: Sealed) -> Value {
        let e: Value = serde_json::from_str(&sealed.text).unwrap();
        assert_eq!(canonical(&e), sealed.text.as_bytes(), "filled in place = canonicalized whole");
        assert_eq!(e["evidence_id"], json!(sealed.evidence_id));
        e
    }

    #[test]
    fn nested_members_of_the_same_names_never_confuse_the_fill() {
        let s = signer();
        let tricky = json!({"request": {"metadata": {"evidence_id": "", "signature": "", "x": "\"signature\":\"\""}},
            "response": {"decision": "ALLOW"}});
        let e = open(s.seal("decide", tricky, 6000, "").unwrap());
        assert_eq!(e["payload"]["decide"]["request"]["metadata"]["signature"], "");
        assert_eq!(verify(&e, Some(&s.jwks(6000))), Disposition::Authentic);
    }

    fn signer() -> Signer {
        let keys = r#"[
            {"kid": "old", "private_key": "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
             "nbf_ms": 1000, "exp_ms": 5000},
            {"kid": "new", "private_key": "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
             "nbf_ms": 5000}]"#;
        Signer::from_config("https://cycles.example.com/v1", keys).unwrap()
    }

    #[test]
    fn envelopes_are_content_addressed_signed_and_verify_across_a_rotation() {
        let s = signer();
        let jwks = s.jwks(6000);
        let payload = json!({"request": {"idempotency_key": "k"}, "response": {"decision": "ALLOW"}});
        let old = open(s.seal("decide", payload.clone(), 4000, "0af7651916cd43dd8448eb211c80319c").unwrap());
        let new = open(s.seal("decide", payload, 6000, "0af7651916cd43dd8448eb211c80319c").unwrap());
        assert!(
            old["signer_did"].as_str().unwrap().ends_with("#old")
                && new["signer_did"].as_str().unwrap().ends_with("#new")
        );
        assert_eq!(old["evidence_id"], json!(content_id(&old)));
        assert_eq!(
            (verify(&old, Some(&jwks)), verify(&new, Some(&jwks))),
            (Disposition::Authentic, Disposition::Authentic)
        );
        assert_eq!(jwks["keys"][0]["status"], "retired");
        // the RFC 8032 test vector 1 key: its public half is the spec's well-known value
        assert_eq!(
            hex::encode(s.keys[0].public.as_bytes()),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
        );
    }

    #[test]
    fn tampering_and_authority_failures_are_told_apart() {
        let s = signer();
        let jwks = s.jwks(6000);
        let e = open(s.seal("decide", json!({"request": {}, "response": {"decision": "DENY"}}), 6000, "").unwrap());
        let mut changed = e.clone();
        changed["payload"]["decide"]["response"]["decision"] = json!("ALLOW");
        assert_eq!(
            verify(&changed, Some(&jwks)),
            Disposition::SignatureInvalid,
            "content changed: id no longer matches"
        );
        let mut resigned = changed.clone();
        resigned["evidence_id"] = json!(content_id(&changed));
        assert_eq!(verify(&resigned, Some(&jwks)), Disposition::SignatureInvalid, "the signature does not cover it");
        let mut other_server = e.clone();
        other_server["server_id"] = json!("https://evil.example.com/v1");
        other_server["evidence_id"] = json!(content_id(&other_server));
        assert_eq!(verify(&other_server, Some(&jwks)), Disposition::SignerAuthorityFailed, "the DID binds the server");
        assert_eq!(verify(&e, None), Disposition::SignerResolutionFailed);
        // outside every window of its key
        let early = open(s.seal("decide", json!({}), 6000, "").unwrap());
        let mut narrow = jwks.clone();
        narrow["keys"][1]["cycles_nbf_ms"] = json!(7000);
        assert_eq!(verify(&early, Some(&narrow)), Disposition::SignerAuthorityFailed);
        // a raw-hex signer without a key set: valid but only bound
        let mut raw = e.clone();
        raw["signer_did"] = json!(hex::encode(s.keys[1].public.as_bytes()));
        raw["evidence_id"] = json!(content_id(&raw));
        raw["signature"] = json!("");
        let sig = s.keys[1].secret.as_ref().unwrap().sign(&canonical(&raw));
        raw["signature"] = json!(hex::encode(sig.to_bytes()));
        assert_eq!(verify(&raw, None), Disposition::BindingOnly);
        assert_eq!(verify(&raw, Some(&jwks)), Disposition::Authentic, "the raw-hex bridge to the set");
    }

    #[test]
    fn key_configuration_is_checked() {
        let good = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
        for bad in [
            "[]".to_string(),
            format!(r#"[{{"kid": "a", "private_key": "{good}", "nbf_ms": 1, "exp_ms": 1}}]"#),
            format!(
                r#"[{{"kid": "a", "private_key": "{good}", "nbf_ms": 1}}, {{"kid": "a", "public_key": "{good}", "nbf_ms": 1}}]"#
            ),
            format!(r#"[{{"kid": "a b", "private_key": "{good}", "nbf_ms": 1}}]"#),
            r#"[{"kid": "a", "private_key": "00", "nbf_ms": 1}]"#.to_string(),
            format!(r#"[{{"kid": "a", "public_key": "{good}", "nbf_ms": 1}}]"#),
        ] {
            assert!(Signer::from_config("https://x/v1", &bad).is_err(), "{bad}");
        }
        let (s, text) = Signer::generate("http://127.0.0.1:7878/v1", 42);
        let again = Signer::from_config("http://127.0.0.1:7878/v1", &text).unwrap();
        assert_eq!(s.keys[0].public, again.keys[0].public);
        assert!(!format!("{:?}", again).contains(&text[30..60]), "Debug never shows the private key");
    }
}

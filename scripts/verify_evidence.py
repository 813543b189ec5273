#!/usr/bin/env python3
"""An independent verifier of CyclesEvidence envelopes (cycles-evidence-v0.2.yaml).

It shares no code with the server: RFC 8785 canonical JSON comes from `rfc8785` (Trail of
Bits), Ed25519 from `cryptography`. Given an envelope and the signer's JWK Set, it reports one
of the five dispositions of the spec: authentic, binding_only, signer_authority_failed,
signer_resolution_failed, signature_invalid.

    verify_evidence.py ENVELOPE [--jwks JWKS] [--expected-signer HEX]

ENVELOPE and JWKS are URLs or files; without --jwks the set is fetched from
{server_id}/.well-known/cycles-jwks.json. Prints the disposition; exits 0 only for authentic
(or binding_only when --allow-binding-only is given).
"""
import argparse
import base64
import hashlib
import json
import sys
import urllib.request

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

ARTIFACTS = ("decide", "reserve", "commit", "release", "error")


def load(source):
    if source.startswith(("http://", "https://")):
        with urllib.request.urlopen(source, timeout=10) as r:
            return json.loads(r.read())
    with open(source) as f:
        return json.load(f)


def content_id(envelope):
    e = dict(envelope, evidence_id="", signature="")
    return hashlib.sha256(rfc8785.dumps(e)).hexdigest()


def signature_valid(envelope, key_bytes):
    try:
        sig = bytes.fromhex(envelope["signature"])
        Ed25519PublicKey.from_public_bytes(key_bytes).verify(sig, rfc8785.dumps(dict(envelope, signature="")))
        return True
    except (InvalidSignature, ValueError):
        return False


def b64url(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def usable(jwk):
    """A JWK that may be a candidate (wrong kty/crv/alg, a bad x or no window start: excluded)."""
    try:
        return (jwk.get("kty") == "OKP" and jwk.get("crv") == "Ed25519" and jwk.get("alg", "EdDSA") == "EdDSA"
                and isinstance(jwk.get("cycles_nbf_ms"), int) and len(b64url(jwk["x"])) == 32)
    except (KeyError, ValueError, TypeError):
        return False


def covers(jwk, issued):
    exp = jwk.get("cycles_exp_ms")
    return jwk["cycles_nbf_ms"] <= issued and (exp is None or issued < exp)


def verify(envelope, jwks, expected_signer=None):
    """The disposition of `envelope` against `jwks` (None: the set could not be obtained)."""
    try:
        server_id, signer, issued = envelope["server_id"], envelope["signer_did"], envelope["issued_at_ms"]
        artifact, payload = envelope["artifact_type"], envelope["payload"]
    except KeyError:
        return "signature_invalid"
    # the payload carries exactly the key its artifact type names
    if envelope.get("schema_version") != "cycles-evidence/v0.1" or artifact not in ARTIFACTS or list(payload) != [artifact]:
        return "signature_invalid"
    if envelope.get("evidence_id") != content_id(envelope):
        return "signature_invalid"
    did = signer[len("did:cycles:"):] if signer.startswith("did:cycles:") else None
    if jwks is None:
        if did is not None:
            return "signer_resolution_failed"
        try:
            raw = bytes.fromhex(signer)
        except ValueError:
            return "signature_invalid"
        if not signature_valid(envelope, raw):
            return "signature_invalid"
        return "binding_only"
    keys = jwks.get("keys") if isinstance(jwks, dict) else None
    if not isinstance(keys, list):
        return "signer_resolution_failed"
    if did is not None:
        server_hash, _, kid = did.partition("#")
        if server_hash != hashlib.sha256(server_id.encode()).hexdigest():
            return "signer_authority_failed"
        named = [k for k in keys if k.get("kid") == kid]
        if len(named) != 1:
            return "signer_authority_failed"
        candidates = [k for k in named if usable(k) and covers(k, issued)]
    else:
        try:
            raw = bytes.fromhex(signer)
        except ValueError:
            return "signature_invalid"
        candidates = [k for k in keys if usable(k) and covers(k, issued) and b64url(k["x"]) == raw]
    if len(candidates) != 1:
        return "signer_authority_failed"
    if not signature_valid(envelope, b64url(candidates[0]["x"])):
        return "signature_invalid"
    if expected_signer is not None and expected_signer != signer:
        return "signer_authority_failed"
    return "authentic"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("envelope")
    p.add_argument("--jwks")
    p.add_argument("--expected-signer")
    p.add_argument("--allow-binding-only", action="store_true")
    a = p.parse_args()
    envelope = load(a.envelope)
    try:
        jwks = load(a.jwks or envelope["server_id"].rstrip("/") + "/.well-known/cycles-jwks.json")
    except Exception:  # unreachable or unparseable: resolution failed, never a forgery
        jwks = None
    d = verify(envelope, jwks, a.expected_signer)
    print(d)
    sys.exit(0 if d == "authentic" or (a.allow_binding_only and d == "binding_only") else 1)


if __name__ == "__main__":
    main()

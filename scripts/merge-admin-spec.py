#!/usr/bin/env python3
"""Applies the spec index's admin_merged recipe (cycles-spec-index.yaml) where the pre-built
cycles-openapi-admin-merged.yaml falls short: the v0.1.26 governance extension's fields merged
into Tenant, Policy, PolicyCreateRequest, TenantCreateRequest and the two PATCH bodies (the
extension: "Admin tooling MUST treat these paths as carrying the extended fields").
Usage: merge-admin-spec.py <reference dir> <output file>"""
import sys

import yaml

ref, out = sys.argv[1], sys.argv[2]
merged = yaml.safe_load(open(f"{ref}/cycles-openapi-admin-merged.yaml"))
ext = yaml.safe_load(open(f"{ref}/cycles-governance-extensions-v0.1.26.yaml"))["components"]["schemas"]
schemas = merged["components"]["schemas"]


def props(name):
    return ext[name]["properties"]


for target, source in [("Tenant", "TenantExtension"), ("TenantCreateRequest", "TenantExtension"),
                       ("Policy", "PolicyExtension"), ("PolicyCreateRequest", "PolicyCreateRequestExtension")]:
    schemas[target].setdefault("properties", {}).update(props(source))
# the returned Tenant and Policy always carry the fields (the extension's DEFAULT VALUE SEMANTICS)
schemas["Tenant"].setdefault("required", []).append("observe_mode")
schemas["Policy"].setdefault("required", []).extend(list(props("PolicyExtension")))
# the PATCH operations keep the base spec's ids (the extension's are documentation-only names
# for the same operations: "implementations MUST merge the new fields into the existing PATCH")
for path, source, op in [("/v1/admin/tenants/{tenant_id}", "TenantPatchExtension", "updateTenant"),
                         ("/v1/admin/policies/{policy_id}", "PolicyPatchExtension", "updatePolicy")]:
    merged["paths"][path]["patch"]["operationId"] = op
    body = merged["paths"][path]["patch"]["requestBody"]["content"]["application/json"]
    base = body["schema"]["allOf"][0]
    base["properties"].update(props(source))
    body["schema"] = base
yaml.safe_dump(merged, open(out, "w"), sort_keys=False)

//! Hash records (tenants, API keys, ledgers, subscriptions, deliveries) as the operator plane
//! reads them: field -> string, read many at a time.

use std::collections::HashMap;

use serde::Deserialize;

use super::{lua_list, script};
use crate::domain::format_rfc3339_ms;
use crate::error::{ApiError, ApiResult};
use crate::store::Store;

/// A stored hash record (field -> string).
pub type Record = HashMap<String, String>;

/// Decodes a record a script hands back as a JSON object of strings.
pub fn record_from_json(s: &str) -> ApiResult<Record> {
    serde_json::from_str(s).map_err(|_| ApiError::fault("malformed record in the store"))
}

pub fn field<'a>(r: &'a Record, name: &str) -> Option<&'a str> {
    r.get(name).map(String::as_str).filter(|v| !v.is_empty())
}

pub fn int_field(r: &Record, name: &str) -> Option<i64> {
    field(r, name).and_then(|v| v.parse().ok())
}

/// An `*_at_ms` field as an RFC 3339 timestamp.
pub fn time_field(r: &Record, name: &str) -> Option<String> {
    int_field(r, &format!("{name}_ms")).map(format_rfc3339_ms)
}

/// A stored JSON field (metadata and the like).
pub fn json_field(r: &Record, name: &str) -> Option<serde_json::Value> {
    field(r, name).and_then(|v| serde_json::from_str(v).ok())
}

/// ",a,b," -> ["a", "b"].
pub fn csv_list(s: &str) -> Vec<String> {
    s.split(',').filter(|p| !p.is_empty()).map(String::from).collect()
}

script! {
    /// Hash records of one tenant (`lua/read_hashes.lua`): one JSON object each, `{}` when absent.
    pub struct ReadHashes = read_hashes read_only -> Hashes {
        keys: [; records],
        args: [],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Hashes {
    #[serde(deserialize_with = "lua_list")]
    pub records: Vec<String>,
}

/// Reads hash records of one tenant (one round trip per 500), one per key, empty where absent.
pub async fn read_hashes(store: &Store, keys: &[String]) -> ApiResult<Vec<Record>> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(500) {
        for s in &store.run(ReadHashes { records: chunk.to_vec() }).await?.value.records {
            out.push(record_from_json(s)?);
        }
    }
    Ok(out)
}

/// Reads hash records of one tenant; absent ones are skipped.
pub async fn read_records(store: &Store, keys: &[String]) -> ApiResult<Vec<Record>> {
    Ok(read_hashes(store, keys).await?.into_iter().filter(|r| !r.is_empty()).collect())
}

/// A script's answer that is one record (a JSON object of strings) and its status.
#[derive(Debug, Clone)]
pub struct RecordAnswer(pub Record);

impl<'de> Deserialize<'de> for RecordAnswer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // `record_json` in lua/lib/reply.lua encodes a missing record as `{}`
        Ok(RecordAnswer(Record::deserialize(d)?))
    }
}

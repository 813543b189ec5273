//! API keys: the key check of the operator plane (what a key may do), creating and updating
//! or revoking keys.

use serde::Deserialize;

use super::records::RecordAnswer;
use super::{lua_list, script};

script! {
    /// Checks a key and reports its permissions, its scope filter and (when `tenant` holds the
    /// tenant record) its tenant's status (`lua/authenticate.lua`).
    pub struct Authenticate = authenticate read_only -> Grant {
        keys: [api_key; tenant],
        args: [digest, accepted],
    }
}

/// What a checked key may do.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Grant {
    #[serde(default, deserialize_with = "lua_list")]
    pub permissions: Vec<String>,
    /// The key's scope filter (JSON array), when it has one.
    #[serde(default)]
    pub scope_filter: Option<String>,
}

impl Grant {
    pub fn scope_filter(&self) -> Vec<String> {
        self.scope_filter.as_deref().and_then(|f| serde_json::from_str(f).ok()).unwrap_or_default()
    }
}

script! {
    /// createApiKey (`lua/api_key_create.lua`): `fields` is the key's record (JSON, the digest
    /// included; never the secret).
    pub struct CreateApiKey = api_key_create -> RecordAnswer {
        keys: [tenant, api_key, api_key_index, events, audit_log],
        args: [context, fields],
    }
}

script! {
    /// updateApiKey and revokeApiKey (`lua/api_key_update.lua`): `mode` is `update` (`change`: a
    /// JSON patch) or `revoke` (`change`: the reason).
    pub struct UpdateApiKey = api_key_update -> RecordAnswer {
        keys: [tenant, api_key, events, audit_log],
        args: [context, mode, change],
    }
}

//! Bearer tokens and their roles.

use super::*;

/// What a bearer token lets its holder do (docs/security.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TokenRole {
    /// Everything but Raft and the agent stream.
    Admin,
    /// Submit, cancel, read.
    Client,
    /// Read only.
    Reader,
}

impl TokenRole {
    /// `admin`, `client` or `reader`.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenRole::Admin => "admin",
            TokenRole::Client => "client",
            TokenRole::Reader => "reader",
        }
    }

    /// Parses [`TokenRole::as_str`]'s words.
    pub fn parse(s: &str) -> Option<TokenRole> {
        match s {
            "admin" => Some(TokenRole::Admin),
            "client" => Some(TokenRole::Client),
            "reader" => Some(TokenRole::Reader),
            _ => None,
        }
    }
}

/// A bearer token. Only the SHA-256 of its secret is stored; the secret is
/// shown once, when it is created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// Its id (part of the secret, so a check finds it without a scan).
    pub id: String,
    /// Who or what holds it.
    pub name: String,
    /// What it allows.
    pub role: TokenRole,
    /// SHA-256 of the secret.
    pub sha256: [u8; 32],
    /// When it was created (entry time).
    pub created_ms: u64,
    /// It stops working at this wall-clock time.
    pub expires_ms: u64,
    /// The admin who created it.
    pub created_by: String,
    /// When and by whom it was revoked.
    pub revoked: Option<(u64, String)>,
}

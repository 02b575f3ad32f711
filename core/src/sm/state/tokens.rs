//! Bearer tokens: create and revoke (hashes only).

use super::*;

/// The most tokens the state keeps (about 200 bytes each on the wire).
pub const MAX_TOKENS: usize = 10_000;

impl State {
    /// A token by id.
    pub fn token(&self, id: &str) -> Option<&Token> {
        self.tokens.get(id)
    }

    /// Every token, by id.
    pub fn tokens(&self) -> impl Iterator<Item = &Token> {
        self.tokens.values()
    }

    pub(super) fn create_token(
        &mut self,
        id: &str,
        name: &str,
        role: TokenRole,
        sha256: [u8; 32],
        expires_ms: u64,
        by: &str,
    ) -> Applied {
        let bad = |field: &str, reason: &str| Rejection::InvalidToken { field: field.into(), reason: reason.into() };
        let word = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if id.is_empty() || id.len() > 32 || !id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
            return Err(bad("id", "must be 1-32 characters of a-z 0-9"));
        }
        if name.is_empty() || name.len() > 128 || !word(name) {
            return Err(bad("name", "must be 1-128 characters of A-Z a-z 0-9 . _ -"));
        }
        if expires_ms <= self.now_ms {
            return Err(bad("ttl", "the token would expire before it is created"));
        }
        validate_node_request(by, "", None, &self.limits)?;
        if self.tokens.contains_key(id) {
            return Err(Rejection::TokenExists(id.to_string()));
        }
        // Revoked and expired tokens are kept (their ids are never reused):
        // a bound on them all keeps `muster token list` one message.
        if self.tokens.len() >= MAX_TOKENS {
            return Err(bad("tokens", &format!("the cluster holds {MAX_TOKENS} tokens, the most it keeps")));
        }
        let token = Token {
            id: id.to_string(),
            name: name.to_string(),
            role,
            sha256,
            created_ms: self.now_ms,
            expires_ms,
            created_by: by.to_string(),
            revoked: None,
        };
        self.tokens.insert(id.to_string(), token);
        Ok(vec![Event::TokenCreated { id: id.to_string(), name: name.to_string(), role, by: by.to_string() }])
    }

    pub(super) fn check_revoke(&self, id: &str, by: &str) -> Result<(), Rejection> {
        validate_node_request(by, "", None, &self.limits)?;
        let token = self.tokens.get(id).ok_or_else(|| Rejection::UnknownToken(id.to_string()))?;
        if token.revoked.is_some() {
            return Err(Rejection::TokenRevoked(id.to_string()));
        }
        Ok(())
    }

    pub(super) fn revoke_token(&mut self, id: &str, by: &str) -> Applied {
        self.check_revoke(id, by)?;
        let now = self.now_ms;
        let token = self.tokens.get_mut(id).expect("checked");
        token.revoked = Some((now, by.to_string()));
        Ok(vec![Event::TokenRevoked { id: id.to_string(), by: by.to_string() }])
    }
}

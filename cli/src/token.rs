//! `muster token`: bearer tokens for admins, clients and readers
//! (docs/security.md). Only admins may create, list or revoke them.

use anyhow::Context;
use clap::Subcommand;
use muster_proto::v1;
use muster_proto::v1::admin_service_client::AdminServiceClient;
use serde_json::json;

use crate::client::Cluster;
use crate::output::Output;

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Create a token; its secret is printed once.
    Create {
        /// admin, client or reader.
        #[arg(long)]
        role: String,
        /// Who or what holds it.
        #[arg(long)]
        name: String,
        /// How long it works (e.g. 12h, 30d).
        #[arg(long, default_value = "30d")]
        ttl: String,
    },
    /// Every token: id, holder, role, expiry, revocation (never secrets).
    List,
    /// Revoke a token: calls and streams using it fail from now on.
    Revoke {
        /// The token's id.
        id: String,
    },
}

fn info_json(t: &v1::TokenInfo) -> serde_json::Value {
    json!({
        "id": t.id, "name": t.name, "role": t.role, "created_ms": t.created_ms, "expires_ms": t.expires_ms,
        "created_by": t.created_by, "revoked_ms": t.revoked_ms, "revoked_by": t.revoked_by,
    })
}

pub async fn run(cluster: &mut Cluster, cmd: TokenCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        TokenCmd::Create { role, name, ttl } => {
            let ttl_s = crate::args::parse_duration_s(&ttl).context("--ttl")?;
            let req = v1::CreateTokenRequest { role, name, ttl_s };
            let r = cluster
                .call(|ch| {
                    let req = req.clone();
                    async move { AdminServiceClient::new(ch).create_token(req).await }
                })
                .await?
                .into_inner();
            let t = r.token.context("the server returned no token")?;
            match out {
                Output::Json => {
                    out!("{}", serde_json::to_string_pretty(&json!({ "token": info_json(&t), "secret": r.secret }))?)
                }
                Output::Text => {
                    out!(
                        "created token {} ({} for {}), expires {}",
                        t.id,
                        t.role,
                        t.name,
                        crate::output::when(t.expires_ms, crate::output::now_ms())
                    );
                    out!("secret (shown once): {}", r.secret);
                    out!("use: export MUSTER_TOKEN={}", r.secret);
                }
            }
        }
        TokenCmd::List => {
            let r = cluster
                .call(|ch| async move { AdminServiceClient::new(ch).list_tokens(v1::StatusRequest {}).await })
                .await?
                .into_inner();
            match out {
                Output::Json => {
                    let tokens: Vec<_> = r.tokens.iter().map(info_json).collect();
                    out!("{}", serde_json::to_string_pretty(&json!({ "tokens": tokens }))?);
                }
                Output::Text => {
                    out!("{:<16}  {:<7}  {:<20}  {:<8}  EXPIRES", "ID", "ROLE", "NAME", "STATE");
                    let now_ms = crate::output::now_ms();
                    for t in &r.tokens {
                        let state = token_state(t, now_ms);
                        let expires = crate::output::when(t.expires_ms, now_ms);
                        out!("{:<16}  {:<7}  {:<20}  {state:<8}  {expires}", t.id, t.role, t.name);
                    }
                }
            }
        }
        TokenCmd::Revoke { id } => {
            let req = v1::RevokeTokenRequest { id };
            let t = cluster
                .call(|ch| {
                    let req = req.clone();
                    async move { AdminServiceClient::new(ch).revoke_token(req).await }
                })
                .await?
                .into_inner();
            match out {
                Output::Json => out!("{}", serde_json::to_string_pretty(&info_json(&t))?),
                Output::Text => out!("revoked token {} ({} for {})", t.id, t.role, t.name),
            }
        }
    }
    Ok(())
}

/// A token as the list shows it: revoked (and by whom), expired, or in force.
fn token_state(t: &v1::TokenInfo, now_ms: u64) -> String {
    if t.revoked_ms > 0 {
        format!("revoked by {}", t.revoked_by)
    } else if t.expires_ms <= now_ms {
        "expired".into()
    } else {
        "in force".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expired_token_is_listed_as_expired_not_in_force() {
        let t = v1::TokenInfo { expires_ms: 1_000, ..Default::default() };
        assert_eq!(token_state(&t, 999), "in force");
        assert_eq!(token_state(&t, 1_000), "expired");
        let revoked = v1::TokenInfo { revoked_ms: 500, revoked_by: "admin dev".into(), ..t };
        assert_eq!(token_state(&revoked, 2_000), "revoked by admin dev");
    }
}

//! `muster.v1.AdminService`: replica status, membership changes, snapshots
//! and elections.
//!
//! openraft 0.9 has no leadership transfer; `TriggerElection` asks one
//! replica to campaign now, which moves leadership to it when its log is up
//! to date (the CLI's `cluster transfer-leader` waits to see that happen).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use muster_proto::bounds::Bounded;
use muster_proto::v1;
use muster_proto::v1::admin_service_server::AdminService;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};
use tonic::{Request, Response, Status};

use muster_tls::Caller;

use super::auth::{caller_name, new_token_secret, token_sha256};
use super::convert::{propose_error_to_status, rejection_to_status};
use crate::server::policies::BugInjector;
use crate::server::raft::Consensus;
use crate::server::raft::proposer::ProposeError;
use crate::sm::{Command, Outcome, Token, TokenRole};

/// The admin API of one replica.
pub struct AdminApi {
    s: Consensus,
    history: Arc<muster_history::HistoryStore>,
    bugs: Arc<BugInjector>,
}

impl AdminApi {
    /// The admin API over a replica's consensus, its job history (backups
    /// carry it) and its injected bug (tests only).
    pub fn new(s: Consensus, history: Arc<muster_history::HistoryStore>, bugs: Arc<BugInjector>) -> Self {
        AdminApi { s, history, bugs }
    }

    fn members(&self) -> Vec<v1::Member> {
        self.s.status().members
    }
}

fn write_error(e: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> Status {
    propose_error_to_status(ProposeError::from(e))
}

fn valid_address(addr: &str) -> bool {
    addr.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0))
}

/// A backup is streamed in chunks of this size.
const BACKUP_CHUNK_BYTES: usize = 1 << 20;

#[tonic::async_trait]
impl AdminService for AdminApi {
    type BackupStream = tokio_stream::Iter<std::vec::IntoIter<Result<v1::BackupChunk, Status>>>;

    async fn backup(&self, _: Request<v1::BackupRequest>) -> Result<Response<Self::BackupStream>, Status> {
        // Through the leader: the backup holds everything committed before
        // the call.
        self.s.linearizable().await?;
        let (applied, state, digest) = self.s.reader().export();
        // The history as this replica has it now: every record of the
        // state's finished allocations that its writer has stored (the
        // restored cluster fetches any it lacks from its peers, and rebuilds
        // those the state still holds).
        let store = self.history.clone();
        let extra = tokio::task::spawn_blocking(move || super::history::export(&store))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::internal(format!("cannot copy the job history: {e}")))?;
        let backup = muster_raft_store::Backup {
            index: applied.map_or(0, |l| l.index),
            digest,
            taken_at_ms: self.s.clock().wall_ms(),
            taken_from: self.s.id(),
            state,
            extra,
        };
        let bytes = backup.encode();
        let (index, state_digest, total_bytes) = (backup.index, crate::server::hex(&digest), bytes.len() as u64);
        tracing::info!(index, bytes = total_bytes, "backup taken");
        let chunks: Vec<Result<v1::BackupChunk, Status>> = bytes
            .chunks(BACKUP_CHUNK_BYTES)
            .map(|c| Ok(v1::BackupChunk { data: c.to_vec(), index, state_digest: state_digest.clone(), total_bytes }))
            .collect();
        Ok(Response::new(tokio_stream::iter(chunks)))
    }

    async fn status(&self, _: Request<v1::StatusRequest>) -> Result<Response<v1::ReplicaStatus>, Status> {
        Ok(Response::new(self.s.status()))
    }

    async fn add_learner(
        &self,
        req: Request<v1::AddLearnerRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        req.get_ref().check_bounds()?;
        let r = req.into_inner();
        if r.id == 0 {
            return Err(Status::invalid_argument("invalid id: replica ids start at 1"));
        }
        if !valid_address(&r.address) {
            return Err(Status::invalid_argument(format!("invalid address: {:?} is not host:port", r.address)));
        }
        if self.members().iter().any(|m| m.id == r.id) {
            return Err(Status::already_exists(format!("replica {} is already a member", r.id)));
        }
        let resp = self.s.raft().add_learner(r.id, BasicNode::new(r.address), true).await.map_err(write_error)?;
        Ok(Response::new(v1::MembershipResponse { members: self.members(), log_index: resp.log_id.index }))
    }

    async fn change_membership(
        &self,
        req: Request<v1::ChangeMembershipRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        req.get_ref().check_bounds()?;
        let r = req.into_inner();
        if r.promote.is_empty() && r.remove.is_empty() {
            return Err(Status::invalid_argument("invalid request: name replicas to promote or remove"));
        }
        let members = self.members();
        for id in r.promote.iter().chain(&r.remove) {
            if !members.iter().any(|m| m.id == *id) {
                return Err(Status::not_found(format!("replica {id} is not a member")));
            }
        }
        let mut log_index = 0;
        if !r.promote.is_empty() {
            let ids: BTreeSet<u64> = r.promote.iter().copied().collect();
            let resp =
                self.s.raft().change_membership(ChangeMembers::AddVoterIds(ids), true).await.map_err(write_error)?;
            log_index = resp.log_id.index;
        }
        let remove: BTreeSet<u64> = r.remove.iter().copied().collect();
        let voters: BTreeSet<u64> = members.iter().filter(|m| m.voter).map(|m| m.id).collect();
        let remove_voters: BTreeSet<u64> = remove.intersection(&voters).copied().collect();
        if !remove_voters.is_empty() {
            // retain = false: a removed voter does not stay on as a learner.
            let retain = self.bugs.has(crate::server::policies::InjectedBug::RemovedVotersLinger);
            let resp = self
                .s
                .raft()
                .change_membership(ChangeMembers::RemoveVoters(remove_voters), retain)
                .await
                .map_err(write_error)?;
            log_index = resp.log_id.index;
        }
        let learners: BTreeSet<u64> = remove.difference(&voters).copied().collect();
        if !learners.is_empty() {
            let resp = self
                .s
                .raft()
                .change_membership(ChangeMembers::RemoveNodes(learners), false)
                .await
                .map_err(write_error)?;
            log_index = resp.log_id.index;
        }
        Ok(Response::new(v1::MembershipResponse { members: self.members(), log_index }))
    }

    async fn trigger_snapshot(&self, _: Request<v1::StatusRequest>) -> Result<Response<v1::ReplicaStatus>, Status> {
        let target = self.s.reader().applied().map_or(0, |l| l.index);
        self.s.raft().trigger().snapshot().await.map_err(|e| Status::unavailable(e.to_string()))?;
        self.s
            .raft()
            .wait(Some(Duration::from_secs(60)))
            .metrics(|m| m.snapshot.is_some_and(|s| s.index >= target), "snapshot built")
            .await
            .map_err(|e| Status::deadline_exceeded(format!("snapshot not built in time: {e}")))?;
        Ok(Response::new(self.s.status()))
    }

    async fn trigger_election(&self, _: Request<v1::StatusRequest>) -> Result<Response<v1::ReplicaStatus>, Status> {
        self.s.raft().trigger().elect().await.map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(self.s.status()))
    }

    async fn create_token(
        &self,
        req: Request<v1::CreateTokenRequest>,
    ) -> Result<Response<v1::CreateTokenResponse>, Status> {
        req.get_ref().check_bounds()?;
        let by = caller_name(&Caller::of(&req));
        let q = req.into_inner();
        let role = TokenRole::parse(&q.role)
            .ok_or_else(|| Status::invalid_argument(format!("invalid role: {:?} (admin, client or reader)", q.role)))?;
        if q.ttl_s == 0 {
            return Err(Status::invalid_argument("invalid ttl_s: must be at least 1 second"));
        }
        let ttl_ms = q.ttl_s.checked_mul(1_000).ok_or_else(|| Status::invalid_argument("invalid ttl_s: too long"))?;
        let (id, secret) =
            new_token_secret().map_err(|e| Status::internal(format!("no randomness for the token: {e}")))?;
        let cmd = Command::CreateToken {
            id: id.clone(),
            name: q.name,
            role,
            sha256: token_sha256(&secret),
            expires_ms: self.s.reader().read(|st| self.s.now(st)).saturating_add(ttl_ms),
            by,
        };
        match self.s.proposer().propose(cmd).await.map_err(propose_error_to_status)? {
            Outcome::Accepted(_) => {}
            Outcome::Rejected(r) => return Err(rejection_to_status(&r)),
        }
        let token = self.token_info(&id)?;
        Ok(Response::new(v1::CreateTokenResponse { token: Some(token), secret }))
    }

    async fn revoke_token(&self, req: Request<v1::RevokeTokenRequest>) -> Result<Response<v1::TokenInfo>, Status> {
        req.get_ref().check_bounds()?;
        let by = caller_name(&Caller::of(&req));
        let id = req.into_inner().id;
        // An unknown or already revoked token is refused before the log (on
        // the leader, whose state holds every acknowledged write).
        let cmd = Command::RevokeToken { id: id.clone(), by };
        if self.s.is_leader() {
            self.s.reader().read(|st| st.precheck(&cmd)).map_err(|r| rejection_to_status(&r))?;
        }
        match self.s.proposer().propose(cmd).await.map_err(propose_error_to_status)? {
            Outcome::Accepted(_) => self.token_info(&id).map(Response::new),
            Outcome::Rejected(r) => Err(rejection_to_status(&r)),
        }
    }

    async fn get_checkpoint_settings(
        &self,
        _: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::CheckpointSettings>, Status> {
        self.s.linearizable().await?;
        Ok(Response::new(self.checkpoint_settings()))
    }

    async fn set_checkpoint_settings(
        &self,
        req: Request<v1::CheckpointSettings>,
    ) -> Result<Response<v1::CheckpointSettings>, Status> {
        req.get_ref().check_bounds()?;
        let by = caller_name(&Caller::of(&req));
        let settings = crate::server::api::convert::settings_from_proto(req.into_inner())?;
        match self
            .s
            .proposer()
            .propose(Command::SetCheckpointSettings { settings, by })
            .await
            .map_err(propose_error_to_status)?
        {
            Outcome::Accepted(_) => Ok(Response::new(self.checkpoint_settings())),
            Outcome::Rejected(r) => Err(rejection_to_status(&r)),
        }
    }

    async fn list_tokens(&self, _: Request<v1::StatusRequest>) -> Result<Response<v1::ListTokensResponse>, Status> {
        self.s.linearizable().await?;
        let tokens = self.s.reader().read(|st| st.tokens().map(token_to_proto).collect());
        Ok(Response::new(v1::ListTokensResponse { tokens }))
    }
}

impl AdminApi {
    fn checkpoint_settings(&self) -> v1::CheckpointSettings {
        self.s.reader().read(|st| {
            let (retired, abandoned) = st.retired_checkpoint_counts();
            crate::server::api::convert::settings_to_proto(st.checkpoint_settings(), retired, abandoned)
        })
    }

    fn token_info(&self, id: &str) -> Result<v1::TokenInfo, Status> {
        self.s
            .reader()
            .read(|st| st.token(id).map(token_to_proto))
            .ok_or_else(|| Status::not_found(format!("no token {id}")))
    }
}

fn token_to_proto(t: &Token) -> v1::TokenInfo {
    v1::TokenInfo {
        id: t.id.clone(),
        name: t.name.clone(),
        role: t.role.as_str().to_string(),
        created_ms: t.created_ms,
        expires_ms: t.expires_ms,
        created_by: t.created_by.clone(),
        revoked_ms: t.revoked.as_ref().map_or(0, |(ms, _)| *ms),
        revoked_by: t.revoked.as_ref().map_or(String::new(), |(_, by)| by.clone()),
    }
}

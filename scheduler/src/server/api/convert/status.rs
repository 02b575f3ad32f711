//! Errors as gRPC statuses: deterministic rejections, redirects to the
//! leader, and failed proposals.

use tonic::Status;

use super::invalid;
use crate::server::raft::{ProposeError, not_leader_status};
use crate::sm::Rejection;

/// The gRPC status of a deterministic rejection.
pub fn rejection_to_status(r: &Rejection) -> Status {
    let msg = r.to_string();
    match r {
        Rejection::InvalidSpec { field, reason } => invalid(&format!("spec.{field}"), reason),
        Rejection::InvalidNode { field, reason } => invalid(field, reason),
        Rejection::InvalidToken { field, reason } => invalid(field, reason),
        Rejection::TokenExists(_) | Rejection::VClusterExists(_) => Status::already_exists(msg),
        Rejection::InvalidVCluster { field, reason } => invalid(field, reason),
        Rejection::UnknownVCluster(_) => Status::not_found(msg),
        Rejection::QuotaExceeded { .. } | Rejection::OverQuota { .. } => Status::resource_exhausted(msg),
        Rejection::UnknownToken(_) => Status::not_found(msg),
        Rejection::TokenRevoked(_) => Status::failed_precondition(msg),
        Rejection::UnknownNode(_)
        | Rejection::UnknownAllocation(_)
        | Rejection::UnknownArray(_)
        | Rejection::UnknownTask { .. } => Status::not_found(msg),
        Rejection::IdempotencyConflict { .. } => Status::already_exists(msg),
        Rejection::WrongNode { .. } | Rejection::NotAdmitted { .. } => Status::permission_denied(msg),
        Rejection::StaleReservationEpoch { .. }
        | Rejection::StaleTaskEpoch { .. }
        | Rejection::StalePreemptionEpoch { .. } => Status::aborted(msg),
        Rejection::NotPreemptible { .. }
        | Rejection::BorrowRefused { .. }
        | Rejection::NodeHeld { .. }
        | Rejection::AlreadyNominated { .. }
        | Rejection::NotNominated { .. }
        | Rejection::NominationNotExpired { .. }
        | Rejection::IllegalNodeTransition { .. }
        | Rejection::NodeBusy { .. }
        | Rejection::DrainNotExpired { .. }
        | Rejection::NodeTerminated(_) => Status::failed_precondition(msg),
        Rejection::CheckpointTooLarge { .. } => Status::resource_exhausted(msg),
        Rejection::NotQueued { .. }
        | Rejection::WrongNodeCount { .. }
        | Rejection::NodeRepeated(_)
        | Rejection::NodeNotReady(_)
        | Rejection::InsufficientCapacity { .. }
        | Rejection::NoFreePorts { .. }
        | Rejection::ConstraintUnmet { .. }
        | Rejection::PackingBroken { .. }
        | Rejection::ShrinkBelowUsage(_)
        | Rejection::WrongTaskStatus { .. }
        | Rejection::NotTearingDown { .. }
        | Rejection::CheckpointDisabled { .. }
        | Rejection::NothingReserved { .. }
        | Rejection::AlreadyTerminal { .. }
        | Rejection::AlreadyCancelling { .. }
        | Rejection::NothingToForget
        | Rejection::NothingToCompact => Status::failed_precondition(msg),
        Rejection::InvalidForget(reason) => invalid("forget", reason),
        Rejection::InvalidWaitNotes(reason) => invalid("notes", reason),
        Rejection::NotAnEndReport { .. } => invalid("usage", &msg),
        Rejection::InvalidCheckpoint { field, reason, .. } => invalid(&format!("manifest.{field}"), reason),
        Rejection::InvalidCheckpointSettings { field, reason } => invalid(field, reason),
        Rejection::UnknownCheckpoint { .. } => Status::not_found(msg),
        Rejection::NotDeleter { .. } => Status::permission_denied(msg),
    }
}

/// The gRPC status of a failed proposal.
pub fn propose_error_to_status(e: ProposeError) -> Status {
    match e {
        ProposeError::NotLeader { leader } => not_leader_status(leader),
        ProposeError::Raft(msg) => Status::unavailable(format!("the write did not complete: {msg}")),
        // Not UNAVAILABLE: retrying this replica cannot help; another can.
        e @ ProposeError::Storage(_) => Status::internal(format!("{e}; ask another replica")),
        ProposeError::Membership(msg) => Status::failed_precondition(msg),
        e @ ProposeError::TooLarge { .. } => Status::invalid_argument(format!("invalid request: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::raft::{LEADER_ADDR_HEADER, LEADER_ID_HEADER};

    /// A failed storage is fatal on this replica, so it is not the
    /// retryable UNAVAILABLE a lost leadership or a shutdown gets.
    #[test]
    fn a_storage_failure_is_internal_and_names_itself_not_unavailable() {
        use openraft::error::{ClientWriteError, Fatal, RaftError};
        use openraft::{ErrorSubject, ErrorVerb, StorageError, StorageIOError};
        let io = StorageIOError::new(ErrorSubject::Logs, ErrorVerb::Write, openraft::AnyError::error("EIO on fsync"));
        let fatal: RaftError<u64, ClientWriteError<u64, openraft::BasicNode>> =
            RaftError::Fatal(Fatal::StorageError(StorageError::from(io)));
        let st = propose_error_to_status(ProposeError::from(fatal));
        assert_eq!(st.code(), tonic::Code::Internal, "{st:?}");
        assert!(st.message().contains("storage failed") && st.message().contains("EIO on fsync"), "{st:?}");
        let stopped: RaftError<u64, ClientWriteError<u64, openraft::BasicNode>> = RaftError::Fatal(Fatal::Stopped);
        assert_eq!(propose_error_to_status(ProposeError::from(stopped)).code(), tonic::Code::Unavailable);
        let not_leader = propose_error_to_status(ProposeError::NotLeader { leader: None });
        assert_eq!(not_leader.code(), tonic::Code::Unavailable);
    }

    #[test]
    fn a_redirect_carries_the_leader_in_metadata() {
        let s = not_leader_status(Some((2, "127.0.0.1:7002".into())));
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert_eq!(s.metadata().get(LEADER_ID_HEADER).unwrap(), "2");
        assert_eq!(s.metadata().get(LEADER_ADDR_HEADER).unwrap(), "127.0.0.1:7002");
        assert!(s.message().contains("replica 2 at 127.0.0.1:7002"));
    }
}

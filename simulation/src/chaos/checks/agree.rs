//! Every replica reports the same applied index and state digest once the
//! cluster is quiet.

use muster_proto::v1;

use super::CheckResult;

/// Checks the replicas' final statuses (`None`: a replica did not answer).
pub fn replicas_agree(statuses: &[Option<v1::ReplicaStatus>]) -> CheckResult {
    let mut violations = Vec::new();
    let answered: Vec<&v1::ReplicaStatus> = statuses.iter().flatten().collect();
    if answered.len() != statuses.len() {
        violations.push(format!("{} of {} replicas did not answer", statuses.len() - answered.len(), statuses.len()));
    }
    let views: Vec<(u64, &str)> = answered.iter().map(|s| (s.applied_index, s.state_digest.as_str())).collect();
    if views.windows(2).any(|w| w[0] != w[1]) {
        violations.push(format!(
            "replicas differ: {}",
            answered
                .iter()
                .map(|s| format!("{}@{}={}", s.id, s.applied_index, s.state_digest))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let checked = views.first().map_or(String::new(), |(i, d)| format!("all at applied index {i}, digest {d}"));
    CheckResult::new("replicas_agree", violations, checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(id: u64, applied_index: u64, digest: &str) -> Option<v1::ReplicaStatus> {
        Some(v1::ReplicaStatus { id, applied_index, state_digest: digest.into(), ..Default::default() })
    }

    #[test]
    fn differing_or_silent_replicas_fail() {
        assert!(replicas_agree(&[s(1, 9, "ab"), s(2, 9, "ab"), s(3, 9, "ab")]).passed);
        assert!(!replicas_agree(&[s(1, 9, "ab"), s(2, 9, "ac"), s(3, 9, "ab")]).passed);
        assert!(!replicas_agree(&[s(1, 9, "ab"), s(2, 8, "ab"), s(3, 9, "ab")]).passed);
        assert!(!replicas_agree(&[s(1, 9, "ab"), None, s(3, 9, "ab")]).passed);
    }
}

//! Every replica that remains a member reports the same applied index and
//! state digest once the cluster is quiet, and the membership the harness
//! made.

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

/// [`replicas_agree`], and every member reports the membership the harness
/// made: exactly `members`, all voters.
pub fn replicas_agree_as_members(statuses: &[Option<v1::ReplicaStatus>], members: &[u64]) -> CheckResult {
    let mut r = replicas_agree(statuses);
    let mut wrong = Vec::new();
    for s in statuses.iter().flatten() {
        let voters: Vec<u64> = s.members.iter().filter(|m| m.voter).map(|m| m.id).collect();
        let learners: Vec<u64> = s.members.iter().filter(|m| !m.voter).map(|m| m.id).collect();
        if voters != members || !learners.is_empty() {
            wrong.push(format!("replica {} reports voters {voters:?} and learners {learners:?}", s.id));
        }
    }
    if !wrong.is_empty() {
        let failed = format!("the harness made the members {members:?}, all voters, but {}", wrong.join("; "));
        r.detail = if r.passed { failed } else { format!("{}; {failed}", r.detail) };
        r.passed = false;
    } else if r.passed {
        r.detail = format!("{}; members {members:?}, all voters, as the harness made them", r.detail);
    }
    r
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

    #[test]
    fn members_other_than_the_harness_made_fail() {
        let member = |id, voter| v1::Member { id, address: String::new(), voter };
        let with = |id, members: Vec<v1::Member>| s(id, 9, "ab").map(|st| v1::ReplicaStatus { members, ..st });
        let five: Vec<v1::Member> = [1, 2, 4, 5, 6].into_iter().map(|id| member(id, true)).collect();
        let all: Vec<_> = [1, 2, 4, 5, 6].into_iter().map(|id| with(id, five.clone())).collect();
        let r = replicas_agree_as_members(&all, &[1, 2, 4, 5, 6]);
        assert!(r.passed && r.detail.contains("members [1, 2, 4, 5, 6], all voters"), "{}", r.detail);
        // A replica the harness removed is still a voter.
        let r = replicas_agree_as_members(&all, &[1, 2, 4, 5]);
        assert!(!r.passed && r.detail.contains("reports voters [1, 2, 4, 5, 6]"), "{}", r.detail);
        // A learner never promoted.
        let mut half = five.clone();
        half[4].voter = false;
        let r = replicas_agree_as_members(&[with(1, half)], &[1, 2, 4, 5, 6]);
        assert!(!r.passed && r.detail.contains("learners [6]"), "{}", r.detail);
    }
}

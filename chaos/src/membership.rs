//! Membership faults, made the way an operator makes them
//! (`docs/operations.md#add-a-replica`), through the leader's admin API,
//! while the workload runs:
//!
//! - **grow**: two fresh replicas (new ids, empty data dirs, on free
//!   machines) start, join as learners and are promoted: 3 voters become 5;
//! - **shrink**: two voters are removed (the leader one of them half the
//!   time), stopped, and their data dirs retired: 5 become 3;
//! - **replace**: one voter (the leader half the time) is replaced by a
//!   fresh replica with a new id: added and promoted first when a machine is
//!   free, otherwise removed first and the newcomer started on its machine.
//!
//! A change the cluster does not commit within [`CALL_FOR`] is reported in
//! the fault's note; the final membership check then names the difference.

use std::future::Future;
use std::time::{Duration, Instant};

use muster_proto::v1;
use muster_proto::v1::admin_service_client::AdminServiceClient;
use tonic::Code;
use tonic::transport::Channel;

use super::client;
use super::nemesis::{FaultKind, leader_of, refresh_known};
use super::procs::Procs;
use super::proxy::Proxy;
use muster_sim::SimRng;

/// How long one membership call keeps trying (a leader may change under it,
/// and a learner must catch up first).
const CALL_FOR: Duration = Duration::from_secs(30);

/// Calls the leader's admin API until it answers, a leader changing under
/// it; `done` are the codes that mean the change was already made (by an
/// earlier try whose answer was lost).
async fn on_leader<F, Fut>(procs: &Procs, what: &str, done: &[Code], call: F) -> Result<(), String>
where
    F: Fn(AdminServiceClient<Channel>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<v1::MembershipResponse>, tonic::Status>>,
{
    let give_up = Instant::now() + CALL_FOR;
    let mut last = "no leader answered".to_string();
    while Instant::now() < give_up {
        if let Some(l) = leader_of(procs).await
            && let Ok(ch) = client::connect(procs.addr(l), Duration::from_secs(2)).await
        {
            match tokio::time::timeout(
                give_up.saturating_duration_since(Instant::now()),
                call(AdminServiceClient::new(ch)),
            )
            .await
            {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(s)) if done.contains(&s.code()) => return Ok(()),
                Ok(Err(s)) => last = format!("{what} on replica {l}: {}", s.message()),
                Err(_) => last = format!("{what} on replica {l}: no answer in {} s", CALL_FOR.as_secs()),
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Err(last)
}

/// Starts fresh replicas `ids`, adds them as learners and promotes them.
async fn add(procs: &mut Procs, proxies: &[Proxy], ids: &[u64]) -> Result<(), String> {
    let roles: Vec<muster_tls::Role> = ids.iter().map(|&id| muster_tls::Role::Server(id)).collect();
    muster_local::ensure_certs(&procs.tls_dir(), &roles)?;
    for &id in ids {
        procs.spawn_server(id).map_err(|e| format!("cannot start replica {id}: {e}"))?;
    }
    refresh_known(procs, proxies);
    for &id in ids {
        let address = procs.advertised(id).to_string();
        on_leader(procs, &format!("add-learner {id}"), &[Code::AlreadyExists], |mut c| {
            let address = address.clone();
            async move { c.add_learner(v1::AddLearnerRequest { id, address }).await }
        })
        .await?;
    }
    let promote = ids.to_vec();
    on_leader(procs, &format!("promote {ids:?}"), &[], |mut c| {
        let promote = promote.clone();
        async move { c.change_membership(v1::ChangeMembershipRequest { promote, remove: vec![] }).await }
    })
    .await
}

/// Removes members `ids`, then stops them for good.
async fn remove(procs: &mut Procs, proxies: &[Proxy], ids: &[u64]) -> Result<(), String> {
    let remove = ids.to_vec();
    let removed = on_leader(procs, &format!("remove {ids:?}"), &[Code::NotFound], |mut c| {
        let remove = remove.clone();
        async move { c.change_membership(v1::ChangeMembershipRequest { promote: vec![], remove }).await }
    })
    .await;
    for &id in ids {
        procs.retire(id)?;
    }
    refresh_known(procs, proxies);
    removed
}

/// `n` members to remove: the leader first half the time, the rest at
/// random; and whether the leader is one.
async fn victims(procs: &Procs, rng: &mut SimRng, n: usize) -> (Vec<u64>, bool) {
    let mut members = procs.members();
    let mut out = Vec::new();
    let mut leader = false;
    if let Some(l) = leader_of(procs).await
        && rng.chance(0.5)
    {
        members.retain(|&m| m != l);
        out.push(l);
        leader = true;
    }
    while out.len() < n && !members.is_empty() {
        out.push(members.remove(rng.range(0, members.len() as u64 - 1) as usize));
    }
    (out, leader)
}

fn ids(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
}

/// `ids`, the first marked as the leader when it is.
fn removed(ids: &[u64], leader: bool) -> String {
    let text = self::ids(ids);
    match (leader, ids.first()) {
        (true, Some(first)) => text.replacen(&first.to_string(), &format!("{first} (the leader)"), 1),
        _ => text,
    }
}

/// A membership fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// `grow-cluster`: two replicas join.
    Grow,
    /// `shrink-cluster`: two replicas leave.
    Shrink,
    /// `replace-replica`: one leaves and one joins.
    Replace,
}

impl Change {
    fn kind(self) -> FaultKind {
        match self {
            Change::Grow => FaultKind::GrowCluster,
            Change::Shrink => FaultKind::ShrinkCluster,
            Change::Replace => FaultKind::ReplaceReplica,
        }
    }
}

/// One membership fault: grow and shrink turn into each other when the
/// cluster is already 5 or 3. Returns the kind made, its target and a note.
pub async fn run(
    procs: &mut Procs,
    proxies: &[Proxy],
    rng: &mut SimRng,
    change: Change,
) -> (FaultKind, String, String) {
    let size = procs.members().len();
    let change = match change {
        Change::Grow | Change::Shrink if size >= 5 => Change::Shrink,
        Change::Grow | Change::Shrink => Change::Grow,
        Change::Replace => Change::Replace,
    };
    let kind = change.kind();
    let outcome = match change {
        Change::Grow => {
            let new: Vec<u64> = (0..2).filter_map(|_| procs.new_replica()).collect();
            add(procs, proxies, &new)
                .await
                .map(|()| (ids(&new), format!("replicas {} joined and were promoted", ids(&new))))
        }
        Change::Shrink => {
            let (old, leader) = victims(procs, rng, 2).await;
            remove(procs, proxies, &old)
                .await
                .map(|()| (ids(&old), format!("replicas {} removed and retired", removed(&old, leader))))
        }
        Change::Replace => {
            let (old, leader) = victims(procs, rng, 1).await;
            if size < 5 {
                let new: Vec<u64> = procs.new_replica().into_iter().collect();
                let r = match add(procs, proxies, &new).await {
                    Ok(()) => remove(procs, proxies, &old).await,
                    Err(e) => Err(e),
                };
                r.map(|()| {
                    (
                        ids(&old),
                        format!("replica {} joined, then replica {} was removed", ids(&new), removed(&old, leader)),
                    )
                })
            } else {
                let r = remove(procs, proxies, &old).await;
                let new: Vec<u64> = procs.new_replica().into_iter().collect();
                r.and(add(procs, proxies, &new).await).map(|()| {
                    let old_text = removed(&old, leader);
                    (ids(&old), format!("replica {old_text} removed, then replica {} joined on its machine", ids(&new)))
                })
            }
        }
    };
    let members = procs.members();
    match outcome {
        Ok((target, note)) => (kind, format!("replicas {target}"), format!("{note}; voters {}", self::ids(&members))),
        Err(e) => (kind, String::new(), format!("FAILED: {e}; the harness's voters {}", self::ids(&members))),
    }
}

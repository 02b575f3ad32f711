//! An in-process cluster of three replicas on loopback: commits, redirects,
//! equal digests, a follower catching up by snapshot after the log it missed
//! was purged, and a leader replicating while its own disk stalls.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use muster_raft_store::{DiskFault, set_disk_fault};
use muster_scheduler::server::api::convert::LEADER_ADDR_HEADER;
use muster_scheduler::server::{RaftTuning, Replica, ReplicaConfig};
use muster_scheduler::sm::{AllocSpec, Command, Event, Resources};
use tokio::net::{TcpListener, TcpSocket};

const WAIT: Duration = Duration::from_secs(60);

async fn channel(addr: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap()
}

fn listen(addr: SocketAddr) -> TcpListener {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(addr).unwrap();
    socket.listen(128).unwrap()
}

fn config(
    id: u64,
    addr: SocketAddr,
    dir: &Path,
    members: &BTreeMap<u64, String>,
    tuning: &RaftTuning,
) -> ReplicaConfig {
    let mut cfg = ReplicaConfig::new(id, addr.to_string(), dir.join(format!("r{id}")));
    cfg.store.disk_fault_file = Some(fault_file(dir, id));
    cfg.initial_members = members.clone();
    cfg.raft = tuning.clone();
    cfg
}

/// The control file of replica `id`'s disk faults (absent: a healthy disk).
fn fault_file(dir: &Path, id: u64) -> std::path::PathBuf {
    dir.join(format!("disk-fault-{id}"))
}

async fn start_cluster(dir: &Path, tuning: &RaftTuning) -> (Vec<Replica>, BTreeMap<u64, String>) {
    let listeners: Vec<TcpListener> = (0..3).map(|_| listen("127.0.0.1:0".parse().unwrap())).collect();
    let members: BTreeMap<u64, String> =
        listeners.iter().enumerate().map(|(i, l)| (i as u64 + 1, l.local_addr().unwrap().to_string())).collect();
    let mut replicas = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let id = i as u64 + 1;
        let addr = l.local_addr().unwrap();
        replicas.push(Replica::start(config(id, addr, dir, &members, tuning), l).await.unwrap());
    }
    (replicas, members)
}

async fn leader(replicas: &[Replica]) -> usize {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(i) = replicas.iter().position(|r| r.status().role == "leader") {
            return i;
        }
        assert!(tokio::time::Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every replica has applied `index` and all digests agree.
async fn converged(replicas: &[&Replica], index: u64) -> String {
    for r in replicas {
        r.raft()
            .wait(Some(WAIT))
            .applied_index_at_least(Some(index), "catch up")
            .await
            .unwrap_or_else(|e| panic!("replica {} did not reach {index}: {e}", r.id()));
    }
    // An election under load may add a blank entry meanwhile: wait for a
    // moment when every replica reports the same index and digest.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let statuses: Vec<_> = replicas.iter().map(|r| r.status()).collect();
        let same = |s: &v1::ReplicaStatus| {
            (s.applied_index, &s.state_digest) == (statuses[0].applied_index, &statuses[0].state_digest)
        };
        if statuses.iter().all(same) {
            return statuses[0].state_digest.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "replicas never agreed: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Proposes on whoever leads, retrying through elections (the idempotency
/// key makes a retry of a write that did commit return the same allocation).
async fn propose(replicas: &[Replica], cmd: Command) -> u64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let l = leader(replicas).await;
        match replicas[l].proposer().propose(cmd.clone()).await {
            Ok(out) => match out.events() {
                [Event::Submitted { alloc, .. }] => return *alloc,
                other => panic!("{other:?}"),
            },
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "no commit: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn submit(i: u32) -> Command {
    let mut spec = AllocSpec::new(
        "it",
        1 + i % 3,
        Resources { gpus: 1, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 },
        vec!["sleep".into(), "1".into()],
    );
    spec.idempotency_key = Some(format!("key-{i}"));
    Command::Submit { spec }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_commit_batches_and_agree() {
    let dir = tempfile::tempdir().unwrap();
    let (replicas, _) = start_cluster(dir.path(), &RaftTuning::default()).await;
    let l = leader(&replicas).await;

    // 200 concurrent proposals share a handful of entries.
    let before = replicas[l].status().applied_index;
    let outcomes = replicas[l].proposer().propose_all((0..200).map(submit).collect()).await;
    let mut ids = Vec::new();
    let mut retried = 0;
    for (i, o) in outcomes.into_iter().enumerate() {
        ids.push(match o {
            Ok(out) => match out.events() {
                [Event::Submitted { alloc, .. }] => *alloc,
                other => panic!("{other:?}"),
            },
            // Leadership moved under load: retry on the new leader.
            Err(_) => {
                retried += 1;
                propose(&replicas, submit(i as u32)).await
            }
        });
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids, (1..=200).collect::<Vec<_>>());
    let l = leader(&replicas).await;
    let index = replicas[l].status().applied_index;
    if retried == 0 {
        // Entries: a few batches, not one per submit.
        assert!(index - before < 150, "200 submits should share far fewer entries ({before} -> {index})");
    }
    let all: Vec<&Replica> = replicas.iter().collect();
    converged(&all, index).await;

    // A follower refuses a write and names the leader; the leader accepts it.
    let spec = muster_scheduler::server::api::convert::spec_to_proto(&match submit(7) {
        Command::Submit { spec } => spec,
        _ => unreachable!(),
    });
    let leader_addr = loop {
        let l = leader(&replicas).await;
        let follower = &replicas[(l + 1) % 3];
        let mut client = AllocationServiceClient::new(channel(&follower.addr().to_string()).await);
        let err = client
            .submit(v1::SubmitRequest { spec: Some(spec.clone()), dry_run: false, ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        if let Some(addr) = err.metadata().get(LEADER_ADDR_HEADER) {
            break addr.to_str().unwrap().to_string();
        }
    };
    assert!(replicas.iter().any(|r| r.addr().to_string() == leader_addr), "{leader_addr}");
    let mut client = AllocationServiceClient::new(channel(&leader_addr).await);
    let resp = client
        .submit(v1::SubmitRequest { spec: Some(spec), dry_run: false, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((resp.id, resp.duplicate), (8, true), "the same idempotency key finds allocation 8");
    let got = client.get(v1::GetRequest { id: 8 }).await.unwrap().into_inner();
    assert_eq!(got.spec.unwrap().idempotency_key, "key-7");

    // Shutdown is structured: every task a replica spawned stops on the
    // one signal and is awaited; none has to be aborted.
    for r in replicas {
        assert_eq!(r.shutdown().await, Vec::<&str>::new(), "background tasks that did not stop");
    }
}

/// A leader sends a new entry to its followers while its own log flush is
/// still in flight (openraft as patched in `vendor/openraft`): with the
/// leader's disk stalled, both followers store the entry in the leader's
/// term, before any election could have moved it. The leader counts itself
/// only once its own flush is done, so the write commits when the disk
/// comes back, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn followers_store_an_entry_while_the_leaders_flush_is_stalled() {
    let dir = tempfile::tempdir().unwrap();
    // A stalled leader sends no heartbeats: elections only after 20 s of
    // silence, so the followers' term tells that no election happened.
    let tuning = RaftTuning { election_timeout_ms: (20_000, 30_000), ..RaftTuning::default() };
    let (replicas, _) = start_cluster(dir.path(), &tuning).await;
    let all: Vec<&Replica> = replicas.iter().collect();
    propose(&replicas, submit(0)).await;
    let l = leader(&replicas).await;
    let (index, term) = (replicas[l].status().last_log_index, replicas[l].status().term);
    converged(&all, index).await;
    // The leader has taken in both followers' answers: no append to either
    // is in flight, so the next entry goes to both at once (openraft sends a
    // follower one append at a time).
    replicas[l]
        .raft()
        .wait(Some(WAIT))
        .metrics(
            |m| {
                m.replication.as_ref().is_some_and(|r| {
                    r.len() == 3 && r.values().all(|matched| matched.is_some_and(|id| id.index >= index))
                })
            },
            "both followers' answers taken in",
        )
        .await
        .unwrap();

    let stall = fault_file(dir.path(), replicas[l].id());
    set_disk_fault(&stall, Some(DiskFault::StalledSync)).unwrap();
    let proposer = replicas[l].proposer().clone();
    let write = tokio::spawn(async move { proposer.propose(submit(1)).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    for follower in replicas.iter().filter(|r| r.id() != replicas[l].id()) {
        loop {
            let s = follower.status();
            assert_eq!(s.term, term, "an election happened while the leader's disk stalled");
            if s.last_log_index > index {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "replica {} never received the entry while the leader's flush stalled: {s:?}",
                follower.id()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(!write.is_finished(), "the write committed before the leader's own flush was done");

    set_disk_fault(&stall, None).unwrap();
    match write.await.unwrap().expect("the write commits once the leader's disk is back").events() {
        [Event::Submitted { alloc, .. }] => assert_eq!(*alloc, 2),
        other => panic!("{other:?}"),
    }
    let l = leader(&replicas).await;
    converged(&all, replicas[l].status().applied_index).await;
    for r in replicas {
        r.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_down_across_a_purge_catches_up_by_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let tuning = RaftTuning { snapshot_every: 20, keep_behind_snapshot: 0, ..RaftTuning::default() };
    let (mut replicas, members) = start_cluster(dir.path(), &tuning).await;
    let l = leader(&replicas).await;
    let down_idx = (l + 1) % 3;
    let down = replicas.remove(down_idx);
    let down_id = down.id();
    let down_addr = down.addr();
    down.shutdown().await;

    for i in 0..120 {
        propose(&replicas, submit(i)).await;
    }
    let l = leader(&replicas).await;
    let status = replicas[l].status();
    replicas[l]
        .raft()
        .wait(Some(WAIT))
        .metrics(|m| m.purged.is_some_and(|p| p.index > 20), "leader purged its log")
        .await
        .unwrap();

    let back =
        Replica::start(config(down_id, down_addr, dir.path(), &members, &tuning), listen(down_addr)).await.unwrap();
    replicas.push(back);
    let all: Vec<&Replica> = replicas.iter().collect();
    converged(&all, status.applied_index).await;
    let rejoined = replicas.last().unwrap().status();
    assert!(rejoined.snapshot_index > 0, "caught up by installing a snapshot: {rejoined:?}");
    for r in replicas {
        r.shutdown().await;
    }
}

/// Grow the cluster by a learner, promote it, snapshot on demand, move
/// leadership by election, then remove a replica: all through AdminService.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn membership_changes_snapshots_and_elections_through_the_admin_api() {
    use muster_proto::v1::admin_service_client::AdminServiceClient;

    let dir = tempfile::tempdir().unwrap();
    let (mut replicas, _) = start_cluster(dir.path(), &RaftTuning::default()).await;
    for i in 0..10 {
        propose(&replicas, submit(i)).await;
    }
    // A fourth replica starts empty, with no initial members.
    let l4 = listen("127.0.0.1:0".parse().unwrap());
    let addr4 = l4.local_addr().unwrap();
    let fourth =
        Replica::start(config(4, addr4, dir.path(), &BTreeMap::new(), &RaftTuning::default()), l4).await.unwrap();
    replicas.push(fourth);

    let admin = |addr: SocketAddr| async move { AdminServiceClient::new(channel(&addr.to_string()).await) };
    let l = leader(&replicas).await;
    let mut a = admin(replicas[l].addr()).await;
    let bad = a.add_learner(v1::AddLearnerRequest { id: 4, address: "nonsense".into() }).await.unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    let resp = a.add_learner(v1::AddLearnerRequest { id: 4, address: addr4.to_string() }).await.unwrap().into_inner();
    assert!(resp.members.iter().any(|m| m.id == 4 && !m.voter), "{resp:?}");
    let again = a.add_learner(v1::AddLearnerRequest { id: 4, address: addr4.to_string() }).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::AlreadyExists);

    let resp = a
        .change_membership(v1::ChangeMembershipRequest { promote: vec![4], remove: vec![] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.members.iter().filter(|m| m.voter).count(), 4, "{resp:?}");
    let index = replicas[l].status().applied_index;
    let all: Vec<&Replica> = replicas.iter().collect();
    converged(&all, index).await;

    // Snapshot on demand on the new member.
    let s = admin(addr4).await.trigger_snapshot(v1::StatusRequest {}).await.unwrap().into_inner();
    assert!(s.snapshot_index >= index, "{s:?}");

    // Ask replica 4 to campaign until it leads (its log is current).
    let deadline = tokio::time::Instant::now() + WAIT;
    while replicas[3].status().role != "leader" {
        admin(addr4).await.trigger_election(v1::StatusRequest {}).await.unwrap();
        assert!(tokio::time::Instant::now() < deadline, "replica 4 never won an election");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }

    // Remove replica 1 through whoever leads now.
    let l = leader(&replicas).await;
    let resp = admin(replicas[l].addr())
        .await
        .change_membership(v1::ChangeMembershipRequest { promote: vec![], remove: vec![1] })
        .await
        .unwrap()
        .into_inner();
    assert!(!resp.members.iter().any(|m| m.id == 1), "{resp:?}");
    assert_eq!(resp.members.len(), 3);
    let missing = admin(replicas[l].addr())
        .await
        .change_membership(v1::ChangeMembershipRequest { promote: vec![9], remove: vec![] })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    for r in replicas {
        r.shutdown().await;
    }
}

/// Raw agent streams: assignments reach only the node they are for, and a
/// claim or report about a task on another node is refused with
/// PERMISSION_DENIED, changing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_cannot_claim_or_report_another_nodes_task() {
    use muster_proto::v1::agent_message::Msg as AgentMsg;
    use muster_proto::v1::agent_service_client::AgentServiceClient;
    use muster_proto::v1::scheduler_message::Msg as SchedMsg;
    use tokio_stream::wrappers::ReceiverStream;

    let dir = tempfile::tempdir().unwrap();
    let (replicas, _) = start_cluster(dir.path(), &RaftTuning::default()).await;
    let l = leader(&replicas).await;
    let leader_addr = replicas[l].addr().to_string();
    let mut streams = Vec::new();
    for name in ["node-a", "node-b"] {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tx.send(v1::AgentMessage {
            msg: Some(AgentMsg::Register(v1::Register {
                node_id: name.into(),
                resources: Some(v1::Resources { gpus: 1, vram_mb: 1_000, mem_mb: 10_000, cpus: 4 }),
                ports: "29500-29599".into(),
                ..Default::default()
            })),
        })
        .await
        .unwrap();
        let mut inbound = AgentServiceClient::new(channel(&leader_addr).await)
            .connect(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let first = inbound.message().await.unwrap().unwrap();
        assert!(matches!(first.msg, Some(SchedMsg::Registered(_))), "{first:?}");
        streams.push((tx, inbound));
    }
    let mut spec =
        AllocSpec::new("raw", 1, Resources { gpus: 1, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }, vec!["x".into()]);
    spec.idempotency_key = Some("raw-1".into());
    let id = propose(&replicas, Command::Submit { spec }).await;
    // Wait for the Assign on whichever node got it.
    let (owner, task) = loop {
        let mut got = None;
        for (i, (_, inbound)) in streams.iter_mut().enumerate() {
            if let Ok(Ok(Some(m))) = tokio::time::timeout(Duration::from_millis(200), inbound.message()).await
                && let Some(SchedMsg::Assign(a)) = m.msg
                && a.task.unwrap().alloc_id == id
            {
                got = Some((i, a.task.unwrap()));
            }
        }
        if let Some(g) = got {
            break g;
        }
    };
    let other = 1 - owner;
    let claim = v1::AgentMessage { msg: Some(AgentMsg::Claim(v1::Claim { task: Some(task) })) };
    streams[other].0.send(claim.clone()).await.unwrap();
    let refused = loop {
        let m = streams[other].1.message().await.unwrap().unwrap();
        if let Some(SchedMsg::Refused(r)) = m.msg {
            break r;
        }
    };
    assert_eq!(refused.code, "PERMISSION_DENIED", "{refused:?}");
    let exited = v1::AgentMessage {
        msg: Some(AgentMsg::Exited(v1::TaskExited { task: Some(task), exit_code: Some(0), ..Default::default() })),
    };
    streams[other].0.send(exited).await.unwrap();
    let refused = loop {
        let m = streams[other].1.message().await.unwrap().unwrap();
        if let Some(SchedMsg::Refused(r)) = m.msg {
            break r;
        }
    };
    assert_eq!(refused.code, "PERMISSION_DENIED", "{refused:?}");
    let l = leader(&replicas).await;
    let status = replicas[l].reader().read(|st| st.alloc(id).unwrap().tasks[0].status);
    assert_eq!(status, muster_scheduler::sm::TaskStatus::Reserved, "the refused messages changed nothing");
    // The owner's claim is granted.
    streams[owner].0.send(claim).await.unwrap();
    loop {
        let m = streams[owner].1.message().await.unwrap().unwrap();
        if let Some(SchedMsg::Granted(g)) = m.msg {
            assert_eq!(g.attempt, 1);
            break;
        }
    }
    drop(streams);
    for r in replicas {
        r.shutdown().await;
    }
}

/// The settings a replica's services read (its `Policies`): a submit
/// without a walltime takes its class's default where the operator set one
/// (`muster server --default-walltime 0=30m`), and a class without one
/// keeps what the core gives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_submit_without_a_walltime_takes_its_classs_default() {
    let dir = tempfile::tempdir().unwrap();
    let l = listen("127.0.0.1:0".parse().unwrap());
    let addr = l.local_addr().unwrap();
    let members: BTreeMap<u64, String> = [(1, addr.to_string())].into();
    let mut cfg = config(1, addr, dir.path(), &members, &RaftTuning::default());
    cfg.walltime_defaults = [(0, 1_800)].into();
    let replica = Replica::start(cfg, l).await.unwrap();
    leader(std::slice::from_ref(&replica)).await;
    let mut client = AllocationServiceClient::new(channel(&addr.to_string()).await);
    let mut walltime_of = async |class: u32, walltime_s: u64| {
        let Command::Submit { spec } = submit(class) else { unreachable!() };
        let mut spec = muster_scheduler::server::api::convert::spec_to_proto(&spec);
        (spec.preemption_class, spec.walltime_s) = (class, walltime_s);
        spec.idempotency_key = format!("class-{class}-walltime-{walltime_s}");
        let req = v1::SubmitRequest { spec: Some(spec), ..Default::default() };
        let id = client.submit(req).await.unwrap().into_inner().id;
        client.get(v1::GetRequest { id }).await.unwrap().into_inner().spec.unwrap().walltime_s
    };
    assert_eq!(walltime_of(0, 0).await, 1_800, "class 0's default");
    assert_eq!(walltime_of(0, 60).await, 60, "a walltime given is kept");
    let other = walltime_of(3, 0).await;
    assert_ne!(other, 1_800, "class 3 has no default set: {other}");
    replica.shutdown().await;
}

/// The bootstrapping replica's first vote fails (its peers are not up yet:
/// under load, or started late). Its peers, once up, know no membership
/// until a leader sends it, so they must still answer its pre-vote: a
/// replica that has never heard of any leader has no leader to protect.
/// (They used to count every tick without a membership as hearing a
/// leader, refused every pre-vote, and the cluster never elected.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_whose_first_vote_failed_still_elects_a_leader() {
    let dir = tempfile::tempdir().unwrap();
    let tuning = RaftTuning::default();
    // Every port is held from the start, but only replica 1's listens: a
    // call to the others is refused until they start.
    let sockets: Vec<TcpSocket> = (0..3)
        .map(|_| {
            let socket = TcpSocket::new_v4().unwrap();
            socket.set_reuseaddr(true).unwrap();
            socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            socket
        })
        .collect();
    let members: BTreeMap<u64, String> =
        sockets.iter().enumerate().map(|(i, s)| (i as u64 + 1, s.local_addr().unwrap().to_string())).collect();
    let mut sockets = sockets.into_iter();
    // Replica 1 alone: it bootstraps and campaigns, and its vote requests
    // are refused.
    let first = sockets.next().unwrap();
    let addr = first.local_addr().unwrap();
    let mut replicas =
        vec![Replica::start(config(1, addr, dir.path(), &members, &tuning), first.listen(128).unwrap()).await.unwrap()];
    muster_testkit::eventually("replica 1's first campaign to fail", WAIT, || {
        let refused = replicas[0].unreachable_peers();
        (replicas[0].status().role != "leader" && refused == [2, 3]).then_some(())
    })
    .await;
    for (i, socket) in sockets.enumerate() {
        let id = i as u64 + 2;
        let addr = socket.local_addr().unwrap();
        let listener = socket.listen(128).unwrap();
        replicas.push(Replica::start(config(id, addr, dir.path(), &members, &tuning), listener).await.unwrap());
    }
    leader(&replicas).await;
    for r in replicas {
        r.shutdown().await;
    }
}

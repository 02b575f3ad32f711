//! Node trust and paging against a real `muster server`: a node's
//! certificate cannot claim what the node is not (admission, reserved
//! labels, secrets kept from the wrong nodes), and vClusters and usage come
//! in pages.

use std::time::Duration;

use muster_proto::v1;
use muster_proto::v1::agent_message::Msg as Up;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use muster_proto::v1::scheduler_message::Msg as Down;
use muster_tls::Role;
use tonic::Code;
use tonic::transport::Channel;

use crate::cluster::channel;
use crate::t80_security::{Server, agent_stream, next_down, one_gpu, register, up};
use crate::tls;

/// A registration of `node` with `gpus` GPUs and these labels.
fn register_with(node: &str, gpus: u32, labels: &[(&str, &str)]) -> v1::AgentMessage {
    let mut m = register(node, gpus);
    if let Some(Up::Register(r)) = m.msg.as_mut() {
        r.labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    }
    m
}

/// The probe's fake node: with a valid agent certificate for `node-evil`
/// it registered 1,024 GPUs labelled `gpu.model=H100` and
/// `muster.vcluster=ml`, was given bob's `--constraint gpu.model=H100` job
/// with its `--env SECRET_TOKEN=hunter2` and admin's 64-GPU job, and
/// reported them done. Now (`--node-admission required`, the default): it
/// cannot register unadmitted, cannot claim a reserved label, more GPUs or
/// a label it was not admitted for; admitted for what it is, it gets no
/// job it does not match and never a secret. The real H100 node, pinned to
/// its certificate, gets bob's job, the secret only in `secret_env`, and no
/// read, history record or log line shows the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t185_a_node_certificate_cannot_claim_what_the_node_is_not() {
    let s = Server::start_with(&["--node-admission", "required"]).await;
    let admin = channel(&s.addr).await.unwrap();
    let evil = tls::material(Role::Agent("node-evil".into()));
    let honest = tls::material(Role::Agent("gpu-h100".into()));
    let before = s.state().await;
    let refused = |r: Result<_, tonic::Status>| r.map(|_| ()).expect_err("refused");
    let err = refused(agent_stream(&s.addr, &evil, register_with("node-evil", 1024, &[("gpu.model", "H100")])).await);
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("node node-evil is not admitted"), "{err:?}");
    let err = refused(agent_stream(&s.addr, &evil, register_with("node-evil", 8, &[("muster.vcluster", "ml")])).await);
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("muster.vcluster") && err.message().contains("reserved"), "{err:?}");
    assert_eq!(s.state().await, before, "no refused registration reached the log");

    // Admitted for what it is (8 GPUs, no GPU model), it still cannot claim more.
    let cli = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--scheduler", &s.addr]);
        let o = crate::muster(&all);
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    cli(&["node", "admit", "node-evil", "--gpus", "8", "--vram-mb", "80000", "--mem-mb", "64000", "--cpus", "8"]);
    let before = s.state().await;
    let err = refused(agent_stream(&s.addr, &evil, register_with("node-evil", 1024, &[])).await);
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("claims 1024 GPUs; it was admitted for 8"), "{err:?}");
    let err = refused(agent_stream(&s.addr, &evil, register_with("node-evil", 8, &[("gpu.model", "H100")])).await);
    assert!(err.message().contains("gpu.model=H100, which it was not admitted for"), "{err:?}");
    assert_eq!(s.state().await, before);
    let (_evil_tx, mut evil_rx) = agent_stream(&s.addr, &evil, register_with("node-evil", 8, &[])).await.unwrap();

    // The real H100 node, pinned to its certificate: another certificate
    // for it (here node-evil's file) is refused.
    let pem = |stem: &str| tls::dir().join(format!("{stem}.pem")).to_str().unwrap().to_string();
    let admit_h100 = |cert: &str| {
        cli(&[
            "node",
            "admit",
            "gpu-h100",
            "--gpus",
            "8",
            "--vram-mb",
            "80000",
            "--mem-mb",
            "64000",
            "--cpus",
            "8",
            "--label",
            "gpu.model=H100",
            "--cert",
            cert,
        ])
    };
    admit_h100(&pem("agent-node-evil"));
    let err = refused(agent_stream(&s.addr, &honest, register_with("gpu-h100", 8, &[("gpu.model", "H100")])).await);
    assert!(err.message().contains("must present the certificate it was admitted with"), "{err:?}");
    let out = admit_h100(&pem("agent-gpu-h100"));
    assert!(out.contains("admitted for 8 GPUs") && out.contains("gpu.model=H100"), "{out}");
    let (h_tx, mut h_rx) =
        agent_stream(&s.addr, &honest, register_with("gpu-h100", 8, &[("gpu.model", "H100")])).await.unwrap();

    // bob's H100 job with a secret, and admin's 64-GPU job.
    let bob = s.as_role(Role::Client("bob".into())).await;
    let mut spec = one_gpu("", &["train"]);
    spec.constraints = vec!["gpu.model=H100".into()];
    spec.env = [("PLAIN".to_string(), "visible".to_string())].into();
    let secrets = [("SECRET_TOKEN".to_string(), "hunter2".to_string())].into();
    let req = v1::SubmitRequest {
        spec: Some(spec),
        dry_run: false,
        secrets,
        queue_if_unsatisfiable: false,
        ..Default::default()
    };
    let bobs = AllocationServiceClient::new(bob.clone()).submit(req).await.unwrap().into_inner().id;
    let big = v1::AllocationSpec {
        gang_size: 8,
        resources: Some(v1::Resources { gpus: 8, vram_mb: 1, mem_mb: 1, cpus: 1 }),
        ..one_gpu("", &["true"])
    };
    // (Two nodes can never run it: queued on request, as on a cluster that
    // expects more nodes.)
    let admins = AllocationServiceClient::new(admin.clone())
        .submit(v1::SubmitRequest { spec: Some(big), queue_if_unsatisfiable: true, ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .id;
    let Down::Assign(assign) = next_down(&mut h_rx, |d| matches!(d, Down::Assign(_))).await else { unreachable!() };
    let task = assign.task.unwrap();
    assert_eq!(task.alloc_id, bobs, "bob's job goes to the real H100 node");
    assert_eq!(assign.secret_env.get("SECRET_TOKEN").map(String::as_str), Some("hunter2"));
    assert!(!assign.env.contains_key("SECRET_TOKEN") && assign.env["PLAIN"] == "visible");
    // The fake node got nothing: no assignment is waiting on its stream,
    // and admin's job (64 GPUs; 16 admitted in all) waits.
    while let Ok(Ok(Some(m))) = tokio::time::timeout(Duration::from_millis(1), evil_rx.message()).await {
        assert!(!matches!(m.msg, Some(Down::Assign(_))), "node-evil was assigned: {m:?}");
    }
    let get = |ch: Channel, id: u64| async move {
        AllocationServiceClient::new(ch).get(v1::GetRequest { id }).await.unwrap().into_inner()
    };
    let a = get(admin.clone(), admins).await;
    assert!(a.tasks.iter().all(|t| t.node_id.is_empty()), "admin's job is placed nowhere: {a:?}");

    // bob's job runs and finishes on the real node.
    h_tx.send(up(Up::Claim(v1::Claim { task: Some(task) }))).await.unwrap();
    next_down(&mut h_rx, |d| matches!(d, Down::Granted(_))).await;
    h_tx.send(up(Up::Exited(v1::TaskExited { task: Some(task), exit_code: Some(0), ..Default::default() })))
        .await
        .unwrap();
    // No read shows the secret, to bob or to the admin; its name shows.
    let a = muster_testkit::eventually_async("bob's job to finish", muster_testkit::WAIT, || async {
        let a = get(bob.clone(), bobs).await;
        let shown = format!("{a:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(a.secret_names, ["SECRET_TOKEN"], "{a:?}");
        (a.status == v1::AllocationStatus::Done as i32).then_some(a)
    })
    .await;
    assert_eq!(a.spec.unwrap().env["PLAIN"], "visible", "--env stays readable");
    let list = AllocationServiceClient::new(admin.clone()).list(v1::ListRequest::default()).await.unwrap();
    assert!(!format!("{list:?}").contains("hunter2"));
    let history = muster_proto::v1::history_service_client::HistoryServiceClient::new(admin.clone());
    muster_testkit::eventually_async("bob's history record", muster_testkit::WAIT, || async {
        let q = v1::HistoryQuery { id: bobs, ..Default::default() };
        let page = format!("{:?}", history.clone().list_history(q).await.unwrap());
        assert!(!page.contains("hunter2"), "{page}");
        (page.contains("SECRET_TOKEN") || page.contains(&format!("id: {bobs}"))).then_some(())
    })
    .await;
    let log = s.log();
    assert!(log.contains("agent registered") && !log.contains("hunter2"), "the server's log:\n{log}");
}

/// vClusters and usage rows are paged like allocations and nodes: pages of
/// `page_size` in name order, each with the token of the next; following
/// them returns every one once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t186_vclusters_and_usage_are_paged() {
    use muster_proto::v1::history_service_client::HistoryServiceClient;
    use muster_proto::v1::v_cluster_service_client::VClusterServiceClient;
    let s = Server::start().await;
    let admin = channel(&s.addr).await.unwrap();
    let mut vc = VClusterServiceClient::new(admin.clone());
    for name in ["zeta", "alpha", "mid"] {
        let req = v1::VClusterRequest { name: name.into(), spec: Some(Default::default()) };
        vc.create_v_cluster(req).await.unwrap();
    }
    let (mut names, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let page = vc.list_v_clusters(v1::ListVClustersRequest { page_size: 1, page_token: token }).await.unwrap();
        let page = page.into_inner();
        assert!(page.vclusters.len() <= 1);
        names.extend(page.vclusters.into_iter().map(|v| v.name));
        pages += 1;
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(names, ["alpha", "default", "mid", "zeta"]);
    assert_eq!(pages, 4);
    let err = vc.list_v_clusters(v1::ListVClustersRequest { page_size: 0, page_token: "x".repeat(100) }).await;
    assert!(err.unwrap_err().message().contains("ListVClustersRequest.page_token"));

    // Three owners' finished jobs, run by a fake agent.
    let (tx, mut rx) =
        agent_stream(&s.addr, &tls::material(Role::Agent("pager".into())), register("pager", 8)).await.unwrap();
    let mut client = AllocationServiceClient::new(admin.clone());
    for owner in ["carol", "alice", "bob"] {
        let req = v1::SubmitRequest { spec: Some(one_gpu(owner, &["true"])), ..Default::default() };
        client.submit(req).await.unwrap();
        let Down::Assign(a) = next_down(&mut rx, |d| matches!(d, Down::Assign(_))).await else { unreachable!() };
        tx.send(up(Up::Claim(v1::Claim { task: a.task }))).await.unwrap();
        next_down(&mut rx, |d| matches!(d, Down::Granted(_))).await;
        tx.send(up(Up::Exited(v1::TaskExited { task: a.task, exit_code: Some(0), ..Default::default() })))
            .await
            .unwrap();
    }
    let history = HistoryServiceClient::new(admin);
    let (owners, pages) =
        muster_testkit::eventually_async("the history to hold three owners", muster_testkit::WAIT, || async {
            let (mut owners, mut token, mut pages) = (Vec::new(), String::new(), 0);
            loop {
                let q = v1::UsageQuery {
                    since_ms: 1,
                    until_ms: 1 << 62,
                    group_by: "owner".into(),
                    page_size: 1,
                    page_token: token,
                };
                let page = history.clone().usage(q).await.unwrap().into_inner();
                owners.extend(page.rows.into_iter().map(|r| r.owner));
                pages += 1;
                token = page.next_page_token;
                if token.is_empty() {
                    break;
                }
            }
            (owners.len() == 3).then_some((owners, pages))
        })
        .await;
    assert_eq!(owners, ["alice", "bob", "carol"]);
    assert_eq!(pages, 3);
}

//! Images: a pull that fails is its own outcome (uncharged, elsewhere next
//! time, at the cap the allocation fails), and nodes report what they hold.

use super::*;

use crate::sm::{ContainerSpec, ImageRef, MAX_IMAGE_PULL_FAILURES, MAX_NODE_IMAGES};

const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const OTHER: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

fn image_spec(gang: u32, gpus: u32) -> AllocSpec {
    let image = ImageRef::parse(&format!("registry.example:5000/team/train@{DIGEST}")).unwrap();
    AllocSpec { container: Some(ContainerSpec { image, mounts: Vec::new(), workdir: None }), ..spec(gang, gpus) }
}

fn pull_failed(f: &mut Fixture, id: AllocId, task: TaskIndex, node: u32, epoch: u64) -> Vec<Event> {
    f.ok(Command::FailImagePull { alloc: id, task, node: n(node), epoch, reason: "not found: manifest unknown".into() })
}

#[test]
fn a_failed_pull_is_not_charged_and_the_gang_goes_elsewhere_after_the_backoff() {
    let mut f = Fixture::new(2);
    let id = f.submit(image_spec(1, 8));
    let epoch = f.reserve(id, &[0]);
    f.start(id, 0, 0, epoch);
    let ev = pull_failed(&mut f, id, 0, 0, epoch);
    assert!(matches!(&ev[0], Event::TaskFailed { charged: false, exit_code: None, .. }), "{ev:?}");
    assert!(
        matches!(&ev[1], Event::ImagePullFailed { failures: 1, retried: true, reason, .. } if reason.contains("manifest unknown")),
        "{ev:?}"
    );
    assert_eq!(f.status(id), AllocStatus::Queued);
    let a = f.s.alloc(id).unwrap();
    assert_eq!((a.failures, a.image_pull_failures, a.tasks[0].attempts), (0, 1, 0), "nothing charged");
    assert!(a.last_failure.is_none(), "no fail-fast signature");
    assert_eq!(a.tasks[0].attempt_log.last().unwrap().end, AttemptEnd::ImagePullFailed);
    assert_eq!(f.used_gpus(0), 0, "its node is free in the same command");
    // Backed off, then placed on the other node.
    let plan = crate::policy::plan_admission(&f.s, f.t, &Default::default());
    assert!(plan.commands.is_empty(), "backing off: {:?}", plan.commands);
    let after = f.s.alloc(id).unwrap().retry_after_ms;
    let plan = crate::policy::plan_admission(&f.s, after, &Default::default());
    assert!(
        matches!(&plan.commands[0], Command::ReserveGang { nodes, .. } if nodes == &vec![n(1)]),
        "{:?}",
        plan.commands
    );
}

#[test]
fn the_last_allowed_pull_failure_fails_the_allocation_with_image_pull_failed() {
    let mut f = Fixture::new(1);
    let id = f.submit(image_spec(1, 8));
    for k in 1..=MAX_IMAGE_PULL_FAILURES {
        let epoch = f.reserve(id, &[0]);
        f.start(id, 0, 0, epoch);
        let ev = pull_failed(&mut f, id, 0, 0, epoch);
        if k < MAX_IMAGE_PULL_FAILURES {
            assert_eq!(f.status(id), AllocStatus::Queued, "pull failure {k}");
        } else {
            assert!(matches!(&ev[1], Event::ImagePullFailed { retried: false, .. }), "{ev:?}");
            let reason = ev.iter().find_map(|e| match e {
                Event::AllocationFailed { reason, .. } => Some(reason.clone()),
                _ => None,
            });
            assert_eq!(reason.as_deref(), Some("image_pull_failed: not found: manifest unknown"));
        }
    }
    assert_eq!(f.status(id), AllocStatus::Failed);
    assert_eq!(f.s.alloc(id).unwrap().failures, 0, "the retry budget was never spent");
}

#[test]
fn a_gangs_pull_failure_tears_its_siblings_down_and_counts_once() {
    let mut f = Fixture::new(3);
    let id = f.submit(image_spec(2, 8));
    let epoch = f.reserve(id, &[0, 1]);
    f.start(id, 0, 0, epoch);
    f.start(id, 1, 1, epoch);
    let ev = pull_failed(&mut f, id, 0, 0, epoch);
    assert!(ev.iter().any(|e| matches!(e, Event::TeardownStarted { .. })), "{ev:?}");
    // The sibling could not pull either: it is simply stopped now.
    pull_failed(&mut f, id, 1, 1, epoch);
    assert_eq!(f.status(id), AllocStatus::Queued);
    assert_eq!(f.s.alloc(id).unwrap().image_pull_failures, 1);
}

#[test]
fn a_pull_failure_from_another_node_or_a_stale_epoch_is_refused() {
    let mut f = Fixture::new(2);
    let id = f.submit(image_spec(1, 8));
    let epoch = f.reserve(id, &[0]);
    f.start(id, 0, 0, epoch);
    let r = f.rejected(Command::FailImagePull { alloc: id, task: 0, node: n(1), epoch, reason: "x".into() });
    assert!(matches!(r, Rejection::WrongNode { .. }), "{r:?}");
    let r = f.rejected(Command::FailImagePull { alloc: id, task: 0, node: n(0), epoch: epoch + 1, reason: "x".into() });
    assert!(matches!(r, Rejection::StaleTaskEpoch { .. }), "{r:?}");
    let long = "x".repeat(crate::sm::MAX_AGENT_REASON_BYTES + 1);
    let r = f.rejected(Command::FailImagePull { alloc: id, task: 0, node: n(0), epoch, reason: long });
    assert!(matches!(r, Rejection::InvalidNode { ref field, .. } if field == "reason"), "{r:?}");
    assert_eq!(f.status(id), AllocStatus::Running);
}

#[test]
fn node_images_are_bounded_checked_sorted_and_a_repeat_changes_nothing() {
    let mut f = Fixture::new(1);
    let ev = f.ok(Command::SetNodeImages { node: n(0), digests: vec![OTHER.into(), DIGEST.into(), OTHER.into()] });
    assert_eq!(ev, vec![Event::NodeImagesChanged { node: n(0), count: 2 }]);
    assert_eq!(f.s.node(f.s.node_slot(&n(0)).unwrap()).images, vec![DIGEST.to_string(), OTHER.to_string()]);
    let digest = f.s.state_digest();
    let ev = f.ok(Command::SetNodeImages { node: n(0), digests: vec![DIGEST.into(), OTHER.into()] });
    assert!(ev.is_empty());
    assert_eq!(f.s.state_digest(), digest);
    let r = f.rejected(Command::SetNodeImages { node: n(0), digests: vec!["latest".into()] });
    assert!(matches!(r, Rejection::InvalidNode { ref field, .. } if field == "images"), "{r:?}");
    let many = (0..=MAX_NODE_IMAGES).map(|i| format!("sha256:{i:064x}")).collect();
    let r = f.rejected(Command::SetNodeImages { node: n(0), digests: many });
    assert!(matches!(r, Rejection::InvalidNode { ref field, .. } if field == "images"), "{r:?}");
    let r = f.rejected(Command::SetNodeImages { node: n(9), digests: vec![] });
    assert!(matches!(r, Rejection::UnknownNode(_)), "{r:?}");
}

#[test]
fn admission_prefers_a_node_holding_the_image_among_equal_fits_only() {
    let mut f = Fixture::new(4);
    // n2 holds the image; n3 holds another.
    f.ok(Command::SetNodeImages { node: n(2), digests: vec![DIGEST.into()] });
    f.ok(Command::SetNodeImages { node: n(3), digests: vec![OTHER.into()] });
    let id = f.submit(image_spec(1, 8));
    let plan = crate::policy::plan_admission(&f.s, f.t, &Default::default());
    assert!(
        matches!(&plan.commands[0], Command::ReserveGang { alloc, nodes, .. } if *alloc == id && nodes == &vec![n(2)]),
        "the holder, not the first equal fit: {:?}",
        plan.commands
    );
    // Without an image, best fit's own order (the lowest slot).
    let plain = f.submit(spec(1, 8));
    let plan = crate::policy::plan_admission(&f.s, f.t, &Default::default());
    assert!(
        plan.commands
            .iter()
            .any(|c| matches!(c, Command::ReserveGang { alloc, nodes, .. } if *alloc == plain && nodes == &vec![n(0)])),
        "{:?}",
        plan.commands
    );
}

#[test]
fn a_better_fit_wins_over_a_node_holding_the_image() {
    let mut f = Fixture::new(2);
    f.ok(Command::SetNodeImages { node: n(1), digests: vec![DIGEST.into()] });
    // n0 has 4 GPUs free, n1 all 8: a 4-GPU task fits n0 best.
    f.running_on(1, 4, 0, &[0]);
    let id = f.submit(image_spec(1, 4));
    let plan = crate::policy::plan_admission(&f.s, f.t, &Default::default());
    assert!(
        plan.commands
            .iter()
            .any(|c| matches!(c, Command::ReserveGang { alloc, nodes, .. } if *alloc == id && nodes == &vec![n(0)])),
        "{:?}",
        plan.commands
    );
}

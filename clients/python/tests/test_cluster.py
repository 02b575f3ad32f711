"""The client against a real `muster dev` cluster (see conftest.py)."""

from __future__ import annotations

import dataclasses
import inspect
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import grpc
import pytest

from conftest import DevCluster, muster_bin
from muster_client import Client, MusterError, Step, TERMINAL_EVENTS, allocation_status_name, pb, types_pb

WATCH_TIMEOUT_S = 60.0


def kinds_until_end(client: Client, alloc_id: int, from_revision: int = 0) -> list[pb.AllocationEvent]:
    events = list(client.watch(alloc_id, from_revision=from_revision, timeout=WATCH_TIMEOUT_S))
    assert events, f"no events for allocation {alloc_id}"
    return events


def test_status_names_a_leader(client: Client, dev: DevCluster) -> None:
    st = client.status()
    assert st.leader_id != 0
    assert st.leader_address in dev.addresses
    assert st.role in ("leader", "follower")
    assert sorted(m.address for m in st.members) == sorted(dev.addresses)
    roles = sorted(_status_of(client, a).role for a in dev.addresses)
    assert roles.count("leader") == 1, roles


def _status_of(client: Client, address: str, deadline_s: float = 30.0) -> pb.ReplicaStatus:
    """One replica's status, asked again while it is unavailable: on a
    loaded machine a fresh connection's handshake can be cut off (the
    server drops handshakes that take too long) and a real caller retries."""
    until = time.monotonic() + deadline_s
    while True:
        try:
            return client.status(address)
        except MusterError as e:
            if e.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > until:
                raise
            time.sleep(0.2)


def test_nodes(client: Client) -> None:
    nodes = client.nodes()
    assert sorted(n.id for n in nodes) == ["node-1", "node-2", "node-3", "node-4"]
    assert all(n.resources.gpus == 8 for n in nodes)
    # Pages of one: every node once, in id order.
    assert [n.id for n in client.nodes(page_size=1)] == ["node-1", "node-2", "node-3", "node-4"]


def test_gang_runs_and_watch_follows_it_to_the_end(client: Client) -> None:
    r = client.submit(
        ["sh", "-c", "echo hi; sleep 1"],
        gang_size=4,
        gpus=1,
        preemption_class=5,
        checkpoint="auto",
        walltime_s=120,
    )
    assert r.id > 0 and not r.duplicate and r.plan is None
    events = kinds_until_end(client, r.id)
    kinds = [e.kind for e in events]
    assert kinds[0] == "submitted"
    assert "gang_reserved" in kinds
    assert kinds.count("task_started") == 4
    assert kinds[-1] == "allocation_done", kinds
    revisions = [e.revision for e in events]
    assert revisions == sorted(set(revisions))
    assert all(e.id == r.id for e in events)

    a = client.get(r.id)
    assert allocation_status_name(a.status) == "done"
    assert a.spec.gang_size == 4 and a.spec.resources.gpus == 1 and a.spec.preemption_class == 5
    assert a.spec.checkpoint == types_pb.CHECKPOINT_MODE_AUTO
    assert [t.exit_code for t in a.tasks] == [0, 0, 0, 0]

    # Resuming from a revision gives only what came after it.
    later = kinds_until_end(client, r.id, from_revision=revisions[2])
    assert [e.revision for e in later] == revisions[3:]

    assert r.id in [x.id for x in client.list(status="done")]
    assert r.id in [x.id for x in client.list(preemption_class=5)]


def test_secrets_reach_the_task_and_never_a_read(client: Client) -> None:
    # The task fails unless the secret is in its environment (its command
    # names only a part of the value, so a read showing the whole would be
    # the secret's).
    r = client.submit(["sh", "-c", 'test "${TOKEN%-value}" = s3cret'], secrets={"TOKEN": "s3cret-value"})
    kinds = [e.kind for e in kinds_until_end(client, r.id)]
    assert kinds[-1] == "allocation_done", kinds
    a = client.get(r.id)
    assert list(a.secret_names) == ["TOKEN"]
    assert "s3cret-value" not in str(a)
    assert "s3cret-value" not in str(client.list_page())


def test_idempotency_key_returns_the_same_allocation(client: Client) -> None:
    key = f"py-test-{uuid.uuid4().hex}"
    first = client.submit(["true"], idempotency_key=key)
    second = client.submit(["true"], idempotency_key=key)
    assert not first.duplicate
    assert second.duplicate
    assert second.id == first.id
    assert kinds_until_end(client, first.id)[-1].kind in TERMINAL_EVENTS


def test_an_impossible_gang_is_refused_or_queued_on_request(client: Client) -> None:
    # Four nodes of 8 GPUs: a gang of 5 x 8 GPUs can never be placed.
    with pytest.raises(MusterError) as refused:
        client.submit(["true"], gang_size=5, gpus=8)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "the gang of 5 needs 5 nodes" in str(refused.value), refused.value
    r = client.submit(["true"], gang_size=5, gpus=8, queue_if_unsatisfiable=True)
    try:
        e = client.explain(r.id)
        assert e.id == r.id
        assert allocation_status_name(e.status) == "queued"
        assert "5" in e.summary, e.summary
        assert e.classes and e.classes[0].nodes == 4
        assert e.HasField("preemption") and e.preemption.reason and not e.preemption.victims
    finally:
        cancelled = client.cancel(r.id)
    assert allocation_status_name(cancelled.status) == "cancelled"


def test_cancel_stops_an_allocation(client: Client) -> None:
    r = client.submit(["sleep", "60"], gang_size=2, gpus=1)
    a = client.cancel(r.id)
    assert a.id == r.id
    # Cancelled at once if nothing ran yet; else tearing down until its
    # tasks have stopped (their GPUs stay held until then).
    assert allocation_status_name(a.status) in ("cancelled", "tearing-down")
    events = kinds_until_end(client, r.id)
    assert events[-1].kind == "allocation_cancelled"
    assert allocation_status_name(client.get(r.id).status) == "cancelled"


def test_a_dependent_waits_and_ends_as_its_dependency_decides(client: Client) -> None:
    first = client.submit(["sleep", "60"], gpus=0)
    then = client.submit(["true"], gpus=0, after=[first.id])
    on_failure = client.submit(["true"], gpus=0, after=[(first.id, "notok")])
    assert allocation_status_name(client.get(then.id).status) == "waiting"
    client.cancel(first.id)
    ended = kinds_until_end(client, then.id)
    assert ended[-1].kind == "allocation_failed"
    assert ended[-1].detail == f"dependency {first.id} was cancelled", ended[-1]
    assert kinds_until_end(client, on_failure.id)[-1].kind == "allocation_done"
    with pytest.raises(MusterError, match="after: allocation 999999 does not exist"):
        client.submit(["true"], after=[999999])
    with pytest.raises(ValueError, match="after kind must be one of"):
        client.submit(["true"], after=[(first.id, "soon")])


def test_dry_run_plans_and_submits_nothing(client: Client) -> None:
    before = [a.id for a in client.list()]
    r = client.submit(["true"], gang_size=2, gpus=1, dry_run=True)
    assert r.id == 0 and not r.duplicate
    assert r.plan is not None and r.plan.summary
    assert [a.id for a in client.list()] == before
    impossible = client.submit(["true"], gang_size=5, gpus=8, dry_run=True)
    assert impossible.plan is not None and "5" in impossible.plan.summary


def test_placement_and_rendezvous_ports_reach_the_scheduler(client: Client) -> None:
    # muster dev's nodes are labelled gpu.model=fake: no node has an H100,
    # so the submit is refused naming the models there are, unless queued
    # on request.
    with pytest.raises(MusterError) as refused:
        client.submit(["true"], constraints=["gpu.model=H100"])
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "no node has gpu.model=H100; known gpu.model values: fake" in refused.value.message
    r = client.submit(
        ["true"], constraints=["gpu.model=H100"], pack_by="rack:preferred", queue_if_unsatisfiable=True, name="h100"
    )
    try:
        a = client.get(r.id)
        assert list(a.spec.constraints) == ["gpu.model=H100"] and a.spec.pack_by == "rack:preferred"
        assert a.spec.name == "h100"
        assert client.explain(r.id).summary == (
            "it can never run on the registered nodes: no node has gpu.model=H100; known gpu.model values: fake"
        )
    finally:
        client.cancel(r.id)
    ok = client.submit(["sleep", "5"], gang_size=2, ports=2, constraints=["gpu.model in (fake)"])
    try:
        deadline = time.monotonic() + 60
        while len(client.get(ok.id).ports) != 2:
            assert time.monotonic() < deadline, client.get(ok.id)
            time.sleep(0.1)
    finally:
        client.cancel(ok.id)
    with pytest.raises(ValueError, match="constraints must be a list"):
        client.submit(["true"], constraints="gpu.model=H100")  # type: ignore[arg-type]
    with pytest.raises(MusterError) as bad:
        client.submit(["true"], constraints=["gpu.model in (H100"])
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT and "spec.constraints" in bad.value.message


def test_a_follower_address_alone_leads_to_the_leader(client: Client, dev: DevCluster) -> None:
    followers = [a for a in dev.addresses if client.status(a).role == "follower"]
    assert followers
    with dev.client(addresses=[followers[0]]) as fc:
        r = fc.submit(["true"])
        assert r.id > 0
        assert fc.leader is not None and fc.leader != followers[0]
        assert fc.leader == client.status(fc.leader).leader_address
        assert fc.get(r.id).id == r.id
        assert [e.kind for e in kinds_until_end(fc, r.id)][-1] in TERMINAL_EVENTS


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"gang_size": 0}, "gang_size"),
        ({"preemption_class": 11}, "preemption_class"),
        ({"cpus": 0}, "cpus"),
        ({"command": []}, "command"),
        ({"vcluster": "Not A Name"}, "vcluster"),
        ({"image": "Bad//ref"}, "image"),
        ({"image": "busybox", "mounts": ["/data:relative"]}, "mounts"),
        ({"image": "busybox", "workdir": "work"}, "workdir"),
    ],
)
def test_the_server_names_the_invalid_field(client: Client, kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"command": ["true"]}
    args.update(kwargs)
    with pytest.raises(MusterError) as info:
        client.submit(**args)  # type: ignore[arg-type]
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"spec.{field}" in info.value.message or f"spec.resources.{field}" in info.value.message


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"gang_size": -1}, "gang_size"),
        ({"gang_size": "4"}, "gang_size"),
        ({"preemption_class": 2**32}, "preemption_class"),
        ({"checkpoint": "sometimes"}, "checkpoint"),
        ({"command": "echo hi"}, "command"),
        ({"walltime_s": 0}, "walltime_s"),
        ({"env": {"A": 1}}, "env"),
        ({"secrets": {"A": 1}}, "secrets"),
        ({"priority": 2**40}, "priority"),
        ({"image": "busybox", "mounts": "/a:/b"}, "mounts"),
        ({"mounts": ["/a:/b"]}, "mounts and workdir need an image"),
    ],
)
def test_bad_arguments_raise_value_error(client: Client, kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"command": ["true"]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        client.submit(**args)  # type: ignore[arg-type]


def test_other_bad_arguments(client: Client) -> None:
    with pytest.raises(ValueError, match="status"):
        client.list(status="bogus")
    with pytest.raises(ValueError, match="id"):
        client.get(-1)
    with pytest.raises(MusterError) as info:
        client.get(10**12)
    assert info.value.code == grpc.StatusCode.NOT_FOUND


def test_unknown_identity_is_a_clear_error(dev: DevCluster) -> None:
    with pytest.raises(ValueError, match="identity 'admin-nobody'") as info:
        Client(dev.addresses, tls_dir=dev.tls_dir, identity="admin-nobody")
    assert dev.identity in str(info.value)  # lists what the dir holds
    with pytest.raises(ValueError, match="client presents"):
        Client(dev.addresses, tls_dir=dev.tls_dir, identity="server-1")


def test_bad_tls_dir_is_a_clear_error(dev: DevCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="tls_dir: .* is not a directory"):
        Client(dev.addresses, tls_dir=tmp_path / "missing")
    with pytest.raises(ValueError, match="ca.pem"):
        Client(dev.addresses, tls_dir=tmp_path)
    monkeypatch.delenv("MUSTER_TLS_DIR", raising=False)
    with pytest.raises(ValueError, match="tls_dir"):
        Client(dev.addresses)


def _muster(*args: str) -> None:
    subprocess.run([str(muster_bin()), *args], check=True, capture_output=True, timeout=60)


def test_certificates_of_another_cluster_fail_fast_and_say_tls(dev: DevCluster, tmp_path: Path) -> None:
    _muster("tls", "init", "--dir", str(tmp_path))
    _muster("tls", "issue", "admin", "eve", "--dir", str(tmp_path))
    start = time.monotonic()
    with Client(dev.addresses, tls_dir=tmp_path, timeout=30) as c:
        with pytest.raises(MusterError) as info:
            c.status()
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert "TLS" in info.value.message and "admin-eve" in info.value.message
    assert time.monotonic() - start < 25  # not retried until the timeout


def test_a_reader_may_read_but_not_submit(dev: DevCluster, tmp_path: Path) -> None:
    for name in ("ca.pem", "ca-key.pem"):
        shutil.copy(Path(dev.tls_dir) / name, tmp_path / name)
    _muster("tls", "issue", "reader", "bob", "--dir", str(tmp_path))
    (tmp_path / "ca-key.pem").unlink()
    with Client(dev.addresses, tls_dir=tmp_path, timeout=20) as c:
        assert c.identity == "reader-bob"
        c.list()
        with pytest.raises(MusterError) as info:
            c.submit(["true"])
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_an_oom_kill_reads_as_oom_killed_with_each_attempts_usage(client: Client) -> None:
    """Issue 46: a task over its --mem-mb is killed by the kernel at the
    limit (its node contains tasks in cgroups); the allocation, its events
    and the job history say oom_killed, with the peak and the CPU time."""
    hog = "x = []\nwhile True:\n    x.append(bytearray(8 << 20))\n"
    started = int(time.time() * 1000) - 1000
    r = client.submit(["python3", "-c", hog], gpus=1, mem_mb=64, max_retries=3)
    kinds = [e.kind for e in kinds_until_end(client, r.id)]
    assert kinds[-1] == "allocation_failed" and kinds.count("oom_killed") == 2, kinds
    a = client.get(r.id)
    assert a.last_failure.oom_killed and a.last_failure.memory_limit_bytes == 64 << 20
    assert "ran out of memory at its 64 MiB limit" in a.failed_reason
    deadline = time.monotonic() + 30
    while not (records := client.history(id=r.id)):
        assert time.monotonic() < deadline, "no history record"
        time.sleep(0.2)
    attempts = records[0].attempts
    assert [x.outcome for x in attempts] == ["oom_killed", "oom_killed"]
    assert all(x.HasField("usage") and x.usage.oom_kills >= 1 and x.usage.peak_memory_bytes > 32 << 20 for x in attempts)
    rows = client.usage(since_ms=started, group_by="owner")
    assert sum(row.oom_killed for row in rows) >= 2, rows


def wait_for_array(client: Client, array_id: int, timeout_s: float = 90.0) -> pb.JobArray:
    """The array once every element has ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        a = client.get_array(array_id)
        if a.finished:
            return a
        assert time.monotonic() < deadline, f"array {array_id} did not finish in {timeout_s} s: {a}"
        time.sleep(0.2)


def test_a_job_array_runs_each_index_once_within_its_throttle(client: Client, tmp_path: Path) -> None:
    running = tmp_path / "running"
    running.mkdir()
    log = tmp_path / "ran.log"
    # Each element marks itself running, records how many are, then unmarks
    # itself: no line may count more than the throttle.
    script = (
        f'k=$MUSTER_ARRAY_INDEX; touch {running}/$k; n=$(ls {running} | wc -l); '
        f'echo "$k $n $MUSTER_ARRAY_COUNT" >> {log}; sleep 0.3; rm {running}/$k'
    )
    r = client.submit(["sh", "-c", script], gpus=0, mem_mb=64, array="10-15%2", name="py-sweep")
    assert r.is_array and r.array_count == 6 and not r.duplicate
    assert r.element_ids == range(r.id + 1, r.id + 7)
    # The array is one row of the list; its elements are allocations only expanded.
    assert r.id in [a.id for a in client.arrays()]
    done = wait_for_array(client, r.id)
    assert (done.id, done.count, done.pending, done.indices, done.throttle) == (r.id, 6, 0, "10-15", 2), done
    assert dict(done.by_status) == {"done": 6}, done
    assert done.status == "done" and done.name == "py-sweep" and list(done.spec.command) == ["sh", "-c", script]
    lines = [line.split() for line in log.read_text().splitlines()]
    assert sorted(int(k) for k, _, _ in lines) == list(range(10, 16)), lines  # every index once
    assert all(1 <= int(n) <= 2 for _, n, _ in lines), f"over the throttle of 2: {lines}"
    assert all(count == "6" for _, _, count in lines), lines
    # Element k is the k-th index ascending: index 13 is the fourth element.
    element = client.get(r.id + 1 + 3)
    assert (element.array_id, element.array_index) == (r.id, 13), element
    assert allocation_status_name(element.status) == "done"
    assert not set(r.element_ids) & {a.id for a in client.list()}
    assert set(r.element_ids) <= {a.id for a in client.list(expand=True)}
    listed = [a for a in client.arrays(status="done") if a.id == r.id]
    assert len(listed) == 1 and listed[0].by_status["done"] == 6, listed

    # A second array pairs each element with the first array's element of
    # the same index (all done, so each runs).
    paired = client.submit(["true"], gpus=0, mem_mb=64, array="12-13", after_corr=r.id)
    assert paired.array_count == 2
    both = wait_for_array(client, paired.id)
    assert dict(both.by_status) == {"done": 2} and both.after_corr == r.id, both
    with pytest.raises(MusterError) as no_partner:
        client.submit(["true"], array="20", after_corr=r.id)
    assert no_partner.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"array {r.id} has no element with index 20" in no_partner.value.message
    with pytest.raises(MusterError) as finished:
        client.set_array_throttle(r.id, 1)
    assert finished.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(ValueError, match="array must be a string"):
        client.submit(["true"], array=5)  # type: ignore[arg-type]


def test_a_live_array_is_throttled_and_cancelled_by_index(client: Client, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    log = tmp_path / "ran.log"
    # Every element waits for the gate, so the array stays live.
    script = f"while [ ! -e {gate} ]; do sleep 0.1; done; echo $MUSTER_ARRAY_INDEX >> {log}"
    r = client.submit(["sh", "-c", script], gpus=0, mem_mb=64, array="0-5%1")
    try:
        a = client.get_array(r.id)
        assert (a.count, a.throttle, a.finished, a.status) == (6, 1, False, "running"), a
        assert a.pending == 5, a  # one element at a time: the rest wait unstarted
        raised = client.set_array_throttle(r.id, 3)
        assert raised.throttle == 3 and raised.pending == 3, raised  # 0-2 started, 3-5 wait
        # Elements 3-5 were never started (0-2 hold the throttle): cancelling
        # them ends them at once.
        cut = client.cancel(r.id, indices="3-5")
        assert cut.id == r.id and cut.array_id == r.id, cut
        after = client.get_array(r.id)
        assert after.by_status["cancelled"] == 3 and after.pending == 0 and not after.finished, after
        assert sum(after.by_status.values()) == 6, after
        # Refusals name what is wrong.
        with pytest.raises(MusterError) as too_many:
            client.set_array_throttle(r.id, 7)
        assert too_many.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert f"7 is more than array {r.id}'s 6 elements" in too_many.value.message, too_many.value
        with pytest.raises(MusterError) as no_such:
            client.cancel(r.id, indices="9")
        assert no_such.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert f"array {r.id} has no element with index 9" in no_such.value.message
        with pytest.raises(MusterError) as not_array:
            client.get_array(r.id + 1)
        assert not_array.value.code == grpc.StatusCode.NOT_FOUND and "is not an array" in not_array.value.message
        with pytest.raises(ValueError, match="throttle"):
            client.set_array_throttle(r.id, -1)
        with pytest.raises(ValueError, match="indices"):
            client.cancel(r.id, indices=3)  # type: ignore[arg-type]
    finally:
        gate.touch()
    ended = wait_for_array(client, r.id)
    assert dict(ended.by_status) == {"done": 3, "cancelled": 3}, ended
    assert ended.status == "cancelled", ended
    assert sorted(int(k) for k in log.read_text().split()) == [0, 1, 2]


def wait_for_workflow(client: Client, workflow_id: int, timeout_s: float = 60.0) -> pb.WorkflowInfo:
    """The workflow once every step has ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        w = client.get_workflow(workflow_id)
        if w.finished:
            return w
        assert time.monotonic() < deadline, f"workflow {workflow_id} did not finish in {timeout_s} s: {w}"
        time.sleep(0.2)


def test_a_workflow_runs_its_steps_in_order_and_fails_what_waits_on_a_failure(client: Client, tmp_path: Path) -> None:
    log = tmp_path / "steps.log"
    record = f'echo "$MUSTER_WORKFLOW_ID $MUSTER_WORKFLOW_STEP" >> {log}'
    key = f"py-wf-{uuid.uuid4().hex}"
    # Given out of order: the server makes each step after those it waits for.
    steps = [
        Step("evaluate", ["sh", "-c", record], mem_mb=64, after=["train"]),
        Step("on-failure", ["sh", "-c", record], mem_mb=64, after=[("train", "notok")]),
        Step("train", ["sh", "-c", f"{record}; exit 3"], mem_mb=64, max_retries=1, after=["prep"]),
        Step("prep", ["sh", "-c", record], mem_mb=64),
    ]
    r = client.submit_workflow("py-pipeline", steps, idempotency_key=key)
    assert r.id > 0 and not r.duplicate
    # Ids follow the workflow's, in the order made: each step after those it waits for.
    assert list(r.ids) == ["prep", "train", "evaluate", "on-failure"], r.steps
    assert list(r.ids.values()) == list(range(r.id + 1, r.id + 5)), r.ids
    assert not r.arrays and not any(s.array for s in r.steps.values())
    ids = r.ids

    w = wait_for_workflow(client, r.id)
    assert (w.id, w.name, w.finished) == (r.id, "py-pipeline", True), w
    assert {s.name: (s.id, s.status) for s in w.steps} == {
        "prep": (ids["prep"], "done"),
        "train": (ids["train"], "failed"),
        "evaluate": (ids["evaluate"], "failed"),
        "on-failure": (ids["on-failure"], "done"),
    }, w
    assert w.owner and w.owner == client.get(ids["prep"]).spec.owner
    evaluate = client.get(ids["evaluate"])
    assert allocation_status_name(evaluate.status) == "failed"
    assert evaluate.failed_reason == f"dependency {ids['train']} failed", evaluate.failed_reason
    assert all(t.runs == 0 for t in evaluate.tasks), evaluate  # never started
    train = client.get(ids["train"])
    assert [t.exit_code for t in train.tasks] == [3] and train.spec.name == "train", train
    assert allocation_status_name(client.get(ids["on-failure"]).status) == "done"
    # Each step that ran saw its workflow and name; evaluate never ran.
    ran = sorted(line.split() for line in log.read_text().splitlines())
    assert ran == sorted([[str(r.id), "on-failure"], [str(r.id), "prep"], [str(r.id), "train"]]), ran

    # A retry under the same key returns the same workflow and steps.
    again = client.submit_workflow("py-pipeline", steps, idempotency_key=key)
    assert again.duplicate and again.id == r.id and again.ids == ids, again

    # A workflow id is no allocation, and an allocation no workflow.
    with pytest.raises(MusterError) as not_alloc:
        client.get(r.id)
    assert not_alloc.value.code == grpc.StatusCode.NOT_FOUND and "is a workflow" in not_alloc.value.message
    with pytest.raises(MusterError) as not_workflow:
        client.get_workflow(ids["prep"])
    assert not_workflow.value.code == grpc.StatusCode.NOT_FOUND and "is not a workflow" in not_workflow.value.message


def test_a_workflow_cycle_is_refused_naming_its_steps(client: Client) -> None:
    before = [a.id for a in client.list()]
    cycle = [
        Step("start", ["true"], mem_mb=64),
        Step("ping", ["true"], mem_mb=64, after=["start", "pong"]),
        Step("pong", ["true"], mem_mb=64, after=[("ping", "any")]),
    ]
    with pytest.raises(MusterError) as refused:
        client.submit_workflow("py-cycle", cycle)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "steps ping, pong wait for each other (a cycle)" in refused.value.message, refused.value
    with pytest.raises(MusterError) as unknown:
        client.submit_workflow("py-unknown", [Step("a", ["true"], after=["nowhere"])])
    assert unknown.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert 'no step is named "nowhere"' in unknown.value.message, unknown.value
    with pytest.raises(MusterError) as bad_spec:
        client.submit_workflow("py-bad", [Step("a", ["true"]), Step("b", ["true"], gang_size=0)])
    assert bad_spec.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "steps[b].gang_size" in bad_spec.value.message, bad_spec.value
    assert [a.id for a in client.list()] == before  # refused whole: nothing was made
    # What the wire cannot carry is refused here, naming the step and the field.
    with pytest.raises(ValueError, match="step 'a': after kind must be one of"):
        client.submit_workflow("w", [Step("a", ["true"], after=[("b", "soon")])])
    with pytest.raises(ValueError, match="step 'a': after must be a list"):
        client.submit_workflow("w", [Step("a", ["true"], after="b")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="step 'a': gang_size"):
        client.submit_workflow("w", [Step("a", ["true"], gang_size=-1)])
    with pytest.raises(ValueError, match="steps must be Step objects"):
        client.submit_workflow("w", [{"name": "a"}])  # type: ignore[list-item]


def test_cancelling_a_workflow_cancels_its_unfinished_steps(client: Client) -> None:
    r = client.submit_workflow(
        "py-cancel",
        [
            Step("pair", ["true"], mem_mb=64, array="0-2", after_corr="grid"),
            Step("hold", ["sleep", "60"], mem_mb=64),
            Step("then", ["true"], mem_mb=64, after=["hold"]),
            Step("grid", ["true"], mem_mb=64, array="0-2", after=["hold"]),
        ],
    )
    assert list(r.ids) == ["hold", "then", "grid", "pair"], r.steps
    assert r.arrays == {"grid", "pair"} and r.steps["grid"].array and not r.steps["then"].array
    # An array step's elements take the ids after its own.
    assert r.ids["pair"] == r.ids["grid"] + 4, r.ids
    assert allocation_status_name(client.get(r.ids["then"]).status) == "waiting"
    assert client.get_array(r.ids["pair"]).after_corr == r.ids["grid"]
    cancelled = client.cancel(r.id)
    assert cancelled.id == r.id and allocation_status_name(cancelled.status) == "cancelled"
    w = wait_for_workflow(client, r.id)
    assert {s.name: s.status for s in w.steps} == {
        "hold": "cancelled",
        "then": "cancelled",
        "grid": "cancelled",
        "pair": "cancelled",
    }, w


def test_a_step_takes_the_spec_arguments_submit_takes() -> None:
    """Step's spec fields and defaults are submit()'s (they are built by the same code)."""
    not_spec = {"self", "command", "name", "after", "array", "after_corr", "idempotency_key", "secrets", "owner",
                "dry_run", "queue_if_unsatisfiable", "timeout"}
    submit_args = {
        n: p.default for n, p in inspect.signature(Client.submit).parameters.items() if n not in not_spec
    }
    step_fields = {f.name: f.default for f in dataclasses.fields(Step) if f.name not in not_spec}
    assert step_fields == submit_args

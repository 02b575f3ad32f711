"""Leader following, retries and watch reconnection against in-process fake
replicas (plaintext gRPC servers on free loopback ports): the cases a real
cluster cannot be made to produce on demand."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from muster_client import Client, MusterError, parse_addresses, pb, pb_grpc, types_pb
from muster_client import _tls

DONE = types_pb.ALLOCATION_STATUS_DONE


class Replica(pb_grpc.AllocationServiceServicer):
    """A fake replica whose behaviour each test sets."""

    def __init__(self) -> None:
        self.submit: Callable[[pb.SubmitRequest, grpc.ServicerContext], pb.SubmitResponse] | None = None
        self.watch: Callable[[pb.WatchRequest, grpc.ServicerContext], Iterator[pb.AllocationEvent]] | None = None
        self.calls = 0
        self.metadata: list[dict[str, str]] = []
        self.watch_from: list[int] = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_AllocationServiceServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self.server.start()

    def _seen(self, context: grpc.ServicerContext) -> None:
        with self.lock:
            self.calls += 1
            self.metadata.append({k: v for k, v in context.invocation_metadata() if isinstance(v, str)})

    def Submit(self, request: pb.SubmitRequest, context: grpc.ServicerContext) -> pb.SubmitResponse:
        self._seen(context)
        assert self.submit is not None
        return self.submit(request, context)

    def Watch(self, request: pb.WatchRequest, context: grpc.ServicerContext) -> Iterator[pb.AllocationEvent]:
        self._seen(context)
        self.watch_from.append(request.from_revision)
        assert self.watch is not None
        yield from self.watch(request, context)


def not_leader(leader: Replica | None) -> Callable[..., pb.SubmitResponse]:
    def refuse(_req: object, context: grpc.ServicerContext) -> pb.SubmitResponse:
        if leader is not None:
            context.set_trailing_metadata((("x-muster-leader-id", "2"), ("x-muster-leader-addr", leader.address)))
        context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader")
        raise AssertionError("unreachable")

    return refuse


def not_leader_at(address: str) -> Callable[..., pb.SubmitResponse]:
    def refuse(_req: object, context: grpc.ServicerContext) -> pb.SubmitResponse:
        context.set_trailing_metadata((("x-muster-leader-id", "1"), ("x-muster-leader-addr", address)))
        context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader")
        raise AssertionError("unreachable")

    return refuse


def accept(_req: object, _context: grpc.ServicerContext) -> pb.SubmitResponse:
    return pb.SubmitResponse(id=7)


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    made = [Replica() for _ in range(3)]
    yield made
    for r in made:
        r.server.stop(grace=None)


def closed_port_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_follows_the_leader_hint_past_an_unreachable_replica(replicas: list[Replica]) -> None:
    follower, leader, _ = replicas
    follower.submit = not_leader(leader)
    leader.submit = accept
    with Client([closed_port_address(), follower.address], insecure=True, token="s3cret", timeout=10) as c:
        assert c.submit(["true"]).id == 7
        assert c.leader == leader.address
        # The leader is remembered: the next call goes straight there.
        calls = follower.calls
        assert c.submit(["true"]).id == 7
        assert follower.calls == calls
    assert leader.metadata[-1]["authorization"] == "Bearer s3cret"


def test_retries_while_no_leader_is_known(replicas: list[Replica]) -> None:
    r = replicas[0]
    answers = iter([not_leader(None)] * 3)

    def election_then_accept(req: pb.SubmitRequest, context: grpc.ServicerContext) -> pb.SubmitResponse:
        return next(answers, accept)(req, context)

    r.submit = election_then_accept
    with Client(r.address, insecure=True, timeout=10) as c:
        assert c.submit(["true"]).id == 7
    assert r.calls == 4


def test_waits_while_followers_still_name_a_dead_leader(replicas: list[Replica]) -> None:
    # The leader was just killed: the follower names it for a while, then
    # an election makes the follower itself the leader.
    follower = replicas[0]
    dead = closed_port_address()
    answers = iter([not_leader_at(dead)] * 3)

    def then_lead(req: pb.SubmitRequest, context: grpc.ServicerContext) -> pb.SubmitResponse:
        return next(answers, accept)(req, context)

    follower.submit = then_lead
    with Client([dead, follower.address], insecure=True, timeout=10) as c:
        assert c.submit(["true"]).id == 7
        assert c.leader == follower.address
    assert follower.calls == 4


def test_gives_up_at_the_timeout_naming_the_replicas(replicas: list[Replica]) -> None:
    for r in replicas:
        r.submit = not_leader(None)
    with Client([r.address for r in replicas], insecure=True, timeout=0.5) as c:
        with pytest.raises(MusterError) as info:
            c.submit(["true"])
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert all(r.address in info.value.message for r in replicas)


def test_other_errors_are_not_retried(replicas: list[Replica]) -> None:
    r = replicas[0]

    def invalid(_req: object, context: grpc.ServicerContext) -> pb.SubmitResponse:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "invalid spec.gang_size: must be at least 1")
        raise AssertionError("unreachable")

    r.submit = invalid
    with Client(r.address, insecure=True) as c:
        with pytest.raises(MusterError) as info:
            c.submit(["true"], gang_size=0)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.gang_size" in str(info.value)
    assert r.calls == 1


def event(revision: int, kind: str, status: int = types_pb.ALLOCATION_STATUS_RUNNING) -> pb.AllocationEvent:
    return pb.AllocationEvent(id=5, revision=revision, kind=kind, status=status)  # type: ignore[arg-type]


def test_watch_follows_the_leader_and_resumes_after_the_last_revision(replicas: list[Replica]) -> None:
    follower, old, new = replicas

    def refuse(_req: pb.WatchRequest, context: grpc.ServicerContext) -> Iterator[pb.AllocationEvent]:
        context.set_trailing_metadata((("x-muster-leader-addr", old.address),))
        context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader")
        yield from ()

    def serve_then_break(req: pb.WatchRequest, context: grpc.ServicerContext) -> Iterator[pb.AllocationEvent]:
        yield event(1, "submitted")
        yield event(2, "gang_reserved")
        context.set_trailing_metadata((("x-muster-leader-addr", new.address),))
        context.abort(grpc.StatusCode.UNAVAILABLE, "the replica is shutting down")

    def finish(req: pb.WatchRequest, _context: grpc.ServicerContext) -> Iterator[pb.AllocationEvent]:
        for e in [event(1, "submitted"), event(2, "gang_reserved"), event(3, "allocation_done", DONE)]:
            if e.revision > req.from_revision:
                yield e

    follower.watch, old.watch, new.watch = refuse, serve_then_break, finish
    with Client(follower.address, insecure=True, timeout=10) as c:
        events = list(c.watch(5, timeout=30))
        assert c.leader == new.address
    assert [(e.revision, e.kind) for e in events] == [(1, "submitted"), (2, "gang_reserved"), (3, "allocation_done")]
    assert old.watch_from == [0]
    assert new.watch_from == [2]


def test_watch_raises_what_is_not_unavailable(replicas: list[Replica]) -> None:
    r = replicas[0]

    def missing(_req: pb.WatchRequest, context: grpc.ServicerContext) -> Iterator[pb.AllocationEvent]:
        context.abort(grpc.StatusCode.NOT_FOUND, "allocation 5 does not exist")
        yield from ()

    r.watch = missing
    with Client(r.address, insecure=True) as c:
        with pytest.raises(MusterError) as info:
            list(c.watch(5))
    assert info.value.code == grpc.StatusCode.NOT_FOUND


def test_parse_addresses() -> None:
    assert parse_addresses("a:1, b:2,,a:1") == ["a:1", "b:2"]
    assert parse_addresses(["[::1]:7001"]) == ["[::1]:7001"]
    for bad in ["", "nohost", "h:0", "h:99999", ":80", ["h:x"]]:
        with pytest.raises(ValueError, match="addresses"):
            parse_addresses(bad)


def test_client_arguments_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MUSTER_SCHEDULER", raising=False)
    with pytest.raises(ValueError, match="addresses"):
        Client(insecure=True)
    with pytest.raises(ValueError, match="timeout"):
        Client("a:1", insecure=True, timeout=0)
    with pytest.raises(ValueError, match="token"):
        Client("a:1", insecure=True, token="bad\ntoken")
    monkeypatch.setenv("MUSTER_SCHEDULER", "h1:1,h2:2")
    with Client(insecure=True) as c:
        assert c.addresses == ["h1:1", "h2:2"]


def _touch(d: Path, *stems: str) -> None:
    (d / "ca.pem").write_text("ca")
    for s in stems:
        (d / f"{s}.pem").write_text("cert")
        (d / f"{s}-key.pem").write_text("key")


def test_identity_choice(tmp_path: Path) -> None:
    _touch(tmp_path, "admin-a", "client-b", "reader-c", "server-1")
    (tmp_path / "client-orphan-key.pem").write_text("key")  # no certificate: not an identity
    assert _tls.identities(tmp_path) == ["admin-a", "client-b", "reader-c", "server-1"]
    assert _tls.choose_identity(tmp_path, None) == "admin-a"
    assert _tls.load(tmp_path, "reader-c").cert_pem == b"cert"
    _touch(tmp_path, "admin-z")
    with pytest.raises(ValueError, match="choose one with identity="):
        _tls.choose_identity(tmp_path, None)
    only_clients = tmp_path / "clients"
    only_clients.mkdir()
    _touch(only_clients, "client-b", "reader-c")
    assert _tls.choose_identity(only_clients, None) == "client-b"

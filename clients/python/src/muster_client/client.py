"""A thin typed client for a Muster cluster that follows the Raft leader.

Every call goes to the last known leader first, then to each listed replica.
A replica that is not the leader answers UNAVAILABLE with the leader in
trailing metadata (``x-muster-leader-id``, ``x-muster-leader-addr``); the call
is sent there (a few hops at most). While replicas answer UNAVAILABLE without
naming a leader (an election), or cannot be reached, the client tries again
with a short backoff until the call's timeout. Any other status raises
:class:`MusterError` at once. Same behaviour as the Rust CLI (cli/src/client.rs).
"""

from __future__ import annotations

import builtins
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc

from . import _tls
from ._errors import MusterError
from ._gen import history_pb2 as history_pb
from ._gen import history_pb2_grpc as history_grpc
from ._gen import scheduler_pb2 as pb
from ._gen import scheduler_pb2_grpc as pb_grpc
from ._gen import types_pb2 as types_pb
from ._spec import (
    _U32,
    _U64,
    CheckpointName,
    Step,
    SubmitResult,
    WorkflowResult,
    _after_ids,
    _spec,
    _step_proto,
    _uint,
)

T = TypeVar("T")

LEADER_ID_HEADER = "x-muster-leader-id"
LEADER_ADDR_HEADER = "x-muster-leader-addr"

#: Leader hints followed within one attempt (as the Rust CLI).
MAX_HOPS = 5
#: Default deadline of a call, leader search and retries included (seconds).
DEFAULT_TIMEOUT = 10.0


_ALLOC_STATUS: dict[str, int] = {
    "queued": types_pb.ALLOCATION_STATUS_QUEUED,
    "reserved": types_pb.ALLOCATION_STATUS_RESERVED,
    "running": types_pb.ALLOCATION_STATUS_RUNNING,
    "tearing-down": types_pb.ALLOCATION_STATUS_TEARING_DOWN,
    "done": types_pb.ALLOCATION_STATUS_DONE,
    "failed": types_pb.ALLOCATION_STATUS_FAILED,
    "cancelled": types_pb.ALLOCATION_STATUS_CANCELLED,
    "suspended": types_pb.ALLOCATION_STATUS_SUSPENDED,
    "waiting": types_pb.ALLOCATION_STATUS_WAITING,
}

#: Event kinds that end an allocation (its watch stream ends after one).
TERMINAL_EVENTS = frozenset({"allocation_done", "allocation_failed", "allocation_cancelled"})

# How a failed TLS handshake (wrong CA either way, bad key) reads in a status.
_TLS_PROBLEM = re.compile(r"handshake|TSI_|SSL|certificate", re.IGNORECASE)



def allocation_status_name(status: int) -> str:
    """``queued``, ``running``, ``tearing-down``, … for an AllocationStatus value (``unknown`` otherwise)."""
    for name, value in _ALLOC_STATUS.items():
        if value == status:
            return name
    return "unknown"


def node_status_name(status: int) -> str:
    """``ready``, ``draining``, … for a NodeStatus value (``unknown`` otherwise)."""
    try:
        return str(types_pb.NodeStatus.Name(status)).removeprefix("NODE_STATUS_").lower()
    except ValueError:
        return "unknown"



def parse_addresses(addresses: str | Sequence[str]) -> list[str]:
    """``"h1:p1,h2:p2"`` or ``["h1:p1", "h2:p2"]`` → a checked list; ValueError otherwise."""
    if isinstance(addresses, str):
        items = addresses.split(",")
    else:
        items = list(addresses)
    out: list[str] = []
    for a in items:
        if not isinstance(a, str):
            raise ValueError(f"addresses: {a!r} is not a host:port string")
        a = a.strip()
        if not a:
            continue
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise ValueError(f"addresses: {a!r} is not host:port")
        if a not in out:
            out.append(a)
    if not out:
        raise ValueError("addresses: give at least one host:port (or set MUSTER_SCHEDULER)")
    return out



def _leader_hint(err: grpc.RpcError) -> str | None:
    if not isinstance(err, grpc.Call):
        return None
    for key, value in err.trailing_metadata() or ():
        if key == LEADER_ADDR_HEADER and isinstance(value, str) and value:
            return value
    return None


class Client:
    """A client of a Muster cluster.

    ``addresses``: the replicas, ``["host:port", …]`` or ``"host:port,host:port"``
    (default: ``$MUSTER_SCHEDULER``). ``tls_dir``: a TLS dir with ``ca.pem`` and
    this client's certificate (default: ``$MUSTER_TLS_DIR``); ``identity`` picks
    the certificate, e.g. ``"admin-dev"`` (default: ``$MUSTER_IDENTITY``, else the
    only admin-*, else client-*, else reader-* pair). ``insecure=True`` uses
    plaintext channels (for a cluster run with ``--insecure``). ``token``: a
    bearer token sent as ``authorization: Bearer <token>`` (default:
    ``$MUSTER_TOKEN``). ``timeout``: seconds a call may take, leader search and
    retries included.

    Usable as a context manager; :meth:`close` closes the channels.
    """

    def __init__(
        self,
        addresses: str | Sequence[str] | None = None,
        tls_dir: str | os.PathLike[str] | None = None,
        identity: str | None = None,
        token: str | None = None,
        insecure: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if addresses is None:
            addresses = os.environ.get("MUSTER_SCHEDULER", "")
        self._addresses = parse_addresses(addresses)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self._timeout = float(timeout)
        if token is None:
            token = os.environ.get("MUSTER_TOKEN") or None
        if token is not None:
            token = token.strip()
            if not token or not token.isascii() or not token.isprintable():
                raise ValueError("token must be non-empty printable ASCII")
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._tls: _tls.TlsMaterial | None = None
        if not insecure:
            if tls_dir is None:
                tls_dir = os.environ.get("MUSTER_TLS_DIR") or None
            if tls_dir is None:
                raise ValueError(
                    "tls_dir: no TLS material: give tls_dir= (or set MUSTER_TLS_DIR) holding ca.pem and this "
                    "client's certificate, or insecure=True for a cluster run without TLS"
                )
            if identity is None:
                identity = os.environ.get("MUSTER_IDENTITY") or None
            self._tls = _tls.load(Path(tls_dir), identity)
            self._credentials: grpc.ChannelCredentials | None = grpc.ssl_channel_credentials(
                root_certificates=self._tls.ca_pem,
                private_key=self._tls.key_pem,
                certificate_chain=self._tls.cert_pem,
            )
        else:
            self._credentials = None
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._leader: str | None = None
        self._closed = False

    # ----- plumbing -----

    @property
    def addresses(self) -> list[str]:
        """The listed replicas."""
        return list(self._addresses)

    @property
    def leader(self) -> str | None:
        """The address of the replica that last answered a leader call (None before the first)."""
        return self._leader

    @property
    def identity(self) -> str | None:
        """The TLS identity presented (e.g. ``admin-dev``), None when insecure."""
        return self._tls.identity if self._tls else None

    def close(self) -> None:
        """Closes every channel; the client cannot be used afterwards."""
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            ch = self._channels.get(address)
            if ch is None:
                options: list[tuple[str, int | str]] = [
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                    ("grpc.keepalive_time_ms", 30_000),
                    ("grpc.keepalive_timeout_ms", 10_000),
                ]
                if self._credentials is not None:
                    # Server certificates name server.muster, not their IP.
                    options.append(("grpc.ssl_target_name_override", _tls.SERVER_NAME))
                    ch = grpc.secure_channel(address, self._credentials, options=options)
                else:
                    ch = grpc.insecure_channel(address, options=options)
                self._channels[address] = ch
            return ch

    def _candidates(self) -> list[str]:
        first = [self._leader] if self._leader else []
        return list(dict.fromkeys(first + self._addresses))

    def _call(self, invoke: Callable[[grpc.Channel, float], T], timeout: float | None = None) -> T:
        """Runs ``invoke(channel, seconds_left)`` on the leader, following hints and retrying."""
        deadline = time.monotonic() + (self._timeout if timeout is None else timeout)
        backoff = 0.05
        problems: dict[str, str] = {}
        while True:
            queue = self._candidates()
            tried: set[str] = set()
            hops = 0
            tls_failures = 0
            while queue:
                address = queue.pop(0)
                if address in tried:
                    continue
                tried.add(address)
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    result = invoke(self._channel(address), left)
                except grpc.RpcError as err:
                    code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
                    if code != grpc.StatusCode.UNAVAILABLE:
                        raise MusterError.from_rpc(err, address) from None
                    hint = _leader_hint(err)
                    problem = (err.details() if isinstance(err, grpc.Call) else None) or "unavailable"
                    problems[address] = problem.replace("failed to connect to all addresses; last error: ", "")
                    if self._tls is not None and _TLS_PROBLEM.search(problem):
                        tls_failures += 1
                    if hint and hops < MAX_HOPS:
                        hops += 1
                        tried.discard(hint)
                        queue.insert(0, hint)
                    continue
                self._leader = address
                return result
            if tried and tls_failures == len(tried) and self._tls is not None:
                # A TLS failure with every replica will not go away by retrying.
                raise MusterError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"TLS with every replica failed: check tls_dir and identity (presenting "
                    f"{self._tls.identity}; ca.pem must be the cluster's CA, which must also have issued "
                    f"{self._tls.identity}.pem): " + "; ".join(f"{a}: {p}" for a, p in problems.items()),
                )
            left = deadline - time.monotonic()
            if left <= 0:
                detail = "; ".join(f"{a}: {p}" for a, p in problems.items()) or "no time left"
                raise MusterError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"cannot reach the scheduler leader through {', '.join(self._addresses)}: {detail}",
                )
            time.sleep(min(backoff, left))
            backoff = min(backoff * 2, 0.5)

    def _alloc(self, ch: grpc.Channel) -> Any:
        return _stub(pb_grpc.AllocationServiceStub, ch)

    # ----- allocations -----

    def submit(
        self,
        command: Sequence[str],
        gang_size: int = 1,
        gpus: int = 0,
        cpus: int = 1,
        mem_mb: int = 1024,
        vram_mb: int = 0,
        preemption_class: int = 0,
        priority: int = 0,
        checkpoint: CheckpointName = "auto",
        walltime_s: int | None = None,
        max_retries: int = 3,
        idempotency_key: str | None = None,
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        owner: str | None = None,
        vcluster: str = "default",
        vcluster_type: str = "",
        sensitive: bool = False,
        checkpoint_estimate_s: int = 60,
        stall_timeout_s: int = 0,
        ports: int = 1,
        pids_max: int = 0,
        constraints: Sequence[str] = (),
        pack_by: str = "",
        name: str = "",
        after: Sequence[int | tuple[int, str]] = (),
        after_any_of: bool = False,
        keep_if_unsatisfiable: bool = False,
        dry_run: bool = False,
        queue_if_unsatisfiable: bool = False,
        array: str | None = None,
        after_corr: int = 0,
        image: str = "",
        mounts: Sequence[str] = (),
        workdir: str = "",
        timeout: float | None = None,
    ) -> SubmitResult:
        """Submits one gang of ``gang_size`` identical tasks, each running ``command``.

        Resources are per task (``gpus``, ``cpus``, ``mem_mb``, and ``vram_mb``:
        the least memory each of its GPUs must have). ``preemption_class`` 0
        (preempted first) to 10 (never); ``checkpoint`` how a task survives
        preemption (auto, manual, none); ``walltime_s`` None: the server's
        default for the class. A retried submit with the same owner and
        ``idempotency_key`` returns the same allocation with ``duplicate=True``
        (pass one to make retries after a lost answer safe). ``dry_run``
        validates and plans only: ``id`` is 0 and ``plan`` says where it would
        stand. ``owner``: None records the caller's verified identity (the
        name in its certificate or token); only an admin may name another.
        ``ports``: rendezvous ports reserved on task 0's node (the first is the
        gang's ``MASTER_PORT``; 0: none). ``constraints``: label expressions
        every node of the gang must meet (``"gpu.model=H100"``, ``"rack in
        (r1,r2)"``); ``pack_by``: a topology label all tasks must share
        (``"rack"``, or ``"rack:preferred"``). ``env`` is readable by anyone
        who may read the allocation; ``secrets`` (environment variables too)
        are never returned by a read (``Allocation.secret_names`` lists
        their names) and reach only the agents of the nodes its tasks run on.
        ``name``: shown by lists (not unique). ``pids_max``: the most
        processes and threads one task may have on a node that contains
        tasks (0: the agent's default). ``after``: allocations to wait for
        before it is queued, each an id (it must succeed) or ``(id, kind)``
        with kind ``ok``, ``any``, ``notok`` or ``started``; all must be met,
        or with ``after_any_of`` the first. Until then it is ``waiting``; one
        that can never be met fails it at once unless
        ``keep_if_unsatisfiable``. A request no registered node
        could ever run is refused (``FAILED_PRECONDITION``, naming what is
        missing) unless ``queue_if_unsatisfiable``. ``array``: submit a job
        array of this spec instead, one element per index in Slurm's
        ``--array`` form (``"0-99"``, ``"1,3,5-11:2"``), with an optional
        ``%N`` throttle on how many run at once (``"0-99%4"``); one submit,
        the elements are allocations the server starts as the throttle
        allows, and each task gets ``MUSTER_ARRAY_ID``,
        ``MUSTER_ARRAY_INDEX`` and ``MUSTER_ARRAY_COUNT`` (and Slurm's
        ``SLURM_ARRAY_*``). The result's ``id`` is then the array's and
        ``array_count`` its size (:class:`SubmitResult`). ``after_corr``
        (with ``array``): element k waits for element k of that existing
        array to succeed, and fails if it fails. ``image``: run each task in
        this container image (a reference as ``docker pull`` takes it; the
        server pins a tag to its digest); ``command`` may then be empty (the
        image's ENTRYPOINT and CMD run), ``mounts`` are ``"SRC:DST[:ro]"``
        host paths the nodes allow, ``workdir`` where the command starts.
        """
        spec = _spec(
            command,
            gang_size=gang_size,
            gpus=gpus,
            cpus=cpus,
            mem_mb=mem_mb,
            vram_mb=vram_mb,
            preemption_class=preemption_class,
            priority=priority,
            checkpoint=checkpoint,
            walltime_s=walltime_s,
            max_retries=max_retries,
            idempotency_key=idempotency_key,
            env=env,
            owner=owner,
            vcluster=vcluster,
            vcluster_type=vcluster_type,
            sensitive=sensitive,
            checkpoint_estimate_s=checkpoint_estimate_s,
            stall_timeout_s=stall_timeout_s,
            ports=ports,
            pids_max=pids_max,
            constraints=constraints,
            pack_by=pack_by,
            name=name,
            after=_after_ids(after),
            after_any_of=after_any_of,
            keep_if_unsatisfiable=keep_if_unsatisfiable,
            image=image,
            mounts=mounts,
            workdir=workdir,
        )
        secret_map = dict(secrets or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in secret_map.items()):
            raise ValueError("secrets must map strings to strings")
        if array is not None and not isinstance(array, str):
            raise ValueError(f"array must be a string such as '0-99%4', not {array!r}")
        req = pb.SubmitRequest(
            spec=spec,
            dry_run=bool(dry_run),
            secrets=secret_map,
            queue_if_unsatisfiable=bool(queue_if_unsatisfiable),
            array=array or "",
            after_corr=_uint("after_corr", after_corr, _U64),
        )
        resp: pb.SubmitResponse = self._call(
            lambda ch, t: self._alloc(ch).Submit(req, timeout=t, metadata=self._metadata), timeout
        )
        return SubmitResult(
            id=resp.id,
            duplicate=resp.duplicate,
            plan=resp.plan if resp.HasField("plan") else None,
            array_count=resp.array_count,
        )

    def get(self, id: int, timeout: float | None = None) -> types_pb.Allocation:
        """One allocation (NOT_FOUND if there is none).

        An element of a job array is an allocation like any other, with
        ``array_id`` and ``array_index`` set; one not started yet, and an
        array's own id, are NOT_FOUND (:meth:`get_array` reads an array),
        as is a workflow's (:meth:`get_workflow`).
        """
        req = pb.GetRequest(id=_uint("id", id, _U64))
        return cast(
            types_pb.Allocation,
            self._call(lambda ch, t: self._alloc(ch).Get(req, timeout=t, metadata=self._metadata), timeout),
        )

    def list_page(
        self,
        status: str | int | None = None,
        owner: str | None = None,
        preemption_class: int | None = None,
        page_size: int = 100,
        page_token: int = 0,
        expand: bool = False,
        timeout: float | None = None,
    ) -> pb.ListResponse:
        """One page: at most ``page_size`` allocations with ids above ``page_token``.

        Without ``expand``, the elements of job arrays are left out of
        ``allocations`` and the arrays whose ids fall within the page are in
        ``arrays`` (each a JobArray counting its elements by status); with
        ``expand``, every element is listed as an allocation and ``arrays``
        is empty.
        """
        req = pb.ListRequest(
            status=cast(types_pb.AllocationStatus, _status_filter(status)),
            owner=owner or "",
            page_size=_uint("page_size", page_size),
            page_token=_uint("page_token", page_token, _U64),
            expand=bool(expand),
        )
        if preemption_class is not None:
            req.preemption_class = _uint("preemption_class", preemption_class)
        return cast(
            pb.ListResponse,
            self._call(lambda ch, t: self._alloc(ch).List(req, timeout=t, metadata=self._metadata), timeout),
        )

    def list(
        self,
        status: str | int | None = None,
        owner: str | None = None,
        preemption_class: int | None = None,
        page_size: int = 100,
        expand: bool = False,
        timeout: float | None = None,
    ) -> builtins.list[types_pb.Allocation]:
        """Every allocation matching the filters (all pages), by id.

        ``status``: ``waiting``, ``queued``, ``suspended``, ``reserved``, ``running``,
        ``tearing-down``, ``done``, ``failed``, ``cancelled`` (or an
        AllocationStatus value); None: any. The elements of job arrays are
        left out (:meth:`arrays` lists the arrays) unless ``expand``.
        """
        out: builtins.list[types_pb.Allocation] = []
        token = 0
        while True:
            page = self.list_page(status, owner, preemption_class, page_size, token, expand, timeout)
            out.extend(page.allocations)
            if page.next_page_token == 0:
                return out
            token = page.next_page_token

    def arrays(
        self,
        status: str | int | None = None,
        owner: str | None = None,
        preemption_class: int | None = None,
        page_size: int = 100,
        timeout: float | None = None,
    ) -> builtins.list[pb.JobArray]:
        """Every job array matching the filters (all pages), by id.

        Each counts its elements by status (``by_status``; ``pending``: not
        started yet). With ``status``, an array is listed when one of its
        elements has that status (a pending one counts as ``queued``).
        """
        out: builtins.list[pb.JobArray] = []
        token = 0
        while True:
            page = self.list_page(status, owner, preemption_class, page_size, token, False, timeout)
            out.extend(page.arrays)
            if page.next_page_token == 0:
                return out
            token = page.next_page_token

    def cancel(self, id: int, indices: str | None = None, timeout: float | None = None) -> types_pb.Allocation:
        """Cancels an allocation; returns it cancelled, or tearing down while its running tasks stop.

        Running tasks are stopped (SIGTERM, grace, SIGKILL) and hold their
        GPUs until each one has stopped; then the allocation is cancelled.
        A job array's id cancels every element that has not ended; with
        ``indices`` (Slurm's form, ``"3-5"``, ``"0-9,12"``), only those
        elements (INVALID_ARGUMENT naming an index the array does not
        have). For an array the answer is the array in allocation form
        (its id and spec, ``array_id`` set, status cancelled even when only
        some elements were): :meth:`get_array` counts its elements. A
        workflow's id cancels every step not yet finished (the answer: its
        id, status cancelled; :meth:`get_workflow` shows the steps).
        """
        if indices is not None and not isinstance(indices, str):
            raise ValueError(f"indices must be a string such as '3-5', not {indices!r}")
        req = pb.CancelRequest(id=_uint("id", id, _U64), indices=indices or "")
        return cast(
            types_pb.Allocation,
            self._call(lambda ch, t: self._alloc(ch).Cancel(req, timeout=t, metadata=self._metadata), timeout),
        )

    def get_array(self, id: int, timeout: float | None = None) -> pb.JobArray:
        """A job array: its indices, throttle, spec and elements counted by status.

        ``by_status`` maps status names (``queued``, ``running``, ``done``,
        ``failed``, ``cancelled``, …) to how many elements have it;
        ``pending``: elements not started yet; ``finished``: every element
        has ended, and ``status`` is then ``done``, ``failed`` or
        ``cancelled`` (``running`` before). NOT_FOUND if ``id`` is no array.
        """
        req = pb.GetRequest(id=_uint("id", id, _U64))
        return cast(
            pb.JobArray,
            self._call(lambda ch, t: self._alloc(ch).GetArray(req, timeout=t, metadata=self._metadata), timeout),
        )

    def set_array_throttle(self, id: int, throttle: int, timeout: float | None = None) -> pb.JobArray:
        """Sets how many of a live array's elements may run at once (0: no limit); returns the array.

        Raising it starts more elements at once; lowering it lets running
        ones finish. A throttle above the array's element count is refused
        (INVALID_ARGUMENT), as is a finished array (FAILED_PRECONDITION).
        """
        req = pb.SetArrayThrottleRequest(id=_uint("id", id, _U64), throttle=_uint("throttle", throttle))
        return cast(
            pb.JobArray,
            self._call(
                lambda ch, t: self._alloc(ch).SetArrayThrottle(req, timeout=t, metadata=self._metadata), timeout
            ),
        )

    def submit_workflow(
        self,
        name: str,
        steps: Sequence[Step],
        idempotency_key: str | None = None,
        queue_if_unsatisfiable: bool = False,
        timeout: float | None = None,
    ) -> WorkflowResult:
        """Submits a workflow: every :class:`Step` in one log entry, accepted or refused whole.

        Steps may be given in any order: the server makes each after the
        steps it waits for, and refuses a cycle (INVALID_ARGUMENT naming
        its steps), an unknown step name, or any step's bad spec (naming
        the step: ``invalid steps[train].gang_size``); nothing is made
        then. At most 64 steps. The owner is the caller. A retried submit
        with the same ``idempotency_key`` and steps returns the same
        workflow with ``duplicate=True`` (a changed one under the key is
        refused). A step no registered node could ever run is refused
        (FAILED_PRECONDITION, naming the step) unless
        ``queue_if_unsatisfiable``. A step whose dependency can never be
        met fails with the reason ``dependency <id> failed`` (or ``was
        cancelled``, …). Cancel the workflow's id (:meth:`cancel`) to
        cancel every step not yet finished.
        """
        if not isinstance(name, str):
            raise ValueError(f"name must be a string, not {name!r}")
        if idempotency_key is not None and not isinstance(idempotency_key, str):
            raise ValueError(f"idempotency_key must be a string, not {idempotency_key!r}")
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
            raise ValueError("steps must be a list of Step objects")
        req = pb.SubmitWorkflowRequest(
            name=name,
            idempotency_key=idempotency_key or "",
            steps=[_step_proto(s) for s in steps],
            queue_if_unsatisfiable=bool(queue_if_unsatisfiable),
        )
        resp: pb.SubmitWorkflowResponse = self._call(
            lambda ch, t: self._alloc(ch).SubmitWorkflow(req, timeout=t, metadata=self._metadata), timeout
        )
        return WorkflowResult(id=resp.id, duplicate=resp.duplicate, steps={s.name: s for s in resp.steps})

    def get_workflow(self, id: int, timeout: float | None = None) -> pb.WorkflowInfo:
        """A workflow: its name, owner and each step's id, kind and status now.

        ``steps`` are in the order they were made (each after the steps it
        waits for); a step's ``status`` is its allocation's (``waiting``,
        ``queued``, ``running``, ``done``, ``failed``, ``cancelled``, …) or,
        for an array step, ``running`` until the array finishes, then
        ``done``, ``failed`` or ``cancelled``. ``finished``: every step has
        ended. NOT_FOUND if ``id`` is no workflow.
        """
        req = pb.GetRequest(id=_uint("id", id, _U64))
        return cast(
            pb.WorkflowInfo,
            self._call(lambda ch, t: self._alloc(ch).GetWorkflow(req, timeout=t, metadata=self._metadata), timeout),
        )

    def explain(self, id: int, timeout: float | None = None) -> pb.Explanation:
        """Why it is pending: per class of nodes, whether and how many could take a task; preemption plan."""
        req = pb.GetRequest(id=_uint("id", id, _U64))
        return cast(
            pb.Explanation,
            self._call(lambda ch, t: self._alloc(ch).Explain(req, timeout=t, metadata=self._metadata), timeout),
        )

    def watch(self, id: int, from_revision: int = 0, timeout: float | None = None) -> Iterator[pb.AllocationEvent]:
        """The allocation's events after ``from_revision``, then each new one, until it ends.

        The iterator ends after the allocation's last event (allocation_done,
        allocation_failed or allocation_cancelled). When the stream breaks
        (the replica serving it stops, the leader moves), the client reconnects,
        following the leader, and continues after the last revision seen;
        it gives up (MusterError UNAVAILABLE) when no replica serves it for
        the client's timeout. ``timeout``: a deadline for the whole watch
        (None: none); past it MusterError DEADLINE_EXCEEDED is raised. An
        element of a job array is watched by its own id; an array's id is
        NOT_FOUND (:meth:`get_array` says how far it is).
        """
        cursor = _uint("from_revision", from_revision, _U64)
        _uint("id", id, _U64)
        end = None if timeout is None else time.monotonic() + timeout
        reconnect_until: float | None = None
        while True:
            if end is not None and time.monotonic() >= end:
                raise MusterError(grpc.StatusCode.DEADLINE_EXCEEDED, f"watching allocation {id}: timed out")
            req = pb.WatchRequest(id=id, from_revision=cursor)

            def open_stream(ch: grpc.Channel, left: float, req: pb.WatchRequest = req) -> grpc.Call:
                call = self._alloc(ch).Watch(
                    req, timeout=None if end is None else max(end - time.monotonic(), 0.001), metadata=self._metadata
                )
                # Wait for the response headers so a refusal (not the leader,
                # not found) surfaces here, where the leader is followed.
                call.initial_metadata()
                if call.done() and call.code() != grpc.StatusCode.OK:
                    raise cast(grpc.RpcError, call)
                return cast(grpc.Call, call)

            left = self._timeout if reconnect_until is None else reconnect_until - time.monotonic()
            if end is not None:
                left = min(left, end - time.monotonic())
            if left <= 0:
                raise MusterError(grpc.StatusCode.UNAVAILABLE, f"watching allocation {id}: no replica serves it")
            call = self._call(open_stream, left)
            try:
                for event in cast(Iterator[pb.AllocationEvent], call):
                    reconnect_until = None
                    cursor = event.revision
                    yield event
                return
            except grpc.RpcError as err:
                code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
                if code != grpc.StatusCode.UNAVAILABLE:
                    raise MusterError.from_rpc(err) from None
                hint = _leader_hint(err)
                if hint:
                    self._leader = hint
                if reconnect_until is None:
                    reconnect_until = time.monotonic() + self._timeout
            finally:
                call.cancel()

    # ----- the job history -----

    def history(
        self,
        id: int = 0,
        owner: str | None = None,
        vcluster: str | None = None,
        status: str | int | None = None,
        since_ms: int = 0,
        until_ms: int = 0,
        timeout: float | None = None,
    ) -> builtins.list[history_pb.HistoryRecord]:
        """Finished allocations in the order they finished (every page), from the job history.

        Each record's ``attempts`` say how each attempt ended (``outcome``:
        ``done``, ``failed``, ``oom_killed``, ``stopped``, ``lost``,
        ``cancelled``) and, where its node contains tasks in cgroups, what it
        used: ``usage.peak_memory_bytes``, ``usage.cpu_ms``,
        ``usage.oom_kills`` and ``usage.memory_limit_bytes``, and where NVML
        reads its GPUs ``usage.gpu_util_pct`` (``HasField``: read) and
        ``usage.peak_gpu_memory_bytes`` (``HasField("usage")`` is false where
        nothing was measured).
        """
        out: builtins.list[history_pb.HistoryRecord] = []
        after = 0
        while True:
            req = history_pb.HistoryQuery(
                id=_uint("id", id, _U64),
                owner=owner or "",
                vcluster=vcluster or "",
                status=cast(types_pb.AllocationStatus, _status_filter(status)),
                since_ms=_uint("since_ms", since_ms, _U64),
                until_ms=_uint("until_ms", until_ms, _U64),
                after_seq=after,
                limit=1000,
            )
            page = cast(
                history_pb.HistoryPage,
                self._call(
                    lambda ch, t, req=req: _stub(history_grpc.HistoryServiceStub, ch).ListHistory(
                        req, timeout=t, metadata=self._metadata
                    ),
                    timeout,
                ),
            )
            out.extend(page.records)
            if page.next_after_seq == 0:
                return out
            after = page.next_after_seq

    def usage(
        self,
        since_ms: int,
        until_ms: int | None = None,
        group_by: str = "owner,vcluster",
        timeout: float | None = None,
    ) -> builtins.list[history_pb.UsageRow]:
        """Use per owner and/or vCluster over ``[since_ms, until_ms)`` (default: until now).

        Each row has the jobs that finished, GPU-seconds, and from the
        attempts' cgroups ``cpu_ms``, ``peak_memory_bytes`` and
        ``oom_killed`` (attempts killed at their memory limit).
        ``group_by``: ``owner``, ``vcluster`` or ``owner,vcluster``.
        """
        until = int(time.time() * 1000) if until_ms is None else until_ms
        rows: builtins.list[history_pb.UsageRow] = []
        token = ""
        while True:
            req = history_pb.UsageQuery(
                since_ms=_uint("since_ms", since_ms, _U64),
                until_ms=_uint("until_ms", until, _U64),
                group_by=group_by,
                page_size=1000,
                page_token=token,
            )
            page = cast(
                history_pb.UsageReport,
                self._call(
                    lambda ch, t, req=req: _stub(history_grpc.HistoryServiceStub, ch).Usage(
                        req, timeout=t, metadata=self._metadata
                    ),
                    timeout,
                ),
            )
            rows.extend(page.rows)
            if not page.next_page_token:
                return rows
            token = page.next_page_token

    # ----- nodes and replicas -----

    def nodes(self, timeout: float | None = None, page_size: int = 1000) -> builtins.list[types_pb.Node]:
        """Every node the cluster knows, with its status, resources and use
        (in id order; the pages the server cuts are followed)."""
        nodes: builtins.list[types_pb.Node] = []
        token = ""
        while True:
            req = pb.ListNodesRequest(page_size=_uint("page_size", page_size, _U32), page_token=token)
            resp = cast(
                pb.ListNodesResponse,
                self._call(
                    lambda ch, t, req=req: _stub(pb_grpc.NodeServiceStub, ch).ListNodes(req, timeout=t, metadata=self._metadata),
                    timeout,
                ),
            )
            nodes.extend(resp.nodes)
            if not resp.next_page_token:
                return nodes
            token = resp.next_page_token

    def status(self, address: str | None = None, timeout: float | None = None) -> pb.ReplicaStatus:
        """A replica's own view (role, term, leader, log indexes, members).

        ``address``: ask that replica (need not be listed); default: the
        last known leader, else the first listed replica that answers.
        """
        req = pb.StatusRequest()
        if address is None:
            return cast(
                pb.ReplicaStatus,
                self._call(
                    lambda ch, t: _stub(pb_grpc.AdminServiceStub, ch).Status(req, timeout=t, metadata=self._metadata), timeout
                ),
            )
        parse_addresses([address])
        try:
            return cast(
                pb.ReplicaStatus,
                _stub(pb_grpc.AdminServiceStub, self._channel(address)).Status(
                    req, timeout=self._timeout if timeout is None else timeout, metadata=self._metadata
                ),
            )
        except grpc.RpcError as err:
            raise MusterError.from_rpc(err, address) from None


def _stub(kind: Callable[[grpc.Channel], Any], channel: grpc.Channel) -> Any:
    # The generated stubs are untyped; the methods using them declare what they return.
    return kind(channel)


def _status_filter(status: str | int | None) -> int:
    if status is None:
        return types_pb.ALLOCATION_STATUS_UNSPECIFIED
    if isinstance(status, str):
        value = _ALLOC_STATUS.get(status.strip().lower().replace("_", "-"))
        if value is None:
            raise ValueError(f"status must be one of {', '.join(_ALLOC_STATUS)}, not {status!r}")
        return value
    if isinstance(status, bool) or not isinstance(status, int) or status not in _ALLOC_STATUS.values():
        raise ValueError(f"status must be one of {', '.join(_ALLOC_STATUS)}, not {status!r}")
    return status

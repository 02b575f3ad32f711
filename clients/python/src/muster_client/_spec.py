"""What a submit sends and what it returns: the spec built (and checked
for what the wire cannot carry) from keyword arguments, a workflow's
steps, and the results of a submit and of a workflow submit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Literal, cast

from ._gen import scheduler_pb2 as pb
from ._gen import types_pb2 as types_pb

CheckpointName = Literal["auto", "manual", "none"]

_CHECKPOINT: dict[str, int] = {
    "auto": types_pb.CHECKPOINT_MODE_AUTO,
    "manual": types_pb.CHECKPOINT_MODE_MANUAL,
    "none": types_pb.CHECKPOINT_MODE_NONE,
}

_AFTER_KINDS = ("ok", "any", "notok", "started")

_U32 = 2**32 - 1
_U64 = 2**64 - 1


@dataclass(frozen=True)
class SubmitResult:
    """What a submit returned.

    ``id`` is 0 for a dry run; ``duplicate`` is true when an earlier submit
    with the same owner and idempotency key made the allocation; ``plan`` is
    set for a dry run (where it would stand, what it would preempt).

    For a job array (``submit(array=...)``), ``id`` is the array's (see
    :meth:`Client.get_array`) and ``array_count`` how many elements it has
    (0: not an array); its elements are allocations ``id + 1`` to ``id +
    array_count`` (:attr:`element_ids`), the k-th index ascending being
    ``id + 1 + k``.
    """

    id: int
    duplicate: bool
    plan: pb.Explanation | None = None
    array_count: int = 0

    @property
    def is_array(self) -> bool:
        """Whether the submit made a job array."""
        return self.array_count > 0

    @property
    def element_ids(self) -> range:
        """The array's elements' allocation ids, in index order (empty: not an array)."""
        return range(self.id + 1, self.id + 1 + self.array_count) if self.array_count else range(0)


@dataclass(frozen=True)
class Step:
    """One step of a workflow (:meth:`Client.submit_workflow`): an allocation, or a job array.

    ``name``: unique within the workflow, 1 to 64 letters, digits, ``.``,
    ``_``, ``-`` (also the allocation's name, shown by lists). ``command``
    and the resource and spec fields are :meth:`Client.submit`'s, with its
    defaults and checks. ``after``: what the step waits for, each a step's
    name (it must succeed), an existing allocation's id, or ``(name or id,
    kind)`` with kind ``ok``, ``any``, ``notok`` or ``started``; steps may
    name each other in any order, but not in a cycle. ``after_any_of`` and
    ``keep_if_unsatisfiable`` cover the whole list. ``array``: make the step
    a job array (Slurm's ``--array`` form, ``"0-99%8"``); ``after_corr``
    (with ``array``): another array step's name, whose element k element k
    waits for to succeed (and fails if it fails). The owner, idempotency
    key and ``queue_if_unsatisfiable`` are the workflow's, not a step's (a
    step takes no secrets). Each task gets ``MUSTER_WORKFLOW_ID`` and
    ``MUSTER_WORKFLOW_STEP`` (the step's name).
    """

    name: str
    command: Sequence[str]
    gang_size: int = 1
    gpus: int = 0
    cpus: int = 1
    mem_mb: int = 1024
    vram_mb: int = 0
    preemption_class: int = 0
    priority: int = 0
    checkpoint: CheckpointName = "auto"
    walltime_s: int | None = None
    max_retries: int = 3
    env: Mapping[str, str] | None = None
    vcluster: str = "default"
    vcluster_type: str = ""
    sensitive: bool = False
    checkpoint_estimate_s: int = 60
    stall_timeout_s: int = 0
    ports: int = 1
    pids_max: int = 0
    constraints: Sequence[str] = ()
    pack_by: str = ""
    after: Sequence[str | int | tuple[str | int, str]] = ()
    after_any_of: bool = False
    keep_if_unsatisfiable: bool = False
    image: str = ""
    mounts: Sequence[str] = ()
    workdir: str = ""
    array: str | None = None
    after_corr: str | None = None


#: Step fields that are not submit()'s spec keyword arguments.
_STEP_OWN_FIELDS = ("name", "after", "array", "after_corr")


def _step_proto(step: Step) -> pb.WorkflowStep:
    """A :class:`Step` on the wire; ValueError naming the step and the field."""
    if not isinstance(step, Step):
        raise ValueError(f"steps must be Step objects, not {step!r}")
    if not isinstance(step.name, str) or not step.name:
        raise ValueError(f"a step's name must be a non-empty string, not {step.name!r}")
    try:
        if isinstance(step.after, (str, bytes)):
            raise ValueError(f"after must be a list of step names or ids, e.g. [{step.after!r}]")
        ids: list[types_pb.Dependency] = []
        steps: list[pb.StepDependency] = []
        for d in step.after:
            if isinstance(d, tuple):
                if len(d) != 2:
                    raise ValueError(f"after entries are a step name, an id, or (either, kind), not {d!r}")
                on, kind = d
            else:
                on, kind = d, "ok"
            if isinstance(on, str):
                if not on:
                    raise ValueError("after step names must not be empty")
                steps.append(pb.StepDependency(step=on, when=_after_kind(kind)))
            else:
                ids.append(_after_id(on, kind))
        for field, value in (("array", step.array), ("after_corr", step.after_corr)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{field} must be a string, not {value!r}")
        kwargs = {f.name: getattr(step, f.name) for f in fields(Step) if f.name not in _STEP_OWN_FIELDS}
        spec = _spec(**kwargs, name=step.name, owner=None, idempotency_key=None, after=ids)
    except ValueError as err:
        raise ValueError(f"step {step.name!r}: {err}") from None
    return pb.WorkflowStep(
        name=step.name, spec=spec, array=step.array or "", after=steps, after_corr=step.after_corr or ""
    )


@dataclass(frozen=True)
class WorkflowResult:
    """What a workflow submit returned.

    ``id`` is the workflow's (:meth:`Client.get_workflow`; cancelling it
    cancels every step not yet finished); ``duplicate`` is true when an
    earlier submit with the same owner and idempotency key made it (the
    same steps, the same ids). ``steps`` maps each step's name to its
    ``WorkflowStepId`` (``id``: the allocation's, or for an array step the
    array's; ``array``; ``status`` when answered), in the order the server
    made them: each after the steps it waits for, with ids ascending from
    ``id + 1`` (an array step's elements take the ids after its own).
    """

    id: int
    duplicate: bool
    steps: dict[str, pb.WorkflowStepId]

    @property
    def ids(self) -> dict[str, int]:
        """Each step's id (an allocation's, or an array step's array's) by name."""
        return {name: s.id for name, s in self.steps.items()}

    @property
    def arrays(self) -> frozenset[str]:
        """The names of the steps that are job arrays (:meth:`Client.get_array` reads each)."""
        return frozenset(name for name, s in self.steps.items() if s.array)


def _uint(name: str, value: object, maximum: int = _U32) -> int:
    # Only what the wire cannot carry is checked here; the server checks the
    # rest (its limits are configurable) and names the field.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    if not 0 <= value <= maximum:
        raise ValueError(f"{name} must be between 0 and {maximum}, not {value}")
    return value


def _after_kind(kind: object) -> str:
    if kind not in _AFTER_KINDS:
        raise ValueError(f"after kind must be one of {', '.join(_AFTER_KINDS)}, not {kind!r}")
    return cast(str, kind)


def _after_id(dep_id: object, kind: object) -> types_pb.Dependency:
    when = _after_kind(kind)
    if _uint("after", dep_id, _U64) == 0:
        raise ValueError("after ids start at 1")
    return types_pb.Dependency(id=cast(int, dep_id), when=when)


def _after_ids(after: Sequence[int | tuple[int, str]]) -> list[types_pb.Dependency]:
    """submit()'s ``after``: existing allocations, each an id or ``(id, kind)``."""
    deps = []
    for d in after:
        if isinstance(d, tuple):
            if len(d) != 2:
                raise ValueError(f"after entries are an id or (id, kind), not {d!r}")
            deps.append(_after_id(*d))
        else:
            deps.append(_after_id(d, "ok"))
    return deps


def _spec(
    command: Sequence[str],
    *,
    gang_size: int,
    gpus: int,
    cpus: int,
    mem_mb: int,
    vram_mb: int,
    preemption_class: int,
    priority: int,
    checkpoint: CheckpointName,
    walltime_s: int | None,
    max_retries: int,
    idempotency_key: str | None,
    env: Mapping[str, str] | None,
    owner: str | None,
    vcluster: str,
    vcluster_type: str,
    sensitive: bool,
    checkpoint_estimate_s: int,
    stall_timeout_s: int,
    ports: int,
    pids_max: int,
    constraints: Sequence[str],
    pack_by: str,
    name: str,
    after: Sequence[types_pb.Dependency],
    after_any_of: bool,
    keep_if_unsatisfiable: bool,
    image: str = "",
    mounts: Sequence[str] = (),
    workdir: str = "",
) -> types_pb.AllocationSpec:
    """The AllocationSpec of submit()'s keyword arguments (and a workflow :class:`Step`'s), checked."""
    if isinstance(command, (str, bytes)) or not isinstance(command, Sequence):
        raise ValueError("command must be a list of arguments, e.g. ['sh', '-c', 'echo hi']")
    if not all(isinstance(a, str) for a in command):
        raise ValueError("command must hold only strings")
    if checkpoint not in _CHECKPOINT:
        raise ValueError(f"checkpoint must be one of auto, manual, none, not {checkpoint!r}")
    if isinstance(priority, bool) or not isinstance(priority, int) or not -(2**31) <= priority < 2**31:
        raise ValueError(f"priority must be a 32-bit integer, not {priority!r}")
    if walltime_s is not None and _uint("walltime_s", walltime_s, _U64) == 0:
        raise ValueError("walltime_s must be at least 1 second (or None for the server's default)")
    env_map = dict(env or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env_map.items()):
        raise ValueError("env must map strings to strings")
    for field, value in (("idempotency_key", idempotency_key), ("owner", owner)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{field} must be a string, not {value!r}")
    if isinstance(constraints, (str, bytes)) or not all(isinstance(c, str) for c in constraints):
        raise ValueError("constraints must be a list of label expressions, e.g. ['gpu.model=H100']")
    if isinstance(mounts, (str, bytes)) or not all(isinstance(m, str) for m in mounts):
        raise ValueError("mounts must be a list of 'SRC:DST[:ro]' strings")
    if (mounts or workdir) and not image:
        raise ValueError("mounts and workdir need an image")

    for field, value in (
        ("vcluster", vcluster),
        ("vcluster_type", vcluster_type),
        ("pack_by", pack_by),
        ("name", name),
        ("image", image),
        ("workdir", workdir),
    ):
        if not isinstance(value, str):
            raise ValueError(f"{field} must be a string, not {value!r}")
    return types_pb.AllocationSpec(
        owner=owner or "",
        gang_size=_uint("gang_size", gang_size),
        resources=types_pb.Resources(
            gpus=_uint("gpus", gpus),
            cpus=_uint("cpus", cpus),
            mem_mb=_uint("mem_mb", mem_mb, _U64),
            vram_mb=_uint("vram_mb", vram_mb, _U64),
        ),
        preemption_class=_uint("preemption_class", preemption_class),
        priority=priority,
        checkpoint=cast(types_pb.CheckpointMode, _CHECKPOINT[checkpoint]),
        walltime_s=walltime_s or 0,
        max_retries=_uint("max_retries", max_retries),
        command=list(command),
        env=env_map,
        idempotency_key=idempotency_key or "",
        vcluster=vcluster,
        vcluster_type=vcluster_type,
        sensitive=bool(sensitive),
        checkpoint_estimate_s=_uint("checkpoint_estimate_s", checkpoint_estimate_s),
        stall_timeout_s=_uint("stall_timeout_s", stall_timeout_s),
        ports=_uint("ports", ports),
        pids_max=_uint("pids_max", pids_max),
        constraints=list(constraints),
        pack_by=pack_by,
        name=name,
        after=list(after),
        after_any_of=bool(after_any_of),
        keep_if_unsatisfiable=bool(keep_if_unsatisfiable),
        image=image,
        mounts=list(mounts),
        workdir=workdir,
    )

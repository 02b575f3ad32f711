from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CheckpointMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINT_MODE_UNSPECIFIED: _ClassVar[CheckpointMode]
    CHECKPOINT_MODE_AUTO: _ClassVar[CheckpointMode]
    CHECKPOINT_MODE_MANUAL: _ClassVar[CheckpointMode]
    CHECKPOINT_MODE_NONE: _ClassVar[CheckpointMode]

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATUS_UNSPECIFIED: _ClassVar[TaskStatus]
    TASK_STATUS_BLOCKED: _ClassVar[TaskStatus]
    TASK_STATUS_RESERVED: _ClassVar[TaskStatus]
    TASK_STATUS_RUNNING: _ClassVar[TaskStatus]
    TASK_STATUS_DONE: _ClassVar[TaskStatus]
    TASK_STATUS_FAILED: _ClassVar[TaskStatus]
    TASK_STATUS_CANCELLED: _ClassVar[TaskStatus]
    TASK_STATUS_PREEMPTING: _ClassVar[TaskStatus]
    TASK_STATUS_PREEMPTED: _ClassVar[TaskStatus]

class AllocationStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALLOCATION_STATUS_UNSPECIFIED: _ClassVar[AllocationStatus]
    ALLOCATION_STATUS_QUEUED: _ClassVar[AllocationStatus]
    ALLOCATION_STATUS_RESERVED: _ClassVar[AllocationStatus]
    ALLOCATION_STATUS_RUNNING: _ClassVar[AllocationStatus]
    ALLOCATION_STATUS_TEARING_DOWN: _ClassVar[AllocationStatus]
    ALLOCATION_STATUS_DONE: _ClassVar[AllocationStatus]
    ALLOCATION_STATUS_FAILED: _ClassVar[AllocationStatus]
    ALLOCATION_STATUS_CANCELLED: _ClassVar[AllocationStatus]
    ALLOCATION_STATUS_SUSPENDED: _ClassVar[AllocationStatus]
    ALLOCATION_STATUS_WAITING: _ClassVar[AllocationStatus]

class NodeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATUS_UNSPECIFIED: _ClassVar[NodeStatus]
    NODE_STATUS_READY: _ClassVar[NodeStatus]
    NODE_STATUS_LOST: _ClassVar[NodeStatus]
    NODE_STATUS_PENDING: _ClassVar[NodeStatus]
    NODE_STATUS_DRAINING: _ClassVar[NodeStatus]
    NODE_STATUS_STOPPING: _ClassVar[NodeStatus]
    NODE_STATUS_STOPPED: _ClassVar[NodeStatus]
    NODE_STATUS_TERMINATED: _ClassVar[NodeStatus]
CHECKPOINT_MODE_UNSPECIFIED: CheckpointMode
CHECKPOINT_MODE_AUTO: CheckpointMode
CHECKPOINT_MODE_MANUAL: CheckpointMode
CHECKPOINT_MODE_NONE: CheckpointMode
TASK_STATUS_UNSPECIFIED: TaskStatus
TASK_STATUS_BLOCKED: TaskStatus
TASK_STATUS_RESERVED: TaskStatus
TASK_STATUS_RUNNING: TaskStatus
TASK_STATUS_DONE: TaskStatus
TASK_STATUS_FAILED: TaskStatus
TASK_STATUS_CANCELLED: TaskStatus
TASK_STATUS_PREEMPTING: TaskStatus
TASK_STATUS_PREEMPTED: TaskStatus
ALLOCATION_STATUS_UNSPECIFIED: AllocationStatus
ALLOCATION_STATUS_QUEUED: AllocationStatus
ALLOCATION_STATUS_RESERVED: AllocationStatus
ALLOCATION_STATUS_RUNNING: AllocationStatus
ALLOCATION_STATUS_TEARING_DOWN: AllocationStatus
ALLOCATION_STATUS_DONE: AllocationStatus
ALLOCATION_STATUS_FAILED: AllocationStatus
ALLOCATION_STATUS_CANCELLED: AllocationStatus
ALLOCATION_STATUS_SUSPENDED: AllocationStatus
ALLOCATION_STATUS_WAITING: AllocationStatus
NODE_STATUS_UNSPECIFIED: NodeStatus
NODE_STATUS_READY: NodeStatus
NODE_STATUS_LOST: NodeStatus
NODE_STATUS_PENDING: NodeStatus
NODE_STATUS_DRAINING: NodeStatus
NODE_STATUS_STOPPING: NodeStatus
NODE_STATUS_STOPPED: NodeStatus
NODE_STATUS_TERMINATED: NodeStatus

class Resources(_message.Message):
    __slots__ = ("gpus", "vram_mb", "mem_mb", "cpus")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    VRAM_MB_FIELD_NUMBER: _ClassVar[int]
    MEM_MB_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    vram_mb: int
    mem_mb: int
    cpus: int
    def __init__(self, gpus: _Optional[int] = ..., vram_mb: _Optional[int] = ..., mem_mb: _Optional[int] = ..., cpus: _Optional[int] = ...) -> None: ...

class AllocationSpec(_message.Message):
    __slots__ = ("owner", "gang_size", "resources", "preemption_class", "priority", "checkpoint", "walltime_s", "max_retries", "command", "env", "idempotency_key", "vcluster", "vcluster_type", "sensitive", "checkpoint_estimate_s", "stall_timeout_s", "ports", "constraints", "pack_by", "checkpoint_store", "name", "pids_max", "after", "after_any_of", "keep_if_unsatisfiable", "image", "mounts", "workdir")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OWNER_FIELD_NUMBER: _ClassVar[int]
    GANG_SIZE_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_CLASS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    WALLTIME_S_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    VCLUSTER_FIELD_NUMBER: _ClassVar[int]
    VCLUSTER_TYPE_FIELD_NUMBER: _ClassVar[int]
    SENSITIVE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ESTIMATE_S_FIELD_NUMBER: _ClassVar[int]
    STALL_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    PACK_BY_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STORE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PIDS_MAX_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    AFTER_ANY_OF_FIELD_NUMBER: _ClassVar[int]
    KEEP_IF_UNSATISFIABLE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    owner: str
    gang_size: int
    resources: Resources
    preemption_class: int
    priority: int
    checkpoint: CheckpointMode
    walltime_s: int
    max_retries: int
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    idempotency_key: str
    vcluster: str
    vcluster_type: str
    sensitive: bool
    checkpoint_estimate_s: int
    stall_timeout_s: int
    ports: int
    constraints: _containers.RepeatedScalarFieldContainer[str]
    pack_by: str
    checkpoint_store: str
    name: str
    pids_max: int
    after: _containers.RepeatedCompositeFieldContainer[Dependency]
    after_any_of: bool
    keep_if_unsatisfiable: bool
    image: str
    mounts: _containers.RepeatedScalarFieldContainer[str]
    workdir: str
    def __init__(self, owner: _Optional[str] = ..., gang_size: _Optional[int] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., preemption_class: _Optional[int] = ..., priority: _Optional[int] = ..., checkpoint: _Optional[_Union[CheckpointMode, str]] = ..., walltime_s: _Optional[int] = ..., max_retries: _Optional[int] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[str] = ..., vcluster: _Optional[str] = ..., vcluster_type: _Optional[str] = ..., sensitive: _Optional[bool] = ..., checkpoint_estimate_s: _Optional[int] = ..., stall_timeout_s: _Optional[int] = ..., ports: _Optional[int] = ..., constraints: _Optional[_Iterable[str]] = ..., pack_by: _Optional[str] = ..., checkpoint_store: _Optional[str] = ..., name: _Optional[str] = ..., pids_max: _Optional[int] = ..., after: _Optional[_Iterable[_Union[Dependency, _Mapping]]] = ..., after_any_of: _Optional[bool] = ..., keep_if_unsatisfiable: _Optional[bool] = ..., image: _Optional[str] = ..., mounts: _Optional[_Iterable[str]] = ..., workdir: _Optional[str] = ...) -> None: ...

class Dependency(_message.Message):
    __slots__ = ("id", "when")
    ID_FIELD_NUMBER: _ClassVar[int]
    WHEN_FIELD_NUMBER: _ClassVar[int]
    id: int
    when: str
    def __init__(self, id: _Optional[int] = ..., when: _Optional[str] = ...) -> None: ...

class CheckpointManifest(_message.Message):
    __slots__ = ("seq", "epoch", "attempt", "saved_at_ms", "step", "bytes", "sha256", "writer", "store", "key")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SAVED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    seq: int
    epoch: int
    attempt: int
    saved_at_ms: int
    step: int
    bytes: int
    sha256: bytes
    writer: str
    store: str
    key: str
    def __init__(self, seq: _Optional[int] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., saved_at_ms: _Optional[int] = ..., step: _Optional[int] = ..., bytes: _Optional[int] = ..., sha256: _Optional[bytes] = ..., writer: _Optional[str] = ..., store: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("index", "status", "node_id", "attempts", "reservation_epoch", "reserved_at_ms", "started_at_ms", "finished_at_ms", "exit_code", "preemption_epoch", "checkpoint_bytes", "checkpoint_epoch", "last_node_id", "runs", "watchdog_trips", "last_watchdog", "borrowed_from", "checkpoints")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESERVED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    WATCHDOG_TRIPS_FIELD_NUMBER: _ClassVar[int]
    LAST_WATCHDOG_FIELD_NUMBER: _ClassVar[int]
    BORROWED_FROM_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    status: TaskStatus
    node_id: str
    attempts: int
    reservation_epoch: int
    reserved_at_ms: int
    started_at_ms: int
    finished_at_ms: int
    exit_code: int
    preemption_epoch: int
    checkpoint_bytes: int
    checkpoint_epoch: int
    last_node_id: str
    runs: int
    watchdog_trips: int
    last_watchdog: str
    borrowed_from: str
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointManifest]
    def __init__(self, index: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., node_id: _Optional[str] = ..., attempts: _Optional[int] = ..., reservation_epoch: _Optional[int] = ..., reserved_at_ms: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., finished_at_ms: _Optional[int] = ..., exit_code: _Optional[int] = ..., preemption_epoch: _Optional[int] = ..., checkpoint_bytes: _Optional[int] = ..., checkpoint_epoch: _Optional[int] = ..., last_node_id: _Optional[str] = ..., runs: _Optional[int] = ..., watchdog_trips: _Optional[int] = ..., last_watchdog: _Optional[str] = ..., borrowed_from: _Optional[str] = ..., checkpoints: _Optional[_Iterable[_Union[CheckpointManifest, _Mapping]]] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("id", "spec", "submit_time_ms", "status", "reservation_epoch", "tasks", "finished_at_ms", "preemption_epoch", "teardown", "preempted_count", "nomination", "ports", "secret_names", "failures", "last_failure", "retry_after_ms", "failed_reason", "array_id", "array_index", "image_pull_failures", "compacted")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TEARDOWN_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_COUNT_FIELD_NUMBER: _ClassVar[int]
    NOMINATION_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    SECRET_NAMES_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    LAST_FAILURE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    FAILED_REASON_FIELD_NUMBER: _ClassVar[int]
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    ARRAY_INDEX_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PULL_FAILURES_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_FIELD_NUMBER: _ClassVar[int]
    id: int
    spec: AllocationSpec
    submit_time_ms: int
    status: AllocationStatus
    reservation_epoch: int
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    finished_at_ms: int
    preemption_epoch: int
    teardown: Teardown
    preempted_count: int
    nomination: Nomination
    ports: _containers.RepeatedScalarFieldContainer[int]
    secret_names: _containers.RepeatedScalarFieldContainer[str]
    failures: int
    last_failure: Failure
    retry_after_ms: int
    failed_reason: str
    array_id: int
    array_index: int
    image_pull_failures: int
    compacted: bool
    def __init__(self, id: _Optional[int] = ..., spec: _Optional[_Union[AllocationSpec, _Mapping]] = ..., submit_time_ms: _Optional[int] = ..., status: _Optional[_Union[AllocationStatus, str]] = ..., reservation_epoch: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., finished_at_ms: _Optional[int] = ..., preemption_epoch: _Optional[int] = ..., teardown: _Optional[_Union[Teardown, _Mapping]] = ..., preempted_count: _Optional[int] = ..., nomination: _Optional[_Union[Nomination, _Mapping]] = ..., ports: _Optional[_Iterable[int]] = ..., secret_names: _Optional[_Iterable[str]] = ..., failures: _Optional[int] = ..., last_failure: _Optional[_Union[Failure, _Mapping]] = ..., retry_after_ms: _Optional[int] = ..., failed_reason: _Optional[str] = ..., array_id: _Optional[int] = ..., array_index: _Optional[int] = ..., image_pull_failures: _Optional[int] = ..., compacted: _Optional[bool] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("task", "attempt", "exit_code", "not_started", "stderr_tail", "early", "at_ms", "oom_killed", "memory_limit_bytes", "peak_memory_bytes")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    NOT_STARTED_FIELD_NUMBER: _ClassVar[int]
    STDERR_TAIL_FIELD_NUMBER: _ClassVar[int]
    EARLY_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    OOM_KILLED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    task: int
    attempt: int
    exit_code: int
    not_started: bool
    stderr_tail: str
    early: bool
    at_ms: int
    oom_killed: bool
    memory_limit_bytes: int
    peak_memory_bytes: int
    def __init__(self, task: _Optional[int] = ..., attempt: _Optional[int] = ..., exit_code: _Optional[int] = ..., not_started: _Optional[bool] = ..., stderr_tail: _Optional[str] = ..., early: _Optional[bool] = ..., at_ms: _Optional[int] = ..., oom_killed: _Optional[bool] = ..., memory_limit_bytes: _Optional[int] = ..., peak_memory_bytes: _Optional[int] = ...) -> None: ...

class Teardown(_message.Message):
    __slots__ = ("epoch", "trigger", "started_at_ms", "preempted_by", "reason", "failed_checkpoints")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FAILED_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    trigger: int
    started_at_ms: int
    preempted_by: int
    reason: str
    failed_checkpoints: int
    def __init__(self, epoch: _Optional[int] = ..., trigger: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., preempted_by: _Optional[int] = ..., reason: _Optional[str] = ..., failed_checkpoints: _Optional[int] = ...) -> None: ...

class Nomination(_message.Message):
    __slots__ = ("node_ids", "waiting_for", "decided_at_ms", "expires_at_ms")
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    waiting_for: _containers.RepeatedScalarFieldContainer[int]
    decided_at_ms: int
    expires_at_ms: int
    def __init__(self, node_ids: _Optional[_Iterable[str]] = ..., waiting_for: _Optional[_Iterable[int]] = ..., decided_at_ms: _Optional[int] = ..., expires_at_ms: _Optional[int] = ...) -> None: ...

class NodeDrain(_message.Message):
    __slots__ = ("started_at_ms", "deadline_ms", "reason", "by")
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    started_at_ms: int
    deadline_ms: int
    reason: str
    by: str
    def __init__(self, started_at_ms: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., reason: _Optional[str] = ..., by: _Optional[str] = ...) -> None: ...

class NodeEvent(_message.Message):
    __slots__ = ("node_id", "revision", "time_ms", "kind", "detail", "status")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    revision: int
    time_ms: int
    kind: str
    detail: str
    status: NodeStatus
    def __init__(self, node_id: _Optional[str] = ..., revision: _Optional[int] = ..., time_ms: _Optional[int] = ..., kind: _Optional[str] = ..., detail: _Optional[str] = ..., status: _Optional[_Union[NodeStatus, str]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("id", "resources", "labels", "status", "used", "tasks", "registered_at_ms", "status_since_ms", "drain", "events", "revision", "reported_labels", "admin_labels", "admission", "images")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ReportedLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AdminLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    STATUS_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REPORTED_LABELS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_LABELS_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    id: str
    resources: Resources
    labels: _containers.ScalarMap[str, str]
    status: NodeStatus
    used: Resources
    tasks: int
    registered_at_ms: int
    status_since_ms: int
    drain: NodeDrain
    events: _containers.RepeatedCompositeFieldContainer[NodeEvent]
    revision: int
    reported_labels: _containers.ScalarMap[str, str]
    admin_labels: _containers.ScalarMap[str, str]
    admission: NodeAdmission
    images: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., status: _Optional[_Union[NodeStatus, str]] = ..., used: _Optional[_Union[Resources, _Mapping]] = ..., tasks: _Optional[int] = ..., registered_at_ms: _Optional[int] = ..., status_since_ms: _Optional[int] = ..., drain: _Optional[_Union[NodeDrain, _Mapping]] = ..., events: _Optional[_Iterable[_Union[NodeEvent, _Mapping]]] = ..., revision: _Optional[int] = ..., reported_labels: _Optional[_Mapping[str, str]] = ..., admin_labels: _Optional[_Mapping[str, str]] = ..., admission: _Optional[_Union[NodeAdmission, _Mapping]] = ..., images: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeAdmission(_message.Message):
    __slots__ = ("resources", "labels", "cert_sha256", "by", "at_ms")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CERT_SHA256_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    resources: Resources
    labels: _containers.ScalarMap[str, str]
    cert_sha256: str
    by: str
    at_ms: int
    def __init__(self, resources: _Optional[_Union[Resources, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., cert_sha256: _Optional[str] = ..., by: _Optional[str] = ..., at_ms: _Optional[int] = ...) -> None: ...

class AttemptUsage(_message.Message):
    __slots__ = ("peak_memory_bytes", "cpu_ms", "oom_kills", "memory_limit_bytes", "gpu_util_pct", "peak_gpu_memory_bytes")
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_MS_FIELD_NUMBER: _ClassVar[int]
    OOM_KILLS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_UTIL_PCT_FIELD_NUMBER: _ClassVar[int]
    PEAK_GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    peak_memory_bytes: int
    cpu_ms: int
    oom_kills: int
    memory_limit_bytes: int
    gpu_util_pct: int
    peak_gpu_memory_bytes: int
    def __init__(self, peak_memory_bytes: _Optional[int] = ..., cpu_ms: _Optional[int] = ..., oom_kills: _Optional[int] = ..., memory_limit_bytes: _Optional[int] = ..., gpu_util_pct: _Optional[int] = ..., peak_gpu_memory_bytes: _Optional[int] = ...) -> None: ...

class WaitSpan(_message.Message):
    __slots__ = ("since_ms", "duration_ms", "wait", "detail", "holders")
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    since_ms: int
    duration_ms: int
    wait: str
    detail: str
    holders: _containers.RepeatedCompositeFieldContainer[WaitHolder]
    def __init__(self, since_ms: _Optional[int] = ..., duration_ms: _Optional[int] = ..., wait: _Optional[str] = ..., detail: _Optional[str] = ..., holders: _Optional[_Iterable[_Union[WaitHolder, _Mapping]]] = ...) -> None: ...

class WaitHolder(_message.Message):
    __slots__ = ("id", "owner", "preemption_class")
    ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_CLASS_FIELD_NUMBER: _ClassVar[int]
    id: int
    owner: str
    preemption_class: int
    def __init__(self, id: _Optional[int] = ..., owner: _Optional[str] = ..., preemption_class: _Optional[int] = ...) -> None: ...

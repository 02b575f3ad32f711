from . import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FetchCheckpoint(_message.Message):
    __slots__ = ("key", "offset")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    key: str
    offset: int
    def __init__(self, key: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class CheckpointChunk(_message.Message):
    __slots__ = ("data", "total")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    total: int
    def __init__(self, data: _Optional[bytes] = ..., total: _Optional[int] = ...) -> None: ...

class TaskRef(_message.Message):
    __slots__ = ("alloc_id", "task_index", "epoch")
    ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    alloc_id: int
    task_index: int
    epoch: int
    def __init__(self, alloc_id: _Optional[int] = ..., task_index: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("register", "heartbeat", "claim", "exited", "log_data", "preempted", "checkpoint", "watchdog_tripped", "checkpoint_unusable", "checkpoints_deleted", "images_held")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    LOG_DATA_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    WATCHDOG_TRIPPED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_UNUSABLE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_DELETED_FIELD_NUMBER: _ClassVar[int]
    IMAGES_HELD_FIELD_NUMBER: _ClassVar[int]
    register: Register
    heartbeat: Heartbeat
    claim: Claim
    exited: TaskExited
    log_data: LogData
    preempted: Preempted
    checkpoint: CheckpointUpload
    watchdog_tripped: WatchdogTripped
    checkpoint_unusable: CheckpointUnusable
    checkpoints_deleted: CheckpointsDeleted
    images_held: ImagesHeld
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., claim: _Optional[_Union[Claim, _Mapping]] = ..., exited: _Optional[_Union[TaskExited, _Mapping]] = ..., log_data: _Optional[_Union[LogData, _Mapping]] = ..., preempted: _Optional[_Union[Preempted, _Mapping]] = ..., checkpoint: _Optional[_Union[CheckpointUpload, _Mapping]] = ..., watchdog_tripped: _Optional[_Union[WatchdogTripped, _Mapping]] = ..., checkpoint_unusable: _Optional[_Union[CheckpointUnusable, _Mapping]] = ..., checkpoints_deleted: _Optional[_Union[CheckpointsDeleted, _Mapping]] = ..., images_held: _Optional[_Union[ImagesHeld, _Mapping]] = ...) -> None: ...

class ImagesHeld(_message.Message):
    __slots__ = ("digests",)
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    digests: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, digests: _Optional[_Iterable[str]] = ...) -> None: ...

class ImagePull(_message.Message):
    __slots__ = ("task", "image", "done_bytes", "total_bytes", "elapsed_ms")
    TASK_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    DONE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    image: str
    done_bytes: int
    total_bytes: int
    elapsed_ms: int
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., image: _Optional[str] = ..., done_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., elapsed_ms: _Optional[int] = ...) -> None: ...

class PrefetchImage(_message.Message):
    __slots__ = ("image",)
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    image: str
    def __init__(self, image: _Optional[str] = ...) -> None: ...

class CheckpointsDeleted(_message.Message):
    __slots__ = ("seqs",)
    SEQS_FIELD_NUMBER: _ClassVar[int]
    seqs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, seqs: _Optional[_Iterable[int]] = ...) -> None: ...

class CheckpointUnusable(_message.Message):
    __slots__ = ("task", "checkpoint_epoch", "reason", "seq")
    TASK_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    checkpoint_epoch: int
    reason: str
    seq: int
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., checkpoint_epoch: _Optional[int] = ..., reason: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class WatchdogTripped(_message.Message):
    __slots__ = ("task", "kind", "detail", "usage")
    TASK_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    kind: str
    detail: str
    usage: _types_pb2.AttemptUsage
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., kind: _Optional[str] = ..., detail: _Optional[str] = ..., usage: _Optional[_Union[_types_pb2.AttemptUsage, _Mapping]] = ...) -> None: ...

class Preempted(_message.Message):
    __slots__ = ("task", "preemption_epoch", "exit_code", "signal", "checkpoint_failed", "usage")
    TASK_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FAILED_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    preemption_epoch: int
    exit_code: int
    signal: int
    checkpoint_failed: bool
    usage: _types_pb2.AttemptUsage
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., preemption_epoch: _Optional[int] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., checkpoint_failed: _Optional[bool] = ..., usage: _Optional[_Union[_types_pb2.AttemptUsage, _Mapping]] = ...) -> None: ...

class CheckpointUpload(_message.Message):
    __slots__ = ("task", "preemption_epoch", "manifest", "on_exit")
    TASK_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    ON_EXIT_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    preemption_epoch: int
    manifest: _types_pb2.CheckpointManifest
    on_exit: bool
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., preemption_epoch: _Optional[int] = ..., manifest: _Optional[_Union[_types_pb2.CheckpointManifest, _Mapping]] = ..., on_exit: _Optional[bool] = ...) -> None: ...

class LogData(_message.Message):
    __slots__ = ("request_id", "data", "eof", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    data: bytes
    eof: bool
    error: str
    def __init__(self, request_id: _Optional[int] = ..., data: _Optional[bytes] = ..., eof: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node_id", "resources", "labels", "version", "running", "address", "ports", "checkpoint_address")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    resources: _types_pb2.Resources
    labels: _containers.ScalarMap[str, str]
    version: str
    running: _containers.RepeatedCompositeFieldContainer[TaskRef]
    address: str
    ports: str
    checkpoint_address: str
    def __init__(self, node_id: _Optional[str] = ..., resources: _Optional[_Union[_types_pb2.Resources, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., version: _Optional[str] = ..., running: _Optional[_Iterable[_Union[TaskRef, _Mapping]]] = ..., address: _Optional[str] = ..., ports: _Optional[str] = ..., checkpoint_address: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("running", "pulls")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    PULLS_FIELD_NUMBER: _ClassVar[int]
    running: _containers.RepeatedCompositeFieldContainer[TaskRef]
    pulls: _containers.RepeatedCompositeFieldContainer[ImagePull]
    def __init__(self, running: _Optional[_Iterable[_Union[TaskRef, _Mapping]]] = ..., pulls: _Optional[_Iterable[_Union[ImagePull, _Mapping]]] = ...) -> None: ...

class Claim(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ...) -> None: ...

class TaskExited(_message.Message):
    __slots__ = ("task", "exit_code", "signal", "error", "stderr_tail", "usage", "image_pull_failed")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STDERR_TAIL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PULL_FAILED_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    exit_code: int
    signal: int
    error: str
    stderr_tail: str
    usage: _types_pb2.AttemptUsage
    image_pull_failed: bool
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., error: _Optional[str] = ..., stderr_tail: _Optional[str] = ..., usage: _Optional[_Union[_types_pb2.AttemptUsage, _Mapping]] = ..., image_pull_failed: _Optional[bool] = ...) -> None: ...

class SchedulerMessage(_message.Message):
    __slots__ = ("registered", "assign", "granted", "stop", "refused", "recorded", "fetch_logs", "preempt", "checkpoint_hint", "node_notice", "heartbeat_ack", "checkpoint_grants", "delete_checkpoints", "prefetch_image")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    FETCH_LOGS_FIELD_NUMBER: _ClassVar[int]
    PREEMPT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_HINT_FIELD_NUMBER: _ClassVar[int]
    NODE_NOTICE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_ACK_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_GRANTS_FIELD_NUMBER: _ClassVar[int]
    DELETE_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_IMAGE_FIELD_NUMBER: _ClassVar[int]
    registered: Registered
    assign: Assign
    granted: ClaimGranted
    stop: Stop
    refused: Refused
    recorded: Recorded
    fetch_logs: FetchLogs
    preempt: Preempt
    checkpoint_hint: CheckpointHint
    node_notice: NodeNotice
    heartbeat_ack: HeartbeatAck
    checkpoint_grants: CheckpointGrants
    delete_checkpoints: DeleteCheckpoints
    prefetch_image: PrefetchImage
    def __init__(self, registered: _Optional[_Union[Registered, _Mapping]] = ..., assign: _Optional[_Union[Assign, _Mapping]] = ..., granted: _Optional[_Union[ClaimGranted, _Mapping]] = ..., stop: _Optional[_Union[Stop, _Mapping]] = ..., refused: _Optional[_Union[Refused, _Mapping]] = ..., recorded: _Optional[_Union[Recorded, _Mapping]] = ..., fetch_logs: _Optional[_Union[FetchLogs, _Mapping]] = ..., preempt: _Optional[_Union[Preempt, _Mapping]] = ..., checkpoint_hint: _Optional[_Union[CheckpointHint, _Mapping]] = ..., node_notice: _Optional[_Union[NodeNotice, _Mapping]] = ..., heartbeat_ack: _Optional[_Union[HeartbeatAck, _Mapping]] = ..., checkpoint_grants: _Optional[_Union[CheckpointGrants, _Mapping]] = ..., delete_checkpoints: _Optional[_Union[DeleteCheckpoints, _Mapping]] = ..., prefetch_image: _Optional[_Union[PrefetchImage, _Mapping]] = ...) -> None: ...

class CheckpointGrants(_message.Message):
    __slots__ = ("grants",)
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    grants: _containers.RepeatedCompositeFieldContainer[CheckpointGrant]
    def __init__(self, grants: _Optional[_Iterable[_Union[CheckpointGrant, _Mapping]]] = ...) -> None: ...

class CheckpointGrant(_message.Message):
    __slots__ = ("seq", "key", "node")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    key: str
    node: str
    def __init__(self, seq: _Optional[int] = ..., key: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class DeleteCheckpoints(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[_types_pb2.CheckpointManifest]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[_types_pb2.CheckpointManifest, _Mapping]]] = ...) -> None: ...

class HeartbeatAck(_message.Message):
    __slots__ = ("reconnect_spread_ms",)
    RECONNECT_SPREAD_MS_FIELD_NUMBER: _ClassVar[int]
    reconnect_spread_ms: int
    def __init__(self, reconnect_spread_ms: _Optional[int] = ...) -> None: ...

class NodeNotice(_message.Message):
    __slots__ = ("status", "detail", "deadline_ms")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    status: _types_pb2.NodeStatus
    detail: str
    deadline_ms: int
    def __init__(self, status: _Optional[_Union[_types_pb2.NodeStatus, str]] = ..., detail: _Optional[str] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class CheckpointHint(_message.Message):
    __slots__ = ("task", "preemption_epoch", "timeout_ms", "max_deferral_ms", "grace_ms")
    TASK_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_DEFERRAL_MS_FIELD_NUMBER: _ClassVar[int]
    GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    preemption_epoch: int
    timeout_ms: int
    max_deferral_ms: int
    grace_ms: int
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., preemption_epoch: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., max_deferral_ms: _Optional[int] = ..., grace_ms: _Optional[int] = ...) -> None: ...

class Preempt(_message.Message):
    __slots__ = ("task", "preemption_epoch", "grace_ms")
    TASK_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    preemption_epoch: int
    grace_ms: int
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., preemption_epoch: _Optional[int] = ..., grace_ms: _Optional[int] = ...) -> None: ...

class FetchLogs(_message.Message):
    __slots__ = ("request_id", "alloc_id", "task_index", "attempt", "stderr", "offset", "max_bytes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    alloc_id: int
    task_index: int
    attempt: int
    stderr: bool
    offset: int
    max_bytes: int
    def __init__(self, request_id: _Optional[int] = ..., alloc_id: _Optional[int] = ..., task_index: _Optional[int] = ..., attempt: _Optional[int] = ..., stderr: _Optional[bool] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class Recorded(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("node_id", "heartbeat_interval_ms", "node_lost_after_ms", "reconnect_spread_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_LOST_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    RECONNECT_SPREAD_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    heartbeat_interval_ms: int
    node_lost_after_ms: int
    reconnect_spread_ms: int
    def __init__(self, node_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., node_lost_after_ms: _Optional[int] = ..., reconnect_spread_ms: _Optional[int] = ...) -> None: ...

class Assign(_message.Message):
    __slots__ = ("task", "gang_size", "command", "env", "peers", "gpus", "restore", "checkpoint_store", "max_checkpoint_bytes", "walltime_s", "stall_timeout_s", "checkpointing", "ports", "secret_env", "mem_mb", "cpus", "owner", "pids_max", "image", "mounts", "workdir")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SecretEnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_FIELD_NUMBER: _ClassVar[int]
    GANG_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STORE_FIELD_NUMBER: _ClassVar[int]
    MAX_CHECKPOINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    WALLTIME_S_FIELD_NUMBER: _ClassVar[int]
    STALL_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTING_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    SECRET_ENV_FIELD_NUMBER: _ClassVar[int]
    MEM_MB_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PIDS_MAX_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    gang_size: int
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    peers: _containers.RepeatedScalarFieldContainer[str]
    gpus: int
    restore: _containers.RepeatedCompositeFieldContainer[CheckpointRef]
    checkpoint_store: str
    max_checkpoint_bytes: int
    walltime_s: int
    stall_timeout_s: int
    checkpointing: bool
    ports: _containers.RepeatedScalarFieldContainer[int]
    secret_env: _containers.ScalarMap[str, str]
    mem_mb: int
    cpus: int
    owner: str
    pids_max: int
    image: str
    mounts: _containers.RepeatedScalarFieldContainer[str]
    workdir: str
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., gang_size: _Optional[int] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., peers: _Optional[_Iterable[str]] = ..., gpus: _Optional[int] = ..., restore: _Optional[_Iterable[_Union[CheckpointRef, _Mapping]]] = ..., checkpoint_store: _Optional[str] = ..., max_checkpoint_bytes: _Optional[int] = ..., walltime_s: _Optional[int] = ..., stall_timeout_s: _Optional[int] = ..., checkpointing: _Optional[bool] = ..., ports: _Optional[_Iterable[int]] = ..., secret_env: _Optional[_Mapping[str, str]] = ..., mem_mb: _Optional[int] = ..., cpus: _Optional[int] = ..., owner: _Optional[str] = ..., pids_max: _Optional[int] = ..., image: _Optional[str] = ..., mounts: _Optional[_Iterable[str]] = ..., workdir: _Optional[str] = ...) -> None: ...

class CheckpointRef(_message.Message):
    __slots__ = ("manifest", "source")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    manifest: _types_pb2.CheckpointManifest
    source: str
    def __init__(self, manifest: _Optional[_Union[_types_pb2.CheckpointManifest, _Mapping]] = ..., source: _Optional[str] = ...) -> None: ...

class ClaimGranted(_message.Message):
    __slots__ = ("task", "attempt")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    attempt: int
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., attempt: _Optional[int] = ...) -> None: ...

class Stop(_message.Message):
    __slots__ = ("task", "grace_ms", "reason")
    TASK_FIELD_NUMBER: _ClassVar[int]
    GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    grace_ms: int
    reason: str
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., grace_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Refused(_message.Message):
    __slots__ = ("task", "code", "message", "checkpoint")
    TASK_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    code: str
    message: str
    checkpoint: bool
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., checkpoint: _Optional[bool] = ...) -> None: ...

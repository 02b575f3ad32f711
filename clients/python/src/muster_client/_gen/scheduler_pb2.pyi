from . import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkflowStep(_message.Message):
    __slots__ = ("name", "spec", "array", "after", "after_corr")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    AFTER_CORR_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec: _types_pb2.AllocationSpec
    array: str
    after: _containers.RepeatedCompositeFieldContainer[StepDependency]
    after_corr: str
    def __init__(self, name: _Optional[str] = ..., spec: _Optional[_Union[_types_pb2.AllocationSpec, _Mapping]] = ..., array: _Optional[str] = ..., after: _Optional[_Iterable[_Union[StepDependency, _Mapping]]] = ..., after_corr: _Optional[str] = ...) -> None: ...

class StepDependency(_message.Message):
    __slots__ = ("step", "when")
    STEP_FIELD_NUMBER: _ClassVar[int]
    WHEN_FIELD_NUMBER: _ClassVar[int]
    step: str
    when: str
    def __init__(self, step: _Optional[str] = ..., when: _Optional[str] = ...) -> None: ...

class SubmitWorkflowRequest(_message.Message):
    __slots__ = ("name", "idempotency_key", "steps", "queue_if_unsatisfiable")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_IF_UNSATISFIABLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    idempotency_key: str
    steps: _containers.RepeatedCompositeFieldContainer[WorkflowStep]
    queue_if_unsatisfiable: bool
    def __init__(self, name: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[WorkflowStep, _Mapping]]] = ..., queue_if_unsatisfiable: _Optional[bool] = ...) -> None: ...

class WorkflowStepId(_message.Message):
    __slots__ = ("name", "id", "array", "status")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    name: str
    id: int
    array: bool
    status: str
    def __init__(self, name: _Optional[str] = ..., id: _Optional[int] = ..., array: _Optional[bool] = ..., status: _Optional[str] = ...) -> None: ...

class SubmitWorkflowResponse(_message.Message):
    __slots__ = ("id", "duplicate", "steps")
    ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    id: int
    duplicate: bool
    steps: _containers.RepeatedCompositeFieldContainer[WorkflowStepId]
    def __init__(self, id: _Optional[int] = ..., duplicate: _Optional[bool] = ..., steps: _Optional[_Iterable[_Union[WorkflowStepId, _Mapping]]] = ...) -> None: ...

class WorkflowInfo(_message.Message):
    __slots__ = ("id", "name", "owner", "steps", "submit_time_ms", "finished")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    owner: str
    steps: _containers.RepeatedCompositeFieldContainer[WorkflowStepId]
    submit_time_ms: int
    finished: bool
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., owner: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[WorkflowStepId, _Mapping]]] = ..., submit_time_ms: _Optional[int] = ..., finished: _Optional[bool] = ...) -> None: ...

class SetArrayThrottleRequest(_message.Message):
    __slots__ = ("id", "throttle")
    ID_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_FIELD_NUMBER: _ClassVar[int]
    id: int
    throttle: int
    def __init__(self, id: _Optional[int] = ..., throttle: _Optional[int] = ...) -> None: ...

class JobArray(_message.Message):
    __slots__ = ("id", "owner", "name", "indices", "throttle", "count", "pending", "by_status", "submit_time_ms", "finished", "status", "after_corr", "spec")
    class ByStatusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    BY_STATUS_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    AFTER_CORR_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    id: int
    owner: str
    name: str
    indices: str
    throttle: int
    count: int
    pending: int
    by_status: _containers.ScalarMap[str, int]
    submit_time_ms: int
    finished: bool
    status: str
    after_corr: int
    spec: _types_pb2.AllocationSpec
    def __init__(self, id: _Optional[int] = ..., owner: _Optional[str] = ..., name: _Optional[str] = ..., indices: _Optional[str] = ..., throttle: _Optional[int] = ..., count: _Optional[int] = ..., pending: _Optional[int] = ..., by_status: _Optional[_Mapping[str, int]] = ..., submit_time_ms: _Optional[int] = ..., finished: _Optional[bool] = ..., status: _Optional[str] = ..., after_corr: _Optional[int] = ..., spec: _Optional[_Union[_types_pb2.AllocationSpec, _Mapping]] = ...) -> None: ...

class LogsRequest(_message.Message):
    __slots__ = ("id", "task", "attempt", "stderr", "follow")
    ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    id: int
    task: int
    attempt: int
    stderr: bool
    follow: bool
    def __init__(self, id: _Optional[int] = ..., task: _Optional[int] = ..., attempt: _Optional[int] = ..., stderr: _Optional[bool] = ..., follow: _Optional[bool] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("id", "from_revision")
    ID_FIELD_NUMBER: _ClassVar[int]
    FROM_REVISION_FIELD_NUMBER: _ClassVar[int]
    id: int
    from_revision: int
    def __init__(self, id: _Optional[int] = ..., from_revision: _Optional[int] = ...) -> None: ...

class AllocationEvent(_message.Message):
    __slots__ = ("id", "revision", "time_ms", "kind", "detail", "status", "truncated")
    ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    id: int
    revision: int
    time_ms: int
    kind: str
    detail: str
    status: _types_pb2.AllocationStatus
    truncated: bool
    def __init__(self, id: _Optional[int] = ..., revision: _Optional[int] = ..., time_ms: _Optional[int] = ..., kind: _Optional[str] = ..., detail: _Optional[str] = ..., status: _Optional[_Union[_types_pb2.AllocationStatus, str]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class Explanation(_message.Message):
    __slots__ = ("id", "status", "summary", "classes", "preemption", "planned_start", "checkpoints", "pulls", "waits", "waits_dropped", "waited_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    PLANNED_START_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    PULLS_FIELD_NUMBER: _ClassVar[int]
    WAITS_FIELD_NUMBER: _ClassVar[int]
    WAITS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    WAITED_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    status: _types_pb2.AllocationStatus
    summary: str
    classes: _containers.RepeatedCompositeFieldContainer[NodeClassReason]
    preemption: PreemptionPlan
    planned_start: PlannedStart
    checkpoints: _containers.RepeatedScalarFieldContainer[str]
    pulls: _containers.RepeatedCompositeFieldContainer[ImagePullProgress]
    waits: _containers.RepeatedCompositeFieldContainer[_types_pb2.WaitSpan]
    waits_dropped: int
    waited_ms: int
    def __init__(self, id: _Optional[int] = ..., status: _Optional[_Union[_types_pb2.AllocationStatus, str]] = ..., summary: _Optional[str] = ..., classes: _Optional[_Iterable[_Union[NodeClassReason, _Mapping]]] = ..., preemption: _Optional[_Union[PreemptionPlan, _Mapping]] = ..., planned_start: _Optional[_Union[PlannedStart, _Mapping]] = ..., checkpoints: _Optional[_Iterable[str]] = ..., pulls: _Optional[_Iterable[_Union[ImagePullProgress, _Mapping]]] = ..., waits: _Optional[_Iterable[_Union[_types_pb2.WaitSpan, _Mapping]]] = ..., waits_dropped: _Optional[int] = ..., waited_ms: _Optional[int] = ...) -> None: ...

class ImagePullProgress(_message.Message):
    __slots__ = ("task", "node_id", "image", "done_bytes", "total_bytes", "elapsed_ms")
    TASK_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    DONE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    task: int
    node_id: str
    image: str
    done_bytes: int
    total_bytes: int
    elapsed_ms: int
    def __init__(self, task: _Optional[int] = ..., node_id: _Optional[str] = ..., image: _Optional[str] = ..., done_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., elapsed_ms: _Optional[int] = ...) -> None: ...

class PlannedStart(_message.Message):
    __slots__ = ("start_ms", "in_ms", "node_ids")
    START_MS_FIELD_NUMBER: _ClassVar[int]
    IN_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    start_ms: int
    in_ms: int
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, start_ms: _Optional[int] = ..., in_ms: _Optional[int] = ..., node_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PreemptionPlan(_message.Message):
    __slots__ = ("victims", "node_ids", "total_cost", "value", "reason")
    VICTIMS_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COST_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    victims: _containers.RepeatedCompositeFieldContainer[Victim]
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    total_cost: int
    value: int
    reason: str
    def __init__(self, victims: _Optional[_Iterable[_Union[Victim, _Mapping]]] = ..., node_ids: _Optional[_Iterable[str]] = ..., total_cost: _Optional[int] = ..., value: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Victim(_message.Message):
    __slots__ = ("id", "preemption_class", "gpus", "elapsed_s", "checkpoint_cost", "recompute_cost", "value_cost", "total_cost")
    ID_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_CLASS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_COST_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_COST_FIELD_NUMBER: _ClassVar[int]
    VALUE_COST_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COST_FIELD_NUMBER: _ClassVar[int]
    id: int
    preemption_class: int
    gpus: int
    elapsed_s: int
    checkpoint_cost: int
    recompute_cost: int
    value_cost: int
    total_cost: int
    def __init__(self, id: _Optional[int] = ..., preemption_class: _Optional[int] = ..., gpus: _Optional[int] = ..., elapsed_s: _Optional[int] = ..., checkpoint_cost: _Optional[int] = ..., recompute_cost: _Optional[int] = ..., value_cost: _Optional[int] = ..., total_cost: _Optional[int] = ...) -> None: ...

class NodeClassReason(_message.Message):
    __slots__ = ("nodes", "can_take_now", "reason")
    CLASS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    CAN_TAKE_NOW_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    can_take_now: int
    reason: str
    def __init__(self, nodes: _Optional[int] = ..., can_take_now: _Optional[int] = ..., reason: _Optional[str] = ..., **kwargs) -> None: ...

class PrefetchImageRequest(_message.Message):
    __slots__ = ("image", "constraints")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    image: str
    constraints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, image: _Optional[str] = ..., constraints: _Optional[_Iterable[str]] = ...) -> None: ...

class PrefetchImageResponse(_message.Message):
    __slots__ = ("image", "digest", "node_ids", "cached", "unreachable")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    image: str
    digest: str
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    cached: _containers.RepeatedScalarFieldContainer[str]
    unreachable: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, image: _Optional[str] = ..., digest: _Optional[str] = ..., node_ids: _Optional[_Iterable[str]] = ..., cached: _Optional[_Iterable[str]] = ..., unreachable: _Optional[_Iterable[str]] = ...) -> None: ...

class AdmitNodeRequest(_message.Message):
    __slots__ = ("id", "admission", "revoke")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    REVOKE_FIELD_NUMBER: _ClassVar[int]
    id: str
    admission: _types_pb2.NodeAdmission
    revoke: bool
    def __init__(self, id: _Optional[str] = ..., admission: _Optional[_Union[_types_pb2.NodeAdmission, _Mapping]] = ..., revoke: _Optional[bool] = ...) -> None: ...

class AdmitNodeResponse(_message.Message):
    __slots__ = ("id", "admission")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    id: str
    admission: _types_pb2.NodeAdmission
    def __init__(self, id: _Optional[str] = ..., admission: _Optional[_Union[_types_pb2.NodeAdmission, _Mapping]] = ...) -> None: ...

class LabelNodeRequest(_message.Message):
    __slots__ = ("id", "set", "remove")
    class SetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    id: str
    set: _containers.ScalarMap[str, str]
    remove: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., set: _Optional[_Mapping[str, str]] = ..., remove: _Optional[_Iterable[str]] = ...) -> None: ...

class LabelNodeResponse(_message.Message):
    __slots__ = ("id", "admin_labels", "labels", "registered")
    class AdminLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    ADMIN_LABELS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    id: str
    admin_labels: _containers.ScalarMap[str, str]
    labels: _containers.ScalarMap[str, str]
    registered: bool
    def __init__(self, id: _Optional[str] = ..., admin_labels: _Optional[_Mapping[str, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., registered: _Optional[bool] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("id", "timeout_ms", "reason", "by")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    id: str
    timeout_ms: int
    reason: str
    by: str
    def __init__(self, id: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., reason: _Optional[str] = ..., by: _Optional[str] = ...) -> None: ...

class NodeActionRequest(_message.Message):
    __slots__ = ("id", "reason", "by")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    by: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ..., by: _Optional[str] = ...) -> None: ...

class ScaleDownRequest(_message.Message):
    __slots__ = ("count", "dry_run", "timeout_ms", "reason", "by", "selector")
    class SelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    count: int
    dry_run: bool
    timeout_ms: int
    reason: str
    by: str
    selector: _containers.ScalarMap[str, str]
    def __init__(self, count: _Optional[int] = ..., dry_run: _Optional[bool] = ..., timeout_ms: _Optional[int] = ..., reason: _Optional[str] = ..., by: _Optional[str] = ..., selector: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ScaleDownChoice(_message.Message):
    __slots__ = ("id", "idle", "tasks", "gpus_used", "drained", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    GPUS_USED_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    idle: bool
    tasks: int
    gpus_used: int
    drained: bool
    error: str
    def __init__(self, id: _Optional[str] = ..., idle: _Optional[bool] = ..., tasks: _Optional[int] = ..., gpus_used: _Optional[int] = ..., drained: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class ScaleDownResponse(_message.Message):
    __slots__ = ("chosen", "short_by")
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    SHORT_BY_FIELD_NUMBER: _ClassVar[int]
    chosen: _containers.RepeatedCompositeFieldContainer[ScaleDownChoice]
    short_by: int
    def __init__(self, chosen: _Optional[_Iterable[_Union[ScaleDownChoice, _Mapping]]] = ..., short_by: _Optional[int] = ...) -> None: ...

class WatchNodesRequest(_message.Message):
    __slots__ = ("id", "from_revision")
    ID_FIELD_NUMBER: _ClassVar[int]
    FROM_REVISION_FIELD_NUMBER: _ClassVar[int]
    id: str
    from_revision: int
    def __init__(self, id: _Optional[str] = ..., from_revision: _Optional[int] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "next_page_token")
    NODES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[_types_pb2.Node]
    next_page_token: str
    def __init__(self, nodes: _Optional[_Iterable[_Union[_types_pb2.Node, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("id", "indices")
    ID_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    id: int
    indices: str
    def __init__(self, id: _Optional[int] = ..., indices: _Optional[str] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("spec", "dry_run", "secrets", "queue_if_unsatisfiable", "array", "after_corr")
    class SecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SPEC_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_IF_UNSATISFIABLE_FIELD_NUMBER: _ClassVar[int]
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    AFTER_CORR_FIELD_NUMBER: _ClassVar[int]
    spec: _types_pb2.AllocationSpec
    dry_run: bool
    secrets: _containers.ScalarMap[str, str]
    queue_if_unsatisfiable: bool
    array: str
    after_corr: int
    def __init__(self, spec: _Optional[_Union[_types_pb2.AllocationSpec, _Mapping]] = ..., dry_run: _Optional[bool] = ..., secrets: _Optional[_Mapping[str, str]] = ..., queue_if_unsatisfiable: _Optional[bool] = ..., array: _Optional[str] = ..., after_corr: _Optional[int] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("id", "duplicate", "plan", "array_count")
    ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ARRAY_COUNT_FIELD_NUMBER: _ClassVar[int]
    id: int
    duplicate: bool
    plan: Explanation
    array_count: int
    def __init__(self, id: _Optional[int] = ..., duplicate: _Optional[bool] = ..., plan: _Optional[_Union[Explanation, _Mapping]] = ..., array_count: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("status", "owner", "preemption_class", "page_size", "page_token", "expand")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_CLASS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPAND_FIELD_NUMBER: _ClassVar[int]
    status: _types_pb2.AllocationStatus
    owner: str
    preemption_class: int
    page_size: int
    page_token: int
    expand: bool
    def __init__(self, status: _Optional[_Union[_types_pb2.AllocationStatus, str]] = ..., owner: _Optional[str] = ..., preemption_class: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[int] = ..., expand: _Optional[bool] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("allocations", "next_page_token", "arrays")
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ARRAYS_FIELD_NUMBER: _ClassVar[int]
    allocations: _containers.RepeatedCompositeFieldContainer[_types_pb2.Allocation]
    next_page_token: int
    arrays: _containers.RepeatedCompositeFieldContainer[JobArray]
    def __init__(self, allocations: _Optional[_Iterable[_Union[_types_pb2.Allocation, _Mapping]]] = ..., next_page_token: _Optional[int] = ..., arrays: _Optional[_Iterable[_Union[JobArray, _Mapping]]] = ...) -> None: ...

class CheckpointSettings(_message.Message):
    __slots__ = ("store", "keep", "max_bytes", "retired", "abandoned")
    STORE_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_FIELD_NUMBER: _ClassVar[int]
    store: str
    keep: int
    max_bytes: int
    retired: int
    abandoned: int
    def __init__(self, store: _Optional[str] = ..., keep: _Optional[int] = ..., max_bytes: _Optional[int] = ..., retired: _Optional[int] = ..., abandoned: _Optional[int] = ...) -> None: ...

class VClusterSpec(_message.Message):
    __slots__ = ("type", "home_labels", "home_nodes", "max_gpus", "max_nodes", "max_allocations", "borrow_limit_pct", "over_quota", "checkpoint_store", "max_checkpoint_bytes")
    class HomeLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TYPE_FIELD_NUMBER: _ClassVar[int]
    HOME_LABELS_FIELD_NUMBER: _ClassVar[int]
    HOME_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_GPUS_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    BORROW_LIMIT_PCT_FIELD_NUMBER: _ClassVar[int]
    OVER_QUOTA_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STORE_FIELD_NUMBER: _ClassVar[int]
    MAX_CHECKPOINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    type: str
    home_labels: _containers.ScalarMap[str, str]
    home_nodes: _containers.RepeatedScalarFieldContainer[str]
    max_gpus: int
    max_nodes: int
    max_allocations: int
    borrow_limit_pct: int
    over_quota: str
    checkpoint_store: str
    max_checkpoint_bytes: int
    def __init__(self, type: _Optional[str] = ..., home_labels: _Optional[_Mapping[str, str]] = ..., home_nodes: _Optional[_Iterable[str]] = ..., max_gpus: _Optional[int] = ..., max_nodes: _Optional[int] = ..., max_allocations: _Optional[int] = ..., borrow_limit_pct: _Optional[int] = ..., over_quota: _Optional[str] = ..., checkpoint_store: _Optional[str] = ..., max_checkpoint_bytes: _Optional[int] = ...) -> None: ...

class VCluster(_message.Message):
    __slots__ = ("name", "spec", "created_ms", "updated_ms", "updated_by", "revision", "home_node_ids")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    HOME_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec: VClusterSpec
    created_ms: int
    updated_ms: int
    updated_by: str
    revision: int
    home_node_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., spec: _Optional[_Union[VClusterSpec, _Mapping]] = ..., created_ms: _Optional[int] = ..., updated_ms: _Optional[int] = ..., updated_by: _Optional[str] = ..., revision: _Optional[int] = ..., home_node_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class VClusterRequest(_message.Message):
    __slots__ = ("name", "spec")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec: VClusterSpec
    def __init__(self, name: _Optional[str] = ..., spec: _Optional[_Union[VClusterSpec, _Mapping]] = ...) -> None: ...

class GetVClusterRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListVClustersRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListVClustersResponse(_message.Message):
    __slots__ = ("vclusters", "next_page_token")
    VCLUSTERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    vclusters: _containers.RepeatedCompositeFieldContainer[VCluster]
    next_page_token: str
    def __init__(self, vclusters: _Optional[_Iterable[_Union[VCluster, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class BackupRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BackupChunk(_message.Message):
    __slots__ = ("data", "index", "state_digest", "total_bytes")
    DATA_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    index: int
    state_digest: str
    total_bytes: int
    def __init__(self, data: _Optional[bytes] = ..., index: _Optional[int] = ..., state_digest: _Optional[str] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("role", "name", "ttl_s")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    role: str
    name: str
    ttl_s: int
    def __init__(self, role: _Optional[str] = ..., name: _Optional[str] = ..., ttl_s: _Optional[int] = ...) -> None: ...

class CreateTokenResponse(_message.Message):
    __slots__ = ("token", "secret")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    token: TokenInfo
    secret: str
    def __init__(self, token: _Optional[_Union[TokenInfo, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class TokenInfo(_message.Message):
    __slots__ = ("id", "name", "role", "created_ms", "expires_ms", "created_by", "revoked_ms", "revoked_by")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    REVOKED_MS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_BY_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    role: str
    created_ms: int
    expires_ms: int
    created_by: str
    revoked_ms: int
    revoked_by: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., role: _Optional[str] = ..., created_ms: _Optional[int] = ..., expires_ms: _Optional[int] = ..., created_by: _Optional[str] = ..., revoked_ms: _Optional[int] = ..., revoked_by: _Optional[str] = ...) -> None: ...

class ListTokensResponse(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[TokenInfo]
    def __init__(self, tokens: _Optional[_Iterable[_Union[TokenInfo, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Member(_message.Message):
    __slots__ = ("id", "address", "voter")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    VOTER_FIELD_NUMBER: _ClassVar[int]
    id: int
    address: str
    voter: bool
    def __init__(self, id: _Optional[int] = ..., address: _Optional[str] = ..., voter: _Optional[bool] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("id", "address", "role", "term", "leader_id", "leader_address", "applied_index", "last_log_index", "state_digest", "snapshot_index", "members")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    id: int
    address: str
    role: str
    term: int
    leader_id: int
    leader_address: str
    applied_index: int
    last_log_index: int
    state_digest: str
    snapshot_index: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, id: _Optional[int] = ..., address: _Optional[str] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader_id: _Optional[int] = ..., leader_address: _Optional[str] = ..., applied_index: _Optional[int] = ..., last_log_index: _Optional[int] = ..., state_digest: _Optional[str] = ..., snapshot_index: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class AddLearnerRequest(_message.Message):
    __slots__ = ("id", "address")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    id: int
    address: str
    def __init__(self, id: _Optional[int] = ..., address: _Optional[str] = ...) -> None: ...

class ChangeMembershipRequest(_message.Message):
    __slots__ = ("promote", "remove")
    PROMOTE_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    promote: _containers.RepeatedScalarFieldContainer[int]
    remove: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, promote: _Optional[_Iterable[int]] = ..., remove: _Optional[_Iterable[int]] = ...) -> None: ...

class MembershipResponse(_message.Message):
    __slots__ = ("members", "log_index")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    log_index: int
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., log_index: _Optional[int] = ...) -> None: ...

from . import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HistoryQuery(_message.Message):
    __slots__ = ("id", "owner", "vcluster", "status", "since_ms", "until_ms", "after_seq", "limit", "array_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    VCLUSTER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    owner: str
    vcluster: str
    status: _types_pb2.AllocationStatus
    since_ms: int
    until_ms: int
    after_seq: int
    limit: int
    array_id: int
    def __init__(self, id: _Optional[int] = ..., owner: _Optional[str] = ..., vcluster: _Optional[str] = ..., status: _Optional[_Union[_types_pb2.AllocationStatus, str]] = ..., since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ..., after_seq: _Optional[int] = ..., limit: _Optional[int] = ..., array_id: _Optional[int] = ...) -> None: ...

class HistoryAttempt(_message.Message):
    __slots__ = ("task", "attempt", "node_id", "start_ms", "end_ms", "outcome", "exit_code", "gpu_seconds", "preempted", "watchdog", "usage")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_FIELD_NUMBER: _ClassVar[int]
    WATCHDOG_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    task: int
    attempt: int
    node_id: str
    start_ms: int
    end_ms: int
    outcome: str
    exit_code: int
    gpu_seconds: int
    preempted: bool
    watchdog: str
    usage: _types_pb2.AttemptUsage
    def __init__(self, task: _Optional[int] = ..., attempt: _Optional[int] = ..., node_id: _Optional[str] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., outcome: _Optional[str] = ..., exit_code: _Optional[int] = ..., gpu_seconds: _Optional[int] = ..., preempted: _Optional[bool] = ..., watchdog: _Optional[str] = ..., usage: _Optional[_Union[_types_pb2.AttemptUsage, _Mapping]] = ...) -> None: ...

class HistoryRecord(_message.Message):
    __slots__ = ("seq", "id", "owner", "vcluster", "preemption_class", "priority", "gang_size", "resources", "command", "submit_time_ms", "start_time_ms", "end_time_ms", "status", "reason", "preemptions", "watchdog_trips", "gpu_seconds", "attempts", "idempotency_key", "array_id", "array_index", "waits", "waits_dropped")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    VCLUSTER_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_CLASS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    GANG_SIZE_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    START_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    END_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    WATCHDOG_TRIPS_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    ARRAY_INDEX_FIELD_NUMBER: _ClassVar[int]
    WAITS_FIELD_NUMBER: _ClassVar[int]
    WAITS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    id: int
    owner: str
    vcluster: str
    preemption_class: int
    priority: int
    gang_size: int
    resources: _types_pb2.Resources
    command: _containers.RepeatedScalarFieldContainer[str]
    submit_time_ms: int
    start_time_ms: int
    end_time_ms: int
    status: _types_pb2.AllocationStatus
    reason: str
    preemptions: int
    watchdog_trips: int
    gpu_seconds: int
    attempts: _containers.RepeatedCompositeFieldContainer[HistoryAttempt]
    idempotency_key: str
    array_id: int
    array_index: int
    waits: _containers.RepeatedCompositeFieldContainer[_types_pb2.WaitSpan]
    waits_dropped: int
    def __init__(self, seq: _Optional[int] = ..., id: _Optional[int] = ..., owner: _Optional[str] = ..., vcluster: _Optional[str] = ..., preemption_class: _Optional[int] = ..., priority: _Optional[int] = ..., gang_size: _Optional[int] = ..., resources: _Optional[_Union[_types_pb2.Resources, _Mapping]] = ..., command: _Optional[_Iterable[str]] = ..., submit_time_ms: _Optional[int] = ..., start_time_ms: _Optional[int] = ..., end_time_ms: _Optional[int] = ..., status: _Optional[_Union[_types_pb2.AllocationStatus, str]] = ..., reason: _Optional[str] = ..., preemptions: _Optional[int] = ..., watchdog_trips: _Optional[int] = ..., gpu_seconds: _Optional[int] = ..., attempts: _Optional[_Iterable[_Union[HistoryAttempt, _Mapping]]] = ..., idempotency_key: _Optional[str] = ..., array_id: _Optional[int] = ..., array_index: _Optional[int] = ..., waits: _Optional[_Iterable[_Union[_types_pb2.WaitSpan, _Mapping]]] = ..., waits_dropped: _Optional[int] = ...) -> None: ...

class HistoryPage(_message.Message):
    __slots__ = ("records", "next_after_seq", "stored", "missing")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[HistoryRecord]
    next_after_seq: int
    stored: int
    missing: int
    def __init__(self, records: _Optional[_Iterable[_Union[HistoryRecord, _Mapping]]] = ..., next_after_seq: _Optional[int] = ..., stored: _Optional[int] = ..., missing: _Optional[int] = ...) -> None: ...

class UsageQuery(_message.Message):
    __slots__ = ("since_ms", "until_ms", "group_by", "page_size", "page_token")
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    since_ms: int
    until_ms: int
    group_by: str
    page_size: int
    page_token: str
    def __init__(self, since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ..., group_by: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class UsageRow(_message.Message):
    __slots__ = ("owner", "vcluster", "array_id", "jobs", "done", "failed", "cancelled", "gpu_seconds", "cpu_ms", "peak_memory_bytes", "oom_killed")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    VCLUSTER_FIELD_NUMBER: _ClassVar[int]
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_MS_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    OOM_KILLED_FIELD_NUMBER: _ClassVar[int]
    owner: str
    vcluster: str
    array_id: int
    jobs: int
    done: int
    failed: int
    cancelled: int
    gpu_seconds: int
    cpu_ms: int
    peak_memory_bytes: int
    oom_killed: int
    def __init__(self, owner: _Optional[str] = ..., vcluster: _Optional[str] = ..., array_id: _Optional[int] = ..., jobs: _Optional[int] = ..., done: _Optional[int] = ..., failed: _Optional[int] = ..., cancelled: _Optional[int] = ..., gpu_seconds: _Optional[int] = ..., cpu_ms: _Optional[int] = ..., peak_memory_bytes: _Optional[int] = ..., oom_killed: _Optional[int] = ...) -> None: ...

class UsageReport(_message.Message):
    __slots__ = ("rows", "since_ms", "until_ms", "missing", "next_page_token")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[UsageRow]
    since_ms: int
    until_ms: int
    missing: int
    next_page_token: str
    def __init__(self, rows: _Optional[_Iterable[_Union[UsageRow, _Mapping]]] = ..., since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ..., missing: _Optional[int] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class FetchRecordsRequest(_message.Message):
    __slots__ = ("first", "last")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class FetchRecordsResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: bytes
    def __init__(self, records: _Optional[bytes] = ...) -> None: ...

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class PreVoteRequest(_message.Message):
    __slots__ = ("candidate", "last_log_term", "last_log_index")
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    candidate: int
    last_log_term: int
    last_log_index: int
    def __init__(self, candidate: _Optional[int] = ..., last_log_term: _Optional[int] = ..., last_log_index: _Optional[int] = ...) -> None: ...

class PreVoteResponse(_message.Message):
    __slots__ = ("granted", "reason")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    reason: str
    def __init__(self, granted: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class FollowRequest(_message.Message):
    __slots__ = ("follower_id",)
    FOLLOWER_ID_FIELD_NUMBER: _ClassVar[int]
    follower_id: int
    def __init__(self, follower_id: _Optional[int] = ...) -> None: ...

class FollowEvent(_message.Message):
    __slots__ = ("replica_id",)
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    def __init__(self, replica_id: _Optional[int] = ...) -> None: ...

class RaftPayload(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

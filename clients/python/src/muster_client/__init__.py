"""Python client of Muster, the Raft-replicated GPU batch scheduler.

    from muster_client import Client

    with Client("127.0.0.1:7001,127.0.0.1:7002", tls_dir="/path/to/tls") as c:
        r = c.submit(["sh", "-c", "echo hi"], gang_size=4, gpus=1, preemption_class=5)
        for event in c.watch(r.id):
            print(event.revision, event.kind, event.detail)

The protobuf messages and gRPC stubs generated from proto/proto/muster/v1
are in ``muster_client.pb`` (scheduler.proto), ``muster_client.types_pb``
(types.proto), ``muster_client.history_pb`` (history.proto: the job
history, each attempt's outcome and usage) and ``muster_client.pb_grpc``
(the stubs).
"""

from ._errors import MusterError
from ._gen import history_pb2 as history_pb
from ._gen import scheduler_pb2 as pb
from ._gen import scheduler_pb2_grpc as pb_grpc
from ._gen import types_pb2 as types_pb
from ._spec import Step, SubmitResult, WorkflowResult
from .client import (
    DEFAULT_TIMEOUT,
    LEADER_ADDR_HEADER,
    LEADER_ID_HEADER,
    TERMINAL_EVENTS,
    Client,
    allocation_status_name,
    node_status_name,
    parse_addresses,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TIMEOUT",
    "LEADER_ADDR_HEADER",
    "LEADER_ID_HEADER",
    "TERMINAL_EVENTS",
    "Client",
    "MusterError",
    "Step",
    "SubmitResult",
    "WorkflowResult",
    "allocation_status_name",
    "node_status_name",
    "history_pb",
    "parse_addresses",
    "pb",
    "pb_grpc",
    "types_pb",
]

"""The one exception a call to the cluster raises."""

from __future__ import annotations

import grpc

# gRPC codes as the Rust CLI words them (cli/src/client.rs describe()).
_WORDS: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid argument",
    grpc.StatusCode.NOT_FOUND: "not found",
    grpc.StatusCode.ALREADY_EXISTS: "already exists",
    grpc.StatusCode.FAILED_PRECONDITION: "refused",
    grpc.StatusCode.PERMISSION_DENIED: "permission denied",
    grpc.StatusCode.UNAUTHENTICATED: "unauthenticated",
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "timed out",
    grpc.StatusCode.ABORTED: "aborted",
}


class MusterError(Exception):
    """A call failed: the gRPC status code and the server's message.

    ``code`` is a :class:`grpc.StatusCode`; ``message`` the status message
    (for INVALID_ARGUMENT it names the field, e.g. ``invalid spec.gang_size:
    must be at least 1``); ``address`` the replica that answered, when one did.
    """

    code: grpc.StatusCode
    message: str
    address: str | None

    def __init__(self, code: grpc.StatusCode, message: str, address: str | None = None) -> None:
        self.code = code
        self.message = message
        self.address = address
        super().__init__(f"{_WORDS.get(code, code.name.lower())}: {message}")

    @classmethod
    def from_rpc(cls, err: grpc.RpcError, address: str | None = None) -> MusterError:
        """Wraps a failed call's status."""
        code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = err.details() if isinstance(err, grpc.Call) else str(err)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "", address)

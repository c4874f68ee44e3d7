"""The front doors' error codes and what each is in HTTP and in gRPC: the wire's codes
(:data:`cis.runtime.wire.ERROR_CODES`) and the doors' own (``not_found``, ``unauthenticated``, ``not_ready``,
``timeout``, ``method_not_allowed``). See docs/runtime.md, *Open Inference Protocol*."""

from __future__ import annotations

# error code -> HTTP status (the wire's codes and the door's own)
HTTP_STATUS: dict[str, int] = {
    "bad_message": 400,
    "bad_version": 400,
    "unknown_kind": 400,
    "bad_tensor": 400,
    "bad_stage": 400,
    "bad_input": 400,
    "too_many_samples": 400,
    "too_large": 413,
    "overloaded": 503,
    "shutting_down": 503,
    "not_ready": 503,
    "deadline_exceeded": 504,
    "internal": 500,
    "not_found": 404,
    "unauthenticated": 401,
    "timeout": 408,
    "method_not_allowed": 405,
    # the update kinds' codes (docs/runtime.md, *Updating a model*): a door request names no bundle and sends no
    # update, so these only pass through when a node answers a load or a carry with them
    "bundle_mismatch": 409,
    "bad_bundle": 400,
    "busy": 503,
}
# error code -> the name of a grpc.StatusCode (grpc is imported by the gRPC door only)
GRPC_STATUS: dict[str, str] = {
    **{code: "INVALID_ARGUMENT" for code, status in HTTP_STATUS.items() if status == 400},
    "too_large": "RESOURCE_EXHAUSTED",
    "overloaded": "UNAVAILABLE",
    "shutting_down": "UNAVAILABLE",
    "not_ready": "UNAVAILABLE",
    "deadline_exceeded": "DEADLINE_EXCEEDED",
    "internal": "INTERNAL",
    "not_found": "NOT_FOUND",
    "unauthenticated": "UNAUTHENTICATED",
    "timeout": "DEADLINE_EXCEEDED",
    "method_not_allowed": "UNIMPLEMENTED",
    "bundle_mismatch": "FAILED_PRECONDITION",
    "busy": "UNAVAILABLE",
}


class OipError(Exception):
    """A request the door refuses: ``code`` (see :data:`HTTP_STATUS`), one line saying what was expected, and the
    request's ``id`` when it was read."""

    def __init__(self, code: str, message: str, req_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.req_id = code, message, req_id

    @property
    def status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

"""API errors and their bodies: OpenAI's {"error": {...}} and Anthropic's {"type": "error", ...}.

Routes raise APIError; app.py renders it in the shape of the API the path belongs to.
"""
from __future__ import annotations

from typing import Any, Optional

from fastapi.responses import JSONResponse

# status -> (OpenAI error type, Anthropic error type)
_TYPES = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("authentication_error", "authentication_error"),
    403: ("permission_error", "permission_error"),
    404: ("not_found_error", "not_found_error"),
    405: ("invalid_request_error", "invalid_request_error"),
    408: ("invalid_request_error", "invalid_request_error"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_error"),
    500: ("internal_server_error", "api_error"),
    503: ("service_unavailable", "overloaded_error"),
}


class APIError(Exception):
    """An error to send to the client.

    Args:
        status: HTTP status.
        message: human-readable; says what was wrong and, where it helps, the limits.
        param: the offending request field (OpenAI's `param`), if any.
        code: OpenAI's `code` (e.g. "model_not_found"); defaults to None.
    """

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def bad_request(message: str, param: Optional[str] = None) -> APIError:
    return APIError(400, message, param)


def internal_error_message(request_id: str) -> str:
    """A 500's whole message: what went wrong stays in the server log, under this id."""
    return f"Internal server error (request id {request_id}); the server log has the details."


def is_anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_body(path: str, status: int, message: str, param: Optional[str] = None,
               code: Optional[str] = None) -> dict[str, Any]:
    oa_type, an_type = _TYPES.get(status, ("internal_server_error" if status >= 500 else "invalid_request_error",
                                           "api_error" if status >= 500 else "invalid_request_error"))
    if is_anthropic_path(path):
        return {"type": "error", "error": {"type": an_type, "message": message}}
    return {"error": {"message": message, "type": oa_type, "param": param, "code": code}}


def error_response(path: str, status: int, message: str, param: Optional[str] = None,
                   code: Optional[str] = None, headers: Optional[dict] = None) -> JSONResponse:
    return JSONResponse(error_body(path, status, message, param, code), status_code=status, headers=headers)


def api_error_response(path: str, e: APIError) -> JSONResponse:
    return error_response(path, e.status, e.message, e.param, e.code)


def param_of_value_error(message: str, fields: tuple[str, ...]) -> Optional[str]:
    """SamplingParams messages start with the field name ("top_p must be in (0, 1], ...", or a dotted path into it:
    "structured_outputs.json (xgrammar): ...")."""
    first = message.split(" ", 1)[0].strip(":,.").split(".")[0]
    return first if first in fields else None

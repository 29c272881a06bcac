"""The server's refusals: an HTTP status and OpenAI's error object, in kern's own words."""

from __future__ import annotations

import math

from ..errors import KernError


class RequestError(KernError):
    """A request the server refuses: the HTTP status and the OpenAI error object's fields."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class HugeInt:
    """A JSON integer of more digits than Python converts (sys.get_int_max_str_digits): refused
    by the field that holds it, not as unparsable JSON."""

    def __init__(self, digits: str):
        self.digits = len(digits.lstrip("-"))


def kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, HugeInt):
        return f"an integer of {v.digits} digits"
    if isinstance(v, float):
        return "a number" if math.isfinite(v) else str(v).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"

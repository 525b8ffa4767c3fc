"""Structured JSON logging with resource keys, and redaction so no secret reaches a log line.

Use ``log = get_logger(__name__)`` then ``log.info("created runner", namespace=ns, name=name)``.
Every record is one JSON object per line on stderr: time, level, logger, msg, and the keyword
fields. Fields whose key looks like a credential are replaced by ``"[redacted]"``, and any
string value registered with :func:`register_secret` is masked wherever it appears.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

import msgspec

_SECRET_KEY_PARTS = ("token", "password", "secret", "private_key", "privatekey", "authorization", "jit", "credential")
_secrets: set[str] = set()
_secrets_lock = threading.Lock()
_encoder = msgspec.json.Encoder()


def register_secret(value: str | None) -> None:
    """Mask ``value`` in every later log line (tokens learnt at run time, e.g. from an exchange)."""
    if value and len(value) >= 6:
        with _secrets_lock:
            _secrets.add(value)


def redact_text(text: str) -> str:
    with _secrets_lock:
        secrets = tuple(_secrets)
    for s in secrets:
        if s in text:
            text = text.replace(s, "[redacted]")
    return text


def _is_secret_key(key: str) -> bool:
    k = key.lower()
    return any(part in k for part in _SECRET_KEY_PARTS) and not k.endswith(("_name", "_ref", "_id", "_expires_at"))


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {str(k): ("[redacted]" if _is_secret_key(str(k)) else _clean(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return redact_text(str(value))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact_text(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if fields:
            for k, v in fields.items():
                doc[k] = "[redacted]" if _is_secret_key(k) else _clean(v)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            doc["error"] = redact_text(f"{type(exc).__name__}: {exc}")
        return _encoder.encode(doc).decode()


class StructLogger:
    """A thin keyword-argument front for a stdlib logger."""

    __slots__ = ("_bound", "_logger")

    def __init__(self, logger: logging.Logger, bound: dict[str, Any] | None = None) -> None:
        self._logger = logger
        self._bound = bound or {}

    def bind(self, **fields: Any) -> StructLogger:
        return StructLogger(self._logger, {**self._bound, **fields})

    def _log(self, level: int, msg: str, exc_info: bool, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, msg, exc_info=exc_info, extra={"fields": {**self._bound, **fields}})

    def debug(self, msg: str, **fields: Any) -> None:
        self._log(logging.DEBUG, msg, False, fields)

    def info(self, msg: str, **fields: Any) -> None:
        self._log(logging.INFO, msg, False, fields)

    def warning(self, msg: str, **fields: Any) -> None:
        self._log(logging.WARNING, msg, False, fields)

    def error(self, msg: str, *, exc_info: bool = False, **fields: Any) -> None:
        self._log(logging.ERROR, msg, exc_info, fields)

    def exception(self, msg: str, **fields: Any) -> None:
        self._log(logging.ERROR, msg, True, fields)


def get_logger(name: str, **bound: Any) -> StructLogger:
    return StructLogger(logging.getLogger(name), bound)


def configure_logging(level: str = "info", stream: Any = None) -> None:
    """Install the JSON formatter on the root logger (idempotent)."""
    root = logging.getLogger()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.handlers[:] = [handler]
    root.setLevel(level.upper())

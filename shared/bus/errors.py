"""The bus's one error hierarchy: every failure a bus caller can see is a :class:`BusError`.

Callers catch ``BusError`` at the process boundary (log it, exit non-zero at start-up, or retry
later); the subclasses say which promise was broken. Messages never include credentials or
payload bodies, only names, subjects, sequences and settings keys.
"""

from __future__ import annotations

from shared.settings import SettingsError  # re-exported: a bad setting is not a bus failure
from shared.shards import NotOwner  # re-exported: neither is a lost lease (whichever backend held it)

__all__ = [
    "BusConfigConflict",
    "BusError",
    "BusUnavailable",
    "InvalidResourceName",
    "MalformedMessage",
    "NotOwner",
    "OutboxFull",
    "PublishFailed",
    "SettingsError",
    "UnknownSchemaVersion",
]


class BusError(Exception):
    """Base of every error raised by ``shared.bus``."""


class BusUnavailable(BusError):
    """NATS could not be reached (at start-up, within the connect deadline)."""


class BusConfigConflict(BusError):
    """A stream, consumer or bucket already exists with a configuration we must not silently change."""

    def __init__(self, resource: str, differences: dict[str, tuple[object, object]] | str) -> None:
        self.resource = resource
        self.differences = differences
        if isinstance(differences, str):
            detail = differences
        else:
            detail = "; ".join(f"{k}: existing={old!r} wanted={new!r}" for k, (old, new) in sorted(differences.items()))
        super().__init__(
            f"{resource} exists with a conflicting configuration ({detail}); "
            "fix it by hand (nats stream edit / nats kv) or align the settings"
        )


class InvalidResourceName(BusError, ValueError):
    """A resource name cannot be turned into a subject token (empty) or a token does not decode."""


class MalformedMessage(BusError):
    """Bytes on a subject do not decode into the message type that subject carries."""

    def __init__(self, subject: str, problem: str) -> None:
        self.subject = subject
        self.problem = problem
        super().__init__(f"malformed message on {subject}: {problem}")


class UnknownSchemaVersion(BusError):
    """A message declares a ``schemaVersion`` this build does not understand."""

    def __init__(self, subject: str, version: object) -> None:
        self.subject = subject
        self.version = version
        super().__init__(f"unknown schemaVersion {version!r} on {subject}")


class PublishFailed(BusError):
    """JetStream did not acknowledge a publish before the deadline (NATS down or stream missing)."""

    def __init__(self, subject: str, attempts: int, cause: str) -> None:
        self.subject = subject
        self.attempts = attempts
        super().__init__(f"publish to {subject} not acknowledged after {attempts} attempts: {cause}")


class OutboxFull(BusError):
    """The in-memory outbox is at capacity: the caller must slow down or fail, never drop silently."""

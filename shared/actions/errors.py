"""The one error hierarchy of the Actions client boundary.

Callers branch on the class, never on message text. Every error that came from an HTTP exchange
names the request (method and path, never the query string, which may carry tokens) and the
service's diagnostic ids (``ActivityId``, ``X-GitHub-Request-Id``), so an operator can quote them
to GitHub support. Texts pass through the log redactor: a token learnt at run time can never
appear in ``str(error)``.

    ActionsError
    ├── ClientConfigError         a client setting is unusable (root CA, proxy, timeouts)
    │   └── ConfigURLError        the config URL is not a repo/org/enterprise URL
    ├── CredentialsError          the credentials given are unusable before any request
    ├── ProtocolError             garbled or unexpected response (wrong status, bad JSON, schema)
    │   ├── EmptyQueueUrlError    a session came back without a usable messageQueueUrl
    │   └── MessageDecodeError    a bad message envelope or job message (shared.actions.messages)
    ├── TransportError            no response: connection failure or deadline, after retries
    │   └── DeadlineExceededError the call's deadline ran out
    └── ActionsHTTPError          the service answered with an error status
        ├── AuthenticationError       401/403 from GitHub REST: bad PAT, App or scope
        ├── TokenExpiredError         401 from the Actions service after a fresh admin token
        │   └── MessageQueueTokenExpiredError  401 on the queue after one session refresh
        ├── SessionConflictError      409: the scale set already has an active session
        ├── SessionNotFoundError      404 on a session refresh / the queue: the session is gone
        ├── ScaleSetNotFoundError     404 RunnerScaleSetNotFoundException
        ├── ScaleSetExistsError       RunnerScaleSetExistsException (create with a taken name)
        ├── MessageNotFoundError      MessageNotFoundException (ack of an unknown message)
        ├── RunnerGroupNotFoundError  runner group lookup found nothing
        ├── RunnerExistsError         AgentExistsException (JIT config for a taken name)
        ├── RunnerNotFoundError       AgentNotFoundException
        ├── JobStillRunningError      JobStillRunningException (remove a busy runner)
        ├── RateLimitedError          429 after the retries (``retry_after`` when known)
        └── ServiceUnavailableError   5xx after the retries
"""

from __future__ import annotations

from shared.log import redact_text

__all__ = [
    "ActionsError",
    "ActionsHTTPError",
    "AuthenticationError",
    "ClientConfigError",
    "ConfigURLError",
    "CredentialsError",
    "DeadlineExceededError",
    "EmptyQueueUrlError",
    "JobStillRunningError",
    "MessageNotFoundError",
    "MessageQueueTokenExpiredError",
    "ProtocolError",
    "RateLimitedError",
    "RunnerExistsError",
    "RunnerGroupNotFoundError",
    "RunnerNotFoundError",
    "ScaleSetExistsError",
    "ScaleSetNotFoundError",
    "ServiceUnavailableError",
    "SessionConflictError",
    "SessionNotFoundError",
    "TokenExpiredError",
    "TransportError",
]

# Error bodies are quoted in messages for diagnosis; cap them so a HTML error page stays readable.
_MAX_BODY_CHARS = 500


class ActionsError(Exception):
    """Base of every error raised by ``shared.actions``.

    ``request`` is ``"METHOD /path"`` (no query string), empty for errors raised before any
    request. The message is redacted on construction.
    """

    def __init__(self, message: str, *, request: str = "") -> None:
        self.request = request
        text = f"{message} ({request})" if request else message
        super().__init__(redact_text(text))


class ClientConfigError(ActionsError, ValueError):
    """A client setting is unusable before any request: a bad root CA bundle, proxy URL or deadline."""


class ConfigURLError(ClientConfigError):
    """The GitHub config URL is not ``https://host/org``, ``/org/repo`` or ``/enterprises/ent``."""


class CredentialsError(ActionsError, ValueError):
    """The credentials are incomplete or malformed (e.g. a private key that is not RSA PEM)."""


class ProtocolError(ActionsError):
    """The service answered, but not as the protocol says: unexpected status, bad JSON, bad shape."""


class EmptyQueueUrlError(ProtocolError):
    """A session response had an empty or unusable ``messageQueueUrl`` (seen in a degraded service)."""


class TransportError(ActionsError):
    """No usable response: connection refused or reset, TLS failure, after the retries."""


class DeadlineExceededError(TransportError):
    """The call's deadline (all attempts and waits included) ran out."""


class ActionsHTTPError(ActionsError):
    """The service answered with an error status.

    Carries what the service said: ``status``, ``type_name`` (the .NET exception name from a
    JSON error body, assembly qualification included), ``service_message`` and the diagnostic
    ids ``activity_id`` / ``github_request_id``.
    """

    def __init__(
        self,
        message: str,
        *,
        request: str = "",
        status: int = 0,
        type_name: str = "",
        service_message: str = "",
        activity_id: str = "",
        github_request_id: str = "",
    ) -> None:
        self.status = status
        self.type_name = type_name
        self.service_message = redact_text(service_message[:_MAX_BODY_CHARS])
        self.activity_id = activity_id
        self.github_request_id = github_request_id
        parts = [f"status={status}"]
        if type_name:
            parts.append(f"type={_short_type_name(type_name)}")
        if activity_id:
            parts.append(f"activity_id={activity_id}")
        if github_request_id:
            parts.append(f"github_request_id={github_request_id}")
        detail = f": {self.service_message}" if self.service_message else ""
        super().__init__(f"{message} [{', '.join(parts)}]{detail}", request=request)


class AuthenticationError(ActionsHTTPError):
    """GitHub REST refused the credentials (401/403): wrong PAT or App, missing permission or scope."""


class TokenExpiredError(ActionsHTTPError):
    """The Actions service answered 401 even after the admin token was refreshed."""


class MessageQueueTokenExpiredError(TokenExpiredError):
    """The message queue answered 401 again after one session refresh."""


class SessionConflictError(ActionsHTTPError):
    """409 ``RunnerScaleSetSessionConflictException``: another listener (or a dead one not yet
    expired server-side) holds the scale set's session. Back off and retry."""


class SessionNotFoundError(ActionsHTTPError):
    """404 on session refresh or on the queue: the service lost or evicted the session."""


class ScaleSetNotFoundError(ActionsHTTPError):
    """404 ``RunnerScaleSetNotFoundException``: the scale set was deleted (or never existed)."""


class ScaleSetExistsError(ActionsHTTPError):
    """Create found a scale set of this name in the runner group (e.g. our own earlier attempt
    that was acted on but answered 5xx): look it up by name. The name of the service's
    exception is an assumption (README "Actions service client", Assumptions); a 409 on create maps here too."""


class MessageNotFoundError(ActionsHTTPError):
    """``MessageNotFoundException``: the message to acknowledge is unknown (already acked)."""


class RunnerGroupNotFoundError(ActionsHTTPError):
    """The runner group lookup by name found no group."""


class RunnerExistsError(ActionsHTTPError):
    """``AgentExistsException``: a runner with this name is already registered."""


class RunnerNotFoundError(ActionsHTTPError):
    """``AgentNotFoundException``: no runner with this id; treat as already gone."""


class JobStillRunningError(ActionsHTTPError):
    """``JobStillRunningException``: the runner is busy; retry the removal later."""


class RateLimitedError(ActionsHTTPError):
    """429 after the retries ran out. ``retry_after`` (seconds) is the server's last hint, if any."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: object) -> None:
        self.retry_after = retry_after
        super().__init__(message, **kwargs)  # type: ignore[arg-type]


class ServiceUnavailableError(ActionsHTTPError):
    """A 5xx (other than 501) after the retries ran out."""


def _short_type_name(type_name: str) -> str:
    """``GitHub.Actions.X.FooException, GitHub.Actions.X`` → ``FooException`` for readable texts."""
    return type_name.split(",", 1)[0].rsplit(".", 1)[-1].strip()

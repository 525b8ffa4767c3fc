"""``ActionsClient``: the GitHub Actions runner scale set service, as the listener and workers use it.

One client per (config URL, credentials). It owns the auth chain (App JWT → installation token →
registration token → Actions service URL and admin token), refreshes the admin token 60 s before
it expires (a failed refresh keeps the old one), retries per the reference policy inside a
per-call deadline, and maps error responses to :mod:`shared.actions.errors`.

The message-queue calls (``get_message``, ``delete_message``, ``acquire_jobs``) take the session
explicitly and raise :class:`MessageQueueTokenExpiredError` on 401 without refreshing;
:class:`shared.actions.session.MessageSessionClient` adds the refresh-and-retry-once.
"""

from __future__ import annotations

import datetime as dt
import socket
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Final, TypeVar
from urllib.parse import urlencode

import anyio
import msgspec
from yarl import URL

from shared.actions.auth import (
    AppCredentials,
    Credentials,
    PersonalAccessToken,
    app_jwt,
    jwt_expiry,
    needs_refresh,
)
from shared.actions.config import ConfigScope, GitHubConfig, parse_config_url
from shared.actions.errors import (
    ActionsHTTPError,
    ClientConfigError,
    CredentialsError,
    DeadlineExceededError,
    EmptyQueueUrlError,
    MessageNotFoundError,
    MessageQueueTokenExpiredError,
    ProtocolError,
    RunnerGroupNotFoundError,
    RunnerNotFoundError,
    ScaleSetExistsError,
    ScaleSetNotFoundError,
    SessionConflictError,
    SessionNotFoundError,
)
from shared.actions.http import (
    HttpResponse,
    HttpTransport,
    Surface,
    build_ssl_context,
    classify_error,
    describe_request,
)
from shared.actions.messages import Message, decode_message
from shared.actions.models import (
    DEFAULT_RUNNER_GROUP_ID,
    DEFAULT_RUNNER_GROUP_NAME,
    AcquirableJob,
    AcquiredJobs,
    ActionsServiceAdmin,
    JitRunnerConfig,
    JitRunnerRequest,
    Label,
    ListEnvelope,
    MessageSession,
    RegistrationExchange,
    RunnerGroup,
    RunnerReference,
    RunnerScaleSet,
    RunnerScaleSetRequest,
    RunnerSetting,
    SessionRequest,
    TokenResponse,
)
from shared.actions.retry import RetryPolicy
from shared.log import get_logger, register_secret
from shared.version import version as _package_version

__all__ = ["API_VERSION", "ActionsClient", "ClientSettings", "SystemInfo", "scale_set_labels"]

log = get_logger(__name__)

API_VERSION: Final = "6.0-preview"
MAX_CAPACITY_LIMIT: Final = 2**31 - 1
_T = TypeVar("_T")


class SystemInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Sent as the User-Agent: a compact JSON document, key order as the reference client."""

    system: str = "runnerscale"
    version: str = msgspec.field(default_factory=_package_version)
    commit_sha: str = "NA"
    scale_set_id: int = 0
    subsystem: str = "runnerscale"
    build_version: str = msgspec.field(default_factory=_package_version)
    build_commit_sha: str = "unknown"
    kind: str = "scaleset"

    def user_agent(self) -> str:
        return msgspec.json.encode(self).decode()


class ClientSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Timeouts (seconds) and retry knobs.

    ``deadline`` bounds one call: every attempt, backoff and ``Retry-After`` wait. The long poll
    gets ``poll_timeout`` per attempt (it must exceed the service's ~50 s hold) and
    ``deadline + poll_timeout`` in total.
    """

    request_timeout: float = 30.0
    poll_timeout: float = 70.0
    deadline: float = 120.0
    retry: RetryPolicy = RetryPolicy()
    # Refresh the admin token when it expires within this many seconds (the reference: 60).
    token_refresh_margin: float = 60.0

    def __post_init__(self) -> None:
        for name in ("request_timeout", "poll_timeout", "deadline"):
            if not getattr(self, name) > 0:
                raise ClientConfigError(f"{name} must be > 0 seconds")


def scale_set_labels(name: str, extra: Sequence[str] = ()) -> list[Label]:
    """ARC's label rule: the scale set name first, then the extra labels, duplicates removed."""
    seen: list[str] = []
    for label in (name, *extra):
        if label and label not in seen:
            seen.append(label)
    return [Label(name=label) for label in seen]


class _AdminAuth(msgspec.Struct, frozen=True):
    url: URL
    token: str
    expires_at: dt.datetime


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _owner_name() -> str:
    try:
        return socket.gethostname() or str(uuid.uuid4())
    except OSError:
        return str(uuid.uuid4())


class ActionsClient:
    """Async client of one scale-set scope. Use as ``async with ActionsClient.from_config(...)``."""

    def __init__(
        self,
        config: GitHubConfig,
        credentials: Credentials,
        *,
        settings: ClientSettings | None = None,
        proxy: str | None = None,
        root_ca: str | bytes | None = None,
        insecure_skip_verify: bool = False,
        system_info: SystemInfo | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(credentials, (PersonalAccessToken, AppCredentials)):
            raise CredentialsError("credentials must be PersonalAccessToken or AppCredentials")
        if isinstance(credentials, AppCredentials) and config.scope is ConfigScope.ENTERPRISE:
            raise CredentialsError("enterprise scope cannot use a GitHub App: use a classic PAT (github_token)")
        if proxy is not None and (URL(proxy).scheme not in ("http", "https") or not URL(proxy).host):
            raise ClientConfigError("proxy must be an http:// or https:// URL")
        if proxy is not None:
            register_secret(URL(proxy).password)
        self.config = config
        self.settings = settings or ClientSettings()
        self._credentials = credentials
        self._system_info = system_info or SystemInfo()
        self._has_root_ca = bool(root_ca)
        self._transport = HttpTransport(
            ssl_context=build_ssl_context(root_ca, insecure_skip_verify=insecure_skip_verify),
            proxy=proxy,
            policy=self.settings.retry,
            user_agent=self._system_info.user_agent(),
            environ=environ,
        )
        self._admin: _AdminAuth | None = None
        self._admin_lock = anyio.Lock()
        self._installation_id = credentials.installation_id if isinstance(credentials, AppCredentials) else 0

    @classmethod
    def from_config(
        cls,
        config_url: str,
        credentials: Credentials,
        *,
        timeout: float | None = None,
        settings: ClientSettings | None = None,
        proxy: str | None = None,
        root_ca: str | bytes | None = None,
        insecure_skip_verify: bool = False,
        user_agent: SystemInfo | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ActionsClient:
        """Build a client for ``config_url`` (``https://github.com/org[/repo]``,
        ``.../enterprises/ent``, a GHE.com or GHES host). ``timeout`` overrides the per-call
        deadline; ``proxy`` overrides ``HTTPS_PROXY``/``NO_PROXY``; ``root_ca`` is PEM data added
        to the system roots. ``environ`` (default ``os.environ``) is where ``*_PROXY`` and
        ``GITHUB_ACTIONS_FORCE_GHES`` are read."""
        settings = settings or ClientSettings()
        if timeout is not None:
            settings = msgspec.structs.replace(settings, deadline=timeout)
        return cls(
            parse_config_url(config_url, environ),
            credentials,
            settings=settings,
            proxy=proxy,
            root_ca=root_ca,
            insecure_skip_verify=insecure_skip_verify,
            system_info=user_agent,
            environ=environ,
        )

    async def __aenter__(self) -> ActionsClient:
        await self._transport.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._transport.close()

    # ---- identity -------------------------------------------------------------------------

    @property
    def system_info(self) -> SystemInfo:
        return self._system_info

    def set_system_info(self, info: SystemInfo) -> None:
        """Replace the User-Agent document (e.g. once the scale set id is known)."""
        self._system_info = info
        self._transport.user_agent = info.user_agent()

    def debug_info(self) -> dict[str, Any]:
        return {
            "has_proxy": self._transport.has_proxy,
            "has_root_ca": self._has_root_ca,
            "system_info": self._system_info.user_agent(),
        }

    # ---- GitHub REST: the auth chain ---------------------------------------------------------

    def _rest_url(self, path: str) -> URL:
        return URL(self.config.api_base + path, encoded=True)

    async def _rest(
        self,
        method: str,
        path: str,
        *,
        authorization: str,
        content_type: str,
        body: bytes | None = None,
        expect: frozenset[int],
        extra_retry_statuses: frozenset[int] = frozenset(),
        what: str,
    ) -> HttpResponse:
        response = await self._transport.send(
            method,
            self._rest_url(path),
            headers={"Authorization": authorization, "Content-Type": content_type},
            body=body,
            attempt_timeout=self.settings.request_timeout,
            deadline=self.settings.deadline,
            extra_retry_statuses=extra_retry_statuses,
        )
        if response.status not in expect:
            if 200 <= response.status < 300:
                raise ProtocolError(f"{what}: unexpected status {response.status}", request=response.request)
            raise classify_error(response, surface=Surface.REST, what=what)
        return response

    async def _lookup_installation_id(self, credentials: AppCredentials, bearer: str) -> int:
        if self.config.scope is ConfigScope.REPOSITORY:
            path = f"/repos/{self.config.organization}/{self.config.repository}/installation"
        else:
            path = f"/orgs/{self.config.organization}/installation"
        response = await self._rest(
            "GET",
            path,
            authorization=f"Bearer {bearer}",
            content_type="application/vnd.github+json",
            expect=frozenset({200}),
            what="GitHub App installation lookup",
        )
        installation = _decode(response, _Installation)
        return installation.id

    async def _access_token(self) -> str:
        """PAT, or a fresh installation token (not cached: minted per admin-token refresh)."""
        credentials = self._credentials
        if isinstance(credentials, PersonalAccessToken):
            return credentials.token
        bearer = app_jwt(credentials)
        if not self._installation_id:
            self._installation_id = await self._lookup_installation_id(credentials, bearer)
        response = await self._rest(
            "POST",
            f"/app/installations/{self._installation_id}/access_tokens",
            authorization=f"Bearer {bearer}",
            content_type="application/vnd.github+json",
            expect=frozenset({201}),
            what="GitHub App installation token",
        )
        token = _decode(response, TokenResponse).token
        register_secret(token)
        if not token:
            raise ProtocolError("installation token response has an empty token", request=response.request)
        return token

    async def _registration_token(self, access_token: str) -> str:
        response = await self._rest(
            "POST",
            self.config.registration_token_path,
            authorization=f"Bearer {access_token}",
            content_type="application/vnd.github.v3+json",
            expect=frozenset({201}),
            what="runner registration token",
        )
        token = _decode(response, TokenResponse).token
        register_secret(token)
        if not token:
            raise ProtocolError("registration token response has an empty token", request=response.request)
        return token

    async def _exchange(self, registration_token: str) -> _AdminAuth:
        body = msgspec.json.encode(RegistrationExchange(url=self.config.url)) + b"\n"
        response = await self._rest(
            "POST",
            "/actions/runner-registration",
            authorization=f"RemoteAuth {registration_token}",
            content_type="application/json",
            body=body,
            expect=frozenset(range(200, 300)),
            # The reference retries this exchange on 401/403 too (propagation delay of a new token).
            extra_retry_statuses=frozenset({401, 403}),
            what="Actions service registration",
        )
        admin = _decode(response, ActionsServiceAdmin)
        register_secret(admin.token)
        if not admin.url or not admin.token:
            raise ProtocolError("Actions service registration returned an empty url or token", request=response.request)
        url = URL(admin.url, encoded=True)
        if url.scheme not in ("http", "https") or not url.host:
            raise ProtocolError("Actions service registration returned an invalid url", request=response.request)
        expires_at = jwt_expiry(admin.token)
        if expires_at is None:
            raise ProtocolError("Actions service admin token is not a JWT with exp", request=response.request)
        return _AdminAuth(url=url, token=admin.token, expires_at=expires_at)

    async def refresh_admin_token(self, *, force: bool = False) -> None:
        """Run the auth chain if the admin token is missing or expires within the margin
        (always, with ``force``). On failure the previous URL and token stay in place."""
        await self._ensure_admin(replacing=self._admin if force else None)

    async def _ensure_admin(self, *, replacing: _AdminAuth | None = None) -> _AdminAuth:
        """The current admin auth, refreshed first if stale or if it is ``replacing`` (a token the
        service just rejected). Serialised, so concurrent callers refresh once."""
        async with self._admin_lock:
            current = self._admin
            if (
                current is not None
                and current is not replacing
                and not needs_refresh(current.expires_at, now=_now(), margin=self.settings.token_refresh_margin)
            ):
                return current
            access = await self._access_token()
            registration = await self._registration_token(access)
            fresh = await self._exchange(registration)
            self._admin = fresh
            log.info(
                "actions admin token refreshed",
                config_url=self.config.url,
                actions_host=fresh.url.host,
                expires_at=fresh.expires_at.isoformat(),
            )
            return fresh

    @property
    def admin_token_expires_at(self) -> dt.datetime | None:
        return self._admin.expires_at if self._admin else None

    # ---- Actions service (admin token) -----------------------------------------------------

    def _admin_url(self, base: URL, path: str, query: Mapping[str, str | int] | None = None) -> URL:
        # URL path-join: base path (trailing slash or not) + relative path, trailing slash kept.
        joined = base.raw_path.rstrip("/") + "/" + path.lstrip("/")
        params: dict[str, str | int] = dict(query or {})
        params.setdefault("api-version", API_VERSION)
        return base.with_path(joined, encoded=True).with_query(None).update_query(urlencode(params))

    async def _admin_call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int] | None = None,
        body: bytes | None = None,
        expect: int | tuple[int, ...],
        what: str,
        status_errors: Mapping[int, type[ActionsHTTPError]] | None = None,
        bearer: str | None = None,
    ) -> HttpResponse:
        """One Actions-service call. With ``bearer`` (the queue token, for acquirejobs) a 401 is
        the caller's to handle; with the admin token a 401 triggers one forced refresh and retry
        (beyond the reference, which only refreshes by expiry). One deadline covers it all,
        token refreshes included."""
        with anyio.move_on_after(self.settings.deadline):
            return await self._admin_call_within_deadline(
                method,
                path,
                query=query,
                body=body,
                expect=expect,
                what=what,
                status_errors=status_errors,
                bearer=bearer,
            )
        where = describe_request(method, self._admin_url(self._admin.url, path)) if self._admin else f"{method} {path}"
        raise DeadlineExceededError(f"{what}: deadline of {self.settings.deadline:g}s exceeded", request=where)

    async def _admin_call_within_deadline(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int] | None,
        body: bytes | None,
        expect: int | tuple[int, ...],
        what: str,
        status_errors: Mapping[int, type[ActionsHTTPError]] | None,
        bearer: str | None,
    ) -> HttpResponse:
        admin = await self._ensure_admin()
        for attempt in range(2):
            response = await self._transport.send(
                method,
                self._admin_url(admin.url, path, query),
                headers={
                    "Authorization": f"Bearer {bearer or admin.token}",
                    "Content-Type": "application/json",
                },
                body=body,
                attempt_timeout=self.settings.request_timeout,
                deadline=self.settings.deadline,
            )
            if response.status == expect or (isinstance(expect, tuple) and response.status in expect):
                return response
            if response.status == 401 and bearer is None and attempt == 0:
                log.info("actions service answered 401; refreshing the admin token", request=response.request)
                admin = await self._ensure_admin(replacing=admin)
                continue
            break
        if 200 <= response.status < 300:
            raise ProtocolError(
                f"{what}: unexpected status {response.status} (expected {expect})", request=response.request
            )
        raise classify_error(
            response, surface=Surface.QUEUE if bearer else Surface.ADMIN, what=what, status_errors=status_errors
        )

    async def get_runner_group_by_name(self, name: str) -> RunnerGroup:
        """A1. Raises :class:`RunnerGroupNotFoundError` when no group has this name."""
        response = await self._admin_call(
            "GET",
            "_apis/runtime/runnergroups/",
            query={"groupName": name},
            expect=200,
            what=f"get runner group {name!r}",
        )
        groups = _decode_list(response, RunnerGroup)
        if not groups:
            raise RunnerGroupNotFoundError(
                f"no runner group named {name!r}", request=response.request, status=response.status
            )
        if len(groups) > 1:
            raise ProtocolError(f"{len(groups)} runner groups named {name!r}", request=response.request)
        return groups[0]

    async def resolve_runner_group_id(self, name: str) -> int:
        """The default group (empty name or ``default``, any case) is id 1 without a lookup."""
        if not name or name.lower() == DEFAULT_RUNNER_GROUP_NAME:
            return DEFAULT_RUNNER_GROUP_ID
        return (await self.get_runner_group_by_name(name)).id

    async def get_scale_set_by_name(
        self, name: str, *, runner_group_id: int = DEFAULT_RUNNER_GROUP_ID
    ) -> RunnerScaleSet | None:
        """A2. ``None`` when the group has no scale set of this name."""
        response = await self._admin_call(
            "GET",
            "_apis/runtime/runnerscalesets",
            query={"runnerGroupId": runner_group_id, "name": name},
            expect=200,
            what=f"get scale set {name!r}",
        )
        found = _decode_list(response, RunnerScaleSet)
        if len(found) > 1:
            raise ProtocolError(f"{len(found)} scale sets named {name!r}", request=response.request)
        return found[0] if found else None

    async def get_scale_set(self, scale_set_id: int) -> RunnerScaleSet | None:
        """A3. ``None`` for a JSON ``null`` body; a 404 raises :class:`ScaleSetNotFoundError`."""
        response = await self._admin_call(
            "GET",
            f"_apis/runtime/runnerscalesets/{int(scale_set_id)}",
            expect=200,
            what=f"get scale set {scale_set_id}",
            status_errors={404: ScaleSetNotFoundError},
        )
        # A 200 with "null" means no such scale set.
        found: RunnerScaleSet | None = _decode(response, RunnerScaleSet | None)  # type: ignore[arg-type]
        return found

    async def create_scale_set(
        self,
        name: str,
        *,
        runner_group_id: int = DEFAULT_RUNNER_GROUP_ID,
        labels: Sequence[str | Label] = (),
        disable_update: bool = True,
    ) -> RunnerScaleSet:
        """A4. Labels default to ``[name]``; a label without a type is ``System``."""
        if not name and not labels:
            raise ClientConfigError("create scale set: name and labels are both empty")
        label_list = [lb if isinstance(lb, Label) else Label(name=lb) for lb in labels] or [Label(name=name)]
        request = RunnerScaleSetRequest(
            name=name or msgspec.UNSET,
            runner_group_id=runner_group_id or msgspec.UNSET,
            labels=[Label(name=lb.name, type=lb.type or "System") for lb in label_list],
            runner_setting=RunnerSetting(disable_update=disable_update),
        )
        response = await self._admin_call(
            "POST",
            "_apis/runtime/runnerscalesets",
            body=msgspec.json.encode(request),
            expect=200,
            what=f"create scale set {name!r}",
            status_errors={409: ScaleSetExistsError},
        )
        return _decode(response, RunnerScaleSet)

    async def update_scale_set(
        self,
        scale_set_id: int,
        *,
        name: str | None = None,
        runner_group_id: int | None = None,
        labels: Sequence[str | Label] | None = None,
        disable_update: bool | None = None,
    ) -> RunnerScaleSet:
        """A5 partial update: only the fields given are sent."""
        request = RunnerScaleSetRequest(
            name=name if name else msgspec.UNSET,
            runner_group_id=runner_group_id if runner_group_id else msgspec.UNSET,
            labels=(
                [
                    Label(name=lb, type="System")
                    if isinstance(lb, str)
                    else Label(name=lb.name, type=lb.type or "System")
                    for lb in labels
                ]
                if labels
                else msgspec.UNSET
            ),
            runner_setting=RunnerSetting(disable_update=bool(disable_update)),
        )
        response = await self._admin_call(
            "PATCH",
            f"_apis/runtime/runnerscalesets/{int(scale_set_id)}",
            body=msgspec.json.encode(request),
            expect=200,
            what=f"update scale set {scale_set_id}",
            status_errors={404: ScaleSetNotFoundError},
        )
        return _decode(response, RunnerScaleSet)

    async def delete_scale_set(self, scale_set_id: int) -> None:
        """A6 (204). A 404 raises :class:`ScaleSetNotFoundError` (callers deleting treat it as done)."""
        await self._admin_call(
            "DELETE",
            f"_apis/runtime/runnerscalesets/{int(scale_set_id)}",
            expect=204,
            what=f"delete scale set {scale_set_id}",
            status_errors={404: ScaleSetNotFoundError},
        )

    async def generate_jit_config(
        self, scale_set_id: int, runner_name: str, *, work_folder: str = ""
    ) -> JitRunnerConfig:
        """A7. :class:`RunnerExistsError` when the name is taken; the config is a secret."""
        if not runner_name:
            raise ClientConfigError("generate JIT config: runner_name is empty")
        response = await self._admin_call(
            "POST",
            f"_apis/runtime/runnerscalesets/{int(scale_set_id)}/generatejitconfig",
            body=msgspec.json.encode(JitRunnerRequest(name=runner_name, work_folder=work_folder)),
            expect=200,
            what=f"generate JIT config for runner {runner_name!r}",
            status_errors={404: ScaleSetNotFoundError},
        )
        config = _decode(response, JitRunnerConfig)
        register_secret(config.encoded_jit_config)
        return config

    async def get_runner(self, runner_id: int) -> RunnerReference:
        """A8. :class:`RunnerNotFoundError` when no such runner."""
        response = await self._admin_call(
            "GET",
            f"_apis/distributedtask/pools/0/agents/{int(runner_id)}",
            expect=200,
            what=f"get runner {runner_id}",
            status_errors={404: RunnerNotFoundError},
        )
        return _decode(response, RunnerReference)

    async def get_runner_by_name(self, runner_name: str) -> RunnerReference | None:
        """A9. ``None`` when no runner has this name."""
        response = await self._admin_call(
            "GET",
            "_apis/distributedtask/pools/0/agents",
            query={"agentName": runner_name},
            expect=200,
            what=f"get runner {runner_name!r}",
        )
        found = _decode_list(response, RunnerReference)
        if len(found) > 1:
            raise ProtocolError(f"{len(found)} runners named {runner_name!r}", request=response.request)
        return found[0] if found else None

    async def remove_runner(self, runner_id: int) -> None:
        """A10 (204, also when the runner is already gone: removal is idempotent).
        :class:`JobStillRunningError` if busy; a 404 from an older service maps to
        :class:`RunnerNotFoundError`, which callers treat as "already gone"."""
        await self._admin_call(
            "DELETE",
            f"_apis/distributedtask/pools/0/agents/{int(runner_id)}",
            expect=204,
            what=f"remove runner {runner_id}",
            status_errors={404: RunnerNotFoundError},
        )

    async def get_acquirable_jobs(self, scale_set_id: int) -> list[AcquirableJob]:
        """J2 (legacy): 200 with a list, or 204 for none."""
        response = await self._admin_call(
            "GET",
            f"_apis/runtime/runnerscalesets/{int(scale_set_id)}/acquirablejobs",
            expect=(200, 204),
            what=f"get acquirable jobs of scale set {scale_set_id}",
            status_errors={404: ScaleSetNotFoundError},
        )
        return [] if response.status == 204 else _decode_list(response, AcquirableJob)

    # ---- message sessions (admin token) -----------------------------------------------------

    def _checked_session(self, response: HttpResponse) -> MessageSession:
        session = _decode(response, MessageSession)
        register_secret(session.message_queue_access_token)
        queue_url = URL(session.message_queue_url, encoded=True) if session.message_queue_url else None
        if queue_url is None or queue_url.scheme not in ("http", "https") or not queue_url.host:
            raise EmptyQueueUrlError(
                f"session {session.session_id} has no usable messageQueueUrl", request=response.request
            )
        if not session.message_queue_access_token:
            raise ProtocolError(
                f"session {session.session_id} has no messageQueueAccessToken", request=response.request
            )
        if session.statistics is None:
            raise ProtocolError(f"session {session.session_id} has no statistics", request=response.request)
        return session

    async def create_message_session(self, scale_set_id: int, owner_name: str | None = None) -> MessageSession:
        """S1. :class:`SessionConflictError` (409) while another session is live: back off and retry."""
        response = await self._admin_call(
            "POST",
            f"_apis/runtime/runnerscalesets/{int(scale_set_id)}/sessions",
            body=msgspec.json.encode(SessionRequest(owner_name=owner_name or _owner_name())),
            expect=200,
            what=f"create message session for scale set {scale_set_id}",
            status_errors={409: SessionConflictError, 404: ScaleSetNotFoundError},
        )
        return self._checked_session(response)

    async def refresh_message_session(self, scale_set_id: int, session_id: str) -> MessageSession:
        """S2: a new queue token (and possibly URL). :class:`SessionNotFoundError` if the service lost it."""
        response = await self._admin_call(
            "PATCH",
            f"_apis/runtime/runnerscalesets/{int(scale_set_id)}/sessions/{session_id}",
            expect=200,
            what=f"refresh message session {session_id}",
            status_errors={404: SessionNotFoundError},
        )
        return self._checked_session(response)

    async def delete_message_session(self, scale_set_id: int, session_id: str) -> None:
        """S3 (204). :class:`SessionNotFoundError` when already gone."""
        await self._admin_call(
            "DELETE",
            f"_apis/runtime/runnerscalesets/{int(scale_set_id)}/sessions/{session_id}",
            expect=204,
            what=f"delete message session {session_id}",
            status_errors={404: SessionNotFoundError},
        )

    # ---- message queue (session token) ------------------------------------------------------

    async def _queue_call(
        self,
        method: str,
        url: URL,
        session: MessageSession,
        *,
        headers: Mapping[str, str],
        expect: frozenset[int],
        what: str,
        attempt_timeout: float,
        deadline: float,
    ) -> HttpResponse:
        response = await self._transport.send(
            method,
            url,
            headers={"Authorization": f"Bearer {session.message_queue_access_token}", **headers},
            attempt_timeout=attempt_timeout,
            deadline=deadline,
        )
        if response.status in expect:
            return response
        if response.status == 401:
            raise classify_error(
                response, surface=Surface.QUEUE, what=what, status_errors={401: MessageQueueTokenExpiredError}
            )
        if 200 <= response.status < 300:
            raise ProtocolError(f"{what}: unexpected status {response.status}", request=response.request)
        raise classify_error(response, surface=Surface.QUEUE, what=what, status_errors={404: SessionNotFoundError})

    async def get_message(self, session: MessageSession, last_message_id: int, max_capacity: int) -> Message | None:
        """Q1 long poll. ``None`` when the service had nothing within its hold (202).

        ``max_capacity`` is sent as ``X-ScaleSetMaxCapacity`` (the scale set's max runners);
        ``last_message_id`` > 0 asks for messages after it.
        """
        if isinstance(max_capacity, bool) or not 0 <= int(max_capacity) <= MAX_CAPACITY_LIMIT:
            raise ValueError(f"max_capacity must be between 0 and {MAX_CAPACITY_LIMIT}, got {max_capacity!r}")
        url = URL(session.message_queue_url, encoded=True)
        if last_message_id > 0:
            url = url.update_query({"lastMessageId": str(int(last_message_id))})
        response = await self._queue_call(
            "GET",
            url,
            session,
            headers={
                "Accept": f"application/json; api-version={API_VERSION}",
                "X-ScaleSetMaxCapacity": str(int(max_capacity)),
            },
            expect=frozenset({200, 202}),
            what="get message",
            attempt_timeout=self.settings.poll_timeout,
            deadline=self.settings.deadline + self.settings.poll_timeout,
        )
        if response.status == 202:
            return None
        return decode_message(response.body, request=response.request)

    async def delete_message(self, session: MessageSession, message_id: int) -> None:
        """Q2: acknowledge (204). An acked message is never redelivered. Idempotent: a
        ``MessageNotFoundException`` (already acknowledged) counts as done."""
        base = URL(session.message_queue_url, encoded=True)
        url = base.with_path(base.raw_path.rstrip("/") + f"/{int(message_id)}", encoded=True).with_query(
            base.raw_query_string
        )
        try:
            await self._queue_call(
                "DELETE",
                url,
                session,
                headers={"Content-Type": "application/json"},
                expect=frozenset({204}),
                what=f"delete message {message_id}",
                attempt_timeout=self.settings.request_timeout,
                deadline=self.settings.deadline,
            )
        except MessageNotFoundError:
            log.debug("message already acknowledged", message_id=message_id)

    async def acquire_jobs(self, session: MessageSession, scale_set_id: int, request_ids: Sequence[int]) -> list[int]:
        """J1 (GHES flow): acquire ``JobAvailable`` jobs by ``runnerRequestId``; returns the ids
        actually acquired (others were taken or withdrawn, not an error)."""
        ids = [int(i) for i in request_ids]
        if not ids:
            return []
        response = await self._admin_call(
            "POST",
            f"_apis/runtime/runnerscalesets/{int(scale_set_id)}/acquirejobs",
            body=msgspec.json.encode(ids),
            expect=200,
            what=f"acquire {len(ids)} job(s)",
            status_errors={401: MessageQueueTokenExpiredError, 404: ScaleSetNotFoundError},
            bearer=session.message_queue_access_token,
        )
        return _decode(response, AcquiredJobs).value


class _Installation(msgspec.Struct):
    id: int


def _decode(response: HttpResponse, typ: type[_T]) -> _T:
    """Decode a success body into ``typ``; a mismatch is a :class:`ProtocolError` naming the request."""
    try:
        return msgspec.json.decode(response.body, type=typ)
    except msgspec.DecodeError as exc:
        detail = str(exc) if response.body.strip() else "empty body"
        raise ProtocolError(f"response does not match the protocol: {detail}", request=response.request) from None


def _decode_list(response: HttpResponse, item: type[_T]) -> list[_T]:
    """A ``{count, value}`` list; the count is trusted over the array length (reference behaviour)."""
    envelope = _decode(response, ListEnvelope)
    if envelope.count <= 0:
        return []
    try:
        return [msgspec.json.decode(raw, type=item) for raw in envelope.value[: envelope.count]]
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"response does not match the protocol: {exc}", request=response.request) from None

"""The simulator's HTTP shell: aiohttp routes over the synchronous :class:`World`.

Surfaces (all on one port):

- GitHub REST, GHES-style, under ``/api/v3``.
- The Actions service under ``/_services/pipelines/{tenant}/`` (the URL the runner-registration
  exchange returns), and its message queue under ``/_services/broker/scalesets/message``.
- The runner-side API for fake runners under ``/_runner/``.
- The control API under ``/_sim/``.

Every handler does I/O only: decode, authenticate, call one World operation, render. After each
request the world is settled (time-driven transitions) and long-polls are woken.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlparse

import anyio
import anyio.abc
import msgspec
from aiohttp import web
from yarl import URL

from services.embedded.actions_sim import faults as faults_mod
from services.embedded.actions_sim import views, wire
from services.embedded.actions_sim.jitconfig import (
    CredentialData,
    CredentialsFile,
    JitConfig,
    RunnerFile,
    encode_jit_config,
)
from services.embedded.actions_sim.settings import SimConfig, public_key_pem
from services.embedded.actions_sim.tls import server_context
from services.embedded.actions_sim.tokens import TokenError, TokenIssuer, opaque_token, verify_app_jwt
from services.embedded.actions_sim.world import (
    RunnerRecord,
    ScaleSetRecord,
    ScopeRef,
    ServiceFault,
    World,
    bad_request,
    exception_name,
    parse_scope_path,
    rfc3339,
)
from shared.log import get_logger, register_secret

log = get_logger(__name__)

JSON = "application/json; charset=utf-8"
SERVICE_PREFIX = "/_services/pipelines"
QUEUE_PATH = "/_services/broker/scalesets/message"
REST_ENDPOINTS = {"access_token", "registration_token", "runner_registration", "installation"}
FAULT_KEY = web.RequestKey("fault", views.FaultView)
T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RestError(Exception):
    """An error answer of the GitHub REST API (``{"message": ...}``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(obj), status=status, headers={"Content-Type": JSON})


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Simulator:
    """One simulator instance: the world, credentials, faults, clock, request log, HTTP app."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.world = World(config.seed, msgspec.structs.replace(config.settings))
        self.issuer = TokenIssuer()
        self.faults = faults_mod.FaultBook()
        self.clock_offset = 0.0
        self.requests: deque[views.RequestRecord] = deque(maxlen=2000)
        # Every request answered, by (method, endpoint, status): the log above is bounded, a burst
        # of thousands of runners needs all of them counted (issue 10: requests per runner).
        self.request_counts: Counter[tuple[str, str, int]] = Counter()
        self.app_public_key_pem = public_key_pem(config.app_private_key_pem)
        self.installations = {config.installation_id + i: org for i, org in enumerate(config.seed.orgs)}
        self.installation_tokens: dict[str, tuple[int, float]] = {}
        self.registration_tokens: dict[str, tuple[ScopeRef, float]] = {}
        self._changed = anyio.Event()
        self._seen_generation = -1
        # Job long-polls of runners wait on their runner's own event, set when the world reports
        # that runner changed (or on a control call): a change wakes the runners it concerns, not
        # every waiting runner (issue 10: O(waiting runners) wake-ups per change).
        self._runner_events: dict[int, anyio.Event] = {}
        # What the last full settle saw: the world's generation and its next deadline. Settling
        # again before either moves changes nothing (issue 10: a settle walks every open job, and
        # every request settled, O(N²) in a burst).
        self._settled_generation = -1
        self._settle_due = 0.0
        # The timer task sleeps until the settle deadline it last saw; it is woken only when the
        # deadline comes earlier (issue 10: it woke, and settled, on every change of the world).
        self._timer_due = float("inf")
        self._due_moved = anyio.Event()
        self._settle_scheduled = False
        # Defence in depth: the simulator never logs credentials. Tokens it mints are not
        # registered (the process-wide secret set would grow with every runner).
        register_secret(config.pat)

    # -- time and wake-ups ---------------------------------------------------------------------

    def now(self) -> float:
        return time.time() + self.clock_offset

    def settle(self, *, force: bool = False) -> None:
        """Apply time-driven transitions, then wake long-polls if anything changed.

        Skipped when nothing changed since the last settle (same generation) and no deadline
        (assignment timeout, session expiry) has come: the world would settle to what it is.
        ``force`` for changes the generation does not record (settings, clock, control calls)."""
        now = self.now()
        if not force and self.world.generation == self._settled_generation and now < self._settle_due:
            return
        self.world.settle(now=now)
        self._settled_generation = self.world.generation
        deadline = self.world.next_deadline()
        self._lower_due(float("inf") if deadline is None else deadline, replace=True)
        if force:
            self._due_moved.set()  # the clock or the settings may have moved: the timer looks again
        if self.world.generation != self._seen_generation:
            self._seen_generation = self.world.generation
            self._changed.set()
            self._changed = anyio.Event()
        changed = self.world.changed_runners
        if force:
            changed.update(self._runner_events)
        for runner_id in changed:
            event = self._runner_events.pop(runner_id, None)
            if event is not None:
                event.set()
        changed.clear()

    def _lower_due(self, due: float, *, replace: bool = False) -> None:
        """A new settle deadline (``replace``: the world's next one, else an earlier candidate);
        wakes the timer task when it comes before what the task sleeps until."""
        self._settle_due = due if replace else min(self._settle_due, due)
        if self._settle_due < self._timer_due:
            self._due_moved.set()

    def _settle_soon(self) -> None:
        """Settle once the requests handled in this turn of the event loop are done: callbacks run
        in order, so the settle comes before the loop reads anyone's next request (a client that
        got its answer sees the settled world), and a batch of requests settles once (issue 10)."""
        if not self._settle_scheduled:
            self._settle_scheduled = True
            asyncio.get_running_loop().call_soon(self._deferred_settle)

    def _deferred_settle(self) -> None:
        self._settle_scheduled = False
        self.settle()

    async def wait_for_change(self, timeout: float) -> None:
        event = self._changed
        with anyio.move_on_after(max(timeout, 0.0)):
            await event.wait()

    async def wait_for_runner(self, runner_id: int, timeout: float) -> None:
        """Until the world reports a change of this runner (or a control call), at most ``timeout``."""
        event = self._runner_events.get(runner_id)
        if event is None:
            event = self._runner_events[runner_id] = anyio.Event()
        with anyio.move_on_after(max(timeout, 0.0)):
            await event.wait()

    async def run_timers(self) -> None:
        """Settle at the world's next deadline (assignment timeouts, session expiry); woken early
        when a settle finds an earlier deadline or after a control call."""
        while True:
            self.settle()
            wait = min(max(self._settle_due - self.now(), 0.01), 5.0)
            self._timer_due, self._due_moved = self.now() + wait, anyio.Event()
            with anyio.move_on_after(wait):
                await self._due_moved.wait()

    def reset(self) -> None:
        self.world.settings = msgspec.structs.replace(self.config.settings)
        self.world.reset()
        self.faults.clear()
        self.requests.clear()
        self.request_counts.clear()
        self.clock_offset = 0.0
        self.installation_tokens.clear()
        self.registration_tokens.clear()
        self.settle(force=True)

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    def root(request: web.Request) -> str:
        # A forward proxy may pass the request on in absolute form (`POST http://host:port/...`):
        # then the request target, not the Host header, says where the client was talking to.
        if "://" in request.raw_path:
            return str(URL(request.raw_path).origin())
        return f"{request.scheme}://{request.host}"

    def service_base(self, request: web.Request, tenant_id: int) -> str:
        return f"{self.root(request)}{SERVICE_PREFIX}/{tenant_id}/"

    @staticmethod
    def bearer(request: web.Request, schemes: tuple[str, ...] = ("bearer",)) -> str | None:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        return value.strip() if scheme.lower() in schemes and value.strip() else None

    @staticmethod
    async def body(request: web.Request, type_: type[T], what: str) -> T:
        raw = await request.read()
        if raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            return msgspec.json.decode(raw or b"{}", type=type_)
        except msgspec.ValidationError as exc:
            raise bad_request(f"{what}: invalid body: {exc}") from None
        except msgspec.DecodeError:
            raise bad_request(f"{what}: body is not valid JSON") from None

    @staticmethod
    def int_param(request: web.Request, name: str, *, query: bool = False) -> int:
        raw = request.query.get(name) if query else request.match_info.get(name)
        try:
            return int(raw or "")
        except ValueError:
            raise bad_request(f"{name} must be an integer") from None

    def render_scale_set(self, request: web.Request, record: ScaleSetRecord) -> wire.ScaleSet:
        base = self.service_base(request, record.tenant_id)
        group = next(
            (g for g in self.world.tenants[record.tenant_id].runner_groups if g.id == record.runner_group_id), None
        )
        return wire.ScaleSet(
            id=record.id,
            name=record.name,
            runner_group_id=record.runner_group_id,
            runner_group_name=group.name if group else "",
            labels=list(record.labels),
            runner_setting=record.runner_setting,
            created_on=rfc3339(record.created_on),
            runner_jit_config_url=f"{base}_apis/runtime/runnerscalesets/{record.id}/generatejitconfig",
            get_acquirable_jobs_url=f"{base}_apis/runtime/runnerscalesets/{record.id}/acquirablejobs",
            acquire_jobs_url=f"{base}_apis/runtime/runnerscalesets/{record.id}/acquirejobs",
            statistics=self.world.statistics(record.id),
        )

    def render_runner(self, runner: Any) -> wire.RunnerReference:
        scale_set = self.world.scale_sets.get(runner.scale_set_id)
        group_id = scale_set.runner_group_id if scale_set else 1
        groups = self.world.tenants[runner.tenant_id].runner_groups
        return wire.RunnerReference(
            id=runner.id,
            name=runner.name,
            runner_scale_set_id=runner.scale_set_id,
            runner_group_id=group_id,
            runner_group_name=next((g.name for g in groups if g.id == group_id), ""),
            created_on=rfc3339(runner.created_on),
            version=runner.version,
            status="online" if runner.status in ("idle", "busy") else "offline",
        )

    def render_session(self, request: web.Request, session: Any) -> wire.Session:
        fault = request.get(FAULT_KEY)
        blank_url = fault is not None and fault.rule.kind == "blank_queue_url"
        record = self.world.scale_sets[session.scale_set_id]
        token = self.issuer.mint_queue(
            session.session_id, session.scale_set_id, now=self.now(), ttl=self.world.settings.queue_token_ttl
        )
        return wire.Session(
            session_id=session.session_id,
            owner_name=session.owner_name,
            runner_scale_set=self.render_scale_set(request, record),
            message_queue_url="" if blank_url else f"{self.root(request)}{QUEUE_PATH}?sessionId={session.session_id}",
            message_queue_access_token=token,
            statistics=self.world.statistics(session.scale_set_id),
        )

    # -- authentication ------------------------------------------------------------------------

    def admin_tenant(self, request: web.Request) -> int:
        """The tenant of an Actions admin call; its Bearer admin JWT must be valid for it."""
        tenant_id = self.int_param(request, "tenant")
        token = self.bearer(request)
        if token is None:
            raise _unauthorized("missing Bearer admin token")
        try:
            claims = self.issuer.verify_admin(token, now=self.now())
        except TokenError as exc:
            raise _unauthorized(exc.reason) from None
        if claims.tenant != tenant_id:
            raise _unauthorized("admin token is for another tenant")
        self.world.tenant(tenant_id)
        return tenant_id

    def queue_session(self, request: web.Request) -> Any:
        token = self.bearer(request)
        if token is None:
            raise _unauthorized("missing Bearer message queue token")
        try:
            claims = self.issuer.verify_queue(token, now=self.now())
        except TokenError as exc:
            raise _unauthorized(exc.reason) from None
        return self.world.session(claims.scale_set_id, claims.session_id)

    def github_credential(self, request: web.Request) -> tuple[str, int | None]:
        """("pat", None) or ("installation", id) for a REST call's PAT or installation token."""
        token = self.bearer(request, ("bearer", "token"))
        if token is not None and token == self.config.pat:
            return "pat", None
        if token is not None and token in self.installation_tokens:
            installation_id, expires = self.installation_tokens[token]
            if expires > self.now():
                return "installation", installation_id
        raise RestError(401, "Bad credentials")

    def app_jwt(self, request: web.Request) -> None:
        token = self.bearer(request)
        if token is None:
            raise RestError(401, "A JSON web token could not be decoded")
        try:
            verify_app_jwt(
                token,
                public_key_pem=self.app_public_key_pem,
                app_ids={str(self.config.app_id), self.config.client_id},
                now=self.now(),
            )
        except TokenError as exc:
            raise RestError(401, exc.reason) from None

    # -- GitHub REST ---------------------------------------------------------------------------

    async def access_token(self, request: web.Request) -> web.Response:
        self.app_jwt(request)
        installation_id = self.int_param(request, "installation_id")
        if installation_id not in self.installations:
            raise RestError(404, "Not Found")
        token = opaque_token("ghs_")
        expires = self.now() + self.world.settings.installation_token_ttl
        _forget_expired(self.installation_tokens, self.now())
        self.installation_tokens[token] = (installation_id, expires)
        return _json(wire.GitHubToken(token=token, expires_at=_iso(expires)), 201)

    def _installation_view(self, installation_id: int) -> wire.Installation:
        org = self.installations[installation_id]
        return wire.Installation(
            id=installation_id,
            app_id=self.config.app_id,
            account=wire.Account(login=org, id=installation_id + 500_000, type="Organization"),
            target_type="Organization",
        )

    async def installation(self, request: web.Request) -> web.Response:
        """``GET /app/installations/{id}``, ``/orgs/{org}/installation``, ``/repos/{o}/{r}/installation``."""
        self.app_jwt(request)
        if "installation_id" in request.match_info:
            installation_id = self.int_param(request, "installation_id")
            if installation_id not in self.installations:
                raise RestError(404, "Not Found")
            return _json(self._installation_view(installation_id))
        owner = request.match_info["owner"].lower()
        for installation_id, org in self.installations.items():
            if org.lower() == owner:
                return _json(self._installation_view(installation_id))
        raise RestError(404, "Not Found")

    async def registration_token(self, request: web.Request) -> web.Response:
        kind, installation_id = self.github_credential(request)
        info = request.match_info
        if "enterprise" in info:
            scope = ScopeRef("enterprise", info["enterprise"])
        elif "repo" in info:
            scope = ScopeRef("repo", info["owner"], info["repo"])
        else:
            scope = ScopeRef("org", info["owner"])
        if not self.world.scope_exists(scope):
            raise RestError(404, "Not Found")
        if kind == "installation":
            installed_on = self.installations.get(installation_id or 0, "")
            if scope.kind == "enterprise" or scope.owner.lower() != installed_on.lower():
                raise RestError(403, "Resource not accessible by integration")
        token = opaque_token("AREG")
        expires = self.now() + self.world.settings.registration_token_ttl
        _forget_expired(self.registration_tokens, self.now())
        self.registration_tokens[token] = (scope, expires)
        return _json(wire.GitHubToken(token=token, expires_at=_iso(expires)), 201)

    async def runner_registration(self, request: web.Request) -> web.Response:
        token = self.bearer(request, ("remoteauth",))
        entry = self.registration_tokens.get(token or "")
        if entry is None or entry[1] <= self.now():
            raise RestError(401, "Bad credentials")
        req = await self.body(request, wire.RunnerRegistrationRequest, "runner-registration")
        scope = parse_scope_path(urlparse(req.url).path) if req.url else None
        if scope is None:
            raise RestError(400, "url must be a GitHub config URL of a repository, organization or enterprise")
        granted = entry[0]
        if (scope.kind, scope.owner.lower(), scope.repo.lower()) != (
            granted.kind,
            granted.owner.lower(),
            granted.repo.lower(),
        ):
            raise RestError(404, "Not Found")
        tenant = self.world.tenant_for(scope)
        tenant.service_url = self.service_base(request, tenant.id)
        admin = self.issuer.mint_admin(tenant.id, now=self.now(), ttl=self.world.settings.admin_token_ttl)
        return _json(wire.RunnerRegistration(url=self.service_base(request, tenant.id), token=admin), 201)

    # -- Actions service -----------------------------------------------------------------------

    async def get_runner_group(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        groups = self.world.runner_groups(tenant, request.query.get("groupName"))
        return _json(wire.Envelope(count=len(groups), value=groups))

    async def get_scale_set_by_name(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        group = self.int_param(request, "runnerGroupId", query=True) if "runnerGroupId" in request.query else None
        found = self.world.find_scale_sets(tenant, group, request.query.get("name"))
        return _json(wire.Envelope(count=len(found), value=[self.render_scale_set(request, s) for s in found]))

    async def get_scale_set(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        record = self.world.scale_set(tenant, self.int_param(request, "scale_set_id"))
        return _json(self.render_scale_set(request, record))

    async def create_scale_set(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        req = await self.body(request, wire.ScaleSetRequest, "create runner scale set")
        record = self.world.create_scale_set(tenant, req, now=self.now())
        log.info("scale set created", scale_set_id=record.id, scale_set=record.name, tenant=tenant)
        return _json(self.render_scale_set(request, record))

    async def update_scale_set(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        req = await self.body(request, wire.ScaleSetRequest, "update runner scale set")
        record = self.world.update_scale_set(tenant, self.int_param(request, "scale_set_id"), req)
        return _json(self.render_scale_set(request, record))

    async def delete_scale_set(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        self.world.delete_scale_set(tenant, self.int_param(request, "scale_set_id"))
        return web.Response(status=204)

    async def generate_jit_config(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        scale_set_id = self.int_param(request, "scale_set_id")
        req = await self.body(request, wire.JitRequest, "generate JIT config")
        token = opaque_token("rnr_")
        runner = self.world.register_runner(tenant, scale_set_id, req.name, token, now=self.now())
        scope = self.world.tenants[tenant].scope
        reference = self.render_runner(runner)
        files = JitConfig(
            runner=RunnerFile(
                agent_id=runner.id,
                agent_name=runner.name,
                pool_id=reference.runner_group_id,
                pool_name=reference.runner_group_name,
                server_url=self.root(request) + "/",
                git_hub_url=f"{self.root(request)}/{scope.key}",
                work_folder=req.work_folder or "_work",
                runner_scale_set_id=scale_set_id,
            ),
            credentials=CredentialsFile(data=CredentialData(token=token)),
        )
        return _json(wire.JitConfig(runner=reference, encoded_jit_config=encode_jit_config(files)))

    async def get_runner(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        return _json(self.render_runner(self.world.runner(tenant, self.int_param(request, "runner_id"))))

    async def get_runner_by_name(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        found = self.world.runners_named(tenant, request.query.get("agentName"))
        return _json(wire.Envelope(count=len(found), value=[self.render_runner(r) for r in found]))

    async def remove_runner(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        self.world.remove_runner(tenant, self.int_param(request, "runner_id"))
        return web.Response(status=204)

    async def create_session(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        req = await self.body(request, wire.SessionRequest, "create message session")
        session = self.world.create_session(
            tenant, self.int_param(request, "scale_set_id"), req.owner_name, now=self.now()
        )
        return _json(self.render_session(request, session))

    async def refresh_session(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        session = self.world.refresh_session(
            tenant, self.int_param(request, "scale_set_id"), request.match_info["session_id"], now=self.now()
        )
        return _json(self.render_session(request, session))

    async def delete_session(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        self.world.delete_session(tenant, self.int_param(request, "scale_set_id"), request.match_info["session_id"])
        return web.Response(status=204)

    async def get_message(self, request: web.Request) -> web.StreamResponse:
        session = self.queue_session(request)
        raw_capacity = request.headers.get("X-ScaleSetMaxCapacity", "")
        try:
            capacity = int(raw_capacity)
            if capacity < 0:
                raise ValueError
        except ValueError:
            return web.Response(
                status=400,
                text="X-ScaleSetMaxCapacity must be a non-negative integer",
                content_type="text/plain",
            )
        last_id = self.int_param(request, "lastMessageId", query=True) if "lastMessageId" in request.query else 0
        scale_set_id = session.scale_set_id
        fault = request.get(FAULT_KEY)
        queue = self.world.queues.get(scale_set_id)
        if fault is not None and queue is not None:
            queue.duplicate_next = queue.duplicate_next or fault.rule.kind == "duplicate_events"
            queue.reverse_next = queue.reverse_next or fault.rule.kind == "reorder"
        self.world.set_capacity(scale_set_id, capacity)
        deadline = anyio.current_time() + self.world.settings.poll_wait
        session.polls_in_flight += 1
        self.settle()  # the capacity may allow assignments now
        # Whoever changes the world settles it and wakes the waiters; a waiter only looks.
        try:
            while True:
                self.world.session(scale_set_id, session.session_id)  # 404 once evicted or deleted
                message = self.world.next_message(scale_set_id, last_id)
                if message is not None:
                    if fault is not None and fault.rule.kind == "redeliver":
                        self.world.queues[scale_set_id].redeliver.append(message.message_id)
                    return _json(
                        wire.Message(
                            message_id=message.message_id,
                            message_type=message.message_type,
                            body=message.body,
                            statistics=message.statistics,
                        )
                    )
                remaining = deadline - anyio.current_time()
                if remaining <= 0:
                    return web.Response(status=202)
                await self.wait_for_change(remaining)
        finally:
            session.polls_in_flight -= 1
            session.last_active = self.now()
            if session.polls_in_flight == 0:  # its idle expiry counts again: a deadline the generation does not record
                self._lower_due(session.last_active + self.world.settings.session_idle_timeout)

    async def delete_message(self, request: web.Request) -> web.Response:
        session = self.queue_session(request)
        self.world.ack_message(session.scale_set_id, self.int_param(request, "message_id"))
        return web.Response(status=204)

    async def acquire_jobs(self, request: web.Request) -> web.Response:
        session = self.queue_session(request)
        scale_set_id = self.int_param(request, "scale_set_id")
        if session.scale_set_id != scale_set_id:
            raise _unauthorized("message queue token is for another scale set")
        ids = await self.body(request, list[int], "acquire jobs")
        acquired = self.world.acquire_jobs(scale_set_id, ids)
        return _json(wire.Envelope(count=len(acquired), value=acquired))

    async def acquirable_jobs(self, request: web.Request) -> web.Response:
        tenant = self.admin_tenant(request)
        scale_set_id = self.int_param(request, "scale_set_id")
        self.world.scale_set(tenant, scale_set_id)
        jobs = self.world.acquirable_jobs(scale_set_id)
        if not jobs:
            return web.Response(status=204)
        base = self.service_base(request, tenant)
        value = [
            {
                "acquireJobUrl": f"{base}_apis/runtime/runnerscalesets/{scale_set_id}/acquirejobs",
                "messageType": "JobAvailable",
                "runnerRequestId": j.runner_request_id,
                "repositoryName": j.repository,
                "ownerName": j.owner,
                "jobWorkflowRef": j.workflow_ref,
                "eventName": j.event_name,
                "requestLabels": j.labels,
            }
            for j in jobs
        ]
        return _json(wire.Envelope(count=len(value), value=value))

    # -- runner-side API -----------------------------------------------------------------------

    def runner_from_token(self, request: web.Request) -> RunnerRecord:
        token = self.bearer(request)
        runner = self.world.runner_by_token(token) if token else None
        if runner is None:
            raise ServiceFault(
                401 if token is None else 404,
                exception_name("AgentNotFoundException", "GitHub.DistributedTask.WebApi"),
                "runner credentials are unknown or the runner was removed",
            )
        return runner

    async def runner_connect(self, request: web.Request) -> web.Response:
        runner = self.runner_from_token(request)
        req = await self.body(request, views.RunnerConnect, "runner connect")
        if not self.world.runner_connect(runner, req.version):
            minimum = self.world.settings.min_runner_version
            log.info("runner rejected as outdated", runner=runner.name, version=req.version, min_version=minimum)
            return _json(
                views.RunnerRejected(
                    message=f"Runner version v{req.version.lstrip('v')} is deprecated and cannot receive messages.",
                    min_version=minimum,
                ),
                403,
            )
        self.settle()  # a job waiting for an idle runner goes to this one now, in this answer
        job = self.world.runner_job(runner)
        return _json(
            views.RunnerConnected(
                runner_id=runner.id,
                runner_name=runner.name,
                scale_set_id=runner.scale_set_id,
                job=_runner_job_view(job) if job is not None else None,
            )
        )

    async def runner_job(self, request: web.Request) -> web.Response:
        """Long-poll for the job handed to this runner: 200 with the job, or 204 after ``wait`` s."""
        runner = self.runner_from_token(request)
        try:
            wait = min(float(request.query.get("wait", "30")), 60.0)
        except ValueError:
            raise bad_request("wait must be a number of seconds") from None
        deadline = anyio.current_time() + wait
        while True:
            if self.world.runners.get(runner.id) is not runner:
                raise ServiceFault(
                    404,
                    exception_name("AgentNotFoundException", "GitHub.DistributedTask.WebApi"),
                    f"runner {runner.name} was removed",
                )
            job = self.world.runner_job(runner)
            if job is not None:
                return _json(_runner_job_view(job))
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                return web.Response(status=204)
            await self.wait_for_runner(runner.id, remaining)

    async def runner_job_started(self, request: web.Request) -> web.Response:
        runner = self.runner_from_token(request)
        self.world.job_started(runner, request.match_info["job_id"], now=self.now())
        return web.Response(status=204)

    async def runner_disconnect(self, request: web.Request) -> web.Response:
        runner = self.runner_from_token(request)
        self.world.runner_lost(runner, now=self.now())
        return web.Response(status=204)

    async def runner_job_completed(self, request: web.Request) -> web.Response:
        runner = self.runner_from_token(request)
        req = await self.body(request, views.RunnerJobCompleted, "runner job completed")
        self.world.job_completed(runner, request.match_info["job_id"], req.result, now=self.now())
        return web.Response(status=204)

    # -- control API ---------------------------------------------------------------------------

    def job_view(self, job: Any) -> views.JobView:
        return views.JobView(
            job_id=job.job_id,
            runner_request_id=job.runner_request_id,
            state=job.state,
            labels=job.labels,
            owner=job.owner,
            repository=job.repository,
            workflow_ref=job.workflow_ref,
            display_name=job.display_name,
            duration=job.duration,
            result=job.result,
            scale_set_id=job.scale_set_id,
            runner_id=job.runner_id,
            runner_name=job.runner_name,
            attempts=job.attempts,
            final_result=job.final_result,
            queue_time=job.queue_time,
            runner_assign_time=job.runner_assign_time,
            finish_time=job.finish_time,
        )

    async def sim_enqueue_jobs(self, request: web.Request) -> web.Response:
        spec = await self.body(request, views.JobSpec, "POST /_sim/jobs")
        jobs = self.world.enqueue_jobs(spec, now=self.now())
        self.settle()
        return _json([self.job_view(j) for j in jobs], 201)

    async def sim_jobs(self, request: web.Request) -> web.Response:
        return _json([self.job_view(j) for j in self.world.jobs.values()])

    async def sim_runners(self, request: web.Request) -> web.Response:
        return _json(
            [
                views.RunnerView(
                    id=r.id,
                    name=r.name,
                    scale_set_id=r.scale_set_id,
                    status=r.status,
                    version=r.version,
                    job_id=r.job_id,
                )
                for r in self.world.runners.values()
            ]
        )

    async def sim_crash_runner(self, request: web.Request) -> web.Response:
        """The runner dies without a word (its process is gone): as ``/_runner/disconnect``."""
        runner = self.world.runners.get(self.int_param(request, "runner_id"))
        if runner is None:
            raise bad_request("no such runner")
        self.world.runner_lost(runner, now=self.now())
        return web.Response(status=204)

    async def sim_sessions(self, request: web.Request) -> web.Response:
        return _json(
            [
                views.SessionView(
                    session_id=s.session_id,
                    scale_set_id=s.scale_set_id,
                    owner_name=s.owner_name,
                    last_poll_capacity=self.world.scale_sets[s.scale_set_id].max_capacity,
                    polls_in_flight=s.polls_in_flight,
                )
                for s in self.world.sessions.values()
            ]
        )

    async def sim_delete_session(self, request: web.Request) -> web.Response:
        """Evict a session server-side (the broker lost it): its token now gets 404."""
        if self.world.sessions.pop(request.match_info["session_id"], None) is None:
            raise bad_request("no such session")
        self.world.touch()
        return web.Response(status=204)

    async def sim_scale_sets(self, request: web.Request) -> web.Response:
        return _json(
            [
                views.ScaleSetView(
                    id=s.id,
                    name=s.name,
                    tenant=self.world.tenants[s.tenant_id].scope.key,
                    runner_group_id=s.runner_group_id,
                    labels=[lb.name for lb in s.labels],
                    statistics=self.world.statistics(s.id),
                    max_capacity=s.max_capacity,
                )
                for s in self.world.scale_sets.values()
            ]
        )

    async def sim_delete_scale_set(self, request: web.Request) -> web.Response:
        """The scale set vanishes server-side while a listener runs."""
        record = self.world.scale_sets.get(self.int_param(request, "scale_set_id"))
        if record is None:
            raise bad_request("no such scale set")
        self.world.delete_scale_set(record.tenant_id, record.id)
        return web.Response(status=204)

    async def sim_messages(self, request: web.Request) -> web.Response:
        queue = self.world.queues.get(self.int_param(request, "scale_set_id"))
        return _json(
            [
                views.MessageView(
                    message_id=m.message_id,
                    scale_set_id=m.scale_set_id,
                    message_type=m.message_type,
                    body=m.body,
                    statistics=m.statistics,
                    acked=m.acked,
                )
                for m in (queue.messages if queue else [])
            ]
        )

    async def sim_inject_message(self, request: web.Request) -> web.Response:
        req = await self.body(request, views.InjectMessage, "POST /_sim/scalesets/{id}/messages")
        body = req.body if req.body is not None else "[" + ",".join(bytes(e).decode() for e in req.events) + "]"
        message = self.world.inject_message(
            self.int_param(request, "scale_set_id"), body=body, statistics=req.statistics, message_type=req.message_type
        )
        return _json(views.MessageCreated(message_id=message.message_id), 201)

    async def sim_min_runner_version(self, request: web.Request) -> web.Response:
        req = await self.body(request, views.MinRunnerVersion, "POST /_sim/min-runner-version")
        self.world.settings.min_runner_version = req.version
        return _json(self.world.settings)

    async def sim_get_config(self, request: web.Request) -> web.Response:
        return _json(self.world.settings)

    async def sim_config(self, request: web.Request) -> web.Response:
        patch = await self.body(request, views.SettingsPatch, "POST /_sim/config")
        for field in patch.__struct_fields__:
            value = getattr(patch, field)
            if value is not None:
                setattr(self.world.settings, field, value)
        self.world.touch()
        return _json(self.world.settings)

    async def sim_add_fault(self, request: web.Request) -> web.Response:
        rule = await self.body(request, views.FaultRule, "POST /_sim/faults")
        try:
            fault_id = self.faults.add(rule)
        except faults_mod.FaultRuleError as exc:
            raise bad_request(f"POST /_sim/faults: {exc}") from None
        return _json(views.FaultCreated(id=fault_id), 201)

    async def sim_faults(self, request: web.Request) -> web.Response:
        return _json(self.faults.views())

    async def sim_clear_faults(self, request: web.Request) -> web.Response:
        self.faults.clear()
        return web.Response(status=204)

    async def sim_delete_fault(self, request: web.Request) -> web.Response:
        if not self.faults.remove(self.int_param(request, "fault_id")):
            raise bad_request("no such fault")
        return web.Response(status=204)

    async def sim_requests(self, request: web.Request) -> web.Response:
        return _json(list(self.requests))

    async def sim_clear_requests(self, request: web.Request) -> web.Response:
        self.requests.clear()
        return web.Response(status=204)

    async def sim_request_counts(self, request: web.Request) -> web.Response:
        counts = sorted(self.request_counts.items())
        return _json([views.RequestCount(method=m, endpoint=e, status=s, count=c) for (m, e, s), c in counts])

    async def sim_clear_request_counts(self, request: web.Request) -> web.Response:
        self.request_counts.clear()
        return web.Response(status=204)

    async def sim_clock(self, request: web.Request) -> web.Response:
        return _json(views.ClockView(now=self.now()))

    async def sim_advance_clock(self, request: web.Request) -> web.Response:
        req = await self.body(request, views.ClockAdvance, "POST /_sim/clock")
        if req.seconds < 0:
            raise bad_request("POST /_sim/clock: seconds must not be negative (the clock never goes back)")
        self.clock_offset += req.seconds
        self.world.touch()
        return _json(views.ClockView(now=self.now()))

    async def sim_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.Response(status=204)

    # -- middleware ----------------------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # Handlers of the simulated service are named after their endpoint (faults.ENDPOINTS).
        endpoint = getattr(request.match_info.route.handler, "__name__", "")
        is_service = endpoint in faults_mod.ENDPOINTS
        fault = self.faults.take(endpoint, request.method) if is_service else None
        if fault is not None:
            request[FAULT_KEY] = fault
        response: web.StreamResponse
        try:
            response = await self._apply(request, handler, fault)
        except ServiceFault as exc:
            response = _json(wire.service_error(exc.type_name, exc.message), exc.status)
        except RestError as exc:
            response = _json(wire.GitHubError(message=exc.message, status=str(exc.status)), exc.status)
        except web.HTTPException as exc:
            response = exc
        finally:
            if is_service:
                self._settle_soon()
            else:
                self.settle(force=True)  # control calls change what the generation does not record
        if is_service:
            if endpoint in REST_ENDPOINTS:
                response.headers["X-GitHub-Request-Id"] = str(uuid.uuid4()).upper()
            else:
                response.headers["ActivityId"] = str(uuid.uuid4())
            if "api-version" not in request.query and request.path.startswith(SERVICE_PREFIX):
                log.debug("actions call without api-version", endpoint=endpoint)
            self.request_counts[request.method, endpoint, response.status] += 1
            self.requests.append(
                views.RequestRecord(
                    time=self.now(),
                    method=request.method,
                    path=request.path,
                    query=request.query_string,
                    endpoint=endpoint,
                    status=response.status,
                    headers=_safe_headers(request),
                    fault=fault.id if fault else None,
                )
            )
        return response

    async def _apply(self, request: web.Request, handler: Handler, fault: views.FaultView | None) -> web.StreamResponse:
        if fault is None:
            return await handler(request)
        rule = fault.rule
        if rule.kind == "delay":
            await anyio.sleep(rule.seconds)
            return await handler(request)
        if rule.kind == "drop":
            if rule.seconds > 0:
                await anyio.sleep(rule.seconds)
            # Abort the TCP connection: the client sees a reset, never a status line. The
            # response returned afterwards is never written.
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=499)
        if rule.kind == "empty_body":
            return web.Response(status=200, headers={"Content-Type": JSON})
        if rule.kind == "status":
            return _fault_response(rule)
        response = await handler(request)
        if rule.kind == "after":
            return _fault_response(rule)
        if (
            rule.kind == "bom"
            and isinstance(response, web.Response)
            and isinstance(response.body, bytes | bytearray)
            and response.body
        ):
            response.body = b"\xef\xbb\xbf" + bytes(response.body)
        return response

    # -- app -----------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.middleware], client_max_size=4 * 1024 * 1024)
        r = app.router
        api = "/api/v3"
        r.add_post(api + "/app/installations/{installation_id}/access_tokens", self.access_token)
        r.add_get(api + "/app/installations/{installation_id}", self.installation)
        r.add_get(api + "/orgs/{owner}/installation", self.installation)
        r.add_get(api + "/repos/{owner}/{repo}/installation", self.installation)
        rt = "/actions/runners/registration-token"
        r.add_post(api + "/repos/{owner}/{repo}" + rt, self.registration_token)
        r.add_post(api + "/orgs/{owner}" + rt, self.registration_token)
        r.add_post(api + "/enterprises/{enterprise}" + rt, self.registration_token)
        r.add_post(api + "/actions/runner-registration", self.runner_registration)

        a = SERVICE_PREFIX + r"/{tenant:\d+}/_apis"
        sets = a + "/runtime/runnerscalesets"
        one = sets + r"/{scale_set_id:\d+}"
        agents = a + r"/distributedtask/pools/{pool:\d+}/agents"
        r.add_get(a + "/runtime/runnergroups", self.get_runner_group)
        r.add_get(a + "/runtime/runnergroups/", self.get_runner_group)
        r.add_get(sets, self.get_scale_set_by_name)
        r.add_post(sets, self.create_scale_set)
        r.add_get(one, self.get_scale_set)
        r.add_patch(one, self.update_scale_set)
        r.add_delete(one, self.delete_scale_set)
        r.add_post(one + "/generatejitconfig", self.generate_jit_config)
        r.add_post(one + "/sessions", self.create_session)
        r.add_patch(one + "/sessions/{session_id}", self.refresh_session)
        r.add_delete(one + "/sessions/{session_id}", self.delete_session)
        r.add_post(one + "/acquirejobs", self.acquire_jobs)
        r.add_get(one + "/acquirablejobs", self.acquirable_jobs)
        r.add_get(agents, self.get_runner_by_name)
        r.add_get(agents + r"/{runner_id:\d+}", self.get_runner)
        r.add_delete(agents + r"/{runner_id:\d+}", self.remove_runner)
        r.add_get(QUEUE_PATH, self.get_message)
        r.add_delete(QUEUE_PATH + r"/{message_id:\d+}", self.delete_message)

        r.add_post("/_runner/connect", self.runner_connect)
        r.add_get("/_runner/job", self.runner_job)
        r.add_post("/_runner/jobs/{job_id}/started", self.runner_job_started)
        r.add_post("/_runner/jobs/{job_id}/completed", self.runner_job_completed)
        r.add_post("/_runner/disconnect", self.runner_disconnect)

        r.add_post("/_sim/jobs", self.sim_enqueue_jobs)
        r.add_get("/_sim/jobs", self.sim_jobs)
        r.add_get("/_sim/runners", self.sim_runners)
        r.add_post(r"/_sim/runners/{runner_id:\d+}/crash", self.sim_crash_runner)
        r.add_get("/_sim/sessions", self.sim_sessions)
        r.add_delete("/_sim/sessions/{session_id}", self.sim_delete_session)
        r.add_get("/_sim/scalesets", self.sim_scale_sets)
        r.add_delete(r"/_sim/scalesets/{scale_set_id:\d+}", self.sim_delete_scale_set)
        r.add_get(r"/_sim/scalesets/{scale_set_id:\d+}/messages", self.sim_messages)
        r.add_post(r"/_sim/scalesets/{scale_set_id:\d+}/messages", self.sim_inject_message)
        r.add_post("/_sim/min-runner-version", self.sim_min_runner_version)
        r.add_get("/_sim/config", self.sim_get_config)
        r.add_post("/_sim/config", self.sim_config)
        r.add_get("/_sim/faults", self.sim_faults)
        r.add_post("/_sim/faults", self.sim_add_fault)
        r.add_delete("/_sim/faults", self.sim_clear_faults)
        r.add_delete(r"/_sim/faults/{fault_id:\d+}", self.sim_delete_fault)
        r.add_get("/_sim/requests", self.sim_requests)
        r.add_delete("/_sim/requests", self.sim_clear_requests)
        r.add_get("/_sim/request-counts", self.sim_request_counts)
        r.add_delete("/_sim/request-counts", self.sim_clear_request_counts)
        r.add_get("/_sim/clock", self.sim_clock)
        r.add_post("/_sim/clock", self.sim_advance_clock)
        r.add_post("/_sim/reset", self.sim_reset)
        return app


def _forget_expired(tokens: dict[str, tuple[Any, float]], now: float) -> None:
    """Token tables hold (grant, expiry); a long run mints one per admin refresh."""
    if len(tokens) > 256:
        for token in [t for t, (_, expires) in tokens.items() if expires <= now]:
            del tokens[token]


def _unauthorized(reason: str) -> ServiceFault:
    return ServiceFault(
        401,
        "Microsoft.VisualStudio.Services.WebApi.VssUnauthorizedException, Microsoft.VisualStudio.Services.WebApi",
        f"Unauthorized: {reason}.",
    )


def _fault_response(rule: views.FaultRule) -> web.Response:
    headers = {"Content-Type": rule.content_type}
    if rule.retry_after is not None:
        headers["Retry-After"] = rule.retry_after
    if rule.body is not None:
        body = rule.body.encode()
    elif rule.status in (202, 204):
        body = b""
    else:
        body = msgspec.json.encode(
            wire.service_error(exception_name("InjectedFaultException"), f"injected fault: HTTP {rule.status}")
        )
    return web.Response(status=rule.status, body=body or None, headers=headers)


_RUNNER_JOB_FIELDS = ("job_id", "runner_request_id", "duration", "result", "workflow_ref")


def _runner_job_view(job: Any) -> views.RunnerJob:
    """What a runner is told of its job (the job poll's answer, and the connect answer's job)."""
    fields = {name: getattr(job, name) for name in _RUNNER_JOB_FIELDS}
    return views.RunnerJob(repository=f"{job.owner}/{job.repository}", **fields)


def _safe_headers(request: web.Request) -> dict[str, str]:
    """Request headers for the request log, with credentials reduced to their scheme."""
    out = {}
    for key, raw in request.headers.items():
        value = raw
        if key.lower() in ("authorization", "proxy-authorization"):
            value = raw.partition(" ")[0]
        elif key.lower() == "cookie":
            value = "[redacted]"
        out[key] = value
    return out


async def serve(
    config: SimConfig, *, task_status: anyio.abc.TaskStatus[tuple[str, Simulator]] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Run the simulator until cancelled; reports ``(base_url, simulator)`` once listening."""
    simulator = Simulator(config)
    runner = web.AppRunner(simulator.app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        ssl_context = server_context(config.tls) if config.tls else None
        site = web.TCPSite(runner, config.host, config.port, ssl_context=ssl_context)
        await site.start()
        addresses = runner.addresses  # (host, port, …) of each listening socket
        port = int(addresses[0][1]) if addresses else config.port
        url = f"{'https' if ssl_context else 'http'}://{config.host}:{port}"
        log.info("actions simulator listening", url=url, orgs=config.seed.orgs)
        task_status.started((url, simulator))
        await simulator.run_timers()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await runner.cleanup()

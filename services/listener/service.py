"""One listener replica: HTTP endpoints, the bus, the leader lease, and the session terms.

::

    Listener.run
      ├── /healthz /readyz /metrics             (aiohttp, while the replica runs)
      ├── Bus.connect                           (streams, publish with JetStream acks)
      └── LeaderLease.join(listener.<ns>.<scale set>)
            └── repeat: leadership() -> term (epoch = the lease's fencing token)
                  └── repeat: open_session -> SessionLoop.run -> close_session

Only the lease holder creates a session, so replicas never fight over it with 409s. Leadership
lost (or lapsed while NATS is unreachable) cancels the term at once; the session is then deleted
(shielded), and the next leader starts a new epoch whose first desired state supersedes ours.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from contextlib import AsyncExitStack

import anyio
import msgspec
from prometheus_client import disable_created_metrics

from services.listener.health import HealthState, Role, build_app
from services.listener.loop import RETRY_CAP, Identity, SessionLoop
from services.listener.metrics import ListenerMetrics
from services.listener.scaling import ScalerState
from services.listener.session import ListenerGaveUp, SessionRecords, close_session, open_session
from shared.actions import (
    ActionsClient,
    ActionsError,
    MessageSessionClient,
    ScaleSetNotFoundError,
    parse_config_url,
)
from shared.backoff import Backoff
from shared.bus import Bus, BusError, BusMessage, BusUnavailable, DesiredState, JobCompleted, JobStarted, LeaderLease
from shared.bus import subjects as bus_subjects
from shared.http import HttpServers, listen_enabled
from shared.listener_config import (
    ListenerConfig,
    actions_environ,
    bus_settings,
    credentials_of,
    owner_name,
)
from shared.log import get_logger

__all__ = ["Listener", "ListenerGaveUp", "run_listener"]

log = get_logger(__name__)


def metrics_for(cfg: ListenerConfig) -> ListenerMetrics:
    url = parse_config_url(cfg.configure_url)
    return ListenerMetrics(
        name=cfg.ephemeral_runner_set_name,
        namespace=cfg.ephemeral_runner_set_namespace,
        repository=url.repository,
        organization=url.organization,
        enterprise=url.enterprise,
    )


class Listener:
    """One replica of the listener of one scale set.

    ``await task_group.start(listener.run)`` returns once the HTTP endpoints are bound
    (``listener.ports``: ``{"health": port, "metrics": port}``); the listener then runs until
    cancelled, deleting its session on the way out. :meth:`crash` stops it the way SIGKILL
    would (no session delete, no lease release), for failure tests.
    """

    def __init__(
        self, cfg: ListenerConfig, *, owner: str | None = None, actions_client: ActionsClient | None = None
    ) -> None:
        # ARC exports no ``*_created`` series and dashboards built for ARC expect its series only.
        # prometheus_client's switch is process-wide; the listener process serves only these.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.cfg = cfg
        self.owner = owner or owner_name()
        self.ident = Identity.from_config(cfg)
        self.metrics = metrics_for(cfg)
        self.health = HealthState()
        self.endpoints = HttpServers()
        self.bus_settings = bus_settings(cfg)
        self.epoch: int | None = None
        self.session_id = ""
        self._credentials = credentials_of(cfg)
        self._scope: anyio.CancelScope | None = None
        self._lease: LeaderLease | None = None
        self._abandoned = False

    @property
    def ports(self) -> dict[str, int]:
        return dict(self.endpoints.ports)

    @property
    def is_leader(self) -> bool:
        return self._lease is not None and self._lease.is_leader

    def crash(self) -> None:
        """Stop at once without any cleanup, as a killed process would."""
        self._abandoned = True
        if self._lease is not None:
            self._lease.abandon()
        if self._scope is not None:
            self._scope.cancel()

    async def run(self, *, task_status: anyio.abc.TaskStatus[Listener] = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.CancelScope() as self._scope:
            try:
                await self._start_endpoints()
                task_status.started(self)
                await self._run_connected()  # Bus.connect closes NATS cleanly even when it is down
            finally:
                self.health.role = Role.STOPPING
                self.metrics.set_leader(False)
                with anyio.CancelScope(shield=True):
                    await self.endpoints.stop()

    async def _start_endpoints(self) -> None:
        cfg = self.cfg
        staleness = cfg.session.poll_staleness_seconds
        metrics_on, health_on = listen_enabled(cfg.metrics_addr), listen_enabled(cfg.health_addr)
        if metrics_on and health_on and cfg.metrics_addr.strip() == cfg.health_addr.strip():
            app = build_app(
                state=self.health,
                staleness=staleness,
                metrics=self.metrics,
                metrics_path=cfg.metrics_endpoint,
                health=True,
            )
            port = await self.endpoints.start("health", app, cfg.health_addr)
            assert port is not None  # health_on
            self.endpoints.ports["metrics"] = port
            return
        if health_on:
            app = build_app(state=self.health, staleness=staleness, metrics=None, metrics_path="", health=True)
            await self.endpoints.start("health", app, cfg.health_addr)
        if metrics_on:
            app = build_app(
                state=self.health,
                staleness=staleness,
                metrics=self.metrics,
                metrics_path=cfg.metrics_endpoint,
                health=False,
            )
            await self.endpoints.start("metrics", app, cfg.metrics_addr)

    async def _run_connected(self) -> None:
        cfg = self.cfg
        self.metrics.record_static(min_runners=cfg.min_runners, max_runners=cfg.max_runners)
        # The config's proxy applies to this listener's client, also when it runs in-process
        # (the CLI additionally exports it to the environment, as ARC's listener does).
        actions = ActionsClient.from_config(
            cfg.configure_url, self._credentials, root_ca=cfg.server_root_ca or None, environ=actions_environ(cfg)
        )
        actions.set_system_info(
            msgspec.structs.replace(actions.system_info, scale_set_id=cfg.runner_scale_set_id, subsystem="listener")
        )
        lease_name = bus_subjects.listener_lease_name(self.ident.scale_set.namespace, self.ident.scale_set.name)
        async with actions, AsyncExitStack() as stack:
            bus = await self._connect_bus(stack)
            records = SessionRecords(bus, timeout=self.bus_settings.request_timeout)
            async with LeaderLease.join(bus, lease_name, replica_id=self.owner) as lease:
                self._lease = lease
                try:
                    await self._lead_when_elected(lease, actions, bus, records)
                finally:
                    self._lease = None

    async def _connect_bus(self, stack: AsyncExitStack) -> Bus:
        """Connect (and set up streams), waiting for NATS if it is not reachable yet: the listener
        stays live (not ready) meanwhile instead of exiting."""
        backoff = Backoff(base=self.cfg.session.error_backoff_seconds, cap=RETRY_CAP)
        for attempt in itertools.count():
            try:
                return await stack.enter_async_context(
                    Bus.connect(
                        # The listener's config does not carry the cluster's stream sizing: create
                        # what is missing, never re-tune streams the workers set up.
                        self.bus_settings,
                        name=f"listener-{self.owner}",
                        tune_existing=False,
                    )
                )
            except BusUnavailable as exc:
                self.health.progressed()
                delay = backoff.delay(attempt)
                log.warning("NATS unreachable; retrying", error=str(exc), retry_in=round(delay, 1))
                await anyio.sleep(delay)  # backoff between attempts, not synchronisation
        raise AssertionError("unreachable")

    async def _lead_when_elected(
        self, lease: LeaderLease, actions: ActionsClient, bus: Bus, records: SessionRecords
    ) -> None:
        tick = self.bus_settings.effective_renew_interval
        while True:
            self.health.role = Role.STANDBY
            self.metrics.set_leader(False)
            while not lease.is_leader:
                self.health.progressed()  # a standby is healthy while it keeps trying the lease
                with anyio.move_on_after(tick):
                    await lease.wait_leader()
            async with lease.leadership() as term:
                await self._term(term.epoch, actions, bus, records)
            if self.epoch is not None:
                log.warning("leadership lost: the session was closed", epoch=self.epoch)

    async def _term(self, epoch: int, actions: ActionsClient, bus: Bus, records: SessionRecords) -> None:
        """Serve as leader for one term (one epoch) until cancelled: sessions come and go inside it
        (a lost session is re-created), the scaler state carries over so patch IDs keep rising."""
        cfg = self.cfg
        self.epoch = epoch
        self.health.role = Role.LEADER
        self.metrics.set_leader(True)
        log.info("leading the scale set", scale_set_id=cfg.runner_scale_set_id, epoch=epoch, owner=self.owner)
        scaler = ScalerState()
        newest_message_id = 0

        async def publish(messages: Sequence[BusMessage]) -> None:
            # In the service's order by kind: every JobStarted, then every JobCompleted (each kind
            # concurrently, each waiting for its JetStream ack), then the desired state (the level).
            for kind in (JobStarted, JobCompleted, DesiredState):
                await _publish_all(bus, [m for m in messages if isinstance(m, kind)])

        backoff = Backoff(base=cfg.session.error_backoff_seconds, cap=RETRY_CAP)
        failures = 0  # in a row; reset once a session polled successfully

        async def back_off() -> None:
            nonlocal failures
            self.health.progressed()
            await anyio.sleep(backoff.delay(failures))  # backoff between attempts, not synchronisation
            failures += 1

        try:
            while True:
                try:
                    session = await open_session(
                        actions,
                        scale_set_id=cfg.runner_scale_set_id,
                        owner=self.owner,
                        epoch=epoch,
                        records=records,
                        settings=cfg.session,
                        metrics=self.metrics,
                        on_wait=self.health.progressed,
                    )
                except ScaleSetNotFoundError as exc:
                    raise ListenerGaveUp(f"scale set {cfg.runner_scale_set_id} no longer exists: {exc}") from None
                except ActionsError as exc:
                    log.warning(
                        "cannot create the message session; retrying",
                        error=str(exc),
                        error_type=type(exc).__name__,
                        retry_in=round(backoff.delay(failures), 1),
                    )
                    await back_off()
                    continue
                self.session_id = self.health.session_id = session.session_id
                self.health.polled()  # the service just answered: ready until a poll says otherwise
                loop = SessionLoop(
                    ident=self.ident,
                    session_client=MessageSessionClient(actions, cfg.runner_scale_set_id, session),
                    publish=publish,
                    metrics=self.metrics,
                    health=self.health,
                    epoch=epoch,
                    poll_error_backoff=cfg.session.error_backoff_seconds,
                    scaler=scaler,
                    newest_message_id=newest_message_id,
                )
                try:
                    await loop.run(session.statistics)
                except ScaleSetNotFoundError as exc:
                    raise ListenerGaveUp(f"scale set {cfg.runner_scale_set_id} no longer exists: {exc}") from None
                except (ActionsError, BusError) as exc:
                    log.warning(
                        "session failed; re-creating it",
                        session_id=session.session_id,
                        error=str(exc),
                        error_type=type(exc).__name__,
                    )
                finally:
                    scaler, newest_message_id = loop.scaler, loop.newest_message_id
                    await self._close(actions, session.session_id, records)
                if loop.polls:
                    failures = 0  # the session worked for a while: start the backoff over
                await back_off()
        finally:
            self.metrics.set_leader(False)

    async def _close(self, actions: ActionsClient, session_id: str, records: SessionRecords) -> None:
        self.session_id = self.health.session_id = ""
        if self._abandoned:
            return  # a crash leaves its session behind: that is what the successor must handle
        await close_session(actions, scale_set_id=self.cfg.runner_scale_set_id, session_id=session_id, records=records)


async def _publish_all(bus: Bus, messages: list[BusMessage]) -> None:
    """Publish concurrently; return once all are acknowledged, else raise the first failure."""
    if len(messages) <= 1:  # nothing to overlap: no task group (issue 10: three per service message)
        for message in messages:
            await bus.publish(message)
        return
    failures: list[BusError] = []

    async def one(message: BusMessage) -> None:
        try:
            await bus.publish(message)
        except BusError as exc:
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        for message in messages:
            tg.start_soon(one, message)
    if failures:
        raise failures[0]


async def run_listener(cfg: ListenerConfig) -> None:
    """Run one listener replica until cancelled (``runnerscale listener``)."""
    async with anyio.create_task_group() as tg:
        listener = await tg.start(Listener(cfg).run)
        log.info("listener started", owner=listener.owner, ports=listener.ports, scale_set_id=cfg.runner_scale_set_id)

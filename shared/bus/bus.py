"""The connection to NATS JetStream: start-up checks, publishing, the outbox, and consumers.

``async with Bus.connect(settings) as bus:`` connects (retrying until ``connect_timeout``),
creates or checks the streams and KV buckets it uses (those of the component its NATS user
names in :data:`shared.bus.permissions.USES`, every one named in :mod:`shared.bus.subjects` for
any other user), and runs the outbox drainer in its task group. Leaving the block flushes the outbox (bounded) and closes.
"""

from __future__ import annotations

import collections
import math
import random
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.abc
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from shared.backoff import Backoff
from shared.bus import messages, permissions, subjects
from shared.bus import metrics as m
from shared.bus.errors import (
    BusConfigConflict,
    BusError,
    BusUnavailable,
    MalformedMessage,
    OutboxFull,
    PublishFailed,
    UnknownSchemaVersion,
)
from shared.bus.messages import BusMessage
from shared.bus.settings import BusSettings, redact_url, validate
from shared.bus.subjects import ConsumerSpec, DeliverFrom, StreamSpec, SubjectKind
from shared.log import get_logger
from shared.tasks import background_tasks

log = get_logger(__name__)

T = TypeVar("T")

# Errors after which the same request may succeed later: the connection is down or
# reconnecting, or JetStream is (re)starting. Anything else is a real answer from the server.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.errors.FlushTimeoutError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    TimeoutError,
)


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, TRANSIENT_ERRORS):
        return True
    return isinstance(exc, nats.js.errors.APIError) and exc.code == 503


#: Pause between publish attempts and between failed fetches: 0.1, 0.2, 0.4 ... 2 s.
RETRY_BACKOFF = Backoff(base=0.1, cap=2.0)
#: A handler failure naks the message with this delay by delivery count: 0.5, 1, 2 ... 30 s.
REDELIVERY_BACKOFF = Backoff(base=0.5, cap=30.0)
#: Reconnect pauses: ``reconnect_wait`` at first, doubling to 8x (see :func:`reconnect_delay`).
RECONNECT_DOUBLINGS = 3


def backoff_delay(attempt: int, backoff: Backoff = RETRY_BACKOFF) -> float:
    """The pause after failed attempt number ``attempt`` (counting from 1)."""
    return backoff.delay(max(0, attempt - 1))


def reconnect_delay(failures: int, base: float, jitter: float) -> float:
    """Pause before a reconnect attempt to a server that failed ``failures`` times in a row.

    The first attempt after a drop waits at most ``base`` (a blip heals fast); then the wait
    doubles up to 8 × base. ``jitter`` in [0, 1) spreads replicas out, so a NATS restart is not
    met by every worker reconnecting in the same instant.
    """
    if failures <= 0:
        return base * jitter
    return Backoff(base=base, cap=base * 2**RECONNECT_DOUBLINGS).delay(failures - 1) * (0.5 + jitter / 2)


def _reconnect_handler(base: float) -> Callable[[list[Any], dict[str, Any]], tuple[Any, float]]:
    def choose(servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
        server = min(servers, key=lambda s: s.reconnects)  # least-failed first, pool order on ties
        return server, reconnect_delay(server.reconnects, base, random.random())

    return choose


@dataclass(frozen=True)
class PublishAck:
    stream: str
    sequence: int
    duplicate: bool


@dataclass(frozen=True)
class Delivery:
    """One message handed to a consumer handler, with where it came from."""

    message: BusMessage
    subject: str
    stream: str
    stream_sequence: int
    num_delivered: int  # 1 on first delivery


Handler = Callable[[Delivery], Awaitable[None]]


class Redeliver(Exception):
    """A handler's answer "not yet: give me this message again in ``after`` seconds".

    Not a failure: the message is nak'ed with exactly that delay, counted in
    ``runnerscale_bus_deferred_messages_total`` (not in the handler failures) and logged at debug
    level. A deferral still uses one of the consumer's ``max_deliver`` deliveries, so a handler
    defers a bounded number of times (``Delivery.num_delivered``) and then handles the message;
    one deferred at the last delivery is terminated like a failure.
    """

    def __init__(self, after: float, reason: str = "") -> None:
        if after < 0:
            raise ValueError(f"redelivery delay must be >= 0, got {after}")
        super().__init__(reason or f"redeliver after {after:g}s")
        self.after = after
        self.reason = reason


# --- pure configuration decisions ------------------------------------------------------------


def stream_config(spec: StreamSpec, settings: BusSettings) -> api.StreamConfig:
    """The JetStream configuration a stream should have under ``settings``."""
    return api.StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        discard=api.DiscardPolicy.OLD,
        # A level keeps the latest `history` messages per subject for inspection; an edge
        # stream keeps everything for `job_retention` so a consumer can be down that long.
        max_msgs_per_subject=settings.history if spec.level else -1,
        max_age=0 if spec.level else settings.job_retention,
        duplicate_window=settings.duplicate_window,
        num_replicas=settings.stream_replicas,
    )


# Fields that decide what a stream *is*: changing them under running workers would move or
# drop messages, so a difference is a start-up error. The others are tuned in place.
_IDENTITY_FIELDS = ("subjects", "retention", "storage")
_TUNABLE_FIELDS = ("max_msgs_per_subject", "max_age", "duplicate_window", "num_replicas", "description")


def _norm(field: str, value: Any) -> object:
    if field == "subjects":
        return sorted(value or [])
    if field in ("max_age", "duplicate_window"):
        return round(float(value or 0), 3)
    if field == "num_replicas":
        return value or 1
    if hasattr(value, "value"):
        return value.value
    return value


def diff_stream_config(
    existing: api.StreamConfig, wanted: api.StreamConfig
) -> tuple[dict[str, tuple[object, object]], dict[str, tuple[object, object]]]:
    """Split the differences into (conflicts, tunables), each ``{field: (existing, wanted)}``."""

    def diff(fields: tuple[str, ...]) -> dict[str, tuple[object, object]]:
        out: dict[str, tuple[object, object]] = {}
        for f in fields:
            old, new = _norm(f, getattr(existing, f)), _norm(f, getattr(wanted, f))
            if old != new:
                out[f] = (old, new)
        return out

    return diff(_IDENTITY_FIELDS), diff(_TUNABLE_FIELDS)


def consumer_config(spec: ConsumerSpec, durable: str, *, inactive_threshold: float | None) -> api.ConsumerConfig:
    deliver = {
        DeliverFrom.LAST_PER_SUBJECT: api.DeliverPolicy.LAST_PER_SUBJECT,
        DeliverFrom.ALL: api.DeliverPolicy.ALL,
        DeliverFrom.NEW: api.DeliverPolicy.NEW,
    }[spec.deliver_from]
    return api.ConsumerConfig(
        name=durable,
        durable_name=durable,
        deliver_policy=deliver,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait_seconds,
        # One more than our own limit: we terminate at max_deliver ourselves, with a log line and
        # a metric, instead of the server silently stopping redelivery.
        max_deliver=spec.max_deliver + 1,
        filter_subjects=list(spec.filter_subjects) if len(spec.filter_subjects) > 1 else None,
        filter_subject=spec.filter_subjects[0] if len(spec.filter_subjects) == 1 else None,
        inactive_threshold=inactive_threshold,
        max_ack_pending=1000,
    )


def durable_name(spec: ConsumerSpec, instance: str | None) -> str:
    """A shared durable (work split across replicas) or one per replica instance."""
    if not instance:
        return spec.durable
    return f"{spec.durable}-{subjects.encode_token(instance)}"


def _stream_of(subject: str) -> StreamSpec:
    """The stream a bus subject is stored in; MalformedMessage for anything else."""
    try:
        kind = subjects.parse_subject(subject).kind
    except BusError:
        kind = SubjectKind.UNKNOWN
    stream = {
        SubjectKind.DESIRED: subjects.DESIRED_STREAM,
        SubjectKind.REVISION_PUBLISHED: subjects.REVISIONS_STREAM,
        SubjectKind.REVISION_APPLIED: subjects.REVISIONS_STREAM,
        SubjectKind.RESOURCE_CHANGED: subjects.CHANGES_STREAM,
        SubjectKind.JOB_STARTED: subjects.JOBS_STREAM,
        SubjectKind.JOB_COMPLETED: subjects.JOBS_STREAM,
    }.get(kind)
    if stream is None:
        raise MalformedMessage(subject, "not a runnerscale message subject")
    return stream


def _kind_label(subject: str) -> str:
    try:
        return subjects.parse_subject(subject).kind.value
    except BusError:
        return SubjectKind.UNKNOWN.value


def _tls_context(settings: BusSettings) -> ssl.SSLContext | None:
    if not (
        settings.tls_ca or settings.tls_cert or any(u.startswith(("tls://", "wss://")) for u in settings.nats_urls)
    ):
        return None
    ctx = ssl.create_default_context(cafile=settings.tls_ca or None)
    if settings.tls_cert:
        ctx.load_cert_chain(settings.tls_cert, settings.tls_key)
    return ctx


# --- the bus ---------------------------------------------------------------------------------


class Bus:
    """A connected bus. Create with :meth:`connect`; all methods are safe to call concurrently."""

    def __init__(self, settings: BusSettings, nc: NatsClient, js: JetStreamContext) -> None:
        self.settings = settings
        self.nc = nc
        self.js = js
        self._outbox: collections.deque[BusMessage] = collections.deque()
        self._outbox_changed = anyio.Event()
        self._outbox_empty = anyio.Event()
        self._outbox_empty.set()
        self._kv: dict[str, KeyValue] = {}
        #: What this process's NATS user may set up (README "Authentication and permissions");
        #: None: not a component's user (no authentication, or a custom one), so everything.
        self.uses = permissions.uses_of(settings.user)

    # -- lifecycle --

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, settings: BusSettings, *, name: str = "runnerscale", setup: bool = True, tune_existing: bool = True
    ) -> AsyncIterator[Bus]:
        """Connect, set up streams and buckets (unless ``setup=False``), run the outbox drainer.

        ``tune_existing=False`` creates what is missing but leaves the tunable settings of
        existing streams (history, replicas, retention times) alone: for processes such as the
        listener whose configuration does not carry the cluster's stream sizing, so that each
        start does not flip a stream back to defaults the workers' settings disagree with.
        """
        validate(settings)  # SettingsError before any network traffic
        nc = await _connect(settings, name)
        bus = cls(settings, nc, nc.jetstream(timeout=settings.request_timeout))
        try:
            if setup:
                await bus.ensure_streams(tune_existing=tune_existing)
                await bus.ensure_buckets()
            async with background_tasks(bus._drain_outbox):
                try:
                    yield bus
                finally:
                    with anyio.CancelScope(shield=True):
                        await bus.flush(timeout=min(5.0, settings.publish_deadline))
        finally:
            with anyio.CancelScope(shield=True):
                if bus._outbox:
                    log.error("bus closing with unsent messages", unsent=len(bus._outbox))
                with anyio.move_on_after(2.0):
                    try:
                        await nc.close()
                    except Exception as exc:
                        log.info("NATS connection closed uncleanly", error=type(exc).__name__)
                m.CONNECTED.set(0)

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    async def ensure_streams(self, *, tune_existing: bool = True) -> None:
        """Create every stream this process uses, or check (and unless told not to, tune) an
        existing one; conflicts raise."""
        streams = subjects.STREAMS if self.uses is None else self.uses.streams
        tune = tune_existing and (self.uses is None or self.uses.tune)
        for spec in streams:
            await self.ensure_stream(spec, tune_existing=tune)
        for spec in () if self.uses is None else self.uses.checks:
            await self.ensure_stream(spec, tune_existing=False)

    async def ensure_stream(self, spec: StreamSpec, *, tune_existing: bool = True) -> None:
        wanted = stream_config(spec, self.settings)
        try:
            info = await self._jsm_call(self.js.stream_info(spec.name))
        except nats.js.errors.NotFoundError:
            await self._jsm_call(self.js.add_stream(wanted), resource=f"stream {spec.name}")
            log.info("stream created", stream=spec.name)
            return
        conflicts, tunables = diff_stream_config(info.config, wanted)
        if conflicts:
            raise BusConfigConflict(f"stream {spec.name}", conflicts)
        if tunables and tune_existing:
            await self._jsm_call(self.js.update_stream(wanted), resource=f"stream {spec.name}")
            log.info("stream updated", stream=spec.name, changed=sorted(tunables))

    async def ensure_buckets(self) -> None:
        """Create or check every KV bucket this process uses."""
        for bucket in subjects.BUCKETS if self.uses is None else self.uses.buckets:
            await self.ensure_bucket(bucket)

    async def ensure_bucket(self, bucket: str) -> KeyValue:
        """Create a bucket named in :data:`subjects.BUCKET_SPECS`, or check an existing one.

        Lease buckets get TTL ``lease_ttl``; the others keep their keys until deleted. An
        existing bucket with another TTL is a conflict: lease safety rests on every replica
        agreeing on the TTL (a replica trusts its lease for slightly less than the TTL), and a
        TTL on the session records would silently lose them, so a bucket is never re-timed.
        """
        spec = subjects.bucket_spec(bucket)
        ttl = self.settings.lease_ttl if spec.lease else 0.0
        stream = f"KV_{bucket}"
        try:
            info = await self._jsm_call(self.js.stream_info(stream))
        except nats.js.errors.NotFoundError:
            kv = await self._jsm_call(
                self.js.create_key_value(
                    bucket=bucket,
                    history=1,
                    ttl=ttl or None,
                    replicas=self.settings.stream_replicas,
                    storage=api.StorageType.FILE,
                    description=spec.description,
                ),
                resource=f"bucket {bucket}",
            )
            log.info("bucket created", bucket=bucket, ttl=ttl)
        else:
            existing_ttl = round(float(info.config.max_age or 0), 3)
            if existing_ttl != round(ttl, 3):
                raise BusConfigConflict(f"bucket {bucket}", {"ttl": (existing_ttl, ttl)})
            kv = await self._jsm_call(self.js.key_value(bucket))
        self._kv[bucket] = kv
        return kv

    async def key_value(self, bucket: str) -> KeyValue:
        kv = self._kv.get(bucket)
        if kv is None:
            kv = await self.ensure_bucket(bucket)
        return kv

    # -- plain key/value records (the listener's session records) --

    async def kv_get(self, bucket: str, key: str) -> bytes | None:
        """The value of ``key`` in ``bucket`` (None: absent or deleted). BusError when unreachable."""
        kv = await self.key_value(bucket)
        try:
            entry = await self._jsm_call(kv.get(key))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.NotFoundError):
            return None
        return entry.value or None

    async def kv_put(self, bucket: str, key: str, value: bytes) -> None:
        """Write ``key`` in ``bucket`` (last writer wins). BusError when unreachable."""
        kv = await self.key_value(bucket)
        await self._jsm_call(kv.put(key, value))

    async def kv_delete(self, bucket: str, key: str) -> None:
        """Delete ``key`` from ``bucket`` (absent is fine). BusError when unreachable."""
        kv = await self.key_value(bucket)
        try:
            await self._jsm_call(kv.delete(key))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.NotFoundError):
            return

    async def _jsm_call(self, coro: Awaitable[T], *, resource: str = "") -> T:
        """One JetStream API call with a deadline; server refusals on ``resource`` become conflicts."""
        try:
            with anyio.fail_after(self.settings.request_timeout + 1.0):
                return await coro
        except TimeoutError:
            raise BusUnavailable(f"JetStream did not answer within {self.settings.request_timeout}s") from None
        except nats.js.errors.NotFoundError:
            raise
        except nats.js.errors.APIError as exc:
            if resource and not is_transient(exc):
                raise BusConfigConflict(resource, f"server refused: {exc.description}") from None
            raise BusUnavailable(f"JetStream error: {exc.description}") from None
        except TRANSIENT_ERRORS as exc:
            raise BusUnavailable(f"JetStream unavailable: {type(exc).__name__}") from None

    # -- publishing --

    async def publish(self, message: BusMessage, *, deadline: float | None = None) -> PublishAck:
        """Publish and wait for JetStream's ack, retrying transient failures with backoff.

        Queued outbox messages go first (so a direct publish never overtakes an older level on
        the same subject). Raises :class:`PublishFailed` after ``deadline`` seconds (default
        ``settings.publish_deadline``); the message is then not on the bus.
        """
        budget = self.settings.publish_deadline if deadline is None else deadline
        give_up_at = time.monotonic() + budget
        subject = messages.subject_for(message)
        with anyio.move_on_after(budget):
            await self._outbox_empty.wait()
        if self._outbox:
            raise PublishFailed(subject, 0, f"{len(self._outbox)} earlier messages still in the outbox")
        return await self._publish_with_retries(message, subject, give_up_at)

    async def _publish_with_retries(self, message: BusMessage, subject: str, give_up_at: float | None) -> PublishAck:
        payload = messages.encode(message)
        msg_id = messages.dedup_id(message)
        headers = {"Nats-Msg-Id": msg_id} if msg_id else None
        kind = messages.subject_kind_of(message).value
        attempt = 0
        while True:
            attempt += 1
            remaining = math.inf if give_up_at is None else give_up_at - time.monotonic()
            timeout = min(self.settings.request_timeout, max(0.05, remaining))
            try:
                with anyio.fail_after(timeout + 0.5):
                    ack = await self.js.publish(subject, payload, timeout=timeout, headers=headers)
            except Exception as exc:
                if not is_transient(exc):
                    m.PUBLISH_FAILURES.labels(kind).inc()
                    raise PublishFailed(subject, attempt, type(exc).__name__) from None
                remaining = math.inf if give_up_at is None else give_up_at - time.monotonic()
                if remaining <= 0:
                    m.PUBLISH_FAILURES.labels(kind).inc()
                    raise PublishFailed(subject, attempt, f"{type(exc).__name__} (NATS unreachable)") from None
                m.PUBLISH_RETRIES.labels(kind).inc()
                await anyio.sleep(min(backoff_delay(attempt), remaining))
                continue
            m.PUBLISHED_MESSAGES.labels(kind, str(bool(ack.duplicate)).lower()).inc()
            return PublishAck(ack.stream, ack.seq, bool(ack.duplicate))

    def enqueue(self, message: BusMessage) -> None:
        """Hand ``message`` to the outbox and return at once; it is published in order.

        The outbox survives NATS outages (it drains when the connection returns) but not the
        process. Raises :class:`OutboxFull` at ``outbox_capacity``: never a silent drop.
        """
        messages.encode(message)  # fail now, in the caller, on an unpublishable message
        if len(self._outbox) >= self.settings.outbox_capacity:
            raise OutboxFull(f"outbox holds {len(self._outbox)} messages (capacity {self.settings.outbox_capacity})")
        self._outbox.append(message)
        self._outbox_empty = anyio.Event() if self._outbox_empty.is_set() else self._outbox_empty
        m.OUTBOX_DEPTH.set(len(self._outbox))
        self._outbox_changed.set()

    @property
    def outbox_depth(self) -> int:
        return len(self._outbox)

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until the outbox is empty; False if ``timeout`` passed first."""
        with anyio.move_on_after(timeout if timeout is not None else math.inf):
            await self._outbox_empty.wait()
            return True
        return False

    async def _drain_outbox(self) -> None:
        while True:
            if not self._outbox:
                self._outbox_empty.set()
                self._outbox_changed = anyio.Event()
                await self._outbox_changed.wait()
                continue
            head = self._outbox[0]
            subject = messages.subject_for(head)
            try:
                # No deadline: while NATS is down the outbox holds (bounded by its capacity).
                await self._publish_with_retries(head, subject, None)
            except PublishFailed as exc:
                # A permanent refusal (e.g. stream deleted by hand): say so loudly, move on.
                log.error("outbox message dropped", subject=subject, error=str(exc))
            self._outbox.popleft()
            m.OUTBOX_DEPTH.set(len(self._outbox))

    # -- reading --

    async def last_message(self, subject: str) -> BusMessage | None:
        """The latest message on ``subject`` (a level's current value), or None if there is none."""
        stream = _stream_of(subject)
        try:
            raw = await self._jsm_call(self.js.get_last_msg(stream.name, subject))
        except nats.js.errors.NotFoundError:
            return None
        return messages.decode(subject, raw.data or b"")

    async def purge(self, subject: str) -> None:
        """Drop every message on ``subject``: call it when the resource is deleted, so level
        streams do not keep the history of resources that no longer exist."""
        stream = _stream_of(subject)
        await self._jsm_call(self.js.purge_stream(stream.name, subject=subject))

    # -- consuming --

    async def consume(
        self,
        consumer: ConsumerSpec,
        handler: Handler,
        *,
        instance: str | None = None,
        batch: int = 16,
        fetch_timeout: float = 2.0,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Feed every message of ``consumer`` to ``handler`` until cancelled (``task_status.started()``
        once subscribed, for ``tg.start``).

        ``instance=None`` shares one durable among all replicas (each message to one of them);
        ``instance="<replica id>"`` gives this replica its own durable that every message
        reaches (for levels with sharded handlers), removed by the server after an hour unused.
        The handler's return acks; an exception naks with backoff, and the
        ``consumer.max_deliver``-th failure terminates. Undecodable messages are terminated and
        counted without reaching the handler.
        """
        durable = durable_name(consumer, instance)
        config = consumer_config(consumer, durable, inactive_threshold=3600.0 if instance else None)
        await self._ensure_consumer(consumer.stream, config)
        log.info("consuming", stream=consumer.stream, durable=durable)
        sub = await self._jsm_call(self.js.pull_subscribe_bind(durable=durable, stream=consumer.stream))
        task_status.started()
        failures = 0
        pending = 0
        try:
            while True:
                try:
                    # nats-py's long poll for N messages holds the first one until N arrive or the
                    # poll expires, so wait for one at a time and batch only what is known to be
                    # pending already (that request returns at once).
                    msgs = await sub.fetch(min(batch, pending) if pending > 0 else 1, timeout=fetch_timeout)
                except nats.errors.TimeoutError:
                    failures, pending = 0, 0
                    continue
                except Exception as exc:
                    failures += 1
                    if isinstance(exc, nats.js.errors.NotFoundError) or failures % 10 == 0:
                        # The consumer may be gone (deleted by hand, or the store was lost).
                        try:
                            await self._ensure_consumer(consumer.stream, config)
                        except BusError as setup_exc:
                            log.warning("consumer re-create failed", durable=durable, error=str(setup_exc))
                    pending = 0
                    log.warning("fetch failed", durable=durable, error=type(exc).__name__, attempt=failures)
                    await anyio.sleep(backoff_delay(failures))
                    continue
                failures = 0
                for raw in msgs:
                    await self._dispatch(consumer, raw, handler)
                pending = msgs[-1].metadata.num_pending if msgs else 0
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(1.0), suppress(Exception):
                await sub.unsubscribe()

    async def _ensure_consumer(self, stream: str, config: api.ConsumerConfig) -> None:
        try:
            assert config.durable_name is not None  # consumer_config always names it
            info = await self._jsm_call(self.js.consumer_info(stream, config.durable_name))
        except nats.js.errors.NotFoundError:
            await self._jsm_call(
                self.js.add_consumer(stream, config), resource=f"consumer {stream}/{config.durable_name}"
            )
            return
        existing = info.config
        conflicts = {}
        for f in ("filter_subject", "deliver_policy", "ack_policy"):
            old, new = _norm(f, getattr(existing, f)), _norm(f, getattr(config, f))
            if old != new:
                conflicts[f] = (old, new)
        if sorted(existing.filter_subjects or []) != sorted(config.filter_subjects or []):
            conflicts["filter_subjects"] = (existing.filter_subjects, config.filter_subjects)
        if conflicts:
            raise BusConfigConflict(f"consumer {stream}/{config.durable_name}", conflicts)
        tunables = [
            f
            for f in ("ack_wait", "max_deliver", "inactive_threshold", "max_ack_pending")
            if _norm("max_age", getattr(existing, f)) != _norm("max_age", getattr(config, f))
        ]
        if tunables:
            # Redelivery bounds changed with a new release: the server updates these in place.
            await self._jsm_call(
                self.js.add_consumer(stream, config), resource=f"consumer {stream}/{config.durable_name}"
            )
            log.info("consumer updated", stream=stream, durable=config.durable_name, changed=tunables)

    async def _dispatch(self, consumer: ConsumerSpec, raw: Msg, handler: Handler) -> None:
        meta = raw.metadata
        subject = raw.subject
        kind = _kind_label(subject)
        try:
            message = messages.decode(subject, raw.data or b"")
        except (MalformedMessage, UnknownSchemaVersion) as exc:
            reason = "unknown_schema_version" if isinstance(exc, UnknownSchemaVersion) else "malformed"
            m.REJECTED_MESSAGES.labels(kind, reason).inc()
            log.error(
                "message rejected",
                subject=subject,
                stream=meta.stream,
                stream_sequence=meta.sequence.stream,
                reason=reason,
                error=str(exc),
            )
            await self._settle(raw.term, subject)
            return
        delivery = Delivery(message, subject, meta.stream, meta.sequence.stream, meta.num_delivered)
        m.DELIVERY_LATENCY.labels(kind).observe(max(0.0, (messages.utcnow() - message.time).total_seconds()))
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._keep_in_progress, raw, consumer.ack_wait_seconds)
            try:
                await handler(delivery)
            except Exception as exc:
                failure = exc
            finally:
                tg.cancel_scope.cancel()
        if failure is None:
            m.HANDLED_MESSAGES.labels(kind).inc()
            await self._settle(raw.ack, subject)
            return
        fields: dict[str, Any] = dict(
            subject=subject, stream_sequence=meta.sequence.stream, delivery=meta.num_delivered
        )
        if isinstance(failure, Redeliver) and meta.num_delivered < consumer.max_deliver:
            deferred = failure
            m.DEFERRED_MESSAGES.labels(kind).inc()
            log.debug("handler deferred the message", after=deferred.after, reason=deferred.reason, **fields)
            await self._settle(lambda: raw.nak(delay=deferred.after), subject)
            return
        m.HANDLER_FAILURES.labels(kind).inc()
        if meta.num_delivered >= consumer.max_deliver:
            m.TERMINATED_MESSAGES.labels(kind).inc()
            log.error("handler failed, giving up", error=f"{type(failure).__name__}: {failure}", **fields)
            await self._settle(raw.term, subject)
        else:
            log.warning("handler failed, will retry", error=f"{type(failure).__name__}: {failure}", **fields)
            await self._settle(lambda: raw.nak(delay=backoff_delay(meta.num_delivered, REDELIVERY_BACKOFF)), subject)

    @staticmethod
    async def _keep_in_progress(raw: Msg, ack_wait: float) -> None:
        # A slow handler must not see its message redelivered to another replica mid-flight.
        while True:
            await anyio.sleep(ack_wait / 3)
            try:
                await raw.in_progress()
            except Exception:
                return

    @staticmethod
    async def _settle(action: Callable[[], Awaitable[None]], subject: str) -> None:
        try:
            with anyio.fail_after(2.0):
                await action()
        except Exception as exc:
            log.warning(
                "ack/nak/term not sent; the message will be redelivered", subject=subject, error=type(exc).__name__
            )


async def _connect(settings: BusSettings, name: str) -> NatsClient:
    """Connect with reconnects forever; the first connection is retried until ``connect_timeout``."""

    async def disconnected() -> None:
        m.CONNECTED.set(0)
        if not nc.is_closed:  # our own close() is not news
            log.warning("NATS disconnected")

    async def reconnected() -> None:
        m.CONNECTED.set(1)
        m.RECONNECTS.inc()
        log.info("NATS reconnected")

    async def error(exc: Exception) -> None:
        log.warning("NATS connection error", error=f"{type(exc).__name__}: {exc}")

    options: dict[str, Any] = dict(
        servers=list(settings.nats_urls),
        name=name,
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=settings.reconnect_wait,  # first connection only
        reconnect_to_server_handler=_reconnect_handler(settings.reconnect_wait),
        connect_timeout=min(settings.connect_timeout, 2.0),
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
        error_cb=error,
        tls=_tls_context(settings),
    )
    if settings.creds_file:
        options["user_credentials"] = settings.creds_file
    if settings.user:
        options.update(user=settings.user, password=settings.effective_password)
    if settings.token:
        options["token"] = settings.token
    # nats-py retries the first connection itself (every reconnect_wait) when reconnects are
    # unlimited; the deadline bounds it and we close the half-made client on the way out.
    nc = NatsClient()
    try:
        with anyio.fail_after(settings.connect_timeout):
            await nc.connect(**options)
    except BaseException as exc:
        # Closed on every way out, cancellation too: a half-made client left open leaks its socket.
        last = nc.last_error or exc
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            await nc.close()
        if not isinstance(exc, (TimeoutError, OSError, nats.errors.Error)):
            raise
        raise BusUnavailable(
            f"cannot connect to NATS at {', '.join(redact_url(u) for u in settings.nats_urls)} "
            f"within {settings.connect_timeout}s: {_connect_failure(last)}"
        ) from None
    m.CONNECTED.set(1)
    return nc


def _connect_failure(exc: BaseException) -> str:
    """Why the first connection failed, without credentials: a refused login says so plainly
    (README "Authentication and permissions")."""
    if "authorization violation" in str(exc).lower():
        return (
            "authorization violation: the server refused this process's credentials "
            "(RUNNERSCALE_NATS_USER / _PASSWORD / _PASSWORD_FILE / _TOKEN / _CREDS missing or wrong)"
        )
    return type(exc).__name__

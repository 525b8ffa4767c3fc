"""Kubernetes Events about objects, de-duplicated like client-go's recorder.

The first occurrence of (object, type, reason, message) creates an Event named
``<object name>.<hex nanoseconds>`` with ``count: 1``; repeats patch ``count`` and
``lastTimestamp`` of that Event. If the Event has gone (expired, deleted), a new one is created.

Recording is best effort, as in client-go: failures are logged, never raised, and each write
has a short deadline, so a sick API server cannot stall a reconcile on an Event. A namespace the
API server reports as terminating (403, cause NamespaceTerminating) gets no Event writes for
``TERMINATING_SKIP`` seconds, and that is logged once per namespace, not once per Event.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from shared.kube.errors import Forbidden, KubeError, NotFound
from shared.kube.objects import kube_time
from shared.kube.resources import EVENTS, RESOURCE_BY_KIND, ObjectKey
from shared.kube.writer import ApiWriter, best_effort_writes
from shared.log import get_logger

log = get_logger(__name__)


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True)
class InvolvedObject:
    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def of(cls, obj: Any) -> InvolvedObject:
        """From a typed object (a custom resource struct or one of ``shared.kube.objects``)."""
        kind = str(getattr(obj, "KIND", None) or getattr(obj, "kind", ""))
        resource = RESOURCE_BY_KIND.get(kind)
        api_version = getattr(obj, "api_version", "") or (resource.api_version if resource else "")
        meta = obj.metadata
        return cls(api_version, kind, meta.namespace, meta.name, meta.uid)


@dataclass
class _Seen:
    event_name: str
    count: int


#: Seconds during which no Event is written into a namespace that answered "being terminated".
TERMINATING_SKIP = 300.0


def namespace_terminating(exc: KubeError) -> bool:
    """A 403 because the namespace is being terminated (the NamespaceLifecycle admission plugin)."""
    if not isinstance(exc, Forbidden):
        return False
    causes = exc.details.causes if exc.details is not None else []
    return any(c.reason == "NamespaceTerminating" for c in causes) or "because it is being terminated" in exc.message


def event_name(object_name: str, now_ns: int) -> str:
    """client-go's Event name: ``<object>.<hex unix nanos>`` (pure)."""
    return f"{object_name}.{now_ns:x}"


class EventRecorder:
    def __init__(
        self, writer: ApiWriter, component: str, *, host: str = "", cache_size: int = 4096, timeout: float = 5.0
    ) -> None:
        self.writer = writer
        self.component = component
        self.host = host
        self.timeout = timeout
        self._seen: OrderedDict[tuple[Any, ...], _Seen] = OrderedDict()
        self._cache_size = cache_size
        # namespace -> monotonic time until which its Events are skipped (terminating namespaces)
        self._terminating: OrderedDict[str, float] = OrderedDict()

    async def event(self, obj: Any, type: EventType | str, reason: str, message: str) -> None:
        """Record an Event about ``obj`` (typed object or :class:`InvolvedObject`)."""
        involved = obj if isinstance(obj, InvolvedObject) else InvolvedObject.of(obj)
        etype = str(EventType(type))
        key = (involved, etype, reason, message)
        now = datetime.now(UTC)
        seen = self._seen.get(key)
        if self._terminating.get(involved.namespace, 0.0) > time.monotonic():
            return
        try:
            with best_effort_writes():
                await self._write(involved, key, seen, etype, reason, message, now)
        except KubeError as exc:
            if namespace_terminating(exc):
                first = involved.namespace not in self._terminating
                self._terminating[involved.namespace] = time.monotonic() + TERMINATING_SKIP
                self._terminating.move_to_end(involved.namespace)
                while len(self._terminating) > self._cache_size:
                    self._terminating.popitem(last=False)
                if first:
                    log.info(
                        "namespace is being terminated; no events are recorded in it",
                        namespace=involved.namespace,
                        name=involved.name,
                        reason=reason,
                    )
                return
            log.warning(
                "could not record event",
                namespace=involved.namespace,
                name=involved.name,
                reason=reason,
                error=str(exc),
            )

    async def _write(
        self,
        involved: InvolvedObject,
        key: tuple[Any, ...],
        seen: _Seen | None,
        etype: str,
        reason: str,
        message: str,
        now: datetime,
    ) -> None:
        if seen is not None:
            try:
                await self.writer.patch_merge(
                    EVENTS,
                    ObjectKey(involved.namespace, seen.event_name),
                    {"count": seen.count + 1, "lastTimestamp": kube_time(now)},
                    timeout=self.timeout,
                )
                seen.count += 1
                self._seen.move_to_end(key)
                return
            except NotFound:
                del self._seen[key]
        name = event_name(involved.name, time.time_ns())
        body = {
            "metadata": {"name": name, "namespace": involved.namespace},
            "involvedObject": {
                "apiVersion": involved.api_version,
                "kind": involved.kind,
                "namespace": involved.namespace,
                "name": involved.name,
                **({"uid": involved.uid} if involved.uid else {}),
            },
            "reason": reason,
            "message": message,
            "type": etype,
            "source": {"component": self.component, **({"host": self.host} if self.host else {})},
            "reportingComponent": self.component,
            "count": 1,
            "firstTimestamp": kube_time(now),
            "lastTimestamp": kube_time(now),
        }
        await self.writer.create(EVENTS, body, timeout=self.timeout)
        self._seen[key] = _Seen(name, 1)
        while len(self._seen) > self._cache_size:
            self._seen.popitem(last=False)

    async def normal(self, obj: Any, reason: str, message: str) -> None:
        await self.event(obj, EventType.NORMAL, reason, message)

    async def warning(self, obj: Any, reason: str, message: str) -> None:
        await self.event(obj, EventType.WARNING, reason, message)

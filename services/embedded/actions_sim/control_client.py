"""A client of the simulator's control API (``/_sim/``), async with a blocking twin.

``control = SimControl(url)``; ``await control.enqueue_jobs(count=3, labels=["my-set"])``;
``control.sync.jobs()`` does the same without an event loop (for threads and plain tests).
Each method is written once: it describes the request, and the transport (aiohttp or urllib)
performs it.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import aiohttp
import msgspec

from services.embedded.actions_sim import views
from services.embedded.actions_sim.wire import Statistics

TIMEOUT = 10.0


class SimControlError(Exception):
    """The control API answered an error (status and the simulator's message)."""

    def __init__(self, method: str, path: str, status: int, text: str) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {text[:500]}")
        self.status = status
        self.text = text


def _identity(x: Any) -> Any:
    return x


class _Methods:
    """The control API's vocabulary; ``_call`` returns a value (sync) or an awaitable (async)."""

    def _call(
        self, method: str, path: str, body: Any = None, type_: Any = None, pick: Callable[[Any], Any] = _identity
    ) -> Any:
        raise NotImplementedError

    def enqueue_jobs(
        self,
        count: int = 1,
        labels: list[str] | None = None,
        duration: float = 0.0,
        result: str = "succeeded",
        repository: str | None = None,
        workflow_ref: str | None = None,
        display_name: str | None = None,
        event_name: str = "workflow_dispatch",
    ) -> Any:
        spec = views.JobSpec(
            count=count,
            labels=labels or [],
            duration=duration,
            result=result,
            repository=repository or "",
            workflow_ref=workflow_ref or "",
            display_name=display_name or "",
            event_name=event_name,
        )
        return self._call("POST", "/_sim/jobs", spec, list[views.JobView])

    def jobs(self) -> Any:
        return self._call("GET", "/_sim/jobs", None, list[views.JobView])

    def runners(self) -> Any:
        return self._call("GET", "/_sim/runners", None, list[views.RunnerView])

    def crash_runner(self, runner_id: int) -> Any:
        return self._call("POST", f"/_sim/runners/{runner_id}/crash")

    def sessions(self) -> Any:
        return self._call("GET", "/_sim/sessions", None, list[views.SessionView])

    def evict_session(self, session_id: str) -> Any:
        return self._call("DELETE", f"/_sim/sessions/{session_id}")

    def scale_sets(self) -> Any:
        return self._call("GET", "/_sim/scalesets", None, list[views.ScaleSetView])

    def delete_scale_set(self, scale_set_id: int) -> Any:
        return self._call("DELETE", f"/_sim/scalesets/{scale_set_id}")

    def messages(self, scale_set_id: int) -> Any:
        return self._call("GET", f"/_sim/scalesets/{scale_set_id}/messages", None, list[views.MessageView])

    def inject_message(
        self,
        scale_set_id: int,
        events: list[dict[str, Any]] | None = None,
        body: str | None = None,
        statistics: Statistics | None = None,
        message_type: str | None = None,
    ) -> Any:
        payload = {"events": events or [], "body": body, "statistics": statistics, "message_type": message_type}
        return self._call(
            "POST", f"/_sim/scalesets/{scale_set_id}/messages", payload, views.MessageCreated, lambda m: m.message_id
        )

    def requests(self) -> Any:
        return self._call("GET", "/_sim/requests", None, list[views.RequestRecord])

    def clear_requests(self) -> Any:
        return self._call("DELETE", "/_sim/requests")

    def request_counts(self) -> Any:
        return self._call("GET", "/_sim/request-counts", None, list[views.RequestCount])

    def clear_request_counts(self) -> Any:
        return self._call("DELETE", "/_sim/request-counts")

    def set_fault(
        self,
        endpoint: str,
        kind: str = "status",
        status: int = 500,
        count: int | None = 1,
        retry_after: str | int | None = None,
        seconds: float = 0.0,
        body: str | None = None,
        content_type: str = "application/json; charset=utf-8",
        method: str = "",
    ) -> Any:
        rule = views.FaultRule(
            endpoint=endpoint,
            kind=kind,  # type: ignore[arg-type]
            status=status,
            count=count,
            method=method,
            retry_after=None if retry_after is None else str(retry_after),
            seconds=seconds,
            body=body,
            content_type=content_type,
        )
        return self._call("POST", "/_sim/faults", rule, views.FaultCreated, lambda f: f.id)

    def faults(self) -> Any:
        return self._call("GET", "/_sim/faults", None, list[views.FaultView])

    def clear_faults(self) -> Any:
        return self._call("DELETE", "/_sim/faults")

    def set_min_runner_version(self, version: str) -> Any:
        return self._call("POST", "/_sim/min-runner-version", views.MinRunnerVersion(version), views.SimSettings)

    def configure(self, **settings: Any) -> Any:
        patch = views.SettingsPatch(**settings)
        return self._call("POST", "/_sim/config", patch, views.SimSettings)

    def settings(self) -> Any:
        return self._call("GET", "/_sim/config", None, views.SimSettings)

    def advance_clock(self, seconds: float) -> Any:
        return self._call("POST", "/_sim/clock", views.ClockAdvance(seconds), views.ClockView, lambda c: c.now)

    def reset(self) -> Any:
        return self._call("POST", "/_sim/reset")


def _ssl_context(ca_pem: str) -> ssl.SSLContext | None:
    return ssl.create_default_context(cadata=ca_pem) if ca_pem else None


class SyncSimControl(_Methods):
    def __init__(self, url: str, timeout: float = TIMEOUT, ca_pem: str = "") -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._ssl = _ssl_context(ca_pem)

    def _call(
        self, method: str, path: str, body: Any = None, type_: Any = None, pick: Callable[[Any], Any] = _identity
    ) -> Any:
        data = None if body is None else msgspec.json.encode(body)
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise SimControlError(method, path, exc.code, exc.read().decode(errors="replace")) from None
        return pick(msgspec.json.decode(raw, type=type_)) if type_ is not None else None


class SimControl(_Methods):
    """Async control client; ``.sync`` is the blocking twin with the same methods."""

    def __init__(self, url: str, timeout: float = TIMEOUT, ca_pem: str = "") -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._ssl = _ssl_context(ca_pem)
        self.sync = SyncSimControl(url, timeout, ca_pem)

    async def _acall(self, method: str, path: str, body: Any, type_: Any, pick: Callable[[Any], Any]) -> Any:
        data = None if body is None else msgspec.json.encode(body)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(
                method, self.url + path, data=data, headers=headers, ssl=self._ssl if self._ssl else True
            ) as resp,
        ):
            raw = await resp.read()
            if resp.status >= 400:
                raise SimControlError(method, path, resp.status, raw.decode(errors="replace"))
        return pick(msgspec.json.decode(raw, type=type_)) if type_ is not None else None

    def _call(
        self, method: str, path: str, body: Any = None, type_: Any = None, pick: Callable[[Any], Any] = _identity
    ) -> Any:
        return self._acall(method, path, body, type_, pick)


__all__ = ["SimControl", "SimControlError", "SyncSimControl"]

"""Readiness and liveness probes of process pods (the only containers that really listen).

``probe_plan`` (pure) turns a probe spec into a :class:`ProbePlan`; ``check`` performs one
attempt. httpGet and tcpSocket are checked against the pod IP (the host, for process pods); exec
and grpc probes are not run and count as passing (a log line says so once).
"""

from __future__ import annotations

from typing import Any, Literal

import aiohttp
import anyio
import msgspec

Obj = dict[str, Any]


class ProbePlan(msgspec.Struct, kw_only=True):
    kind: Literal["http", "tcp", "unsupported"]
    host: str
    port: int = 0
    path: str = "/"
    scheme: str = "http"
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3
    error: str = ""  # why it cannot be checked (unsupported kind, unknown named port)


def _port(value: Any, container: Obj) -> int | None:
    if isinstance(value, int):
        return value
    text = str(value or "")
    if text.isdigit():
        return int(text)
    for p in container.get("ports") or []:
        if isinstance(p, dict) and p.get("name") == text and isinstance(p.get("containerPort"), int):
            return int(p["containerPort"])
    return None


def probe_plan(probe: Obj, container: Obj, pod_ip: str) -> ProbePlan:
    """Defaults as the API server sets them (period 10 s, timeout 1 s, thresholds 1 / 3)."""
    common: dict[str, Any] = dict(
        initial_delay=float(probe.get("initialDelaySeconds") or 0),
        period=float(probe.get("periodSeconds") or 10),
        timeout=float(probe.get("timeoutSeconds") or 1),
        success_threshold=int(probe.get("successThreshold") or 1),
        failure_threshold=int(probe.get("failureThreshold") or 3),
    )
    if isinstance(probe.get("httpGet"), dict):
        h = probe["httpGet"]
        port = _port(h.get("port"), container)
        headers = {
            str(x.get("name")): str(x.get("value", "")) for x in h.get("httpHeaders") or [] if isinstance(x, dict)
        }
        return ProbePlan(
            kind="http",
            host=str(h.get("host") or pod_ip),
            port=port or 0,
            path=str(h.get("path") or "/"),
            scheme=str(h.get("scheme") or "HTTP").lower(),
            headers=headers,
            error="" if port else f"unknown port {h.get('port')!r}",
            **common,
        )
    if isinstance(probe.get("tcpSocket"), dict):
        t = probe["tcpSocket"]
        port = _port(t.get("port"), container)
        return ProbePlan(
            kind="tcp",
            host=str(t.get("host") or pod_ip),
            port=port or 0,
            error="" if port else f"unknown port {t.get('port')!r}",
            **common,
        )
    return ProbePlan(
        kind="unsupported",
        host=pod_ip,
        error=f"probe kind {sorted(k for k in probe if k in ('exec', 'grpc'))} not run by the node simulator",
        **common,
    )


async def check(plan: ProbePlan, http: aiohttp.ClientSession) -> tuple[bool, str]:
    """One attempt: (success, failure message as a kubelet words it)."""
    if plan.kind == "unsupported" or plan.error:
        return (plan.kind == "unsupported"), plan.error
    if plan.kind == "tcp":
        try:
            with anyio.fail_after(plan.timeout):
                stream = await anyio.connect_tcp(plan.host, plan.port)
            await stream.aclose()
            return True, ""
        except (OSError, TimeoutError) as exc:
            return (
                False,
                f"dial tcp {plan.host}:{plan.port}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else 'i/o timeout'}",
            )
    url = f"{plan.scheme}://{plan.host}:{plan.port}{plan.path}"
    try:
        async with http.get(
            url, headers=plan.headers, timeout=aiohttp.ClientTimeout(total=plan.timeout), ssl=False
        ) as resp:
            if 200 <= resp.status < 400:
                return True, ""
            return False, f"HTTP probe failed with statuscode: {resp.status}"
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return False, f'Get "{url}": {type(exc).__name__}'

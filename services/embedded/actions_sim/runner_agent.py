"""Play one ephemeral runner against the simulator, as the node simulator's runner pods do.

``outcome = await run_runner(sim_url, encoded_jit_config)`` connects with the JIT config, waits
for the job the service hands it, reports it started, "works" for the job's duration, reports it
completed, and returns the exit code the runner container would have:

- 0: the job ran (whatever its result), or the runner was removed before it got one;
- 7: rejected as outdated (below the simulator's minimum runner version);
- 1: the JIT config or the simulator's answers were unusable.

Runner-side API (simulator-only, ``Authorization: Bearer <token from the JIT config>``):
``POST /_runner/connect {"version"}`` → 200 (with ``job`` when one is already handed to the runner:
the first poll is skipped) / 403 outdated; ``GET /_runner/job?wait=S`` → 200
job / 204 none yet / 404 removed; ``POST /_runner/jobs/{id}/started`` → 204 / 409 not yours;
``POST /_runner/jobs/{id}/completed {"result"}`` → 204; ``POST /_runner/disconnect`` → 204 (the
process is going away: a started job ends canceled, the runner stays registered, offline).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
import anyio
import msgspec

from services.embedded.actions_sim import views
from services.embedded.actions_sim.jitconfig import JitConfigError, decode_jit_config
from shared.log import get_logger

log = get_logger(__name__)

DEFAULT_RUNNER_VERSION = "2.329.0"
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_OUTDATED = 7
_TRANSIENT_ATTEMPTS = 5


class RunnerOutcome(msgspec.Struct, kw_only=True):
    exit_code: int
    reason: str
    runner_name: str = ""
    job_id: str = ""
    result: str = ""


class _Unusable(Exception):
    """The simulator answered something a runner cannot work with."""


async def run_runner(
    sim_url: str | None,
    jit_config: str,
    *,
    version: str = DEFAULT_RUNNER_VERSION,
    job_wait: float = 30.0,
    request_timeout: float = 10.0,
    on_started: Callable[[views.RunnerJob], Awaitable[None]] | None = None,
    connector: aiohttp.BaseConnector | None = None,
) -> RunnerOutcome:
    """Run one runner to completion. ``sim_url`` overrides the server URL inside the JIT config
    (a pod may reach the simulator by another address); cancel the call to kill the runner.
    ``connector``: a connection pool shared with other runners (kept open), else the runner's own."""
    try:
        config = decode_jit_config(jit_config)
    except JitConfigError as exc:
        return RunnerOutcome(exit_code=EXIT_ERROR, reason=str(exc))
    name = config.runner.agent_name
    base = (sim_url or config.runner.server_url).rstrip("/")
    headers = {"Authorization": f"Bearer {config.credentials.data.token}"}
    async with aiohttp.ClientSession(
        base_url=base, headers=headers, connector=connector, connector_owner=connector is None
    ) as http:
        try:
            return await _run(http, name, version, job_wait, request_timeout, on_started)
        except _Unusable as exc:
            log.warning("runner gave up", runner=name, reason=str(exc))
            return RunnerOutcome(exit_code=EXIT_ERROR, reason=str(exc), runner_name=name)


async def _request(
    http: aiohttp.ClientSession, method: str, path: str, *, timeout: float, json: object = None
) -> tuple[int, bytes]:
    """One call, retrying connection errors and 5xx a few times (a real runner is patient too)."""
    delay = 0.2
    for attempt in range(_TRANSIENT_ATTEMPTS):
        try:
            body = None if json is None else msgspec.json.encode(json)
            hdrs = {"Content-Type": "application/json"} if body is not None else None
            async with http.request(
                method, path, data=body, headers=hdrs, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                raw = await resp.read()
                if resp.status < 500 or attempt == _TRANSIENT_ATTEMPTS - 1:
                    return resp.status, raw
        except (aiohttp.ClientError, TimeoutError) as exc:
            if attempt == _TRANSIENT_ATTEMPTS - 1:
                raise _Unusable(f"{method} {path} failed: {type(exc).__name__}") from None
        await anyio.sleep(delay)  # backoff between retries, not synchronisation
        delay *= 2
    raise _Unusable(f"{method} {path} failed")  # pragma: no cover - loop always returns or raises


async def _run(
    http: aiohttp.ClientSession,
    name: str,
    version: str,
    job_wait: float,
    timeout: float,
    on_started: Callable[[views.RunnerJob], Awaitable[None]] | None,
) -> RunnerOutcome:
    status, raw = await _request(http, "POST", "/_runner/connect", timeout=timeout, json=views.RunnerConnect(version))
    if status == 403:
        log.info("runner rejected as outdated", runner=name, version=version)
        return RunnerOutcome(exit_code=EXIT_OUTDATED, reason="outdated", runner_name=name)
    if status == 404:
        return RunnerOutcome(exit_code=EXIT_OK, reason="removed", runner_name=name)
    if status != 200:
        raise _Unusable(f"connect answered HTTP {status}")
    try:
        first = msgspec.json.decode(raw, type=views.RunnerConnected).job
    except msgspec.DecodeError:
        raise _Unusable("connect answered an invalid body") from None
    finished = False
    try:
        outcome = await _work(http, name, job_wait, timeout, on_started, first)
        finished = True
        return outcome
    finally:
        if not finished:
            # Killed (cancelled) or failed while online: tell the service, briefly and shielded,
            # as a runner's shutdown handler does; if that fails the service just sees silence.
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    async with http.post("/_runner/disconnect", timeout=aiohttp.ClientTimeout(total=2)):
                        pass
                except (aiohttp.ClientError, TimeoutError):
                    pass


async def _poll(http: aiohttp.ClientSession, job_wait: float, timeout: float) -> views.RunnerJob | RunnerOutcome | None:
    """One job long-poll: the job, None (none yet), or the outcome "removed"."""
    status, raw = await _request(http, "GET", f"/_runner/job?wait={job_wait}", timeout=job_wait + timeout)
    if status == 204:
        return None
    if status == 404:
        return RunnerOutcome(exit_code=EXIT_OK, reason="removed")
    if status != 200:
        raise _Unusable(f"job poll answered HTTP {status}")
    try:
        return msgspec.json.decode(raw, type=views.RunnerJob)
    except msgspec.DecodeError:
        raise _Unusable("job poll answered an invalid job") from None


async def _work(
    http: aiohttp.ClientSession,
    name: str,
    job_wait: float,
    timeout: float,
    on_started: Callable[[views.RunnerJob], Awaitable[None]] | None,
    first: views.RunnerJob | None = None,
) -> RunnerOutcome:
    while True:
        answer: views.RunnerJob | RunnerOutcome | None = first
        first = None
        if answer is None:
            answer = await _poll(http, job_wait, timeout)
        if answer is None:
            continue
        if isinstance(answer, RunnerOutcome):
            return RunnerOutcome(exit_code=answer.exit_code, reason=answer.reason, runner_name=name)
        job = answer
        status, _ = await _request(http, "POST", f"/_runner/jobs/{job.job_id}/started", timeout=timeout)
        if status == 409:
            continue  # the service took the job back (assignment timeout); wait for another
        if status != 204:
            raise _Unusable(f"job started answered HTTP {status}")
        if on_started is not None:
            await on_started(job)
        await anyio.sleep(job.duration)  # the job's work
        status, _ = await _request(
            http,
            "POST",
            f"/_runner/jobs/{job.job_id}/completed",
            timeout=timeout,
            json=views.RunnerJobCompleted(job.result),
        )
        if status != 204:
            raise _Unusable(f"job completed answered HTTP {status}")
        return RunnerOutcome(
            exit_code=EXIT_OK, reason="completed", runner_name=name, job_id=job.job_id, result=job.result
        )

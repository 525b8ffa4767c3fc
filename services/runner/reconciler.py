"""The async shell of the runner worker: read, decide (pure), write.

Reads (README "runner worker", reads and caches):

- The EphemeralRunner of a pass comes from the worker's informer. Every write decided on it
  carries its resourceVersion (deletes: the uid), so a cache that lags costs a 409 and a re-read,
  never a wrong write. A key this worker has seen (read or written) that is missing from the
  cache ends its pass with no read and no write: the ER is gone (the informer's delete, or the
  garbage collection of its pod, woke the pass); were it back, the informer's add would wake the
  key again. Such a key is remembered as gone (bounded), so a job event for it that is
  redelivered after the runner-set deleted the ER is dropped without a GET while the cache still
  lacks it. A key never seen is read from the server (an ER the informer cannot decode is found
  only that way). Two guards keep a lagging cache from costing more than that:
  *read-your-writes*: the worker remembers the newest resourceVersion it has seen of each ER (its
  own writes' answers and its GETs); a cached copy older than that is not used, the ER is read
  from the server (else a pass right after the worker's own status patch would see no runner id
  and call the Actions service for a JIT config again); and a pass re-run after a 409, or a key
  whose last pass found the cache stale, reads from the server.
- Authoritative reads (an uncached GET) stay where a stale answer could lead to a wrong action:
  a runner pod missing from the pod cache (a job recorded just before the pod vanished must be
  seen, or the runner would get a new pod for a spent JIT config: the pod and then the ER are
  re-read), a job event's write (the ER may not be in this replica's cache yet: a missed event
  would be lost; a deferral, or an event the cached copy records already, is decided on the cache
  when it is fresh enough: it writes nothing), the JIT Secret of a registration the service reports as existing, and
  the pod and Secret before a delete of the failed-runner cleanup.
- Nothing the worker has just created is read back: the JIT Secret and the pod are created
  without a read first (AlreadyExists is the existence check).

The controller runs each pass under its shared policy (README "Worker runtime"): a 409 re-reads
and decides again, and a write without a precondition is refused before it is sent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import anyio
import msgspec

from services.runner import build, decide, jobs
from services.runner.decide import RunnerSettings
from services.runner.metrics import RunnerMetrics, runner_metrics
from shared.actions import (
    ActionsClient,
    ActionsError,
    JobStillRunningError,
    RunnerExistsError,
    RunnerNotFoundError,
)
from shared.api import EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerStatus, finished, validate
from shared.api.constants import (
    API_VERSION,
    FINALIZER_EPHEMERAL_RUNNER,
    FINALIZER_RUNNER_REGISTRATION,
    KIND_EPHEMERAL_RUNNER,
    LABEL_EPHEMERAL_RUNNER,
    LABEL_RUNNER_POD,
    LABEL_SCALE_SET_NAME,
)
from shared.bus import Delivery, Redeliver
from shared.bus.messages import JobCompleted, JobStarted
from shared.clock import SYSTEM_CLOCK, Clock
from shared.kube import (
    DONE,
    EPHEMERAL_RUNNERS,
    PODS,
    SECRETS,
    AlreadyExists,
    ApiReader,
    ApiWriter,
    DecodeFailed,
    EventRecorder,
    Forbidden,
    Invalid,
    InvolvedObject,
    KubeError,
    NotFound,
    ObjectKey,
    ReconcileContext,
    Resource,
    Result,
    retry_on_conflict,
)
from shared.kube.objects import Pod, Secret, SecretDataError
from shared.log import get_logger
from shared.version import version
from shared.worker import ActionsCredentialsUnavailable, WorkerContext

log = get_logger(__name__)

JsonTree = dict[str, Any]
# The runner worker's own finalizers; teardown removes both in one patch (README "runner worker").
OWN_FINALIZERS = decide.OWN_FINALIZERS


class ClientSource(Protocol):
    """Where Actions clients come from (``shared.worker.ActionsClientPool``)."""

    async def for_spec(self, namespace: str, spec: Any) -> ActionsClient: ...


class _Stop(Exception):
    """Internal: end this pass with ``result``."""

    def __init__(self, result: Result) -> None:
        self.result = result


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class RunnerReconciler:
    """Reconciles one EphemeralRunner per call; also records job events on ER status."""

    def __init__(
        self,
        reader: ApiReader,
        writer: ApiWriter,
        events: EventRecorder,
        clients: ClientSource,
        settings: RunnerSettings | None = None,
        *,
        user_agent: str = "runnerscale",
        metrics: RunnerMetrics | None = None,
        clock: Clock = SYSTEM_CLOCK,
        namespaces: tuple[str, ...] = (),
        cached_pod: Callable[[ObjectKey], Pod | None] | None = None,
        cached_er: Callable[[ObjectKey], EphemeralRunner | None] | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.events = events
        self.clients = clients
        self.settings = settings or RunnerSettings()
        self.user_agent = user_agent
        self.exclude_label_prefixes = self.settings.exclude_label_prefixes
        self.metrics = metrics or runner_metrics()
        self.clock = clock
        self.namespaces = namespaces  # job events of other namespaces are ignored (--watch-namespace)
        # JIT configs the service issued whose Secret is not written yet (an API-server error on
        # the create), by ER key, with the ER uid they belong to: the next pass writes the same
        # registration instead of registering the runner again (README "runner worker", step 5).
        self._unwritten_jit: dict[ObjectKey, tuple[str, Any]] = {}
        # The worker's pod informer (runner pods): existence and outcome without a GET. None (tests
        # without a runtime): every pod is read from the server.
        self._cached_pod = cached_pod
        # The worker's ER informer (None: every pass GETs the ER). ``_seen_rv``: the newest
        # resourceVersion this worker has seen of each ER (its writes' answers, its GETs); a cached
        # copy older than that is stale. ``_read_server``: keys whose next pass must GET.
        self._cached_er = cached_er
        self._seen_rv: dict[ObjectKey, int] = {}
        self._read_server: set[ObjectKey] = set()
        # Keys a pass found missing from the informer's cache (or the server), newest last,
        # bounded: a job event for such a key while the cache still lacks it reads nothing.
        self._gone: dict[ObjectKey, None] = {}
        # Runner ids registered whose status write waits for the pod's first phase that is not
        # Pending (--pending-status-after), by ER key, with the ER uid. Lost on a restart: the next
        # pass meets RunnerExists and takes the id from the JIT Secret (README "runner worker", step 6).
        self._unwritten_id: dict[ObjectKey, tuple[str, JsonTree]] = {}
        # Job events this replica received and deferred, by ER key (bounded, oldest dropped
        # first): JobStarted whose fields ride on the runner's next status write, JobCompleted whose
        # mark rides on its end-of-life metadata patch (README "runner worker", job events).
        self._started: dict[ObjectKey, JobStarted] = {}
        self._heard: dict[ObjectKey, JobCompleted] = {}

    @classmethod
    def from_context(cls, ctx: WorkerContext, settings: RunnerSettings) -> RunnerReconciler:
        return cls(
            ctx.reader,
            ctx.writer,
            ctx.events,
            ctx.actions,
            settings,
            user_agent=f"runnerscale/{version()}",
            metrics=runner_metrics(ctx.registry),
            namespaces=ctx.settings.namespaces,
            cached_pod=lambda key: ctx.cached(PODS, key, label_selector=f"{LABEL_EPHEMERAL_RUNNER}=True"),
            cached_er=lambda key: ctx.cached(EPHEMERAL_RUNNERS, key),
        )

    # --- entry points ---------------------------------------------------------------------------

    async def reconcile(self, key: ObjectKey, ctx: ReconcileContext) -> Result:
        try:
            return await self._reconcile(key, from_cache=ctx.attempt <= 1)
        except _Stop as stop:
            return stop.result

    async def on_job(self, delivery: Delivery) -> None:
        """A job event from the bus (any replica may record it; raising naks: redelivered;
        ``shared.bus.Redeliver``: deferred, see :meth:`handle_job_event`)."""
        message = delivery.message
        if not isinstance(message, (JobStarted, JobCompleted)):
            log.warning("unexpected message on the jobs consumer; ignored", subject=delivery.subject)
            return
        if self.namespaces and message.scale_set.namespace not in self.namespaces:
            return
        await self.handle_job_event(message, delivery=delivery.num_delivered)

    # --- the reconcile ---------------------------------------------------------------------------

    def _saw(self, obj: Any) -> None:
        """Remember the resourceVersion of an ER this worker wrote or read from the server."""
        meta = getattr(obj, "metadata", None)
        rv = _rv_int(getattr(meta, "resource_version", ""))
        if meta is None or rv is None:
            return
        key = ObjectKey(meta.namespace, meta.name)
        if rv > self._seen_rv.get(key, -1):
            self._seen_rv[key] = rv

    def _fresh_enough(self, key: ObjectKey) -> EphemeralRunner | None:
        """The cached ER, unless it is older than what this worker has seen of it (pure on the
        cache; None: read the server)."""
        if self._cached_er is None or key in self._read_server:
            return None
        er = self._cached_er(key)
        if er is None:
            return None
        rv = _rv_int(er.metadata.resource_version)
        if rv is None or rv < self._seen_rv.get(key, -1):
            return None
        return er

    def _absent_from_cache(self, key: ObjectKey) -> bool:
        """The informer's cache has no ER of ``key`` (and no server read is due for it): nothing to
        decide on. False without an informer (every pass reads the server)."""
        return self._cached_er is not None and key not in self._read_server and self._cached_er(key) is None

    def _mark_gone(self, key: ObjectKey) -> None:
        self._seen_rv.pop(key, None)
        _remember(self._gone, key, None)

    async def _get_er(self, key: ObjectKey) -> EphemeralRunner | None:
        er = await self.reader.get_or_none(EPHEMERAL_RUNNERS, key)
        self._read_server.discard(key)
        if er is None:
            self._mark_gone(key)
        else:
            self._gone.pop(key, None)
            self._saw(er)
        return er

    async def _patch_er(self, key: ObjectKey, patch: JsonTree, *, resource_version: str) -> EphemeralRunner:
        er = await self.writer.patch_merge(EPHEMERAL_RUNNERS, key, patch, resource_version=resource_version)
        self._saw(er)
        return er

    async def _patch_er_status(self, key: ObjectKey, patch: JsonTree, *, resource_version: str) -> EphemeralRunner:
        er = await self.writer.patch_status(EPHEMERAL_RUNNERS, key, patch, resource_version=resource_version)
        self._saw(er)
        return er

    async def _reconcile(self, key: ObjectKey, *, from_cache: bool = False) -> Result:
        er = self._fresh_enough(key) if from_cache else None
        if er is None and from_cache and (key in self._seen_rv or key in self._gone) and self._absent_from_cache(key):
            # Seen before and missing now: gone (or, after a relist, back with its add, which
            # wakes the key again): no GET. A key never seen is read (an ER the informer cannot
            # decode is only found that way).
            self._forget(key)
            self._mark_gone(key)
            return DONE
        try:
            if er is None:
                er = await self._get_er(key)
        except DecodeFailed as exc:
            # Not a crash loop: say so once on the object and wait for it to change.
            await self.events.warning(
                InvolvedObject(API_VERSION, KIND_EPHEMERAL_RUNNER, key.namespace, key.name),
                "InvalidEphemeralRunner",
                str(exc),
            )
            log.error(
                "undecodable EphemeralRunner; waiting for it to change",
                namespace=key.namespace,
                name=key.name,
                error=str(exc),
            )
            return DONE
        if er is None:
            self._forget(key)
            self._read_server.discard(key)
            return DONE
        if er.metadata.is_deleting:
            self._forget(key)
            return await self._finalize(er)
        status = er.status or EphemeralRunnerStatus()
        if status.is_done():
            if status.phase == EphemeralRunnerPhase.SUCCEEDED:
                # Finished: pod and Secret go with the ER (owner-reference garbage collection). A
                # pass that wrote Succeeded but not the end-of-life metadata patch writes it now.
                er = await self._release_finalizers(er)
                return await self._release_if_abandoned(er)
            await self._cleanup_resources(er)
            return DONE
        if not status.runner_id:
            problems = validate(er)
            if problems:  # before the finalizers: nothing was registered, nothing needs them
                message = "invalid EphemeralRunner: " + "; ".join(f"{p.path}: {p.message}" for p in problems)
                await self._write_failed(er, "InvalidSpec", message)
                await self.events.warning(er, "InvalidSpec", message)
                return DONE
            try:  # a template that can never yield a runner pod: no registration either
                build.build_runner_pod(
                    er, user_agent=self.user_agent, exclude_label_prefixes=self.exclude_label_prefixes
                )
            except build.PodBuildError as exc:
                message = f"Failed to build the pod: {exc}"
                er = await self._write_failed(er, "InvalidPod", message)
                await self.events.warning(er, "InvalidPod", message)
                return DONE
        er = await self._ensure_finalizers(er)
        # A JobStarted this replica deferred: decided on as if written, and written with this
        # pass's status patch, if it makes one.
        job_fields = self._started_job(key, er)
        if job_fields is not None:
            er = jobs.with_job(er, job_fields)
        registered_now: JsonTree | None = None
        new_registration = False
        held = self._unwritten_id.get(key)
        if status.runner_id or (held is not None and held[0] != er.metadata.uid):
            self._unwritten_id.pop(key, None)
            held = None
        if not status.runner_id:
            if held is not None:
                # Registered by an earlier pass whose pod was still young and Pending: the id
                # waits for the pod's first phase that is not Pending (step 6).
                registered_now = held[1]
            else:
                # Registration: JIT call, then create the Secret (no read first). Its runner id
                # goes into this pass's one status patch (README "runner worker", steps 5-6).
                secret = await self._ensure_secret(er)
                registered_now = await self._runner_id_fields(er, secret)
                new_registration = True
        if job_fields is not None:
            registered_now = {**(registered_now or {}), **job_fields}
        if decide.too_many_failures(er, self.settings):
            return await self._apply(er, None, decide.too_many_failures_decision(er, self.settings), registered_now)
        pod = self._cached_pod(key) if self._cached_pod is not None else None
        if pod is None and not new_registration:
            # Not in the cache (or no cache): read the server; and the ER was read before the pod,
            # so a job recorded just before the pod vanished is not in that read. Re-read it, so a
            # lost pod with a job deletes the runner instead of getting a new pod for a spent JIT
            # config (README "runner worker", pod outcome table). A runner registered in this very
            # pass has never had a pod, so it needs neither read.
            pod = await self.reader.get_or_none(PODS, key)
            if pod is None:
                fresh = await self._get_er(key)
                if fresh is None or fresh.metadata.resource_version != er.metadata.resource_version:
                    self._read_server.add(key)  # the cache may still lag: the next pass GETs
                    return Result(requeue_after=0.0)
        now = self.clock.now()
        decision = (
            decide.decide_missing_pod(er, now, self.settings)
            if pod is None
            else decide.decide_pod(er, pod, now, self.settings)
        )
        return await self._apply(er, pod, decision, registered_now)

    async def _ensure_finalizers(self, er: EphemeralRunner) -> EphemeralRunner:
        current = list(er.metadata.finalizers)
        missing = [f for f in (FINALIZER_EPHEMERAL_RUNNER, FINALIZER_RUNNER_REGISTRATION) if f not in current]
        if not missing:
            return er
        return await self._patch_er(
            EPHEMERAL_RUNNERS.key_of(er),
            {"metadata": {"finalizers": current + missing}},
            resource_version=er.metadata.resource_version,
        )

    # --- JIT config -------------------------------------------------------------------------------

    async def _client(self, er: EphemeralRunner) -> ActionsClient:
        try:
            return await self.clients.for_spec(er.metadata.namespace, er.spec)
        except Exception as exc:  # ActionsCredentialsUnavailable and friends: no secrets in the text
            await self.events.warning(er, "ActionsCredentialsUnavailable", str(exc))
            raise

    async def _ensure_secret(self, er: EphemeralRunner) -> Secret:
        """The JIT Secret of an ER whose status has no runner id yet. No read first: the JIT call,
        then the create. Only when the service says the name is registered already (a pass that
        wrote the Secret but not the status) is the Secret read, and used if it is this ER's."""
        key = EPHEMERAL_RUNNERS.key_of(er)
        unwritten = self._unwritten_jit.get(key)
        if unwritten is not None and unwritten[0] == er.metadata.uid:
            return await self._write_jit_secret(er, unwritten[1])
        client = await self._client(er)
        container = er.spec.runner_container() or {}
        work_folder = container.get("workingDir") or ""
        try:
            with anyio.fail_after(self.settings.actions_call_timeout):
                jit = await client.generate_jit_config(
                    er.spec.runner_scale_set_id, er.metadata.name, work_folder=work_folder
                )
        except RunnerExistsError:
            self.metrics.jit_configs.labels("runner_exists").inc()
            existing = await self.reader.get_or_none(SECRETS, key)
            if existing is not None and not existing.metadata.is_deleting and _owned_by_uid(existing, er):
                return existing
            try:
                with anyio.fail_after(self.settings.actions_call_timeout):
                    result = await self._resolve_name_collision(er, client)
            except (ActionsError, TimeoutError) as exc:
                await self.events.warning(
                    er, "JitConfigFailed", f"runner name already registered, and resolving that failed: {_short(exc)}"
                )
                raise
            raise _Stop(result) from None
        except (ActionsError, TimeoutError) as exc:
            self.metrics.jit_configs.labels("error").inc()
            await self.events.warning(
                er, "JitConfigFailed", f"could not generate the runner's JIT config: {_short(exc)}"
            )
            raise
        if jit.runner.id <= 0 or not jit.encoded_jit_config:
            self.metrics.jit_configs.labels("garbled").inc()
            msg = f"the Actions service answered an unusable JIT config (runner id {jit.runner.id}, config {'present' if jit.encoded_jit_config else 'empty'})"
            await self.events.warning(er, "JitConfigFailed", msg)
            raise RuntimeError(msg)
        self.metrics.jit_configs.labels("ok").inc()
        self._unwritten_jit[key] = (er.metadata.uid, jit)
        return await self._write_jit_secret(er, jit)

    async def _write_jit_secret(self, er: EphemeralRunner, jit: Any) -> Secret:
        """Create the JIT Secret. Any error but AlreadyExists keeps ``jit`` for the next pass."""
        key = EPHEMERAL_RUNNERS.key_of(er)
        body = build.build_jit_secret(
            er,
            runner_id=jit.runner.id,
            runner_name=jit.runner.name or er.metadata.name,
            encoded_jit_config=jit.encoded_jit_config,
            exclude_label_prefixes=self.exclude_label_prefixes,
        )
        try:
            created = await self.writer.create(SECRETS, body)
        except AlreadyExists:
            self._unwritten_jit.pop(key, None)
        else:
            self._unwritten_jit.pop(key, None)
            return created
        # Someone else (a replica that lost this key mid-pass) wrote the Secret meanwhile. Keep it
        # only if it names the registration we just made; otherwise drop it and start over (the
        # next pass meets RunnerExists for our registration and resolves it), so the pod never
        # starts with a JIT config of a runner that was already removed.
        existing = await self.reader.get(SECRETS, key)
        try:
            existing_id = build.parse_runner_id(existing.decoded(build.SECRET_KEY_RUNNER_ID))
        except SecretDataError:
            existing_id = None
        if existing_id == jit.runner.id:
            return existing
        log.warning(
            "JIT secret written concurrently for another registration; replacing it",
            namespace=key.namespace,
            name=key.name,
        )
        await self.writer.delete(SECRETS, key, uid=existing.metadata.uid, missing_ok=True)
        raise _Stop(Result(requeue_after=0.0))

    async def _resolve_name_collision(self, er: EphemeralRunner, client: ActionsClient) -> Result:
        """ARC: RunnerExists → look the name up: gone → retry; same scale set → remove and retry;
        another scale set → the name is taken for good: delete the ER."""
        name = er.metadata.name
        found = await client.get_runner_by_name(name)
        if found is None:
            return Result(requeue_after=self.settings.runner_exists_requeue)
        if found.runner_scale_set_id == er.spec.runner_scale_set_id:
            with contextlib.suppress(RunnerNotFoundError):
                await client.remove_runner(found.id)
            await self.events.normal(
                er,
                "StaleRegistrationRemoved",
                f"runner {name} (id {found.id}) was already registered in this scale set; removed it to register again",
            )
            return Result(requeue_after=self.settings.runner_exists_requeue)
        await self.events.warning(
            er,
            "RunnerNameTaken",
            f"runner name {name} is registered in scale set {found.runner_scale_set_id}, not {er.spec.runner_scale_set_id}; deleting the EphemeralRunner",
        )
        await self._delete_er(er, "RunnerNameTaken")
        return DONE

    async def _runner_id_fields(self, er: EphemeralRunner, secret: Secret) -> JsonTree:
        """``runnerId``/``runnerName`` from the JIT Secret, for this pass's status patch (an
        unusable Secret is deleted and the pass ends: the next one registers again)."""
        try:
            runner_id = build.parse_runner_id(secret.decoded(build.SECRET_KEY_RUNNER_ID))
            raw_name = secret.decoded(build.SECRET_KEY_RUNNER_NAME)
        except SecretDataError:
            runner_id, raw_name = None, None
        if runner_id is None:
            await self.events.warning(
                er,
                "InvalidJitSecret",
                f"secret {secret.metadata.name} has no usable runnerId; deleting it to register again",
            )
            await self.writer.delete(SECRETS, SECRETS.key_of(secret), uid=secret.metadata.uid, missing_ok=True)
            raise _Stop(Result(requeue_after=0.0))
        name = raw_name.decode("utf-8", "replace") if raw_name else er.metadata.name
        return {"runnerId": runner_id, "runnerName": name}

    def _hold_runner_id(self, er: EphemeralRunner, fields: JsonTree) -> None:
        """Keep a registration's runner id for the pod's first phase that is not Pending (step 6)."""
        held = {k: v for k, v in fields.items() if k in ("runnerId", "runnerName")}
        if held:
            self._unwritten_id[EPHEMERAL_RUNNERS.key_of(er)] = (er.metadata.uid, held)

    async def _write_runner_id(self, er: EphemeralRunner, fields: JsonTree | None) -> EphemeralRunner:
        """Write the runner id on its own (a decision that writes no status of its own), with the
        fields of a deferred JobStarted if there are any; those alone wait for their redelivery."""
        if fields is None or "runnerId" not in fields:
            return er
        return await self._patch_er_status(
            EPHEMERAL_RUNNERS.key_of(er),
            {"status": fields},
            resource_version=er.metadata.resource_version,
        )

    # --- applying a decision ------------------------------------------------------------------------

    async def _apply(
        self, er: EphemeralRunner, pod: Pod | None, decision: decide.Decision, runner_id: JsonTree | None = None
    ) -> Result:
        """Apply one decision: at most one metadata patch and one status patch per pass (README
        "runner worker"). ``runner_id``: status fields of a registration made in this pass, folded
        into the decision's own status patch; written alone only when the decision writes none (a
        runner about to be deleted needs none: its removal reads the id from the Secret)."""
        key = EPHEMERAL_RUNNERS.key_of(er)
        match decision:
            case decide.DeleteRunner(reason=reason, message=message):
                if reason == "RunnerSucceeded":  # the normal end of every runner: a log line, not an Event write
                    log.info("runner finished", namespace=er.metadata.namespace, name=er.metadata.name)
                else:
                    await self.events.warning(er, reason, message)
                if reason in decide.FINISHED_REASONS:
                    return await self._finish(er, pod, reason, message, runner_id)
                await self._delete_er(er, reason)
                return DONE
            case decide.RecordFailure(reason=reason, message=message, status_patch=patch):
                assert pod is not None
                if runner_id is not None:
                    patch = _merged(patch or {"status": {}}, runner_id)
                if patch is not None:
                    await self._patch_er_status(key, patch, resource_version=er.metadata.resource_version)
                    self.metrics.pod_failures.labels(reason or "unknown").inc()
                    count = len((er.status or EphemeralRunnerStatus()).failures) + 1
                    await self.events.warning(
                        er,
                        "RunnerPodFailed",
                        f"pod {pod.metadata.name} failed (failure {count}; failure {self.settings.max_failures + 1} replaces the runner): {reason}: {message}".rstrip(
                            ": "
                        ),
                    )
                if not pod.metadata.is_deleting:
                    await self.writer.delete(PODS, key, uid=pod.metadata.uid, missing_ok=True)
                return DONE
            case decide.MarkFailed(reason=reason, message=message):
                return await self._mark_failed(er, message, reason, runner_id)
            case decide.MarkOutdated(status_patch=patch):
                await self._patch_er_status(
                    key, _merged(patch, runner_id), resource_version=er.metadata.resource_version
                )
                self.metrics.outdated.inc()
                await self.events.warning(
                    er,
                    "RunnerOutdated",
                    "the runner exited with the version-deprecated code (7); removing it from the service",
                )
                await self._remove_best_effort(er)
                await self._cleanup_resources(er)
                return DONE
            case decide.PatchStatus(status_patch=patch, requeue_after=after):
                await self._patch_er_status(
                    key, _merged(patch, runner_id), resource_version=er.metadata.resource_version
                )
                return Result(requeue_after=after) if after is not None else DONE
            case decide.CreatePod():
                return await self._create_pod(er, runner_id)
            case decide.Wait(requeue_after=after, hold_status=hold):
                if hold and runner_id is not None:
                    self._hold_runner_id(er, runner_id)
                else:
                    await self._write_runner_id(er, runner_id)
                return Result(requeue_after=after) if after is not None else DONE
        raise AssertionError(f"unknown decision {decision!r}")

    async def _create_pod(self, er: EphemeralRunner, runner_id: JsonTree | None) -> Result:
        """Create the pod (existence came from the cache or a read; AlreadyExists means: read it and
        decide on it), then one status patch: the runner id of this pass's registration and phase
        Pending (the phase of a pod just created, so its first Pending copy is no write)."""
        key = EPHEMERAL_RUNNERS.key_of(er)
        try:
            body = build.build_runner_pod(
                er, user_agent=self.user_agent, exclude_label_prefixes=self.exclude_label_prefixes
            )
        except build.PodBuildError as exc:
            return await self._mark_failed(er, f"Failed to build the pod: {exc}", runner_id=runner_id)
        try:
            await self.writer.create(PODS, body)
        except AlreadyExists:
            pod = await self.reader.get_or_none(PODS, key)
            if pod is None or pod.metadata.is_deleting or not _owned_by_uid(pod, er):
                await self._write_runner_id(er, runner_id)  # a namesake being deleted: try again later
                return Result(requeue_after=self.settings.already_exists_requeue)
            return await self._apply(er, pod, decide.decide_pod(er, pod, self.clock.now(), self.settings), runner_id)
        except Invalid as exc:
            return await self._mark_failed(er, f"Failed to create the pod: {exc.message}", runner_id=runner_id)
        except Forbidden as exc:
            if "exceeded quota:" in exc.message:
                await self.events.warning(er, "ExceededQuota", exc.message)
                decision = decide.quota_decision(er, self.clock.now(), self.settings)
                return await self._apply(er, None, decision, runner_id)
            return await self._mark_failed(er, f"Failed to create the pod: {exc.message}", runner_id=runner_id)
        self.metrics.pods_created.inc()
        if self.settings.pending_status_after > 0:
            # The new pod is Pending: its phase and this registration's runner id are written
            # together with its first phase that is not Pending, or alone once it has been Pending
            # for --pending-status-after (README "runner worker", step 6).
            if runner_id is not None:
                self._hold_runner_id(er, runner_id)
            return Result(requeue_after=self.settings.pending_status_after)
        patch = decide.pod_created_patch(er, runner_id)
        if patch is not None:
            await self._patch_er_status(key, patch, resource_version=er.metadata.resource_version)
        return DONE

    async def _mark_failed(
        self, er: EphemeralRunner, message: str, reason: str = "InvalidPod", runner_id: JsonTree | None = None
    ) -> Result:
        er = await self._write_failed(er, reason, message, runner_id)
        await self.events.warning(er, reason, message)
        await self._remove_best_effort(er)
        return DONE

    async def _write_failed(
        self, er: EphemeralRunner, reason: str, message: str, runner_id: JsonTree | None = None
    ) -> EphemeralRunner:
        """Stamp ``failed-at`` (metadata), then status phase Failed, both locked on what was read
        (the second on the first's answer). A crash between them leaves a harmless stamp on a
        runner that is not Failed; the next failure stamps again."""
        key = EPHEMERAL_RUNNERS.key_of(er)
        er = await self._patch_er(
            key,
            decide.failed_at_patch(self.clock.now()),
            resource_version=er.metadata.resource_version,
        )
        er = await self._patch_er_status(
            key,
            _merged(decide.failed_patch(reason, message), runner_id),
            resource_version=er.metadata.resource_version,
        )
        self._count_failure(er, reason)
        return er

    def _count_failure(self, er: EphemeralRunner, reason: str) -> None:
        ref = er.metadata.controller_reference()
        name = er.metadata.labels.get(LABEL_SCALE_SET_NAME) or (ref.name if ref is not None else "")
        self.metrics.failures.labels(er.metadata.namespace, name, reason).inc()

    async def _finish(
        self, er: EphemeralRunner, pod: Pod | None, reason: str, message: str, runner_id: JsonTree | None = None
    ) -> Result:
        """A runner that ended after its job (or exited 0) is not deleted here: one locked status
        patch, phase Succeeded with ``finishedAt``. The runner-set worker keeps counting it until
        the listener has accounted for its job, then deletes it, so no replacement is ever made for
        a finished job (README "runner-set worker", finished runners). Pod and Secret go with the
        ER (owner-reference garbage collection); only a pod still running (a hung runner, a
        sidecar after the runner's exit) is deleted now, with the uid of the pod decided on."""
        key = EPHEMERAL_RUNNERS.key_of(er)
        if reason == "RunnerSucceeded":
            # Exit 0 after a job: the end-of-life metadata patch first, then Succeeded on its
            # answer (the runner-set deletes only finished runners: never between the two).
            released = await self._release_finalizers(er, exited_0=True)
            if released is not er:
                er = _with_status(released, er)
        er = await self._patch_er_status(
            key,
            _merged(decide.finished_patch(reason, message, self.clock.now()), runner_id),
            resource_version=er.metadata.resource_version,
        )
        self._unwritten_id.pop(key, None)
        self._started.pop(key, None)
        self.metrics.runners_deleted.labels(reason).inc()
        if reason in decide.FAILURE_DELETE_REASONS:
            self._count_failure(er, reason)
        if pod is not None and not pod.metadata.is_deleting and not decide.pod_terminal(pod) and _owned_by(pod, er):
            await self.writer.delete(PODS, key, uid=pod.metadata.uid, missing_ok=True)
        return await self._release_if_abandoned(er)

    async def _release_finalizers(
        self, er: EphemeralRunner, event: JobCompleted | None = None, *, exited_0: bool = False
    ) -> EphemeralRunner:
        """The end-of-life metadata patch of a runner that exited 0 after its job (its registration
        is provably gone): the ``job-completed`` mark, when this replica has heard it and the ER
        lacks it, and the removal of both finalizers, in ONE locked patch; the runner-set's later
        delete then needs no teardown pass (README "runner worker", finished runners). The ER
        unchanged when it does not apply (a mark alone is the job handler's)."""
        key = EPHEMERAL_RUNNERS.key_of(er)
        if event is None:
            event = self._heard.get(key)
        patch = decide.release_patch(er, event, exited_0=exited_0)
        if patch is None:
            return er
        with contextlib.suppress(NotFound):
            er = await self._patch_er(key, patch, resource_version=er.metadata.resource_version)
        self._heard.pop(key, None)
        return er

    def _forget(self, key: ObjectKey) -> None:
        """Drop what is kept in memory for an ER that is gone or being deleted."""
        self._unwritten_jit.pop(key, None)
        self._unwritten_id.pop(key, None)
        self._started.pop(key, None)
        self._heard.pop(key, None)

    def _started_job(self, key: ObjectKey, er: EphemeralRunner) -> JsonTree | None:
        """The status fields of a JobStarted this replica deferred for ``er``, None when there is
        none or ``er`` shows them already (then it is forgotten)."""
        event = self._started.get(key)
        if event is None:
            return None
        patch = None if jobs.mismatch(er, event) is not None else jobs.job_status_patch(er, event)
        if patch is None:
            self._started.pop(key, None)
            return None
        fields: JsonTree = patch["status"]
        return fields

    async def _release_if_abandoned(self, er: EphemeralRunner) -> Result:
        """A finished runner is the runner-set worker's to delete; one still here
        ``finished_release_after`` after it finished (runner-set worker down) is deleted here."""
        wait = decide.finished_release_wait(finished.finished_time(er), self.clock.now(), self.settings)
        if wait == float("inf"):
            return DONE
        if wait > 0:
            return Result(requeue_after=wait)
        log.warning(
            "finished runner not released by the runner-set worker in time; deleting it",
            namespace=er.metadata.namespace,
            name=er.metadata.name,
        )
        await self.writer.delete(EPHEMERAL_RUNNERS, EPHEMERAL_RUNNERS.key_of(er), uid=er.metadata.uid, missing_ok=True)
        return DONE

    async def _delete_er(self, er: EphemeralRunner, reason: str) -> None:
        self.metrics.runners_deleted.labels(reason).inc()
        if reason in decide.FAILURE_DELETE_REASONS:
            self._count_failure(er, reason)
        await self.writer.delete(EPHEMERAL_RUNNERS, EPHEMERAL_RUNNERS.key_of(er), uid=er.metadata.uid, missing_ok=True)

    # --- the Actions service ---------------------------------------------------------------------------

    async def _local_runner_id(self, er: EphemeralRunner) -> int:
        """The runner id this ER registered, from status, else from its JIT Secret (0: unknown)."""
        status = er.status or EphemeralRunnerStatus()
        if status.runner_id:
            return status.runner_id
        secret = await self.reader.get_or_none(SECRETS, EPHEMERAL_RUNNERS.key_of(er))
        if secret is None:
            return 0
        try:
            return build.parse_runner_id(secret.decoded(build.SECRET_KEY_RUNNER_ID)) or 0
        except SecretDataError:
            return 0

    async def _remove_runner(self, er: EphemeralRunner) -> None:
        """Remove the runner from the service; RunnerNotFound counts as removed.

        Without a known runner id (registration may have happened while the Secret write failed)
        the name is looked up, and only a runner of this ER's scale set is removed. If then not even
        a client can be built (bad URL, credentials gone), nothing was registered that we could
        remove, so the removal counts as done.
        """
        if decide.registration_gone(er):
            self.metrics.service_removals.labels("finished").inc()
            return
        runner_id = await self._local_runner_id(er)
        try:
            client = await self.clients.for_spec(er.metadata.namespace, er.spec)
        except Exception as exc:
            if runner_id:
                await self.events.warning(er, "ActionsCredentialsUnavailable", str(exc))
                raise
            self.metrics.service_removals.labels("not_registered").inc()
            log.info(
                "no Actions client for a runner that never registered; nothing to remove",
                namespace=er.metadata.namespace,
                name=er.metadata.name,
                error=_short(exc),
            )
            return
        with anyio.fail_after(self.settings.actions_call_timeout):
            if not runner_id:
                found = await client.get_runner_by_name(er.metadata.name)
                if found is None or found.runner_scale_set_id != er.spec.runner_scale_set_id:
                    self.metrics.service_removals.labels("not_registered").inc()
                    return
                runner_id = found.id
            try:
                await client.remove_runner(runner_id)
            except RunnerNotFoundError:
                self.metrics.service_removals.labels("not_found").inc()
                log.info(
                    "runner already gone from the service",
                    namespace=er.metadata.namespace,
                    name=er.metadata.name,
                    runner_id=runner_id,
                )
                return
        self.metrics.service_removals.labels("removed").inc()

    async def _remove_best_effort(self, er: EphemeralRunner) -> None:
        try:
            await self._remove_runner(er)
        except Exception as exc:
            self.metrics.service_removals.labels("error").inc()
            log.warning(
                "could not remove runner from the service (retried on deletion)",
                namespace=er.metadata.namespace,
                name=er.metadata.name,
                error=_short(exc),
            )

    # --- deletion -----------------------------------------------------------------------------------------

    async def _finalize(self, er: EphemeralRunner) -> Result:
        """Teardown in one pass: unregister (unless provably gone), clean container-hook leftovers,
        then ONE locked patch removing both finalizers. The pod and the JIT Secret carry a
        controller ownerReference to the ER, so garbage collection deletes them once it is gone."""
        finalizers = er.metadata.finalizers
        if not any(f in finalizers for f in OWN_FINALIZERS):
            return DONE
        if FINALIZER_RUNNER_REGISTRATION in finalizers:
            result = await self._unregister(er)
            if result is not None:
                return result
        if FINALIZER_EPHEMERAL_RUNNER in finalizers and er.spec.has_container_hook_configured():
            await self._cleanup_hook_objects(er)
        with contextlib.suppress(NotFound):
            await self._patch_er(
                EPHEMERAL_RUNNERS.key_of(er),
                {"metadata": {"finalizers": [f for f in finalizers if f not in OWN_FINALIZERS]}},
                resource_version=er.metadata.resource_version,
            )
        key = EPHEMERAL_RUNNERS.key_of(er)
        self._seen_rv.pop(key, None)  # released: nothing more to remember of it
        self._read_server.discard(key)
        return DONE

    async def _pod_alive(self, er: EphemeralRunner) -> bool:
        pod = await self.reader.get_or_none(PODS, EPHEMERAL_RUNNERS.key_of(er))
        if pod is None or pod.metadata.is_deleting:
            return False
        return decide.classify_pod(pod) in (decide.PodOutcome.ACTIVE, decide.PodOutcome.NO_RUNNER_STATUS)

    async def _unregister(self, er: EphemeralRunner) -> Result | None:
        """None when the registration finalizer may go; a Result to try again later."""
        try:
            await self._remove_runner(er)
            return None
        except JobStillRunningError:
            self.metrics.service_removals.labels("job_still_running").inc()
            if decide.should_abandon_removal(
                er.metadata.deletion_timestamp, await self._pod_alive(er), self.clock.now(), self.settings
            ):
                await self.events.warning(
                    er,
                    "RunnerRemovalAbandoned",
                    "the service still reports a job on this runner but its pod is gone; releasing the EphemeralRunner",
                )
                return None
            log.info(
                "runner still has a job; removal retried later", namespace=er.metadata.namespace, name=er.metadata.name
            )
            return Result(requeue_after=self.settings.job_still_running_requeue)
        except KubeError:
            raise
        except ActionsCredentialsUnavailable as exc:
            # The credentials Secret is gone (typically: its namespace is being deleted). Not an
            # error loop: one Event (repeats only count up), a slow retry, and the ER is released
            # like any unremovable runner once its pod is gone and --removal-give-up-after passed.
            self.metrics.service_removals.labels("error").inc()
            if decide.should_abandon_removal(
                er.metadata.deletion_timestamp, await self._pod_alive(er), self.clock.now(), self.settings
            ):
                log.warning(
                    "credentials unavailable for too long; runner left registered at the service",
                    namespace=er.metadata.namespace,
                    name=er.metadata.name,
                    error=_short(exc),
                )
                await self.events.warning(
                    er,
                    "RunnerRemovalAbandoned",
                    f"could not remove the runner from the service for too long ({_short(exc)}); releasing the EphemeralRunner",
                )
                return None
            return Result(requeue_after=self.settings.job_still_running_requeue)
        except Exception as exc:  # ActionsError, timeout
            self.metrics.service_removals.labels("error").inc()
            if decide.should_abandon_removal(
                er.metadata.deletion_timestamp, await self._pod_alive(er), self.clock.now(), self.settings
            ):
                await self.events.warning(
                    er,
                    "RunnerRemovalAbandoned",
                    f"could not remove the runner from the service for too long ({_short(exc)}); releasing the EphemeralRunner",
                )
                return None
            await self.events.warning(
                er, "RunnerRemovalFailed", f"could not remove the runner from the service: {_short(exc)}"
            )
            raise

    async def _cleanup_resources(self, er: EphemeralRunner) -> None:
        """Delete the runner pod and the JIT Secret (uid preconditions; does not wait)."""
        key = EPHEMERAL_RUNNERS.key_of(er)
        pod = await self.reader.get_or_none(PODS, key)
        if pod is not None and not pod.metadata.is_deleting and _owned_by(pod, er):
            await self.writer.delete(PODS, key, uid=pod.metadata.uid, missing_ok=True)
        secret = await self.reader.get_or_none(SECRETS, key)
        if secret is not None and not secret.metadata.is_deleting and _owned_by(secret, er):
            await self.writer.delete(SECRETS, key, uid=secret.metadata.uid, missing_ok=True)

    async def _cleanup_hook_objects(self, er: EphemeralRunner) -> None:
        """Delete what container hooks left in the ER's namespace (label ``runner-pod=<ER>``): pods
        always; Secrets only with --cleanup-hook-secrets, the one Secret ``list``
        (README "runner worker", container-hook cleanup). Every other Secret is read by name."""
        selector = f"{LABEL_RUNNER_POD}={er.metadata.name}"
        resources: tuple[Resource[Any], ...] = (PODS, SECRETS) if self.settings.cleanup_hook_secrets else (PODS,)
        for resource in resources:
            listed = await self.reader.list(resource, namespace=er.metadata.namespace, label_selector=selector)
            for obj in listed.items:
                if not obj.metadata.is_deleting:
                    await self.writer.delete(resource, resource.key_of(obj), uid=obj.metadata.uid, missing_ok=True)

    # --- job events ---------------------------------------------------------------------------------------

    async def handle_job_event(self, event: JobStarted | JobCompleted, *, delivery: int | None = None) -> str:
        """Record a job event on the matching ER's status; returns what happened (for metrics/tests).

        Idempotent: duplicates and out-of-order pairs converge to the same status. ``delivery``:
        the bus delivery count. An event whose write can ride on one the runner makes anyway is
        deferred (``shared.bus.Redeliver``, metric result ``deferred``; README "runner worker",
        job events): a JobStarted on its first delivery while the runner is active (its fields go
        with the pass's next status write), a JobCompleted while ``delivery`` is at most
        ``JOB_EVENT_DEFERRALS`` when its ER does not show the job yet or its mark can ride on the
        runner's end-of-life metadata patch. None (a direct call): never deferred.
        """
        kind = "started" if isinstance(event, JobStarted) else "completed"
        try:
            result = await retry_on_conflict(lambda: self._job_once(event, delivery))
        except Redeliver:
            self.metrics.job_events.labels(kind, "deferred").inc()
            raise
        self.metrics.job_events.labels(kind, result).inc()
        return result

    def _may_defer(self, delivery: int | None) -> bool:
        return delivery is not None and delivery <= JOB_EVENT_DEFERRALS

    async def _job_once(self, event: JobStarted | JobCompleted, delivery: int | None = None) -> str:
        key = ObjectKey(event.scale_set.namespace, event.runner_name)
        fields = {"namespace": key.namespace, "name": key.name, "job_id": event.job_id, "runner_id": event.runner_id}
        cached = self._fresh_enough(key) if delivery is not None else None
        if cached is None and delivery is not None and key in self._gone and self._absent_from_cache(key):
            # A pass found this ER gone and the cache still lacks it: nothing to write (a redelivered
            # JobCompleted after the runner-set's delete). A direct call still reads the server.
            log.info("job event for an EphemeralRunner that is gone; ignored", **fields)
            return "unknown_runner"
        if cached is not None and jobs.mismatch(cached, event) is None and not jobs.conflicting_job(cached, event):
            # What writes nothing may be decided on the cache (README "runner worker", job
            # events): a deferral (the redelivery decides again) and an event the cached copy
            # records already (the fields are a fill and the mark is never removed: the server's
            # newer copy records them too). Anything else is decided on the GET below.
            self._defer(key, cached, event, delivery)
            if jobs.job_status_patch(cached, event) is None and jobs.completion_patch(cached, event) is None:
                return "unchanged"
        er = await self._get_er(key)  # authoritative: see the module docstring
        if er is None:
            log.info("job event for an unknown EphemeralRunner; ignored", **fields)
            return "unknown_runner"
        why = jobs.mismatch(er, event)
        if why is not None:
            log.warning("job event does not match the EphemeralRunner; ignored", reason=why, **fields)
            return "mismatch"
        if jobs.conflicting_job(er, event):
            log.warning(
                "EphemeralRunner already records another job; event ignored",
                recorded=(er.status.job_id if er.status else ""),
                **fields,
            )
            return "other_job"
        self._defer(key, er, event, delivery)
        written = False
        patch = jobs.job_status_patch(er, event)
        if patch is not None:
            er = await self._patch_er_status(key, patch, resource_version=er.metadata.resource_version)
            self._started.pop(key, None)
            written = True
        if isinstance(event, JobCompleted) and jobs.completion_patch(er, event) is not None:
            # The mark, with the finalizers when the runner already exited 0 (one patch).
            mark = decide.release_patch(er, event) or jobs.completion_patch(er, event)
            assert mark is not None
            await self._patch_er(key, mark, resource_version=er.metadata.resource_version)
            self._heard.pop(key, None)
            written = True
        return "recorded" if written else "unchanged"

    def _defer(
        self, key: ObjectKey, er: EphemeralRunner, event: JobStarted | JobCompleted, delivery: int | None
    ) -> None:
        """Raise ``shared.bus.Redeliver`` when the event's write can ride on one the runner makes
        anyway (see :meth:`handle_job_event`), deciding on ``er``."""
        if (
            isinstance(event, JobStarted)
            and delivery == 1
            and jobs.job_status_patch(er, event) is not None
            and _active(er)
        ):
            # Its fields ride on the runner's next status write (for a short job: Succeeded); the
            # redelivery writes them if none came (README "runner worker", job events).
            _remember(self._started, key, event)
            raise Redeliver(self.settings.job_event_defer, "the job fields ride on the runner's next status write")
        if isinstance(event, JobCompleted) and self._may_defer(delivery):
            started = self._started_job(key, er)
            view = jobs.with_job(er, started) if started is not None else er
            if not (view.status is not None and view.status.has_job()):
                # The ER does not show the job yet: its JobStarted is on the way. Writing the job
                # fields from here would cost a write that JobStarted makes anyway.
                raise Redeliver(self.settings.job_event_defer, "the EphemeralRunner does not show the job yet")
            if jobs.completion_patch(view, event) is not None:
                # Remembered: the pass that sees the runner exit 0 folds the mark into its
                # end-of-life metadata patch; the redelivery writes it if that did not happen.
                _remember(self._heard, key, event)
                raise Redeliver(self.settings.job_event_defer, "the mark rides on the runner's end-of-life patch")


# A JobCompleted is deferred on at most this many deliveries (the consumer's max_deliver is 5: the
# rest stay for handler failures).
JOB_EVENT_DEFERRALS = 2
# Deferred job events remembered per kind (a few seconds' worth at any job rate).
HEARD_EVENTS = 10_000

V = TypeVar("V")


def _remember(memory: dict[ObjectKey, V], key: ObjectKey, value: V) -> None:
    """Remember ``value`` for ``key``, the newest last, at most HEARD_EVENTS keys."""
    memory.pop(key, None)  # re-inserted last: eviction goes oldest first
    memory[key] = value
    while len(memory) > HEARD_EVENTS:
        del memory[next(iter(memory))]


def _active(er: EphemeralRunner) -> bool:
    """Not being deleted and not done: the runner worker will still write its status."""
    status = er.status or EphemeralRunnerStatus()
    return not er.metadata.is_deleting and not status.is_done()


def _rv_int(rv: Any) -> int | None:
    try:
        return int(rv)
    except (TypeError, ValueError):
        return None


def _with_status(er: EphemeralRunner, decided: EphemeralRunner) -> EphemeralRunner:
    """``er`` (a write's answer) with the status the pass decided on (it may hold the fields of a
    deferred JobStarted that the coming status patch writes)."""
    return msgspec.structs.replace(er, status=decided.status)


def _merged(patch: JsonTree, runner_id: JsonTree | None) -> JsonTree:
    """A status merge patch with this pass's runner id fields folded in."""
    if runner_id is None:
        return patch
    return {"status": {**runner_id, **patch.get("status", {})}}


def _owned_by_uid(obj: Any, er: EphemeralRunner) -> bool:
    """This ER's uid is among the object's owners (what the runner worker creates always has it)."""
    return any(r.uid == er.metadata.uid for r in obj.metadata.owner_references)


def _owned_by(obj: Any, er: EphemeralRunner) -> bool:
    """Not someone else's object of the same name: no owner, or this ER's uid among its owners."""
    refs = obj.metadata.owner_references
    return not refs or any(r.uid == er.metadata.uid for r in refs)

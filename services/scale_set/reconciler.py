"""The async shell of the scale-set worker: read authoritatively, decide (decide.py), write.

One pass of :meth:`ScaleSetReconciler.reconcile` for an AutoscalingRunnerSet key:

1. GET the ARS (uncached). Gone → done. Deleting → the deletion chain (:meth:`_finalize`).
2. Finalizer (added alone: the pass ends there); validation (invalid → Event + status Invalid,
   no service call, no requeue).
3. Registration with the Actions service: get-or-create by name, runner group / name drift,
   re-registration when the recorded scale set no longer exists. A pass that patched the ARS
   metadata here ends (status Pending for a new generation) and the next one goes on: one
   metadata and one status patch per pass (README "Worker runtime").
4. The EphemeralRunnerSet: create at revision 1, or patch drift (runner spec change → revision + 1,
   RevisionPublished on the bus). What Go ARC left (its ``<ARS>-<random>`` sets, a set at revision
   0, their runners) is taken over on the way (adopt.py, README "Switching from ARC").
5. The Outdated guard: park (listener down, ERS drained) only when the ERS reports Outdated for
   the revision it has applied; otherwise the AutoscalingListener: create or patch in place.
6. Status (phase, counts, observedGeneration), status-patched only when different.

Every write that depends on a read carries that read's resourceVersion. The controller runs the
pass under its shared policy (README "Worker runtime"): a 409 Conflict re-runs it from fresh reads;
a create that meets a namesake (AlreadyExists) raises Conflict and is treated the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from services.scale_set import adopt, decide
from services.scale_set.build import (
    ars_listener_name,
    desired_ephemeral_runner_set,
    desired_listener,
    effective_scale_set_name,
    scale_set_id_of,
)
from shared.actions import (
    ActionsClient,
    ActionsError,
    RunnerGroupNotFoundError,
    ScaleSetExistsError,
    ScaleSetNotFoundError,
    scale_set_labels,
)
from shared.api import AutoscalingListener, AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet
from shared.api.constants import (
    ANNOTATION_CLEANUP_GITHUB_SECRET_NAME,
    ANNOTATION_CLEANUP_KUBERNETES_MODE_ROLE_BINDING_NAME,
    ANNOTATION_CLEANUP_KUBERNETES_MODE_ROLE_NAME,
    ANNOTATION_CLEANUP_KUBERNETES_MODE_SERVICE_ACCOUNT_NAME,
    ANNOTATION_CLEANUP_MANAGER_ROLE_BINDING,
    ANNOTATION_CLEANUP_MANAGER_ROLE_NAME,
    ANNOTATION_CLEANUP_NO_PERMISSION_SERVICE_ACCOUNT_NAME,
    ANNOTATION_RUNNER_SCALE_SET_ID,
    ANNOTATION_RUNNER_SCALE_SET_NAME,
    FINALIZER_AUTOSCALING_RUNNER_SET,
    FINALIZER_CLEANUP_PROTECTION,
    LABEL_SCALE_SET_NAME,
    LABEL_SCALE_SET_NAMESPACE,
)
from shared.api.names import url_labels
from shared.bus import BusMessage, ResourceRef, RevisionPublished
from shared.clock import SYSTEM_CLOCK, Clock
from shared.kube import (
    AUTOSCALING_LISTENERS,
    AUTOSCALING_RUNNER_SETS,
    DONE,
    EPHEMERAL_RUNNER_SETS,
    EPHEMERAL_RUNNERS,
    NEXT_PASS,
    ROLE_BINDINGS,
    ROLES,
    SECRETS,
    SERVICE_ACCOUNTS,
    AlreadyExists,
    ApiReader,
    ApiWriter,
    Conflict,
    EventRecorder,
    Forbidden,
    Invalid,
    NotFound,
    ObjectKey,
    ReconcileContext,
    Resource,
    Result,
)
from shared.log import get_logger
from shared.worker import ActionsCredentialsUnavailable, WorkerContext

log = get_logger(__name__)

# Dependent objects whose cleanup-protection finalizer the ARS removes on deletion, in ARC's order.
CLEANUP_DEPENDENTS: tuple[tuple[str, Resource[Any]], ...] = (
    (ANNOTATION_CLEANUP_KUBERNETES_MODE_ROLE_BINDING_NAME, ROLE_BINDINGS),
    (ANNOTATION_CLEANUP_KUBERNETES_MODE_ROLE_NAME, ROLES),
    (ANNOTATION_CLEANUP_KUBERNETES_MODE_SERVICE_ACCOUNT_NAME, SERVICE_ACCOUNTS),
    (ANNOTATION_CLEANUP_NO_PERMISSION_SERVICE_ACCOUNT_NAME, SERVICE_ACCOUNTS),
    (ANNOTATION_CLEANUP_GITHUB_SECRET_NAME, SECRETS),
    (ANNOTATION_CLEANUP_MANAGER_ROLE_BINDING, ROLE_BINDINGS),
    (ANNOTATION_CLEANUP_MANAGER_ROLE_NAME, ROLES),
)


class ClientSource(Protocol):
    """Where Actions clients come from (``shared.worker.ActionsClientPool``)."""

    async def for_spec(self, namespace: str, spec: Any) -> ActionsClient: ...


class ScaleSetMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.revisions = Counter(
            "runnerscale_scale_set_revision_bumps_total",
            "Runner spec changes published as a new actionable revision",
            registry=reg,
        )
        self.registrations = Counter(
            "runnerscale_scale_set_registrations_total",
            "Scale set registrations at the Actions service",
            ["kind"],
            registry=reg,
        )
        self.service_updates = Counter(
            "runnerscale_scale_set_service_updates_total",
            "Scale set updates at the Actions service",
            ["field"],
            registry=reg,
        )
        self.invalid = Counter(
            "runnerscale_scale_set_invalid_total", "Reconciles stopped by an invalid AutoscalingRunnerSet", registry=reg
        )
        self.parked = Counter(
            "runnerscale_scale_set_outdated_parks_total",
            "Scale sets parked because their runners report Outdated",
            registry=reg,
        )
        self.service_errors = Counter(
            "runnerscale_scale_set_service_errors_total",
            "Actions service calls that failed, by error class",
            ["error"],
            registry=reg,
        )


class ScaleSetReconciler:
    """The I/O shell of the scale-set worker: ``reconcile(key, ctx) -> Result`` for one ARS."""

    def __init__(
        self,
        reader: ApiReader,
        writer: ApiWriter,
        events: EventRecorder,
        clients: ClientSource,
        settings: decide.ScaleSetSettings,
        *,
        publish: Callable[[BusMessage], None] | None = None,
        metrics: ScaleSetMetrics | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.events = events
        self.clients = clients
        self.settings = settings
        self.options = settings.build
        self.publish = publish
        self.metrics = metrics or ScaleSetMetrics()
        self.verify_interval = settings.verify_interval
        self.deletion_requeue = settings.deletion_requeue
        self.credentials_requeue = settings.credentials_requeue
        self.clock = clock
        self._verified: dict[ObjectKey, float] = {}
        # ARS uids found without ARC leftovers: no LIST of their sets again (ARC is stopped for good).
        self._arc_free: set[str] = set()

    @classmethod
    def from_context(cls, ctx: WorkerContext, settings: decide.ScaleSetSettings) -> ScaleSetReconciler:
        return cls(
            ctx.reader,
            ctx.writer,
            ctx.events,
            ctx.actions,
            settings,
            publish=ctx.bus.enqueue,
            metrics=ScaleSetMetrics(ctx.registry),
        )

    # --- entry point -----------------------------------------------------------------------------

    async def reconcile(self, key: ObjectKey, ctx: ReconcileContext) -> Result:
        """One pass over ``key`` (see the module docstring for its steps)."""
        return await self._pass(key)

    async def _pass(self, key: ObjectKey) -> Result:
        ars = await self.reader.get_or_none(AUTOSCALING_RUNNER_SETS, key)
        if ars is None:
            self._verified.pop(key, None)
            return DONE
        if ars.metadata.is_deleting:
            self._arc_free.discard(ars.metadata.uid)
            return await self._finalize(ars)
        if FINALIZER_AUTOSCALING_RUNNER_SET not in ars.metadata.finalizers:
            # The finalizer is on the object before anything exists at the service. One metadata
            # patch per pass (README "Worker runtime"): the next pass, right away, goes on.
            await self.writer.add_finalizer(AUTOSCALING_RUNNER_SETS, ars, FINALIZER_AUTOSCALING_RUNNER_SET)
            return NEXT_PASS

        problems = decide.spec_problems(ars)
        if problems:
            self.metrics.invalid.inc()
            message = decide.problems_message(problems)
            log.warning(
                "invalid AutoscalingRunnerSet; nothing done until it is fixed",
                namespace=key.namespace,
                name=key.name,
                problems=message,
            )
            await self.events.warning(ars, decide.REASON_INVALID_SPEC, message)
            now = self.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
            await self._write_status(ars, decide.invalid_status(ars, message, now))
            return DONE

        try:
            ars, registered = await self._ensure_registration(ars)
        except _CredentialsProblem as exc:
            log.warning(
                "cannot register the scale set",
                namespace=key.namespace,
                name=key.name,
                reason=exc.reason,
                error=exc.message,
            )
            await self.events.warning(ars, exc.reason, exc.message)
            await self._write_status(ars, decide.pending_status(ars))
            return Result(requeue_after=self.credentials_requeue)
        except ActionsError as exc:
            # A sick or garbled service: say so on the object, then retry with the controller's backoff.
            self.metrics.service_errors.labels(type(exc).__name__).inc()
            await self.events.warning(ars, "ActionsServiceError", f"{type(exc).__name__}: {exc}")
            if decide.generation_pending(ars):
                await self._write_status(ars, decide.pending_status(ars))
            raise
        if registered:
            # The pass wrote what the service said on the ARS (its one metadata patch); the next
            # pass builds from it.
            if decide.generation_pending(ars):
                await self._write_status(ars, decide.pending_status(ars))
            return NEXT_PASS

        patch = adopt.ars_cleanup_patch(ars)  # ARC's fingerprints (README "Switching from ARC")
        if patch is not None:
            await self.writer.patch_merge(
                AUTOSCALING_RUNNER_SETS,
                AUTOSCALING_RUNNER_SETS.key_of(ars),
                patch,
                resource_version=ars.metadata.resource_version,
            )
            return NEXT_PASS
        try:
            ers = await self._ensure_runner_set(ars)
            if ers is None or ers.metadata.is_deleting:
                await self._write_status(ars, decide.pending_status(ars))
                return Result(requeue_after=self.deletion_requeue)

            requeue: float | None = None
            if await self._adopt(ars, ers):
                requeue = self.deletion_requeue
            parked = decide.outdated_teardown_allowed(ers)
            if parked:
                ers, listeners_gone = await self._park(ars, ers)
                if not listeners_gone:
                    requeue = self.deletion_requeue
            elif not await self._ensure_listener(ars):
                requeue = self.deletion_requeue
        except Invalid as exc:
            # The API server refused a child built from this ARS (a value no schema check here
            # foresaw): the user has to change the ARS. Say so on it, retry slowly, never spin.
            causes = "; ".join(f"{c.field}: {c.message}" for c in exc.causes) or exc.message
            log.warning(
                "child object rejected by the API server", namespace=key.namespace, name=key.name, error=str(exc)
            )
            await self.events.warning(ars, "ChildRejected", f"{exc.request}: {causes}")
            await self._write_status(ars, decide.pending_status(ars))
            return Result(requeue_after=self.credentials_requeue)
        status = decide.next_status(ars, ers, acted=requeue is None, outdated=parked)
        await self._write_status(ars, status)
        return Result(requeue_after=requeue) if requeue is not None else Result(requeue_after=self.verify_interval)

    # --- status ----------------------------------------------------------------------------------

    async def _write_status(self, ars: AutoscalingRunnerSet, status: Any) -> AutoscalingRunnerSet:
        patch = decide.status_patch(ars, status)
        if patch is None:
            return ars
        return await self.writer.patch_status(
            AUTOSCALING_RUNNER_SETS,
            AUTOSCALING_RUNNER_SETS.key_of(ars),
            patch,
            resource_version=ars.metadata.resource_version,
        )

    # --- registration ----------------------------------------------------------------------------

    async def _client(self, ars: AutoscalingRunnerSet) -> ActionsClient:
        try:
            return await self.clients.for_spec(ars.metadata.namespace, ars.spec)
        except ActionsCredentialsUnavailable as exc:
            raise _CredentialsProblem("CredentialsUnavailable", str(exc)) from None

    async def _ensure_registration(self, ars: AutoscalingRunnerSet) -> tuple[AutoscalingRunnerSet, bool]:
        """The ARS and whether this pass patched its metadata (at most once: registration, a runner
        group move or a rename; a second drift waits for the next pass)."""
        key = AUTOSCALING_RUNNER_SETS.key_of(ars)
        if decide.needs_registration(ars):
            return await self._register(ars, reason=""), True
        now = self.clock.monotonic()
        last = self._verified.get(key)
        if decide.generation_pending(ars) or last is None or now - last >= self.verify_interval:
            client = await self._client(ars)
            try:
                found = await client.get_scale_set(scale_set_id_of(ars))
            except ScaleSetNotFoundError:
                found = None
            if found is None:
                reason = f"scale set {scale_set_id_of(ars)} no longer exists at the Actions service"
                return await self._register(ars, reason=reason), True
            self._verified[key] = now
        if decide.runner_group_drifted(ars):
            client = await self._client(ars)
            group_id = await self._group_id(client, ars)
            try:
                updated = await client.update_scale_set(scale_set_id_of(ars), runner_group_id=group_id)
            except ScaleSetNotFoundError:
                return await self._register(ars, reason="scale set vanished during a runner group update"), True
            self.metrics.service_updates.labels("runner_group").inc()
            group_name = updated.runner_group_name or ars.spec.runner_group or "default"
            await self.events.normal(
                ars, "RunnerGroupUpdated", f"scale set {updated.id} moved to runner group {group_name!r}"
            )
            ars = await self._patch_ars_meta(
                ars,
                annotations=decide.registration_annotations(
                    updated.id, updated.name or effective_scale_set_name(ars), group_name
                ),
            )
            return ars, True
        if decide.scale_set_name_drifted(ars):
            client = await self._client(ars)
            name = effective_scale_set_name(ars)
            try:
                updated = await client.update_scale_set(scale_set_id_of(ars), name=name)
            except ScaleSetNotFoundError:
                return await self._register(ars, reason="scale set vanished during a rename"), True
            self.metrics.service_updates.labels("name").inc()
            await self.events.normal(
                ars, "ScaleSetRenamed", f"scale set {updated.id} renamed to {updated.name or name!r}"
            )
            ars = await self._patch_ars_meta(ars, annotations={ANNOTATION_RUNNER_SCALE_SET_NAME: updated.name or name})
            return ars, True
        return ars, False

    async def _group_id(self, client: ActionsClient, ars: AutoscalingRunnerSet) -> int:
        try:
            return await client.resolve_runner_group_id(ars.spec.runner_group)
        except RunnerGroupNotFoundError:
            raise _CredentialsProblem(
                "RunnerGroupNotFound", f"runner group {ars.spec.runner_group!r} does not exist at the Actions service"
            ) from None

    async def _register(self, ars: AutoscalingRunnerSet, *, reason: str) -> AutoscalingRunnerSet:
        """Get-or-create the scale set by name in its runner group; record id, name and group."""
        client = await self._client(ars)
        group_id = await self._group_id(client, ars)
        name = effective_scale_set_name(ars)
        scale_set = await client.get_scale_set_by_name(name, runner_group_id=group_id)
        kind = "adopted"
        if scale_set is None:
            try:
                scale_set = await client.create_scale_set(
                    name, runner_group_id=group_id, labels=scale_set_labels(name, ars.spec.runner_scale_set_labels)
                )
                kind = "created"
            except ScaleSetExistsError:
                scale_set = await client.get_scale_set_by_name(name, runner_group_id=group_id)
                if scale_set is None:
                    raise Conflict(f"create scale set {name!r}", "exists but cannot be found by name") from None
        if reason:
            kind = "re-registered"
        self.metrics.registrations.labels(kind).inc()
        group_name = scale_set.runner_group_name or ars.spec.runner_group or "default"
        annotations = decide.registration_annotations(scale_set.id, scale_set.name or name, group_name)
        message = f"scale set {scale_set.name or name!r} (id {scale_set.id}) {kind} in runner group {group_name!r}"
        if reason:
            message += f": {reason}"
            log.warning(
                "scale set re-registered",
                namespace=ars.metadata.namespace,
                name=ars.metadata.name,
                reason=reason,
                scale_set_id=scale_set.id,
            )
        await self.events.normal(ars, "ScaleSetRegistered", message)
        ars = await self._patch_ars_meta(ars, annotations=annotations, labels=url_labels(ars.spec.github_config_url))
        self._verified[AUTOSCALING_RUNNER_SETS.key_of(ars)] = self.clock.monotonic()
        return ars

    async def _patch_ars_meta(
        self,
        ars: AutoscalingRunnerSet,
        *,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> AutoscalingRunnerSet:
        meta: dict[str, Any] = {}
        if annotations:
            meta["annotations"] = annotations
        if labels:
            meta["labels"] = labels
        if not meta:
            return ars
        return await self.writer.patch_merge(
            AUTOSCALING_RUNNER_SETS,
            AUTOSCALING_RUNNER_SETS.key_of(ars),
            {"metadata": meta},
            resource_version=ars.metadata.resource_version,
        )

    # --- EphemeralRunnerSet ----------------------------------------------------------------------

    async def _ensure_runner_set(self, ars: AutoscalingRunnerSet) -> EphemeralRunnerSet | None:
        key = AUTOSCALING_RUNNER_SETS.key_of(ars)
        ers = await self.reader.get_or_none(EPHEMERAL_RUNNER_SETS, key)
        if ers is None:
            desired = desired_ephemeral_runner_set(ars, self.options, actionable_revision=1)
            legacy = adopt.legacy_runner_sets(ars, await self._sets_of(ars))
            if legacy:  # taking over ARC 0.12-0.14: no runner created or removed before the listener speaks
                seed = adopt.seed_spec_for_new_set(legacy)
                desired.spec.replicas, desired.spec.patch_id = seed["replicas"], seed["patchID"]
            try:
                ers = await self.writer.create(EPHEMERAL_RUNNER_SETS, desired)
            except AlreadyExists:
                raise Conflict(EPHEMERAL_RUNNER_SETS.describe("CREATE", key), "appeared concurrently") from None
            log.info("created EphemeralRunnerSet", namespace=key.namespace, name=key.name, revision=1)
            await self.events.normal(
                ars, "EphemeralRunnerSetCreated", f"created EphemeralRunnerSet {key.name} at actionable revision 1"
            )
            self._publish_revision(ers)
            return ers
        if ers.metadata.is_deleting:
            return ers
        owner = ers.metadata.controller_reference()
        if owner is not None and owner.uid and ars.metadata.uid and owner.uid != ars.metadata.uid:
            # A namesake left over from a deleted ARS: wait for the garbage collector / its finalizer.
            log.info(
                "EphemeralRunnerSet belongs to another AutoscalingRunnerSet; waiting",
                namespace=key.namespace,
                name=key.name,
                owner_uid=owner.uid,
            )
            await self.events.warning(
                ars,
                "EphemeralRunnerSetNotOwned",
                f"EphemeralRunnerSet {key.name} is controlled by another object (uid {owner.uid}); waiting for it to go",
            )
            return None
        if adopt.is_arc_runner_set(ers):
            return ers  # ARC's set: _adopt seeds its revision (and spec) once its runners are stamped
        desired = desired_ephemeral_runner_set(ars, self.options, actionable_revision=ers.spec.actionable_revision)
        plan = decide.plan_ers_update(ers, desired)
        if plan.patch is None:
            return ers
        ers = await self.writer.patch_merge(
            EPHEMERAL_RUNNER_SETS, key, plan.patch, resource_version=ers.metadata.resource_version
        )
        if plan.new_revision is not None:
            self.metrics.revisions.inc()
            log.info(
                "runner spec changed; new actionable revision",
                namespace=key.namespace,
                name=key.name,
                revision=plan.new_revision,
                first_difference=plan.spec_drift_path,
            )
            await self.events.normal(
                ars,
                "RunnerSpecChanged",
                f"runner spec changed at {plan.spec_drift_path}: EphemeralRunnerSet {key.name} now at actionable revision {plan.new_revision}",
            )
            self._publish_revision(ers)
        return ers

    # --- adoption of what Go ARC left (adopt.py) ----------------------------------------------------

    async def _sets_of(self, ars: AutoscalingRunnerSet) -> list[EphemeralRunnerSet]:
        selector = f"{LABEL_SCALE_SET_NAME}={ars.metadata.name},{LABEL_SCALE_SET_NAMESPACE}={ars.metadata.namespace}"
        listed = await self.reader.list(
            EPHEMERAL_RUNNER_SETS, namespace=ars.metadata.namespace, label_selector=selector
        )
        return listed.items

    async def _runners_of(self, ars: AutoscalingRunnerSet) -> list[EphemeralRunner]:
        selector = f"{LABEL_SCALE_SET_NAME}={ars.metadata.name},{LABEL_SCALE_SET_NAMESPACE}={ars.metadata.namespace}"
        listed = await self.reader.list(EPHEMERAL_RUNNERS, namespace=ars.metadata.namespace, label_selector=selector)
        return listed.items

    async def _adopt(self, ars: AutoscalingRunnerSet, ers: EphemeralRunnerSet) -> bool:
        """Take over ARC's leftovers of this ARS, one locked write per object; True while work remains
        (requeue soon: runner changes do not wake this worker)."""
        arc_set = adopt.is_arc_runner_set(ers)
        if ars.metadata.uid in self._arc_free and not arc_set:
            return False
        legacy = adopt.legacy_runner_sets(ars, await self._sets_of(ars))
        if not legacy and not arc_set:
            self._arc_free.add(ars.metadata.uid)
            return False
        desired = desired_ephemeral_runner_set(ars, self.options, actionable_revision=1)
        feeding = adopt.feeding_listeners(await self._listeners_of(ars), legacy) if legacy else []
        plan = adopt.plan_adoption(ers, desired, legacy, await self._runners_of(ars), legacy_listener=bool(feeding))
        ns = ars.metadata.namespace
        for old, freeze in plan.freeze:
            await self.writer.patch_merge(
                EPHEMERAL_RUNNER_SETS,
                EPHEMERAL_RUNNER_SETS.key_of(old),
                freeze,
                resource_version=old.metadata.resource_version,
            )
            log.info("froze ARC runner set before taking its runners over", namespace=ns, name=old.metadata.name)
        if plan.freeze:
            return True  # move runners on a fresh LIST, once no legacy set creates any more
        for step in plan.runners:
            if step.patch is None:
                continue
            er = step.runner
            await self.writer.patch_merge(
                EPHEMERAL_RUNNERS,
                EPHEMERAL_RUNNERS.key_of(er),
                step.patch,
                resource_version=er.metadata.resource_version,
            )
            log.info(
                "adopted ARC runner", namespace=ns, name=er.metadata.name, runner_set=ers.metadata.name, why=step.why
            )
        if plan.runner_patches or feeding:
            return True  # seed and retire on a fresh LIST, once every kept runner is stamped
        if plan.seed is not None:
            await self.writer.patch_merge(
                EPHEMERAL_RUNNER_SETS,
                EPHEMERAL_RUNNER_SETS.key_of(ers),
                plan.seed,
                resource_version=ers.metadata.resource_version,
            )
            log.info("adopted ARC runner set", namespace=ns, name=ers.metadata.name, revision=1)
            await self.events.normal(
                ars,
                "RunnerSetAdopted",
                f"took over EphemeralRunnerSet {ers.metadata.name} left by ARC at actionable revision 1",
            )
        for old in plan.delete_sets:
            await self.writer.delete(
                EPHEMERAL_RUNNER_SETS, EPHEMERAL_RUNNER_SETS.key_of(old), uid=old.metadata.uid, missing_ok=True
            )
            log.info("retiring ARC runner set", namespace=ns, name=old.metadata.name, replaced_by=ers.metadata.name)
            await self.events.normal(
                ars,
                "LegacyRunnerSetRetired",
                f"EphemeralRunnerSet {old.metadata.name} left by ARC retired; its matching runners moved to {ers.metadata.name}",
            )
        return plan.seed is not None or bool(plan.delete_sets)

    def _publish_revision(self, ers: EphemeralRunnerSet) -> None:
        if self.publish is None:
            return
        message = RevisionPublished(
            ers=ResourceRef(ers.metadata.namespace, ers.metadata.name),
            revision=ers.spec.actionable_revision,
            phase=str(ers.status.phase) if ers.status is not None else "",
        )
        try:
            self.publish(message)
        except Exception as exc:
            log.warning(
                "could not publish RevisionPublished",
                namespace=ers.metadata.namespace,
                name=ers.metadata.name,
                error=str(exc),
            )

    # --- Outdated: park --------------------------------------------------------------------------

    async def _park(self, ars: AutoscalingRunnerSet, ers: EphemeralRunnerSet) -> tuple[EphemeralRunnerSet, bool]:
        """Runners report the current runner spec as Outdated: take the listener down and drain the
        ERS (replicas 0, authoritative patch ID 0) until the runner spec changes. Unlike ARC the ERS
        is not deleted and re-created with the same spec, which loops forever."""
        if ars.status is None or ars.status.phase != "Outdated":
            self.metrics.parked.inc()
            await self.events.warning(
                ars,
                "RunnerOutdated",
                f"runners of actionable revision {ers.spec.actionable_revision} report their version as outdated; "
                "listener stopped and runner set drained until the runner spec changes",
            )
        gone = await self._delete_listeners(ars, keep=None)
        patch = decide.drain_patch(ers)
        if patch is not None:
            ers = await self.writer.patch_merge(
                EPHEMERAL_RUNNER_SETS,
                EPHEMERAL_RUNNER_SETS.key_of(ers),
                patch,
                resource_version=ers.metadata.resource_version,
            )
        return ers, gone

    # --- AutoscalingListener ---------------------------------------------------------------------

    async def _listeners_of(self, ars: AutoscalingRunnerSet) -> list[AutoscalingListener]:
        selector = decide.listener_selector(ars)
        listed = await self.reader.list(
            AUTOSCALING_LISTENERS, namespace=self.options.controller_namespace, label_selector=selector or ""
        )
        return decide.listeners_of(listed.items, ars)

    async def _delete_listeners(self, ars: AutoscalingRunnerSet, *, keep: str | None) -> bool:
        """Delete this ARS's listeners except ``keep``; True when none (other than ``keep``) is left."""
        found = {al.metadata.name: al for al in await self._listeners_of(ars)}
        name = ars_listener_name(ars)
        if name not in found and name != keep:
            al = await self.reader.get_or_none(
                AUTOSCALING_LISTENERS, ObjectKey(self.options.controller_namespace, name)
            )
            if al is not None:
                found[name] = al
        remaining = [al for al in found.values() if al.metadata.name != keep]
        for al in decide.orphan_listeners(remaining, ars, keep):
            log.info(
                "deleting listener", namespace=al.metadata.namespace, name=al.metadata.name, scale_set=ars.metadata.name
            )
            await self.writer.delete(
                AUTOSCALING_LISTENERS, AUTOSCALING_LISTENERS.key_of(al), uid=al.metadata.uid, missing_ok=True
            )
        return not remaining

    async def _ensure_listener(self, ars: AutoscalingRunnerSet) -> bool:
        """Create or patch the listener; False when it is still going away (requeue)."""
        desired = desired_listener(ars, self.options)
        key = AUTOSCALING_LISTENERS.key_of(desired)
        al = await self.reader.get_or_none(AUTOSCALING_LISTENERS, key)
        if al is None:
            await self._delete_listeners(ars, keep=key.name)  # listeners orphaned by a name change
            try:
                await self.writer.create(AUTOSCALING_LISTENERS, desired)
            except AlreadyExists:
                raise Conflict(AUTOSCALING_LISTENERS.describe("CREATE", key), "appeared concurrently") from None
            log.info("created AutoscalingListener", namespace=key.namespace, name=key.name, scale_set=ars.metadata.name)
            await self.events.normal(ars, "ListenerCreated", f"created AutoscalingListener {key}")
            return True
        if al.metadata.is_deleting:
            return False
        patch = decide.plan_listener_update(al, desired)
        removals = adopt.arc_annotation_removals(al.metadata)  # an AL ARC wrote: its fingerprints go
        if removals:
            patch = patch or {}
            patch.setdefault("metadata", {}).setdefault("annotations", {}).update(removals)
        if patch is not None:
            await self.writer.patch_merge(
                AUTOSCALING_LISTENERS, key, patch, resource_version=al.metadata.resource_version
            )
            log.info(
                "updated AutoscalingListener in place",
                namespace=key.namespace,
                name=key.name,
                fields=sorted(patch.get("spec", {})),
            )
        return True

    # --- deletion --------------------------------------------------------------------------------

    async def _finalize(self, ars: AutoscalingRunnerSet) -> Result:
        key = AUTOSCALING_RUNNER_SETS.key_of(ars)
        if FINALIZER_AUTOSCALING_RUNNER_SET not in ars.metadata.finalizers:
            return DONE
        if not await self._delete_listeners(ars, keep=None):
            return Result(requeue_after=self.deletion_requeue)
        ers = await self.reader.get_or_none(EPHEMERAL_RUNNER_SETS, key)
        if ers is not None:
            if not ers.metadata.is_deleting:
                log.info("deleting EphemeralRunnerSet", namespace=key.namespace, name=key.name)
                await self.writer.delete(EPHEMERAL_RUNNER_SETS, key, uid=ers.metadata.uid, missing_ok=True)
            return Result(requeue_after=self.deletion_requeue)
        scale_set_id = scale_set_id_of(ars)
        if scale_set_id:
            try:
                client = await self._client(ars)
            except _CredentialsProblem as exc:
                await self.events.warning(
                    ars,
                    "ScaleSetNotDeleted",
                    f"cannot delete scale set {scale_set_id} at the Actions service ({exc.message}); remove the "
                    f"{ANNOTATION_RUNNER_SCALE_SET_ID} annotation to skip it",
                )
                return Result(requeue_after=self.credentials_requeue)
            try:
                await client.delete_scale_set(scale_set_id)
                log.info(
                    "deleted scale set at the Actions service",
                    namespace=key.namespace,
                    name=key.name,
                    scale_set_id=scale_set_id,
                )
            except ScaleSetNotFoundError:
                log.info(
                    "scale set already gone at the Actions service",
                    namespace=key.namespace,
                    name=key.name,
                    scale_set_id=scale_set_id,
                )
            except ActionsError as exc:
                self.metrics.service_errors.labels(type(exc).__name__).inc()
                await self.events.warning(
                    ars,
                    "ScaleSetNotDeleted",
                    f"deleting scale set {scale_set_id} failed ({type(exc).__name__}: {exc}); retrying",
                )
                raise
            # The id annotation is not removed here: a pass that stops before the finalizer goes asks
            # the service again, which answers "not found" (handled above). One patch per pass.
        for annotation, resource in CLEANUP_DEPENDENTS:
            name = ars.metadata.annotations.get(annotation)
            if not name:
                continue
            try:
                obj = await self.reader.get(resource, ObjectKey(key.namespace, name))
            except (NotFound, Forbidden):
                continue
            await self.writer.remove_finalizer(resource, obj, FINALIZER_CLEANUP_PROTECTION)
        await self.writer.remove_finalizer(AUTOSCALING_RUNNER_SETS, ars, FINALIZER_AUTOSCALING_RUNNER_SET)
        self._verified.pop(key, None)
        log.info("AutoscalingRunnerSet cleaned up", namespace=key.namespace, name=key.name)
        return DONE


class _CredentialsProblem(Exception):
    """Something the user must fix outside the ARS (Secret, runner group): Event + slow requeue."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        self.message = message
        super().__init__(message)


__all__ = ["CLEANUP_DEPENDENTS", "ClientSource", "ScaleSetReconciler"]

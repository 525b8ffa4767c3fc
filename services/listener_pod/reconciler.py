"""The AutoscalingListener reconcile: a thin async shell around ``build.py`` and ``decide.py``.

Every decision is taken on objects read with an uncached GET, and every write that depends on
one carries that read's resourceVersion (or, for deletes, its uid). The controller runs the pass
under its shared policy (README "Worker runtime"): a 409 re-reads everything and decides again,
and a lock-less write is refused before it is sent. Order (as ARC's listener reconciler):

1. AL gone → forget it. Deleting → the deletion chain (pod, config + proxy secrets, role binding,
   role, service account; requeue until all are gone; then the finalizer).
2. Finalizer added (locked) and the pass continues.
3. AL invalid → Warning Event, no requeue (an edit re-triggers). Its ARS gone → delete the AL.
4. ServiceAccount, Role (rules), RoleBinding: created, or labels/annotations/rules/subjects patched.
5. Config Secret ``<AL>-config``: built from the AL, the ARS's GitHub secret, proxy credential
   secrets and the TLS ConfigMap, validated with the listener's own parser; created, or its DATA
   rewritten when it means something else (ARC rewrites only an annotation).
6. Listener pod: created (after the restart backoff if the last one failed); a terminated /
   evicted / failed pod is deleted (counted, Event) and recreated; a drifted pod (semantic
   derivative, config revision, port count) is deleted and recreated; otherwise only
   labels/annotations are merged on. ``gha_controller_running_listeners`` follows the container.
"""

from __future__ import annotations

import base64
from typing import Any, TypeVar

from services.listener_pod import build, decide
from services.listener_pod.decide import ListenerPodSettings
from services.listener_pod.metrics import ListenerPodMetrics, listener_pod_metrics
from shared.actions import CredentialsError, credentials_from_secret
from shared.actions.auth import AppCredentials, PersonalAccessToken
from shared.api import AutoscalingListener, validate
from shared.api.constants import (
    API_VERSION,
    FINALIZER_AUTOSCALING_LISTENER,
    KIND_AUTOSCALING_LISTENER,
    LISTENER_CONTAINER_NAME,
)
from shared.clock import SYSTEM_CLOCK, Clock
from shared.kube import (
    AUTOSCALING_LISTENERS,
    AUTOSCALING_RUNNER_SETS,
    CONFIG_MAPS,
    DONE,
    PODS,
    ROLE_BINDINGS,
    ROLES,
    SECRETS,
    SERVICE_ACCOUNTS,
    AlreadyExists,
    ApiReader,
    ApiWriter,
    Conflict,
    DecodeFailed,
    EventRecorder,
    InvolvedObject,
    ObjectKey,
    ReconcileContext,
    Resource,
    Result,
)
from shared.kube.objects import Pod, Secret
from shared.listener_config import ConfigError, parse_config
from shared.log import get_logger
from shared.worker import WorkerContext

log = get_logger(__name__)

T = TypeVar("T")


class ListenerPodReconciler:
    """The I/O shell of the listener-pod worker: ``reconcile(key, ctx) -> Result`` for one AL."""

    def __init__(
        self,
        reader: ApiReader,
        writer: ApiWriter,
        settings: ListenerPodSettings | None = None,
        bus: build.BusPassThrough | None = None,
        *,
        recorder: EventRecorder | None = None,
        metrics: ListenerPodMetrics | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.settings = settings or ListenerPodSettings()
        self.bus = bus or build.BusPassThrough()
        self.recorder = recorder
        self.metrics = metrics or listener_pod_metrics()
        self.clock = clock
        self.restarts: dict[ObjectKey, decide.RestartRecord] = {}

    @classmethod
    def from_context(cls, ctx: WorkerContext, settings: ListenerPodSettings) -> ListenerPodReconciler:
        """Listener configs carry this worker's own NATS settings (``--listener-nats-url`` overrides the
        URLs), with the listener's own user when ``--listener-nats-user`` is set."""
        bus = build.listener_bus(build.BusPassThrough.from_bus_settings(ctx.settings.bus), settings)
        return cls(
            ctx.reader,
            ctx.writer,
            settings,
            bus,
            recorder=ctx.events,
            metrics=listener_pod_metrics(ctx.registry),
        )

    # --- entry point -------------------------------------------------------------------------------

    async def reconcile(self, key: ObjectKey, ctx: ReconcileContext) -> Result:
        return await self._reconcile(key)

    async def _event(self, obj: Any, warning: bool, reason: str, message: str) -> None:
        if self.recorder is None:
            return
        if warning:
            await self.recorder.warning(obj, reason, message)
        else:
            await self.recorder.normal(obj, reason, message)

    async def _reconcile(self, key: ObjectKey) -> Result:
        try:
            al = await self.reader.get_or_none(AUTOSCALING_LISTENERS, key)
        except DecodeFailed as exc:
            # Bad input is an Event and a log line, not a retry loop: an edit of the object re-triggers.
            log.warning(
                "AutoscalingListener does not decode; not reconciling it until it changes",
                namespace=key.namespace,
                name=key.name,
                error=str(exc),
            )
            await self._event(
                InvolvedObject(API_VERSION, KIND_AUTOSCALING_LISTENER, key.namespace, key.name),
                True,
                "InvalidSpec",
                str(exc),
            )
            return DONE
        if al is None:
            self.restarts.pop(key, None)
            return DONE
        if al.metadata.is_deleting:
            if FINALIZER_AUTOSCALING_LISTENER in al.metadata.finalizers:
                return await self._cleanup(key, al)
            return DONE
        if FINALIZER_AUTOSCALING_LISTENER not in al.metadata.finalizers:
            al = await self.writer.add_finalizer(AUTOSCALING_LISTENERS, al, FINALIZER_AUTOSCALING_LISTENER)

        problems = [str(p) for p in validate(al)]
        if not al.spec.autoscaling_runner_set_namespace:
            problems.append("$.spec.autoscalingRunnerSetNamespace: is required")
        if problems:
            log.warning(
                "invalid AutoscalingListener; not reconciling it until it changes",
                namespace=key.namespace,
                name=key.name,
                problems=problems,
            )
            await self._event(al, True, "InvalidSpec", "; ".join(problems))
            return DONE

        ars_key = ObjectKey(al.spec.autoscaling_runner_set_namespace, al.spec.autoscaling_runner_set_name)
        ars = await self.reader.get_or_none(AUTOSCALING_RUNNER_SETS, ars_key)
        if ars is None:
            log.info(
                "AutoscalingRunnerSet is gone; deleting its listener",
                namespace=key.namespace,
                name=key.name,
                ars=str(ars_key),
            )
            await self.writer.delete(AUTOSCALING_LISTENERS, key, uid=al.metadata.uid, missing_ok=True)
            return DONE

        settings = self.settings
        await self._ensure_service_account(al, settings)
        await self._ensure_role(al, settings)
        await self._ensure_role_binding(al, settings)

        config_rv = await self._ensure_config_secret(al, settings)
        if config_rv is None:
            return Result(requeue_after=self.settings.resync_seconds)
        return await self._ensure_pod(key, al, settings, config_rv)

    # --- RBAC ------------------------------------------------------------------------------------------

    async def _ensure_service_account(self, al: AutoscalingListener, settings: ListenerPodSettings) -> None:
        want = build.desired_service_account(al, settings)
        key = ObjectKey(al.metadata.namespace, build.service_account_name(al))
        live = await self.reader.get_or_none(SERVICE_ACCOUNTS, key)
        if live is None:
            await self._create(SERVICE_ACCOUNTS, want, al)
            return
        patch = decide.metadata_patch(want["metadata"], live.metadata.labels, live.metadata.annotations)
        if patch:
            await self.writer.patch_merge(SERVICE_ACCOUNTS, key, patch, resource_version=live.metadata.resource_version)

    async def _ensure_role(self, al: AutoscalingListener, settings: ListenerPodSettings) -> None:
        want = build.desired_role(al, settings)
        key = ObjectKey(build.ars_namespace(al), build.role_name(al))
        live = await self.reader.get_or_none(ROLES, key)
        if live is None:
            await self._create(ROLES, want, al)
            return
        patch = decide.metadata_patch(want["metadata"], live.metadata.labels, live.metadata.annotations) or {}
        if decide.rules_differ(want["rules"], live.rules):
            patch["rules"] = want["rules"]
        if patch:
            await self.writer.patch_merge(ROLES, key, patch, resource_version=live.metadata.resource_version)

    async def _ensure_role_binding(self, al: AutoscalingListener, settings: ListenerPodSettings) -> None:
        want = build.desired_role_binding(al, settings)
        key = ObjectKey(build.ars_namespace(al), build.role_name(al))
        live = await self.reader.get_or_none(ROLE_BINDINGS, key)
        if live is None:
            await self._create(ROLE_BINDINGS, want, al)
            return
        if live.role_ref.name != want["roleRef"]["name"] or live.role_ref.kind != "Role":
            # roleRef is immutable: replace the binding (re-created on the next pass).
            await self.writer.delete(ROLE_BINDINGS, key, uid=live.metadata.uid, missing_ok=True)
            return
        patch = decide.metadata_patch(want["metadata"], live.metadata.labels, live.metadata.annotations) or {}
        if decide.subjects_differ(want["subjects"], live.subjects):
            patch["subjects"] = want["subjects"]
        if patch:
            await self.writer.patch_merge(ROLE_BINDINGS, key, patch, resource_version=live.metadata.resource_version)

    async def _create(self, resource: Resource[T], body: dict[str, Any], al: AutoscalingListener) -> T:
        try:
            created = await self.writer.create(resource, body)
        except AlreadyExists:
            # Created since our read (another replica, or a lagging view): decide again on fresh reads.
            raise Conflict(resource.describe("CREATE"), "created concurrently; re-reading") from None
        log.info(
            "created",
            kind=resource.kind,
            namespace=body["metadata"].get("namespace"),
            name=body["metadata"]["name"],
            listener=al.metadata.name,
        )
        return created

    # --- config secret ------------------------------------------------------------------------------------

    async def _read_config_inputs(
        self, al: AutoscalingListener
    ) -> tuple[build.Credentials, str, dict[str, str]] | None:
        """Credentials, CA PEM and proxy block; None (after a Warning Event) when an input is bad."""
        ns = build.ars_namespace(al)
        secret_name = al.spec.github_config_secret
        if not secret_name:
            await self._event(al, True, "InvalidSpec", "spec.githubConfigSecret is empty")
            return None
        gh = await self.reader.get_or_none(SECRETS, ObjectKey(ns, secret_name))
        if gh is None:
            await self._event(
                al, True, "GitHubSecretMissing", f"secret {ns}/{secret_name} (githubConfigSecret) not found"
            )
            log.warning(
                "GitHub config secret not found",
                namespace=al.metadata.namespace,
                name=al.metadata.name,
                secret=f"{ns}/{secret_name}",
            )
            return None
        try:
            data = {k: gh.decoded(k) or b"" for k in gh.data}
            creds = credentials_from_secret(data)
        except (CredentialsError, ValueError) as exc:
            await self._event(al, True, "InvalidGitHubSecret", f"secret {ns}/{secret_name}: {exc}")
            return None
        if isinstance(creds, PersonalAccessToken):
            credentials = build.Credentials(github_token=creds.token)
        else:
            assert isinstance(creds, AppCredentials)
            credentials = build.Credentials(
                github_app_id=str(creds.app_id),
                github_app_installation_id=int(creds.installation_id),
                github_app_private_key=creds.private_key,
            )

        ca = ""
        tls = al.spec.github_server_tls
        ref = tls.certificate_from.config_map_key_ref if tls is not None and tls.certificate_from is not None else None
        if ref is not None:
            cm = await self.reader.get_or_none(CONFIG_MAPS, ObjectKey(ns, ref.name))
            value = None
            if cm is not None:
                value = cm.data.get(ref.key)
                if value is None and ref.key in cm.binary_data:
                    value = base64.b64decode(cm.binary_data[ref.key]).decode(errors="replace")
            if value is None:
                await self._event(
                    al,
                    True,
                    "TLSConfigMissing",
                    f"configmap {ns}/{ref.name} key {ref.key!r} (githubServerTLS) not found",
                )
                return None
            ca = value

        proxy_creds: dict[str, tuple[str, str]] = {}
        for name in build.proxy_secret_refs(al):
            s = await self.reader.get_or_none(SECRETS, ObjectKey(ns, name))
            if s is None:
                await self._event(
                    al, True, "ProxySecretMissing", f"secret {ns}/{name} (proxy credentialSecretRef) not found"
                )
                return None
            try:
                user = (s.decoded("username") or b"").decode()
                password = (s.decoded("password") or b"").decode()
            except (ValueError, UnicodeDecodeError):
                await self._event(
                    al, True, "InvalidProxySecret", f"secret {ns}/{name}: username/password are not valid text"
                )
                return None
            proxy_creds[name] = (user, password)
        return credentials, ca, build.proxy_settings(al, proxy_creds)

    async def _ensure_config_secret(self, al: AutoscalingListener, settings: ListenerPodSettings) -> str | None:
        """Create or rewrite ``<AL>-config``; return its resourceVersion (None: inputs are bad)."""
        inputs = await self._read_config_inputs(al)
        if inputs is None:
            return None
        credentials, ca, proxy = inputs
        try:
            cfg = build.listener_config(al, credentials, settings, self.bus, server_root_ca=ca, proxy=proxy)
            config_bytes = build.encode_config(cfg)
            parse_config(config_bytes)  # the listener's own validation: never ship a config it rejects
        except (build.ConfigProblem, ConfigError) as exc:
            log.warning(
                "listener config is invalid", namespace=al.metadata.namespace, name=al.metadata.name, error=str(exc)
            )
            await self._event(al, True, "InvalidListenerConfig", str(exc))
            return None

        want = build.desired_config_secret(al, config_bytes, settings)
        key = ObjectKey(al.metadata.namespace, build.config_secret_name(al))
        live = await self.reader.get_or_none(SECRETS, key)
        labels = {"name": al.metadata.name, "namespace": al.metadata.namespace}
        if live is None:
            created = await self._create(SECRETS, want, al)
            self.metrics.config_writes_total.labels(labels["name"], labels["namespace"], "created").inc()
            return created.metadata.resource_version
        patch = decide.metadata_patch(want["metadata"], live.metadata.labels, live.metadata.annotations) or {}
        try:
            live_bytes = live.decoded(build.CONFIG_FILE_KEY)
        except ValueError:
            live_bytes = None
        changed = decide.config_data_differs(config_bytes, live_bytes)
        if changed:
            patch["data"] = want["data"]
        if not patch:
            return live.metadata.resource_version
        updated: Secret = await self.writer.patch_merge(
            SECRETS, key, patch, resource_version=live.metadata.resource_version
        )
        if changed:
            self.metrics.config_writes_total.labels(labels["name"], labels["namespace"], "changed").inc()
            log.info(
                "listener config rewritten",
                namespace=key.namespace,
                name=key.name,
                resource_version=updated.metadata.resource_version,
            )
            await self._event(
                al,
                False,
                "ListenerConfigUpdated",
                f"config secret {key.name} rewritten; the listener pod will be restarted",
            )
        return updated.metadata.resource_version

    # --- pod ------------------------------------------------------------------------------------------------

    async def _ensure_pod(
        self, key: ObjectKey, al: AutoscalingListener, settings: ListenerPodSettings, config_rv: str
    ) -> Result:
        opts = self.settings
        want = build.desired_listener_pod(al, settings, config_rv)
        pod_key = ObjectKey(al.metadata.namespace, build.pod_name(al))
        url = al.spec.github_config_url
        live = await self.reader.get_or_none(PODS, pod_key)
        if live is None:
            record = self.restarts.get(key)
            wait = decide.next_create_at(record, opts.restart) - self.clock.monotonic()
            if wait > 0:
                return Result(requeue_after=wait)
            self.metrics.set_running(al.metadata.name, al.metadata.namespace, url, 0)
            await self._create(PODS, want, al)
            await self._event(al, False, "ListenerPodCreated", f"created listener pod {pod_key.name}")
            return Result(requeue_after=opts.resync_seconds)

        verdict = decide.pod_verdict(live)
        if verdict.state is decide.PodState.TERMINATING:
            self.metrics.set_running(al.metadata.name, al.metadata.namespace, url, 0)
            return Result(requeue_after=opts.cleanup_requeue_seconds)

        owner = live.metadata.controller_reference()
        if owner is None or owner.uid != al.metadata.uid:
            return await self._recreate(
                key, al, live, "foreign-owner", "the pod is not controlled by this AutoscalingListener", failure=False
            )
        if verdict.state is decide.PodState.FAILED:
            return await self._recreate(key, al, live, verdict.reason, verdict.detail, failure=True)
        drift = decide.pod_drift(want, live.spec, live.metadata.annotations)
        if drift is not None:
            reason = "config-changed" if drift.startswith("config") else "spec-drift"
            return await self._recreate(key, al, live, reason, drift, failure=False)

        patch = decide.pod_metadata_patch(want, live.metadata.labels, live.metadata.annotations)
        if patch:
            await self.writer.patch_merge(PODS, pod_key, patch, resource_version=live.metadata.resource_version)
        running = verdict.state is decide.PodState.RUNNING
        self.metrics.set_running(al.metadata.name, al.metadata.namespace, url, 1 if running else 0)
        if running:
            self._maybe_forget_failures(key, live)
        return Result(requeue_after=opts.resync_seconds)

    def _maybe_forget_failures(self, key: ObjectKey, pod: Pod) -> None:
        record = self.restarts.get(key)
        if record is None:
            return
        cs = pod.status.container(LISTENER_CONTAINER_NAME)
        started = cs.state.running.started_at if cs is not None and cs.state.running is not None else None
        if started is None:
            return
        if (self.clock.now() - started).total_seconds() >= self.settings.stable_run_seconds:
            self.restarts.pop(key, None)

    async def _recreate(
        self, key: ObjectKey, al: AutoscalingListener, pod: Pod, reason: str, detail: str, *, failure: bool
    ) -> Result:
        """Delete the live pod (uid precondition: never a namesake created meanwhile); the pod
        informer wakes this AL when it is gone and the next pass creates the new one."""
        name, ns = al.metadata.name, al.metadata.namespace
        log.info("recreating listener pod", namespace=ns, name=name, reason=reason, detail=detail)
        await self.writer.delete(
            PODS, ObjectKey(pod.metadata.namespace, pod.metadata.name), uid=pod.metadata.uid, missing_ok=True
        )
        self.metrics.recreations_total.labels(name, ns, reason).inc()
        self.metrics.set_running(name, ns, al.spec.github_config_url, 0)
        wait = self.settings.cleanup_requeue_seconds
        if failure:
            record = self.restarts.setdefault(key, decide.RestartRecord())
            record.failures += 1
            record.last_failure = self.clock.monotonic()
            wait = max(wait, decide.restart_delay(record.failures, self.settings.restart))
            await self._event(
                al,
                True,
                "ListenerPodFailed",
                f"listener pod {pod.metadata.name}: {detail}; recreating (failure {record.failures} in a row)",
            )
        else:
            await self._event(al, False, "ListenerPodRecreated", f"listener pod {pod.metadata.name}: {detail}")
        return Result(requeue_after=wait)

    # --- deletion chain -------------------------------------------------------------------------------------

    async def _cleanup(self, key: ObjectKey, al: AutoscalingListener) -> Result:
        ns, ars_ns = al.metadata.namespace, build.ars_namespace(al)
        steps: list[tuple[Resource[Any], ObjectKey]] = [
            (PODS, ObjectKey(ns, build.pod_name(al))),
            (SECRETS, ObjectKey(ns, build.config_secret_name(al))),
            (SECRETS, ObjectKey(ns, build.proxy_secret_name(al))),
        ]
        if ars_ns:
            steps += [
                (ROLE_BINDINGS, ObjectKey(ars_ns, build.role_name(al))),
                (ROLES, ObjectKey(ars_ns, build.role_name(al))),
            ]
        steps.append((SERVICE_ACCOUNTS, ObjectKey(ns, build.service_account_name(al))))
        remaining = []
        for resource, obj_key in steps:
            obj = await self.reader.get_or_none(resource, obj_key)
            if obj is None:
                continue
            remaining.append(f"{resource.kind} {obj_key}")
            if resource is PODS:
                self.metrics.set_running(al.metadata.name, ns, al.spec.github_config_url, 0)
            if not obj.metadata.is_deleting:
                await self.writer.delete(resource, obj_key, uid=obj.metadata.uid, missing_ok=True)
        if remaining:
            log.debug("waiting for listener resources to go", namespace=ns, name=al.metadata.name, remaining=remaining)
            return Result(requeue_after=self.settings.cleanup_requeue_seconds)
        await self.writer.remove_finalizer(AUTOSCALING_LISTENERS, al, FINALIZER_AUTOSCALING_LISTENER)
        self.metrics.forget(al.metadata.name, ns, al.spec.github_config_url)
        self.restarts.pop(key, None)
        log.info("listener resources cleaned up; finalizer removed", namespace=ns, name=al.metadata.name)
        return DONE

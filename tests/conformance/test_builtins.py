"""Built-in kinds: pod admission/defaulting, secrets, leases, events, RBAC objects."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient

from tests.fixtures.apiserver import KubeApi

from .conftest import Http, core

pytestmark = pytest.mark.anyio
SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
# An events.k8s.io/v1 Event with every field that API requires, except metadata and "regarding".
EVENTS_V1_EVENT = {
    "eventTime": "2026-01-01T00:00:00.000000Z",
    "reason": "R",
    "action": "A",
    "reportingController": "x",
    "reportingInstance": "y",
    "type": "Normal",
}


async def test_pod_admission_and_defaults(http: Http, namespace: str) -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "a", "image": "ghcr.io/actions/actions-runner:latest", "ports": [{"containerPort": 80}]},
                {"name": "b", "image": "busybox:1.36"},
            ],
            "initContainers": [{"name": "init", "image": "busybox"}],
        },
    }
    obj = await http.create(core(namespace, "pods"), pod)
    spec = obj["spec"]
    assert spec["restartPolicy"] == "Always" and spec["dnsPolicy"] == "ClusterFirst"
    assert spec["schedulerName"] == "default-scheduler" and spec["terminationGracePeriodSeconds"] == 30
    assert spec["serviceAccountName"] == "default" and spec["serviceAccount"] == "default"
    assert spec["securityContext"] == {} and spec["enableServiceLinks"] is True
    assert spec["priority"] == 0 and spec["preemptionPolicy"] == "PreemptLowerPriority"
    by_name = {c["name"]: c for c in spec["containers"] + spec["initContainers"]}
    assert by_name["a"]["imagePullPolicy"] == "Always"
    assert by_name["b"]["imagePullPolicy"] == "IfNotPresent"
    assert by_name["init"]["imagePullPolicy"] == "Always"
    assert by_name["a"]["ports"][0]["protocol"] == "TCP"
    for c in by_name.values():
        assert c["terminationMessagePath"] == "/dev/termination-log" and c["terminationMessagePolicy"] == "File"
        mounts = [m for m in c["volumeMounts"] if m["mountPath"] == SA_PATH]
        assert len(mounts) == 1 and mounts[0]["readOnly"] is True
    vol = next(v for v in spec["volumes"] if v["name"].startswith("kube-api-access-"))
    assert len(vol["name"]) == len("kube-api-access-") + 5
    sources = vol["projected"]["sources"]
    assert sources[0]["serviceAccountToken"] == {"expirationSeconds": 3607, "path": "token"}
    assert vol["projected"]["defaultMode"] == 420
    tolerations = {t["key"]: t for t in spec["tolerations"]}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        assert tolerations[key] == {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    assert obj["status"] == {"phase": "Pending", "qosClass": "BestEffort"}


async def test_pod_without_automount_and_missing_sa(http: Http, namespace: str) -> None:
    pod = {
        "metadata": {"name": "n"},
        "spec": {"automountServiceAccountToken": False, "containers": [{"name": "c", "image": "busybox"}]},
    }
    obj = await http.create(core(namespace, "pods"), pod)
    assert "volumes" not in obj["spec"] and "volumeMounts" not in obj["spec"]["containers"][0]
    pod = {
        "metadata": {"name": "m"},
        "spec": {"serviceAccountName": "missing", "containers": [{"name": "c", "image": "busybox"}]},
    }
    status, body = await http.post(core(namespace, "pods"), pod)
    assert status == 403
    assert 'serviceaccount "missing" not found' in body["message"]


async def test_pod_validation(http: Http, namespace: str) -> None:
    status, body = await http.post(core(namespace, "pods"), {"metadata": {"name": "v"}, "spec": {"containers": []}})
    assert status == 422 and body["message"] == 'Pod "v" is invalid: spec.containers: Required value'
    assert body["details"] == {
        "name": "v",
        "kind": "Pod",
        "causes": [{"reason": "FieldValueRequired", "message": "Required value", "field": "spec.containers"}],
    }


async def test_typed_pod_round_trip(kube_client: ApiClient, namespace: str) -> None:
    api = client.CoreV1Api(kube_client)
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="typed", labels={"app": "x"}),
        spec=client.V1PodSpec(
            containers=[client.V1Container(name="c", image="busybox:1.36", env=[client.V1EnvVar(name="A", value="1")])]
        ),
    )
    created = await api.create_namespaced_pod(namespace, pod)
    assert isinstance(created, client.V1Pod) and created.metadata.uid
    read = await api.read_namespaced_pod("typed", namespace)
    assert read.spec.containers[0].env[0].name == "A" and read.status.phase == "Pending"
    read.status.phase = "Running"
    updated = await api.replace_namespaced_pod_status("typed", namespace, read)
    assert updated.status.phase == "Running"
    patched = await api.patch_namespaced_pod("typed", namespace, {"metadata": {"labels": {"b": "y"}}})
    assert patched.metadata.labels == {"app": "x", "b": "y"}
    deleted = await api.delete_namespaced_pod("typed", namespace)
    assert isinstance(deleted, client.V1Pod)


async def test_secret_string_data_and_immutability(http: Http, namespace: str) -> None:
    obj = await http.create(
        core(namespace, "secrets"), {"metadata": {"name": "s"}, "stringData": {"token": "abc"}, "immutable": True}
    )
    assert "stringData" not in obj and obj["type"] == "Opaque"
    assert base64.b64decode(obj["data"]["token"]) == b"abc"
    status, body = await http.patch(core(namespace, "secrets", "s"), {"stringData": {"token": "new"}})
    assert status == 422 and body["details"]["kind"] == "Secret"


async def test_lease_round_trip(kube_client: ApiClient, namespace: str) -> None:
    api = client.CoordinationV1Api(kube_client)
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="leader"),
        spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15),
    )
    created = await api.create_namespaced_lease(namespace, lease)
    created.spec.holder_identity = "b"
    replaced = await api.replace_namespaced_lease("leader", namespace, created)
    assert replaced.spec.holder_identity == "b"
    created.spec.holder_identity = "c"  # stale RV: optimistic lock fails
    from kubernetes_asyncio.client.exceptions import ApiException

    with pytest.raises(ApiException) as exc:
        await api.replace_namespaced_lease("leader", namespace, created)
    assert exc.value.status == 409


async def test_events_rbac_and_service_accounts(kube_client: ApiClient, namespace: str) -> None:
    core_api = client.CoreV1Api(kube_client)
    ev = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="x."),
        involved_object=client.V1ObjectReference(kind="Pod", name="p", namespace=namespace),
        reason="Test",
        message="hello",
        type="Normal",
    )
    created = await core_api.create_namespaced_event(namespace, ev)
    listed = await core_api.list_namespaced_event(namespace, field_selector="involvedObject.name=p")
    assert [e.metadata.name for e in listed.items] == [created.metadata.name]
    events_api = client.EventsV1Api(kube_client)
    e2 = await events_api.create_namespaced_event(
        namespace,  # plain dict bodies below: the client sends them as they are (its stubs ask for models)
        {
            **EVENTS_V1_EVENT,
            "metadata": {"name": "e2"},
            "regarding": {"kind": "Pod", "name": "p", "namespace": namespace},
        },  # type: ignore[arg-type]
    )
    assert e2.metadata.name == "e2"
    rbac = client.RbacAuthorizationV1Api(kube_client)
    await core_api.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="listener"))
    )
    await rbac.create_namespaced_role(
        namespace,
        {"metadata": {"name": "r"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},  # type: ignore[arg-type]
    )
    await rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "rb"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "listener", "namespace": namespace}],
        },  # type: ignore[arg-type]
    )
    roles = await rbac.list_namespaced_role(namespace)
    assert [r.metadata.name for r in roles.items] == ["r"]
    sa = await core_api.delete_namespaced_service_account("listener", namespace)
    assert isinstance(sa, client.V1ServiceAccount)


async def test_pod_binding_sets_node_once(http: Http, namespace: str) -> None:
    await http.create(
        core(namespace, "pods"),
        {"metadata": {"name": "b"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
    )
    status, body = await http.patch(core(namespace, "pods", "b"), {"spec": {"nodeName": "node-a"}})
    assert status == 422  # nodeName is not settable by an update
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "b"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
    }
    status, body = await http.post(core(namespace, "pods", "b", "binding"), binding)
    assert status == 201 and body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    _, pod = await http.get(core(namespace, "pods", "b"))
    assert pod["spec"]["nodeName"] == "node-a" and pod["metadata"]["generation"] == 1
    # The binding also records the scheduling.
    assert list(pod["status"]) == ["phase", "conditions", "qosClass"]
    [cond] = pod["status"]["conditions"]
    assert cond["type"] == "PodScheduled" and cond["status"] == "True" and cond["lastProbeTime"] is None
    assert cond["lastTransitionTime"].endswith("Z")
    status, body = await http.post(core(namespace, "pods", "b", "binding"), binding)
    assert status == 409 and 'already assigned to node "node-a"' in body["message"]


async def test_pod_binding_through_the_client(kube_client: ApiClient, namespace: str) -> None:
    api = client.CoreV1Api(kube_client)
    await api.create_namespaced_pod(
        namespace,
        {"metadata": {"name": "cb"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},  # type: ignore[arg-type]  # a dict body is sent as it is
    )
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name="cb"), target=client.V1ObjectReference(kind="Node", name="node-b")
    )
    await api.create_namespaced_pod_binding("cb", namespace, body, _preload_content=False)
    pod = await api.read_namespaced_pod("cb", namespace)
    assert pod.spec.node_name == "node-b"


async def test_builtin_unknown_fields_are_pruned(kube_api: KubeApi, namespace: str) -> None:
    import aiohttp

    pod = {
        "metadata": {"name": "u", "owner_references": []},
        "spec": {"containers": [{"name": "c", "image": "busybox", "image_pull_policy": "Never"}]},
    }
    async with aiohttp.ClientSession() as s:
        url = f"{kube_api.url}/api/v1/namespaces/{namespace}/pods"
        async with s.post(url, json=pod) as resp:
            body = await resp.json()
            assert resp.status == 201
            assert sorted(resp.headers.getall("Warning")) == [
                '299 - "unknown field \\"metadata.owner_references\\""',
                '299 - "unknown field \\"spec.containers[0].image_pull_policy\\""',
            ]
        assert "image_pull_policy" not in body["spec"]["containers"][0]
        assert body["spec"]["containers"][0]["imagePullPolicy"] == "Always"
        async with s.post(
            f"{kube_api.url}/api/v1/namespaces/{namespace}/configmaps",
            json={"metadata": {"name": "x"}, "datta": {}},
            params={"fieldValidation": "Strict"},
        ) as resp:
            body = await resp.json()
            assert resp.status == 400 and 'strict decoding error: unknown field "datta"' in body["message"]


async def test_event_validation(http: Http, namespace: str) -> None:
    mismatch = {
        "reason": "FieldValueInvalid",
        "message": 'Invalid value: "": does not match event.namespace',
        "field": "involvedObject.namespace",
    }
    event = {**EVENTS_V1_EVENT, "metadata": {"name": "e"}}
    path = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
    status, body = await http.post(path, event)  # no "regarding"
    assert (
        status == 422
        and body["message"]
        == 'Event "e" is invalid: involvedObject.namespace: Invalid value: "": does not match event.namespace'
    )
    assert body["details"] == {"name": "e", "kind": "Event", "causes": [mismatch]}
    status, body = await http.post(
        path, {**event, "regarding": {"kind": "Pod", "name": "p", "namespace": namespace}, "eventTime": None}
    )
    assert status == 422 and body["details"]["causes"] == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "eventTime"}
    ]
    status, body = await http.post(
        path, {**event, "regarding": {"kind": "Pod", "name": "p"}, "eventTime": "2026-01-01T00:00:00Z"}
    )
    assert status == 400 and body["message"] == (
        'Event in version "v1" cannot be handled as a Event: parsing time "2026-01-01T00:00:00Z" as '
        '"2006-01-02T15:04:05.000000Z07:00": cannot parse "Z" as ".000000"'
    )
    core_event = {
        "metadata": {"name": "c"},
        "involvedObject": {"kind": "Pod", "name": "p"},
        "reason": "R",
        "type": "Normal",
    }
    status, body = await http.post(core(namespace, "events"), core_event)
    assert status == 422 and body["details"]["causes"] == [mismatch]
    status, _ = await http.post(core("default", "events"), {**core_event, "metadata": {"generateName": "c."}})
    assert status == 201  # an event about a cluster-scoped object lives in "default"


async def test_lease_times_are_micro_time(kube_client: ApiClient, http: Http, namespace: str) -> None:
    from datetime import UTC, datetime

    api = client.CoordinationV1Api(kube_client)
    now = datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="t"),
        spec=client.V1LeaseSpec(holder_identity="a", renew_time=now, acquire_time=now),
    )
    await api.create_namespaced_lease(namespace, lease)
    _, raw = await http.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/t")
    assert raw["spec"]["renewTime"] == "2026-11-29T12:00:00.123456Z"
    read = await api.read_namespaced_lease("t", namespace)
    assert read.spec.renew_time == now
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    layout = "2006-01-02T15:04:05.000000Z07:00"
    # A patched object the decoder refuses is a 422 on the field "patch".
    status, body = await http.patch(f"{leases}/t", {"spec": {"renewTime": "yesterday"}})
    assert status == 422 and body["reason"] == "Invalid"
    assert body["message"].startswith(' "" is invalid: patch: Invalid value: "{')
    assert body["message"].endswith(f': parsing time "yesterday" as "{layout}": cannot parse "yesterday" as "2006"')
    [cause] = body["details"]["causes"]
    assert cause["field"] == "patch" and cause["reason"] == "FieldValueInvalid"
    # MicroTime needs exactly six fraction digits.
    status, body = await http.patch(
        f"{leases}/t", {"spec": {"renewTime": "2026-11-29T12:00:00Z"}}, "application/strategic-merge-patch+json"
    )
    assert status == 422 and body["message"] == (
        ' "" is invalid: patch: Invalid value: "map[spec:map[renewTime:2026-11-29T12:00:00Z]]": '
        f'parsing time "2026-11-29T12:00:00Z" as "{layout}": cannot parse "Z" as ".000000"'
    )
    for sent, rest, element in (
        ("yesterday", "yesterday", "2006"),
        ("2026-11-29T12:00:00.123Z", ".123Z", ".000000"),
        ("2026-11-29T12:00:00.123456789Z", "789Z", "Z07:00"),
    ):
        status, body = await http.post(leases, {"metadata": {"name": "bad"}, "spec": {"renewTime": sent}})
        assert status == 400 and body["message"] == (
            f'Lease in version "v1" cannot be handled as a Lease: parsing time "{sent}" as "{layout}": '
            f'cannot parse "{rest}" as "{element}"'
        )
    obj = await http.create(
        leases, {"metadata": {"name": "tz"}, "spec": {"renewTime": "2026-11-29T12:00:00.123456+02:00"}}
    )
    assert obj["spec"]["renewTime"] == "2026-11-29T10:00:00.123456Z"


async def test_pod_quantities_are_canonical(http: Http, namespace: str) -> None:
    res = {"requests": {"cpu": "0.5", "memory": "1024Mi"}, "limits": {"cpu": "1000m", "memory": "1536Mi"}}
    pod: dict[str, Any] = {
        "metadata": {"name": "q"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "resources": res}],
            "volumes": [{"name": "w", "emptyDir": {"sizeLimit": "2048Mi"}}],
        },
    }
    obj = await http.create(core(namespace, "pods"), pod)
    assert obj["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "1536Mi"},
    }
    assert obj["spec"]["volumes"][0]["emptyDir"] == {"sizeLimit": "2Gi"}
    assert obj["status"]["qosClass"] == "Burstable"
    pod["metadata"]["name"] = "bad"
    pod["spec"]["containers"][0]["resources"] = {"requests": {"memory": "lots"}}
    status, body = await http.post(core(namespace, "pods"), pod)
    assert status == 400 and "quantities must match the regular expression" in body["message"]


async def test_limits_default_requests_and_guaranteed_qos(http: Http, namespace: str) -> None:
    pod = {
        "metadata": {"name": "g"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]
        },
    }
    obj = await http.create(core(namespace, "pods"), pod)
    assert obj["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    assert obj["status"]["qosClass"] == "Guaranteed"


async def test_role_without_rules_reads_back_null(http: Http, namespace: str) -> None:
    # RBAC's rules have no omitempty and etcd's protobuf keeps no empty list: "rules": null, not [].
    path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles"
    created = await http.create(path, {"metadata": {"name": "empty"}, "rules": []})
    assert created["rules"] is None
    _, got = await http.get(f"{path}/empty")
    assert got["rules"] is None
    status, patched = await http.patch(
        f"{path}/empty", {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}
    )
    assert status == 200 and patched["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    status, patched = await http.patch(f"{path}/empty", {"rules": []})
    assert status == 200 and patched["rules"] is None

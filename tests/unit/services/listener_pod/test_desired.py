"""The objects the listener-pod worker builds for an AutoscalingListener (pure)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from services.listener_pod import build, decide
from shared.api import AutoscalingListener, decode
from shared.api.constants import (
    ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION,
    LABEL_LISTENER_NAME,
    LABEL_LISTENER_NAMESPACE,
    LABEL_SCALE_SET_NAME,
    LABEL_SCALE_SET_NAMESPACE,
)
from shared.bus import BusSettings
from shared.listener_config import parse_config

PAT = build.Credentials(github_token="ghp_testtoken_123456")
SETTINGS = decide.ListenerPodSettings(image="example.com/runnerscale:1.0")


def make_al(**spec: Any) -> AutoscalingListener:
    base: dict[str, Any] = {
        "githubConfigUrl": "https://github.com/octo-org/octo-repo",
        "githubConfigSecret": "gh-secret",
        "runnerScaleSetId": 17,
        "autoscalingRunnerSetNamespace": "arc-runners",
        "autoscalingRunnerSetName": "arc-runner-set",
        "ephemeralRunnerSetName": "arc-runner-set",
        "minRunners": 1,
        "maxRunners": 10,
    }
    base.update(spec)
    return decode(
        AutoscalingListener,
        {
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "AutoscalingListener",
            "metadata": {
                "name": "arc-runner-set-7f984dc6-listener",
                "namespace": "arc-systems",
                "uid": "uid-al-1",
                "labels": {
                    "app.kubernetes.io/component": "runner-scale-set-listener",
                    "example.com/excluded": "x",
                    "team": "ci",
                },
            },
            "spec": base,
        },
    )


# --- RBAC ---------------------------------------------------------------------------------------------


def test_service_account_is_owned_and_labelled() -> None:
    al = make_al(
        serviceAccountMetadata={"labels": {"sa-label": "listener", "team": "overridden"}, "annotations": {"a": "b"}}
    )
    sa = build.desired_service_account(al, SETTINGS)
    meta = sa["metadata"]
    assert (meta["name"], meta["namespace"]) == ("arc-runner-set-7f984dc6-listener", "arc-systems")
    assert meta["labels"]["sa-label"] == "listener"
    assert meta["labels"]["team"] == "ci", "the AL's labels win over the metadata labels"
    assert meta["labels"][LABEL_SCALE_SET_NAME] == "arc-runner-set"
    assert meta["labels"][LABEL_SCALE_SET_NAMESPACE] == "arc-runners"
    assert meta["annotations"] == {"a": "b"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "AutoscalingListener",
            "name": "arc-runner-set-7f984dc6-listener",
            "uid": "uid-al-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_excluded_label_prefixes_are_not_propagated() -> None:
    al = make_al(roleMetadata={"labels": {"example.com/role": "x", "keep": "y"}})
    settings = decide.ListenerPodSettings(exclude_label_prefixes=("example.com/",))
    role = build.desired_role(al, settings)
    labels = role["metadata"]["labels"]
    assert "example.com/excluded" not in labels and "example.com/role" not in labels
    assert labels["keep"] == "y" and labels["team"] == "ci"


def test_role_lives_in_the_ars_namespace_and_grants_nothing() -> None:
    al = make_al(ephemeralRunnerSetName="my-ers")
    role = build.desired_role(al, SETTINGS)
    assert role["metadata"]["namespace"] == "arc-runners"
    assert "ownerReferences" not in role["metadata"], "cross-namespace: no owner reference"
    assert role["metadata"]["labels"][LABEL_LISTENER_NAME] == al.metadata.name
    assert role["metadata"]["labels"][LABEL_LISTENER_NAMESPACE] == "arc-systems"
    assert role["rules"] == []  # the runnerscale listener never talks to Kubernetes


def test_role_binding_binds_the_service_account_across_namespaces() -> None:
    al = make_al()
    rb = build.desired_role_binding(al, SETTINGS)
    assert rb["metadata"]["namespace"] == "arc-runners"
    assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": al.metadata.name}
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": al.metadata.name, "namespace": "arc-systems"}]


def test_listener_role_grants_nothing_the_listener_never_talks_to_kubernetes() -> None:
    """Least privilege (issue 11): the runnerscale listener publishes on NATS only, so its Role is
    empty; an ARC Role with the old rules is a drift the worker patches away."""
    import pathlib
    import re

    from shared.kube.objects import PolicyRule

    assert build.role_rules("ers") == []
    listener = pathlib.Path(build.__file__).resolve().parents[1] / "listener"
    for path in listener.rglob("*.py"):
        source = path.read_text()
        assert not re.search(r"^\s*(from|import) shared\.kube\b", source, re.MULTILINE), path
        assert "KubeClient" not in source and "kubeconfig" not in source.lower(), path
    arc_rules = [PolicyRule(api_groups=["actions.github.com"], resources=["ephemeralrunners"], verbs=["patch"])]
    assert decide.rules_differ(build.role_rules("ers"), arc_rules)
    assert not decide.rules_differ(build.role_rules("ers"), [])


def test_a_role_without_rules_decodes_as_a_real_api_server_returns_it() -> None:
    # The listener's Role grants nothing; kube-apiserver then answers "rules": null (no omitempty).
    import msgspec

    from shared.kube.objects import Role

    body = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "l"}, "rules": None}
    role = msgspec.convert(body, Role)
    assert not decide.rules_differ(build.role_rules("ers"), role.rules)


def test_rules_compare_semantically() -> None:
    from shared.kube.objects import PolicyRule

    live = [
        PolicyRule(
            api_groups=["actions.github.com"],
            resources=["ephemeralrunnersets"],
            resource_names=["ers"],
            verbs=["patch"],
        ),
        PolicyRule(
            api_groups=["actions.github.com"],
            resources=["ephemeralrunners", "ephemeralrunners/status"],
            verbs=["patch"],
        ),
    ]
    desired = [
        {
            "apiGroups": ["actions.github.com"],
            "resources": ["ephemeralrunnersets"],
            "resourceNames": ["ers"],
            "verbs": ["patch"],
        },
        {
            "apiGroups": ["actions.github.com"],
            "resources": ["ephemeralrunners", "ephemeralrunners/status"],
            "verbs": ["patch"],
        },
    ]
    assert not decide.rules_differ(desired, live)
    desired[0]["resourceNames"] = ["ers-updated"]
    assert decide.rules_differ(desired, live)


def test_metadata_patch_is_a_subset_check() -> None:
    want = {"labels": {"a": "1"}, "annotations": {"x": "y"}}
    assert decide.metadata_patch(want, {"a": "1", "foreign": "kept"}, {"x": "y", "webhook/added": "z"}) is None
    assert decide.metadata_patch(want, {"a": "2"}, {}) == {
        "metadata": {"labels": {"a": "1"}, "annotations": {"x": "y"}}
    }


# --- config --------------------------------------------------------------------------------------------


def test_config_parses_with_the_listeners_own_parser() -> None:
    al = make_al()
    bus = build.BusPassThrough.from_bus_settings(
        BusSettings(nats_urls=("nats://10.0.0.1:4222",), user="u", password="natspass", lease_ttl=8.0)
    )
    cfg = build.listener_config(al, PAT, SETTINGS, bus)
    parsed = parse_config(build.encode_config(cfg))
    assert parsed.configure_url == "https://github.com/octo-org/octo-repo"
    assert parsed.github_token == "ghp_testtoken_123456"
    assert parsed.runner_scale_set_id == 17
    assert parsed.runner_scale_set_name == "arc-runner-set"
    assert (parsed.ephemeral_runner_set_namespace, parsed.ephemeral_runner_set_name) == (
        "arc-runners",
        "arc-runner-set",
    )
    assert (parsed.min_runners, parsed.max_runners) == (1, 10)
    assert parsed.nats.servers == ["nats://10.0.0.1:4222"]
    assert (parsed.nats.user, parsed.nats.password) == ("u", "natspass")
    assert parsed.ha.lease_ttl_seconds == 8.0
    assert parsed.metrics_addr == ":8080" and parsed.metrics_endpoint == "/metrics"
    assert parsed.health_addr == ":8081"


def test_config_with_github_app_credentials() -> None:
    creds = build.Credentials(
        github_app_id="12345",
        github_app_installation_id=678,
        github_app_private_key="-----BEGIN RSA PRIVATE KEY-----\nx\n",
    )
    cfg = build.listener_config(make_al(), creds, SETTINGS, build.BusPassThrough())
    assert "github_token" not in cfg
    assert (cfg["github_app_id"], cfg["github_app_installation_id"]) == ("12345", 678)


def test_metrics_disabled_by_arc_zero() -> None:
    settings = decide.ListenerPodSettings(metrics_addr="0")
    cfg = build.listener_config(make_al(), PAT, settings, build.BusPassThrough())
    assert cfg["metrics_addr"] == "" and "metrics_endpoint" not in cfg
    pod = build.desired_listener_pod(make_al(), settings, "1")
    ports = pod["spec"]["containers"][0]["ports"]
    assert [p["name"] for p in ports] == ["health"]


def test_proxy_with_credentials_goes_into_the_config() -> None:
    al = make_al(
        proxy={
            "http": {"url": "http://proxy.example.com:3128", "credentialSecretRef": "proxy-creds"},
            "https": {"url": "http://proxy.example.com:3129"},
            "noProxy": ["example.org", "10.0.0.0/8"],
        }
    )
    assert build.proxy_secret_refs(al) == ["proxy-creds"]
    proxy = build.proxy_settings(al, {"proxy-creds": ("user", "p@ss")})
    assert proxy == {
        "http_proxy": "http://user:p%40ss@proxy.example.com:3128",
        "https_proxy": "http://proxy.example.com:3129",
        "no_proxy": "example.org,10.0.0.0/8",
    }
    cfg = build.listener_config(
        al, PAT, SETTINGS, build.BusPassThrough(), proxy=proxy, server_root_ca="-----BEGIN CERTIFICATE-----\n"
    )
    parsed = parse_config(build.encode_config(cfg))
    assert parsed.proxy.no_proxy == "example.org,10.0.0.0/8"
    assert parsed.server_root_ca.startswith("-----BEGIN CERTIFICATE")


def test_vault_is_refused_with_a_clear_problem() -> None:
    al = make_al(
        vaultConfig={
            "type": "azure_key_vault",
            "azureKeyVault": {"url": "u", "tenantId": "t", "clientId": "c", "certificatePath": "p"},
        }
    )
    with pytest.raises(build.ConfigProblem, match="vaultConfig"):
        build.listener_config(al, PAT, SETTINGS, build.BusPassThrough())


def test_config_bytes_are_deterministic_and_compared_as_json() -> None:
    al = make_al()
    a = build.encode_config(build.listener_config(al, PAT, SETTINGS, build.BusPassThrough()))
    b = build.encode_config(build.listener_config(al, PAT, SETTINGS, build.BusPassThrough()))
    assert a == b
    reordered = json.dumps(dict(reversed(list(json.loads(a).items())))).encode()
    assert not decide.config_data_differs(a, reordered)
    changed = build.encode_config(build.listener_config(make_al(maxRunners=20), PAT, SETTINGS, build.BusPassThrough()))
    assert decide.config_data_differs(changed, a)
    assert decide.config_data_differs(a, None) and decide.config_data_differs(a, b"not json")


def test_config_secret_holds_config_json() -> None:
    al = make_al(configSecretMetadata={"labels": {"l": "1"}, "annotations": {"n": "2"}})
    secret = build.desired_config_secret(al, b'{"k":1}', SETTINGS)
    assert secret["metadata"]["name"] == "arc-runner-set-7f984dc6-listener-config"
    assert base64.b64decode(secret["data"]["config.json"]) == b'{"k":1}'
    assert secret["metadata"]["labels"] == {"l": "1"} and secret["metadata"]["annotations"] == {"n": "2"}


def test_bus_pass_through_repr_hides_secrets() -> None:
    bus = build.BusPassThrough(password="natspassword", token="natstoken")
    assert "natspassword" not in repr(bus) and "natstoken" not in repr(bus)
    assert "ghp_testtoken_123456" not in repr(PAT)


# --- pod -----------------------------------------------------------------------------------------------


def test_listener_pod_shape() -> None:
    al = make_al(imagePullSecrets=[{"name": "ghcr-pull"}])
    pod = build.desired_listener_pod(al, SETTINGS, "4711")
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == al.metadata.name and meta["namespace"] == "arc-systems"
    assert meta["ownerReferences"][0]["uid"] == "uid-al-1"
    assert meta["labels"]["team"] == "ci"
    # Seed 004 review: the builder itself must stamp the config Secret's resourceVersion.
    assert meta["annotations"][ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION] == "4711"
    assert meta["annotations"]["runnerscale.dev/node-sim-exec"] == "true"
    assert spec["serviceAccountName"] == al.metadata.name
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["terminationGracePeriodSeconds"] == 60
    assert spec["imagePullSecrets"] == [{"name": "ghcr-pull"}]
    assert spec["volumes"] == [
        {"name": "listener-config", "secret": {"secretName": "arc-runner-set-7f984dc6-listener-config"}}
    ]
    (c,) = spec["containers"]
    assert c["name"] == "listener"
    assert c["image"] == "example.com/runnerscale:1.0"
    assert c["command"] == ["runnerscale", "listener", "--config", "/etc/gha-listener/config.json"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    assert c["volumeMounts"] == [{"name": "listener-config", "mountPath": "/etc/gha-listener", "readOnly": True}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8081}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8081}
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("metrics", 8080), ("health", 8081)]


def test_spec_image_wins_over_the_flag() -> None:
    pod = build.desired_listener_pod(make_al(image="ghcr.io/x/listener:2"), SETTINGS, "1")
    assert pod["spec"]["containers"][0]["image"] == "ghcr.io/x/listener:2"


def test_health_disabled_means_no_probes() -> None:
    pod = build.desired_listener_pod(make_al(), decide.ListenerPodSettings(health_addr="0"), "1")
    c = pod["spec"]["containers"][0]
    assert "livenessProbe" not in c and "readinessProbe" not in c


def test_template_merge() -> None:
    template = {
        "metadata": {"labels": {"tmpl": "l", "team": "not-overridden"}, "annotations": {"tmpl": "a"}},
        "spec": {
            "securityContext": {"runAsUser": 1001},
            "serviceAccountName": "ignored",
            "nodeSelector": {},
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "volumes": [{"name": "extra", "emptyDir": {}}],
            "containers": [
                {
                    "name": "listener",
                    "imagePullPolicy": "Always",
                    "securityContext": {"runAsUser": 1001},
                    "resources": {"limits": {"memory": "256Mi"}},
                    "env": [{"name": "EXTRA", "value": "1"}],
                },
                {"name": "sidecar", "image": "busybox", "imagePullPolicy": "IfNotPresent"},
            ],
        },
    }
    pod = build.desired_listener_pod(make_al(template=template), SETTINGS, "1")
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"]["tmpl"] == "l" and meta["labels"]["team"] == "ci"
    assert meta["annotations"]["tmpl"] == "a"
    assert spec["securityContext"] == {"runAsUser": 1001}
    assert spec["serviceAccountName"] == make_al().metadata.name
    assert spec["nodeSelector"] == {}, "an explicit empty nodeSelector clears the linux default (ARC)"
    assert spec["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert [v["name"] for v in spec["volumes"]] == ["listener-config", "extra"]
    listener, sidecar = spec["containers"]
    assert listener["imagePullPolicy"] == "Always"
    assert listener["securityContext"] == {"runAsUser": 1001}
    assert listener["resources"] == {"limits": {"memory": "256Mi"}}
    assert [e["name"] for e in listener["env"]] == ["LISTENER_CONFIG_PATH", "POD_NAME", "EXTRA"]
    assert "livenessProbe" in listener, "a template that does not set probes keeps ours"
    assert listener["image"] == "example.com/runnerscale:1.0"
    assert sidecar == {"name": "sidecar", "image": "busybox", "imagePullPolicy": "IfNotPresent"}


def test_template_without_node_selector_keeps_the_default() -> None:
    pod = build.desired_listener_pod(
        make_al(template={"spec": {"tolerations": [{"key": "a", "operator": "Exists"}]}}), SETTINGS, "1"
    )
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["spec"]["tolerations"] == [{"key": "a", "operator": "Exists"}]


def test_addr_helpers() -> None:
    assert decide.addr_port(":8080") == 8080 and decide.addr_port("127.0.0.1:9000") == 9000
    assert decide.addr_port("0") == 0 and decide.addr_port("") == 0 and decide.addr_port("127.0.0.1:0") == 0
    assert decide.enabled_addr("0") == "" and decide.enabled_addr(" :1 ") == ":1"

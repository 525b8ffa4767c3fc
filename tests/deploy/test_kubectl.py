"""kubectl reads deploy/ as a user would: `apply --dry-run=client -f` of the manifests and the NATS
directory, `kustomize` of the kustomizations, and a real `apply -f deploy/examples/` against the
Kubernetes API emulator serving the CRDs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import (
    DEPLOY,
    EXAMPLES,
    KUBECTL,
    MANIFESTS,
    MONITORING,
    NATS,
    Doc,
    Emulator,
    Stub,
    kubectl,
    load_docs,
    yaml_files,
)

pytestmark = [
    pytest.mark.kubectl,
    pytest.mark.skipif(not os.access(KUBECTL, os.X_OK), reason="needs the kubectl binary"),
]


def _names(docs: list[Doc]) -> list[str]:
    """`kubectl -o name` spelling: kind.group/name (core kinds without group), lower case."""
    out = []
    for d in docs:
        group = d.obj["apiVersion"].rpartition("/")[0]
        kind = d.kind.lower() + (f".{group}" if group else "")
        out.append(f"{kind}/{d.name}")
    return out


@pytest.mark.parametrize("directory", [MANIFESTS, NATS, MONITORING], ids=lambda p: str(p.relative_to(DEPLOY)))
def test_apply_dry_run_client(directory: Path, discovery_stub: Stub) -> None:
    """Client-side dry run: kubectl maps every kind through discovery (stub), fetches each object
    (absent) and reports what it would create; nothing is sent. Schema validation of built-in
    kinds is done offline by test_manifests.py (the stub serves no OpenAPI)."""
    result = kubectl(
        "apply",
        "--dry-run=client",
        "--validate=false",
        "-f",
        str(directory),
        "-o",
        "name",
        kubeconfig=discovery_stub.kubeconfig,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == sorted(_names(load_docs(directory)))
    assert not [r for r in discovery_stub.requests if r[0] != "GET"], "a client dry run must not write"


@pytest.mark.parametrize("directory", [MANIFESTS, NATS, MONITORING], ids=lambda p: str(p.relative_to(DEPLOY)))
def test_kustomization_builds_every_file(directory: Path, tmp_path: Path) -> None:
    """`kubectl apply -k DIR` renders the same objects as `kubectl apply -f DIR` (no file forgotten
    in the Kustomization, none listed twice)."""
    kustomization = yaml.safe_load((directory / "Kustomization").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in yaml_files(directory))
    result = kubectl("kustomize", str(directory), kubeconfig=tmp_path / "none")
    assert result.returncode == 0, result.stderr
    built = sorted((o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(result.stdout) if o)
    assert built == sorted((d.kind, d.name) for d in load_docs(directory))


def test_examples_apply_to_the_emulator(emulator: Emulator) -> None:
    """An ARC user's AutoscalingRunnerSets and GitHub Secrets apply unchanged to the CRDs of
    deploy/crds, without a warning (no unknown field pruned) and read back identical."""
    result = kubectl("apply", "-f", str(EXAMPLES), kubeconfig=emulator.kubeconfig)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    docs = load_docs(EXAMPLES)
    assert sorted(result.stdout.split("\n")[:-1]) == sorted(f"{n} created" for n in _names(docs))

    for doc in docs:
        if doc.kind != "AutoscalingRunnerSet":
            continue
        got = kubectl(
            "get",
            "autoscalingrunnersets.actions.github.com",
            doc.name,
            "-n",
            doc.namespace,
            "-o",
            "json",
            kubeconfig=emulator.kubeconfig,
        )
        assert got.returncode == 0, got.stderr
        stored = json.loads(got.stdout)
        assert stored["spec"] == doc.obj["spec"], f"{doc}: the server changed the spec"
        assert {k: stored["metadata"]["labels"][k] for k in doc.obj["metadata"]["labels"]} == doc.obj["metadata"][
            "labels"
        ]

    secrets = kubectl("get", "secrets", "-n", "arc-runners", "-o", "json", kubeconfig=emulator.kubeconfig)
    keys = {s["metadata"]["name"]: sorted(s["data"]) for s in json.loads(secrets.stdout)["items"]}
    assert keys["pre-defined-secret"] == ["github_token"]
    assert keys["github-app-secret"] == ["github_app_id", "github_app_installation_id", "github_app_private_key"]

    again = kubectl("apply", "-f", str(EXAMPLES), kubeconfig=emulator.kubeconfig)
    assert again.returncode == 0, again.stderr
    # (A Secret written with stringData reads "configured" on every apply, on a real server too.)
    ars_lines = [line for line in again.stdout.splitlines() if line.startswith("autoscalingrunnerset")]
    assert len(ars_lines) == 2 and all(line.endswith("unchanged") for line in ars_lines), again.stdout

"""Rendering deploy/helm/runnerscale with the helm built by tests/tools/helm.py, for the chart tests.

A :class:`Case` is one way to install the chart (release, namespace, values); :func:`render` runs
``helm template`` for it and returns the objects as :class:`~tests.deploy.conftest.Doc`. Helm runs
with its configuration, cache and data directories in a temporary directory, never the user's.
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.conftest import DEPLOY, Doc

CHART = DEPLOY / "helm" / "runnerscale"
DATA = Path(__file__).resolve().parent / "data"
MAXIMAL = DATA / "helm-maximal-values.yaml"


@dataclass(frozen=True)
class Case:
    id: str
    release: str = "runnerscale"
    namespace: str = "runnerscale-system"
    values: tuple[Path, ...] = ()
    sets: tuple[str, ...] = ()

    def args(self) -> list[str]:
        out = ["--namespace", self.namespace]
        for path in self.values:
            out += ["-f", str(path)]
        for item in self.sets:
            out += ["--set", item]
        return out


CASES = {
    case.id: case
    for case in (
        # what `helm install runnerscale deploy/helm/runnerscale -n runnerscale-system` installs
        Case("default"),
        # every value set (an existing NATS cluster with user/password and TLS, watched namespaces)
        Case("maximal", release="maximal", namespace="helm-ns", values=(MAXIMAL,)),
        # a bigger bundled NATS cluster, metrics off, no PodDisruptionBudgets
        Case(
            "bundled-custom",
            release="ci",
            namespace="ci-runners",
            sets=(
                "nats.replicas=5",
                "bus.streamReplicas=5",
                "nats.auth.method=token",
                "nats.auth.token=a-token-from-values",
                "nats.storage.storageClassName=fast",
                "metrics=null",
                "podDisruptionBudget.enabled=false",
            ),
        ),
        # an existing NATS cluster with a .creds file, ServiceAccounts made elsewhere, no discovery labels
        Case(
            "external-creds",
            release="runnerscale",
            namespace="arc-systems",
            sets=(
                "nats.bundled=false",
                "nats.url=nats://nats.nats.svc:4222",
                "nats.auth.method=creds",
                "nats.auth.existingSecret=runnerscale-nats-creds",
                "serviceAccount.create=false",
                "serviceAccount.name=platform",
                "arcChartDiscovery=false",
                "bus.setupJob.enabled=false",
                "flags.watchSingleNamespace=arc-runners",
            ),
        ),
    )
}


def helm_env(home: Path) -> dict[str, str]:
    """The environment helm runs in: no user configuration, repositories or plugins."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBE"))}
    env.update(
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_DATA_HOME=str(home / "data"),
        HOME=str(home),
    )
    return env


def run_helm(helm: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        return subprocess.run(
            [str(helm), *args], check=False, capture_output=True, text=True, env=helm_env(Path(home)), timeout=timeout
        )


def template(helm: Path, case: Case, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_helm(helm, "template", case.release, str(CHART), *case.args(), *extra)


@functools.cache
def _rendered(helm: Path, case: Case, include_crds: bool) -> tuple[Doc, ...]:
    result = template(helm, case, *(["--include-crds"] if include_crds else []))
    assert result.returncode == 0, f"helm template ({case.id}) failed:\n{result.stderr}"
    docs = [obj for obj in yaml.safe_load_all(result.stdout) if obj]
    return tuple(Doc(CHART, i, obj) for i, obj in enumerate(docs))


def render(helm: Path, case: Case | str, *, include_crds: bool = False) -> list[Doc]:
    """The objects ``helm template`` renders for ``case`` (cached per case)."""
    return list(_rendered(helm, CASES[case] if isinstance(case, str) else case, include_crds))


def leaf_paths(value: object, prefix: str = "") -> set[str]:
    """Dotted paths of a values tree's leaves (lists and empty maps are leaves)."""
    if isinstance(value, dict) and value:
        return set().union(*(leaf_paths(v, f"{prefix}{k}.") for k, v in value.items()))
    return {prefix.rstrip(".")}


def default_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values

"""A foreign client runs unchanged against the API under test (emulator or real control plane).

``tests/goclient`` is a client-go v0.37 / controller-runtime v0.25 program, built from the Go
module proxy: informers that sync through WatchList, protobuf bodies and DeleteOptions, merge
and strategic merge patches, status writes (an invalid one must be rejected), deletes, on
Pods, Secrets, ConfigMaps, Leases, Events, ServiceAccounts and the runnerscale CRDs. It exits
non-zero naming the first wrong answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
from pathlib import Path

import anyio
import pytest
import yaml

from tests.fixtures.apiserver import KubeApi, new_api_client

REPO = Path(__file__).resolve().parents[2]
TABLES = REPO / "services" / "embedded" / "apiserver" / "protobuf_fields.json"


@pytest.fixture(scope="module")
def runnerscale_crds(kube_api: KubeApi) -> None:
    """deploy/crds on the API under test (the emulator fixture loads them; a real cluster may not
    have them yet). Idempotent; left installed for the other suites."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a private loop, off the test's thread
        pool.submit(asyncio.run, _install_crds(kube_api.kubeconfig)).result(120)


async def _install_crds(kubeconfig: Path) -> None:
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    api = await new_api_client(kubeconfig)
    async with api:
        ext = client.ApiextensionsV1Api(api)
        names = []
        for path in sorted((REPO / "deploy" / "crds").glob("*.yaml")):
            doc = yaml.safe_load(path.read_text())
            names.append(doc["metadata"]["name"])
            try:
                await ext.create_custom_resource_definition(doc, _request_timeout=30)
            except ApiException as exc:
                if exc.status != 409:
                    raise
        with anyio.fail_after(30):
            for name in names:
                while True:
                    crd = await ext.read_custom_resource_definition(name, _request_timeout=30)
                    conditions = (crd.status.conditions if crd.status else None) or []
                    if any(c.type == "Established" and c.status == "True" for c in conditions):
                        break
                    await anyio.sleep(0.1)  # bounded poll for CRD establishment


@pytest.mark.timeout(1800)  # a cold build of client-go and controller-runtime takes minutes
def test_go_client_runs_unchanged(
    go_programs: dict[str, Path], kube_api: KubeApi, runnerscale_crds: None, namespace: str
) -> None:
    proc = subprocess.run(
        [str(go_programs["goclient"]), "-kubeconfig", str(kube_api.kubeconfig), "-namespace", namespace],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = proc.stdout + ("\n--- stderr (last 3000 chars) ---\n" + proc.stderr[-3000:] if proc.returncode else "")
    assert proc.returncode == 0, report
    assert proc.stdout.rstrip().endswith("PASS"), report


@pytest.mark.timeout(1800)
def test_protobuf_field_tables_are_current(go_programs: dict[str, Path]) -> None:
    """The emulator's protobuf tables match the Go types of the module versions in go.mod."""
    proc = subprocess.run([str(go_programs["prototables"])], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout == TABLES.read_text(), (
        "services/embedded/apiserver/protobuf_fields.json is stale: regenerate it with "
        "`cd tests/goclient && go run -trimpath ./prototables > ../../services/embedded/apiserver/protobuf_fields.json`"
    )

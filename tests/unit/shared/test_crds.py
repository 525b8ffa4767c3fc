"""deploy/crds/ is exactly what the structs generate; ARC manifests validate against it."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared import crds
from shared.api import (
    ALL_KINDS,
    KIND_BY_NAME,
    CustomObject,
    EphemeralRunnerSet,
    EphemeralRunnerSetSpec,
    EphemeralRunnerSetStatus,
    EphemeralRunnerSpec,
    ObjectMeta,
    decode,
    to_dict,
)
from shared.cli import main as runnerscale
from tests.support import paths

REPO = paths.REPO
CRD_DIR = REPO / "deploy" / "crds"
ARC_DATA = REPO / "tests" / "data" / "arc"
MANIFESTS = sorted(
    p.name
    for p in ARC_DATA.glob("*.yaml")
    if yaml.safe_load(p.read_text()).get("apiVersion", "").startswith("actions.github.com/")
)


def load(name: str) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load((ARC_DATA / name).read_text())
    return manifest


def crd_for(kind: str) -> dict[str, Any]:
    return next(c for c in crds.build_crds() if c["spec"]["names"]["kind"] == kind)


def columns(kind: str, priority: int) -> list[tuple[str, str]]:
    cols = crd_for(kind)["spec"]["versions"][0]["additionalPrinterColumns"]
    return [(c["name"], c["jsonPath"]) for c in cols if c.get("priority", 0) == priority]


# --- generated == checked in ----------------------------------------------------------------------


def test_checked_in_crds_match_the_structs() -> None:
    expected = crds.rendered_files()
    on_disk = {p.name: p.read_text() for p in CRD_DIR.glob("*.yaml")}
    assert sorted(on_disk) == sorted(expected), "run: python -m shared.crds --write"
    for name, text in expected.items():
        assert on_disk[name] == text, f"{name} is stale; run: python -m shared.crds --write"


def test_one_file_per_kind_with_arc_names() -> None:
    assert sorted(crds.rendered_files()) == [
        "actions.github.com_autoscalinglisteners.yaml",
        "actions.github.com_autoscalingrunnersets.yaml",
        "actions.github.com_ephemeralrunners.yaml",
        "actions.github.com_ephemeralrunnersets.yaml",
    ]


def test_check_and_write_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crds.cli_main(["--check", "--dir", str(tmp_path)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert crds.cli_main(["--write", "--dir", str(tmp_path)]) == 0
    assert crds.cli_main(["--check", "--dir", str(tmp_path)]) == 0
    (tmp_path / "actions.github.com_ephemeralrunners.yaml").write_text("# edited by hand\n")
    assert crds.cli_main(["--check", "--dir", str(tmp_path)]) == 1


def _print_crds(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    assert runnerscale(["crds"]) == 0
    return [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]


def test_runnerscale_crds_prints_every_crd(capsys: pytest.CaptureFixture[str]) -> None:
    docs = _print_crds(capsys)
    assert [d["metadata"]["name"] for d in docs] == sorted(f"{cls.PLURAL}.actions.github.com" for cls in ALL_KINDS)
    on_disk = [yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml"))]
    assert docs == on_disk


def test_runnerscale_crds_needs_no_checkout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Built in-process from the structs, so an installed package (no deploy/ beside it) works too.
    monkeypatch.setattr(crds, "DEFAULT_OUTPUT_DIR", tmp_path / "absent")
    monkeypatch.chdir(tmp_path)
    assert len(_print_crds(capsys)) == 4


def test_runnerscale_crds_console_script_runs_outside_the_repo(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("runnerscale")
    assert script.exists(), "the runnerscale console script is not installed (pip install -e .)"
    out = subprocess.run([str(script), "crds"], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    assert len([d for d in yaml.safe_load_all(out.stdout) if d]) == 4


# --- shape of the CRDs ----------------------------------------------------------------------------


def _nodes(schema: Any, path: str = "$") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(schema, dict):
        yield path, schema
        for key, child in schema.get("properties", {}).items():
            yield from _nodes(child, f"{path}.{key}")
        if isinstance(schema.get("additionalProperties"), dict):
            yield from _nodes(schema["additionalProperties"], f"{path}[*]")
        if "items" in schema:
            yield from _nodes(schema["items"], f"{path}[]")


@pytest.mark.parametrize("cls", ALL_KINDS, ids=lambda c: c.KIND)
def test_schemas_are_structural(cls: type[CustomObject]) -> None:
    crd = crd_for(cls.KIND)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["spec"]["group"] == "actions.github.com" and crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    for path, node in _nodes(version["schema"]["openAPIV3Schema"]):
        assert "type" in node, f"{path} has no type"
        assert "$ref" not in node and "anyOf" not in node and "oneOf" not in node, path
        # ObjectMeta is the server's; AutoscalingListener's status is an empty object, as in ARC.
        if (
            node["type"] == "object"
            and path != "$.metadata"
            and not (cls.KIND == "AutoscalingListener" and path == "$.status")
        ):
            assert (
                "properties" in node
                or "additionalProperties" in node
                or node.get("x-kubernetes-preserve-unknown-fields")
            ), f"{path}: an object with no fields would prune everything"


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("AutoscalingRunnerSet", ("spec", "template")),
        ("AutoscalingRunnerSet", ("spec", "listenerTemplate")),
        ("EphemeralRunnerSet", ("spec", "ephemeralRunnerSpec", "metadata")),
        ("EphemeralRunnerSet", ("spec", "ephemeralRunnerSpec", "spec")),
        ("EphemeralRunner", ("spec", "spec")),
        ("AutoscalingListener", ("spec", "template")),
    ],
)
def test_pod_templates_preserve_unknown_fields(kind: str, path: tuple[str, ...]) -> None:
    node = crd_for(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for key in path:
        node = node["properties"][key]
    assert node["type"] == "object" and node["x-kubernetes-preserve-unknown-fields"] is True


def test_arc_printer_columns_come_first_and_unchanged() -> None:
    assert columns("AutoscalingRunnerSet", 0) == [
        ("Minimum Runners", ".spec.minRunners"),
        ("Maximum Runners", ".spec.maxRunners"),
        ("Current Runners", ".status.currentRunners"),
        ("Phase", ".status.phase"),
        ("Pending Runners", ".status.pendingEphemeralRunners"),
        ("Running Runners", ".status.runningEphemeralRunners"),
        ("Finished Runners", ".status.finishedEphemeralRunners"),
        ("Deleting Runners", ".status.deletingEphemeralRunners"),
    ]
    assert [n for n, _ in columns("EphemeralRunnerSet", 0)] == [
        "DesiredReplicas",
        "CurrentReplicas",
        "Pending Runners",
        "Running Runners",
        "Finished Runners",
        "Deleting Runners",
        "Phase",
    ]
    assert [n for n, _ in columns("EphemeralRunner", 0)] == [
        "GitHub Config URL",
        "RunnerId",
        "Phase",
        "JobRepository",
        "JobWorkflowRef",
        "WorkflowRunId",
        "JobDisplayName",
        "JobId",
        "Message",
        "Age",
    ]
    assert [n for n, _ in columns("AutoscalingListener", 0)] == [
        "GitHub Configure URL",
        "AutoscalingRunnerSet Namespace",
        "AutoscalingRunnerSet Name",
    ]


def test_typed_state_has_wide_columns() -> None:
    assert (("Observed Generation", ".status.observedGeneration")) in columns("AutoscalingRunnerSet", 1)
    wide = dict(columns("EphemeralRunnerSet", 1))
    assert wide["Actionable Revision"] == ".spec.actionableRevision"
    assert wide["Applied Revision"] == ".status.appliedActionableRevision"
    assert wide["Cleanup PatchID"] == ".status.finishedRunnerCleanupPatchID"


def test_names_match_arc_which_defines_no_short_names() -> None:
    for cls in ALL_KINDS:
        names = crd_for(cls.KIND)["spec"]["names"]
        assert names == {
            "kind": cls.KIND,
            "listKind": f"{cls.KIND}List",
            "plural": cls.PLURAL,
            "singular": cls.SINGULAR,
        }


def test_typed_state_fields_are_in_the_schema() -> None:
    ars = crd_for("AutoscalingRunnerSet")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert ars["properties"]["status"]["properties"]["observedGeneration"]["type"] == "integer"
    ers = crd_for("EphemeralRunnerSet")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    assert ers["spec"]["properties"]["actionableRevision"]["type"] == "integer"
    assert ers["spec"]["required"] == ["ephemeralRunnerSpec", "patchID"]
    status = ers["status"]["properties"]
    assert status["appliedActionableRevision"]["type"] == "integer"
    assert status["finishedRunnerCleanupPatchID"] == {
        "description": status["finishedRunnerCleanupPatchID"]["description"],
        "type": "integer",
        "nullable": True,
    }
    spec = ars["properties"]["spec"]["properties"]
    assert spec["minRunners"]["minimum"] == 0 and spec["maxRunners"]["minimum"] == 0


# --- manifests against the schema -----------------------------------------------------------------


@pytest.mark.parametrize("name", MANIFESTS)
def test_arc_manifests_validate_against_the_crds(name: str) -> None:
    report = crds.check_manifest(load(name))
    assert report.ok, report.errors
    assert report.pruned == [], "a server would silently drop these fields"


@pytest.mark.parametrize("name", MANIFESTS)
def test_encoded_structs_validate_against_the_crds(name: str) -> None:
    manifest = load(name)
    obj = decode(KIND_BY_NAME[manifest["kind"]], manifest)
    assert crds.check_manifest(to_dict(obj)) == crds.SchemaReport([], [])


def test_objects_built_in_code_validate_including_null_marker() -> None:
    ers = EphemeralRunnerSet(
        metadata=ObjectMeta(name="x", namespace="ns"),
        spec=EphemeralRunnerSetSpec(
            patch_id=0,
            ephemeral_runner_spec=EphemeralRunnerSpec(
                github_config_url="https://github.com/o/r",
                github_config_secret="s",
                runner_scale_set_id=1,
                spec={"containers": [{"name": "runner", "image": "r"}]},
            ),
        ),
        status=EphemeralRunnerSetStatus(),
    )
    assert crds.check_manifest(to_dict(ers)).ok
    assert crds.check_manifest(to_dict(ers)).pruned == []


@pytest.mark.parametrize(
    ("mutate", "error_path"),
    [
        (lambda m: m["spec"].__setitem__("minRunners", -1), "$.spec.minRunners"),
        (lambda m: m["spec"].__setitem__("maxRunners", "10"), "$.spec.maxRunners"),
        (lambda m: m["spec"].__setitem__("runnerScaleSetLabels", [1]), "$.spec.runnerScaleSetLabels[0]"),
        (lambda m: m["spec"]["proxy"].__setitem__("noProxy", "example.com"), "$.spec.proxy.noProxy"),
        (lambda m: m["spec"].__setitem__("template", []), "$.spec.template"),
        (
            lambda m: m["spec"]["githubServerTLS"]["certificateFrom"]["configMapKeyRef"].pop("key"),
            "$.spec.githubServerTLS.certificateFrom.configMapKeyRef.key",
        ),
        (
            lambda m: m["spec"]["listenerMetrics"]["histograms"]["gha_job_startup_duration_seconds"].__setitem__(
                "buckets", ["1"]
            ),
            "$.spec.listenerMetrics.histograms.gha_job_startup_duration_seconds.buckets[0]",
        ),
        (
            lambda m: m["status"] if False else m.__setitem__("status", {"currentRunners": True}),
            "$.status.currentRunners",
        ),
    ],
)
def test_invalid_manifests_are_rejected_with_the_path(
    mutate: Callable[[dict[str, Any]], object], error_path: str
) -> None:
    manifest = load("ars-dind.yaml")
    mutate(manifest)
    report = crds.check_manifest(manifest)
    assert not report.ok
    assert [p.path for p in report.errors] == [error_path]


def test_unknown_and_null_fields_are_reported_as_pruned() -> None:
    manifest = load("ars-minimal.yaml")
    manifest["spec"]["minRunner"] = 1  # a typo: a server would drop it silently
    manifest["spec"]["runnerGroup"] = None
    manifest["spec"]["template"]["spec"]["anythingGoes"] = {"x": 1}  # preserved, not pruned
    manifest["metadata"]["futureMetaField"] = 1  # ObjectMeta is the server's business
    report = crds.check_manifest(manifest)
    assert report.ok
    assert report.pruned == ["$.spec.minRunner", "$.spec.runnerGroup"]
    listener = load("al.yaml")
    listener["status"] = {"anything": 1}
    assert crds.check_manifest(listener).pruned == ["$.status.anything"]


def test_chart_vault_secret_key_is_pruned_as_by_arc() -> None:
    # The chart renders vaultConfig.azureKeyVault.secretKey, which ARC's types do not have.
    manifest = load("ars-minimal.yaml")
    manifest["spec"]["vaultConfig"] = {
        "type": "azure_key_vault",
        "azureKeyVault": {
            "url": "https://v.vault.azure.net",
            "tenantId": "t",
            "clientId": "c",
            "certificatePath": "/etc/cert.pem",
            "secretKey": "github",
        },
    }
    report = crds.check_manifest(manifest)
    assert report.ok and report.pruned == ["$.spec.vaultConfig.azureKeyVault.secretKey"]


def test_missing_required_fields_and_unknown_kinds() -> None:
    manifest = load("ers.yaml")
    del manifest["spec"]["patchID"]
    assert [p.path for p in crds.check_manifest(manifest).errors] == ["$.spec.patchID"]
    report = crds.check_manifest({"kind": "Runner", "apiVersion": "actions.summerwind.dev/v1alpha1"})
    assert [p.path for p in report.errors] == ["$.kind"]
    assert not crds.check_manifest(copy.deepcopy([])).ok  # type: ignore[arg-type]

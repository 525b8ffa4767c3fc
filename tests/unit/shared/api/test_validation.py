"""What ARC refuses is reported as a list of problems naming the field, never raised."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import yaml

from shared.api import (
    AutoscalingListener,
    AutoscalingRunnerSet,
    EphemeralRunner,
    EphemeralRunnerSet,
    Problem,
    decode,
    validate,
)
from tests.support.paths import TEST_DATA

T = TypeVar("T")
ARC_DATA = TEST_DATA / "arc"


def load(cls: type[T], name: str, mutate: Callable[[dict[str, Any]], None] | None = None) -> T:
    manifest = yaml.safe_load((ARC_DATA / name).read_text())
    if mutate:
        mutate(manifest)
    return decode(cls, manifest)


def paths(problems: list[Problem]) -> list[str]:
    return [p.path for p in problems]


@pytest.mark.parametrize(
    ("cls", "name"),
    [
        (AutoscalingRunnerSet, "ars-dind.yaml"),
        (AutoscalingRunnerSet, "ars-kubernetes.yaml"),
        (AutoscalingRunnerSet, "ars-kubernetes-novolume.yaml"),
        (AutoscalingRunnerSet, "ars-minimal.yaml"),
        (EphemeralRunnerSet, "ers.yaml"),
        (EphemeralRunner, "er.yaml"),
        (AutoscalingListener, "al.yaml"),
    ],
)
def test_realistic_arc_objects_are_valid(
    cls: type[AutoscalingRunnerSet | EphemeralRunnerSet | EphemeralRunner | AutoscalingListener], name: str
) -> None:
    assert validate(load(cls, name)) == []


def test_min_runners_above_max_runners() -> None:
    def mutate(m: dict[str, Any]) -> None:
        m["spec"]["minRunners"], m["spec"]["maxRunners"] = 5, 2

    problems = validate(load(AutoscalingRunnerSet, "ars-dind.yaml", mutate))
    assert paths(problems) == ["$.spec.minRunners"]
    assert "5 > 2" in str(problems[0])


def test_runner_counts_above_int32_are_invalid() -> None:
    """An ARS stored before the CRD bounded maxRunners decodes and is reported, never half-accepted."""

    def mutate(m: dict[str, Any]) -> None:
        m["spec"]["maxRunners"] = 1_000_000_000_000

    problems = validate(load(AutoscalingRunnerSet, "ars-dind.yaml", mutate))
    assert paths(problems) == ["$.spec.maxRunners"]
    assert "2147483647" in str(problems[0])


def test_equal_min_and_max_is_fine() -> None:
    def mutate(m: dict[str, Any]) -> None:
        m["spec"]["minRunners"] = m["spec"]["maxRunners"] = 3

    assert validate(load(AutoscalingRunnerSet, "ars-dind.yaml", mutate)) == []


def test_every_problem_is_reported_at_once() -> None:
    def mutate(m: dict[str, Any]) -> None:
        m["spec"]["githubConfigUrl"] = "github.com/octo-org"  # no scheme
        m["spec"]["githubConfigSecret"] = ""
        m["spec"]["runnerScaleSetName"] = "x" * 46
        m["spec"]["runnerScaleSetLabels"] = ["ok", ""]
        m["spec"]["proxy"]["http"]["url"] = ""
        m["spec"]["vaultConfig"] = {"type": "hashicorp"}
        m["spec"]["template"]["spec"]["containers"] = []

    problems = validate(load(AutoscalingRunnerSet, "ars-dind.yaml", mutate))
    assert sorted(paths(problems)) == sorted(
        [
            "$.spec.githubConfigUrl",
            "$.spec.githubConfigSecret",
            "$.spec.runnerScaleSetName",
            "$.spec.runnerScaleSetLabels[1]",
            "$.spec.proxy.http.url",
            "$.spec.vaultConfig.type",
            "$.spec.template.spec.containers",
        ]
    )


def test_template_without_spec_or_container_names() -> None:
    ars = load(AutoscalingRunnerSet, "ars-minimal.yaml", lambda m: m["spec"].__setitem__("template", {}))
    assert paths(validate(ars)) == ["$.spec.template.spec"]
    ars = load(
        AutoscalingRunnerSet,
        "ars-minimal.yaml",
        lambda m: m["spec"]["template"]["spec"]["containers"].append({"image": "busybox"}),
    )
    assert paths(validate(ars)) == ["$.spec.template.spec.containers[1].name"]


def test_azure_vault_needs_its_block() -> None:
    ars = load(
        AutoscalingRunnerSet,
        "ars-minimal.yaml",
        lambda m: m["spec"].__setitem__("vaultConfig", {"type": "azure_key_vault"}),
    )
    assert paths(validate(ars)) == ["$.spec.vaultConfig.azureKeyVault"]


def test_runner_set_and_runner_need_a_registered_scale_set() -> None:
    ers = load(
        EphemeralRunnerSet, "ers.yaml", lambda m: m["spec"]["ephemeralRunnerSpec"].__setitem__("runnerScaleSetId", 0)
    )
    assert paths(validate(ers)) == ["$.spec.ephemeralRunnerSpec.runnerScaleSetId"]
    er = load(EphemeralRunner, "er.yaml", lambda m: m["spec"]["spec"].__setitem__("containers", []))
    assert paths(validate(er)) == ["$.spec.spec.containers"]


def test_negative_counts_on_runner_set() -> None:
    def mutate(m: dict[str, Any]) -> None:
        m["spec"]["replicas"] = -1
        m["spec"]["actionableRevision"] = -2

    assert paths(validate(load(EphemeralRunnerSet, "ers.yaml", mutate))) == [
        "$.spec.replicas",
        "$.spec.actionableRevision",
    ]


def test_listener_needs_its_targets() -> None:
    def mutate(m: dict[str, Any]) -> None:
        m["spec"]["ephemeralRunnerSetName"] = ""
        m["spec"]["minRunners"] = 11

    assert paths(validate(load(AutoscalingListener, "al.yaml", mutate))) == [
        "$.spec.minRunners",
        "$.spec.ephemeralRunnerSetName",
    ]


def test_validate_rejects_non_api_objects() -> None:
    with pytest.raises(TypeError):
        validate({"kind": "AutoscalingRunnerSet"})  # type: ignore[arg-type]

"""What ARC (its chart, CRD and controllers) refuses, as pure functions returning problems.

Each check returns a list of :class:`Problem` (empty when the object is acceptable) instead of
raising, so a worker can report every problem at once in one Kubernetes Event.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import msgspec

from shared.api.constants import DEFAULT_MAX_RUNNERS, RUNNER_CONTAINER_NAME, VAULT_TYPE_AZURE_KEY_VAULT
from shared.api.types import (
    AutoscalingListener,
    AutoscalingRunnerSet,
    EphemeralRunner,
    EphemeralRunnerSet,
    EphemeralRunnerSpec,
    ProxyConfig,
    VaultConfig,
)

MAX_SCALE_SET_NAME_LENGTH = 45  # the chart's limit (the name becomes part of object names)
MAX_SCALE_SET_LABEL_LENGTH = 255


class Problem(msgspec.Struct, frozen=True):
    """One reason an object is not acceptable; ``path`` is the JSON path of the field."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _url_problems(path: str, url: str, *, required: bool) -> list[Problem]:
    if not url:
        return [Problem(path, "is required")] if required else []
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return [Problem(path, f"must be an http(s) URL, got {url!r}")]
    return []


def _proxy_problems(path: str, proxy: ProxyConfig | None) -> list[Problem]:
    if proxy is None:
        return []
    problems: list[Problem] = []
    for name, server in (("http", proxy.http), ("https", proxy.https)):
        if server is not None:
            problems += _url_problems(f"{path}.{name}.url", server.url, required=True)
    return problems


def _vault_problems(path: str, vault: VaultConfig | None) -> list[Problem]:
    if vault is None or not vault.type:
        return []
    if vault.type != VAULT_TYPE_AZURE_KEY_VAULT:
        return [Problem(f"{path}.type", f"unsupported vault type {vault.type!r} (only {VAULT_TYPE_AZURE_KEY_VAULT!r})")]
    if vault.azure_key_vault is None:
        return [Problem(f"{path}.azureKeyVault", "is required for type azure_key_vault")]
    return _proxy_problems(f"{path}.proxy", vault.proxy)


def pod_template_problems(path: str, template: Any, *, require_runner: bool) -> list[Problem]:
    """A pod template must have a spec with at least one named container (and `runner` if asked)."""
    if not isinstance(template, dict):
        return [Problem(path, "must be an object")]
    spec = template.get("spec")
    if not isinstance(spec, dict):
        return [Problem(f"{path}.spec", "is required")]
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return [Problem(f"{path}.spec.containers", "must list at least one container")]
    problems: list[Problem] = []
    names: list[str] = []
    for i, container in enumerate(containers):
        name = container.get("name") if isinstance(container, dict) else None
        if not isinstance(name, str) or not name:
            problems.append(Problem(f"{path}.spec.containers[{i}].name", "is required"))
        else:
            names.append(name)
    if require_runner and not problems and RUNNER_CONTAINER_NAME not in names:
        problems.append(Problem(f"{path}.spec.containers", f"needs a container named {RUNNER_CONTAINER_NAME!r}"))
    return problems


def _min_max_problems(path: str, min_runners: int | None, max_runners: int | None) -> list[Problem]:
    problems = []
    for field, value in (("minRunners", min_runners), ("maxRunners", max_runners)):
        if value is not None and value < 0:
            problems.append(Problem(f"{path}.{field}", "must be >= 0"))
        if value is not None and value > DEFAULT_MAX_RUNNERS:
            # The listener config, the Actions service and Kubernetes clients take an int32.
            problems.append(Problem(f"{path}.{field}", f"must be <= {DEFAULT_MAX_RUNNERS} (an int32)"))
    if min_runners is not None and max_runners is not None and min_runners > max_runners:
        problems.append(Problem(f"{path}.minRunners", f"must be <= maxRunners ({min_runners} > {max_runners})"))
    return problems


def validate_autoscaling_runner_set(ars: AutoscalingRunnerSet) -> list[Problem]:
    spec = ars.spec
    problems = _url_problems("$.spec.githubConfigUrl", spec.github_config_url, required=True)
    if not spec.github_config_secret:
        problems.append(Problem("$.spec.githubConfigSecret", "is required"))
    if len(spec.runner_scale_set_name) > MAX_SCALE_SET_NAME_LENGTH:
        problems.append(Problem("$.spec.runnerScaleSetName", f"must be at most {MAX_SCALE_SET_NAME_LENGTH} characters"))
    for i, label in enumerate(spec.runner_scale_set_labels):
        if not label or len(label) > MAX_SCALE_SET_LABEL_LENGTH:
            problems.append(
                Problem(f"$.spec.runnerScaleSetLabels[{i}]", f"must be 1..{MAX_SCALE_SET_LABEL_LENGTH} characters")
            )
    problems += _min_max_problems("$.spec", spec.min_runners, spec.max_runners)
    problems += _proxy_problems("$.spec.proxy", spec.proxy)
    problems += _vault_problems("$.spec.vaultConfig", spec.vault_config)
    problems += pod_template_problems("$.spec.template", spec.template, require_runner=False)
    if spec.listener_template is not None:
        problems += pod_template_problems("$.spec.listenerTemplate", spec.listener_template, require_runner=False)
    return problems


def _runner_spec_problems(path: str, spec: EphemeralRunnerSpec) -> list[Problem]:
    problems = _url_problems(f"{path}.githubConfigUrl", spec.github_config_url, required=True)
    if not spec.github_config_secret:
        problems.append(Problem(f"{path}.githubConfigSecret", "is required"))
    if spec.runner_scale_set_id <= 0:
        problems.append(Problem(f"{path}.runnerScaleSetId", "must be a registered scale set id (> 0)"))
    problems += _proxy_problems(f"{path}.proxy", spec.proxy)
    problems += _vault_problems(f"{path}.vaultConfig", spec.vault_config)
    problems += pod_template_problems(path, {"spec": spec.spec}, require_runner=False)
    return problems


def validate_ephemeral_runner_set(ers: EphemeralRunnerSet) -> list[Problem]:
    spec = ers.spec
    problems: list[Problem] = []
    if spec.replicas < 0:
        problems.append(Problem("$.spec.replicas", "must be >= 0"))
    if spec.actionable_revision < 0:
        problems.append(Problem("$.spec.actionableRevision", "must be >= 0"))
    return problems + _runner_spec_problems("$.spec.ephemeralRunnerSpec", spec.ephemeral_runner_spec)


def validate_ephemeral_runner(er: EphemeralRunner) -> list[Problem]:
    return _runner_spec_problems("$.spec", er.spec)


def validate_autoscaling_listener(al: AutoscalingListener) -> list[Problem]:
    spec = al.spec
    problems = _url_problems("$.spec.githubConfigUrl", spec.github_config_url, required=True)
    problems += _min_max_problems("$.spec", spec.min_runners, spec.max_runners)
    if not spec.autoscaling_runner_set_name:
        problems.append(Problem("$.spec.autoscalingRunnerSetName", "is required"))
    if not spec.ephemeral_runner_set_name:
        problems.append(Problem("$.spec.ephemeralRunnerSetName", "is required"))
    problems += _proxy_problems("$.spec.proxy", spec.proxy)
    problems += _vault_problems("$.spec.vaultConfig", spec.vault_config)
    return problems


def validate(obj: AutoscalingRunnerSet | EphemeralRunnerSet | EphemeralRunner | AutoscalingListener) -> list[Problem]:
    """Every problem with ``obj`` (dispatch on kind)."""
    if isinstance(obj, AutoscalingRunnerSet):
        return validate_autoscaling_runner_set(obj)
    if isinstance(obj, EphemeralRunnerSet):
        return validate_ephemeral_runner_set(obj)
    if isinstance(obj, EphemeralRunner):
        return validate_ephemeral_runner(obj)
    if isinstance(obj, AutoscalingListener):
        return validate_autoscaling_listener(obj)
    raise TypeError(f"not an API object: {type(obj).__name__}")

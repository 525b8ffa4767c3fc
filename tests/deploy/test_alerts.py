"""deploy/manifests/monitoring/prometheusrule.yaml: every alert expression is valid PromQL and uses
only metrics the workers export; the alerts the operators asked for exist; each has a severity, a
summary, a description and a runbook line in the README; the Helm chart carries the same rules."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import MONITORING, ROOT, find, load_docs
from tests.deploy.exported_metrics import exported_series, metric_names

CHART_RULES = ROOT / "deploy" / "helm" / "runnerscale" / "files" / "prometheus-rules.yaml"

# What each required alert watches (issue: listener down or not polling, revision lag that does not
# close, failure backoff active, bus consumer lag, desired vs current runners apart for too long,
# scale set missing at the service) → the alert and the metric it must be built on.
REQUIRED = {
    "RunnerscaleListenerDown": "gha_controller_running_listeners",
    "RunnerscaleListenerNotPolling": "runnerscale_listener_last_poll_timestamp_seconds",
    "RunnerscaleRevisionLagNotClosing": "runnerscale_runner_set_revision_lag",
    "RunnerscaleFailureBackoff": "runnerscale_runner_set_failure_backoff_level",
    "RunnerscaleBusConsumerLag": "runnerscale_bus_delivery_latency_seconds_bucket",
    "RunnerscaleRunnersBelowDesired": "runnerscale_runner_set_desired_replicas",
    "RunnerscaleScaleSetMissingAtService": "runnerscale_scale_set_registrations_total",
    # issue 11: the runner-set worker's own maxRunners guard fired (someone published above it)
    "RunnerscaleDesiredAboveMaxRunners": "runnerscale_runner_set_max_runners_clamped_total",
}


def rule_spec() -> dict[str, Any]:
    spec: dict[str, Any] = find(load_docs(MONITORING), "PrometheusRule", "runnerscale").obj["spec"]
    return spec


def alerts() -> list[dict[str, Any]]:
    return [rule for group in rule_spec()["groups"] for rule in group["rules"]]


def readme_runbook() -> dict[str, str]:
    """Alert name → its runbook cell in the README's alert table."""
    rows = re.findall(r"^\| `(Runnerscale\w+)` \|(.*)\|\s*$", (ROOT / "README.md").read_text(), re.MULTILINE)
    return {name: cells.rsplit("|", 1)[-1].strip() for name, cells in rows}


def test_required_alerts_exist_on_their_metrics() -> None:
    by_name = {a["alert"]: a for a in alerts()}
    for name, metric in REQUIRED.items():
        assert name in by_name, f"missing alert {name}"
        assert metric in metric_names(by_name[name]["expr"]), f"{name} does not watch {metric}"


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_expression_parses_and_uses_exported_metrics(alert: dict[str, Any]) -> None:
    names = metric_names(alert["expr"])  # raises on invalid PromQL
    assert names, alert["expr"]
    unknown = names - set(exported_series())
    assert not unknown, f"{alert['alert']}: not exported by the workers: {unknown}"


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_alert_is_documented(alert: dict[str, Any]) -> None:
    name = alert["alert"]
    assert alert["labels"]["severity"] in ("critical", "warning")
    assert alert["annotations"]["summary"] and alert["annotations"]["description"]
    assert alert["annotations"]["runbook"] == f'README "Alerts": {name}'
    runbook = readme_runbook()
    assert name in runbook, f"README has no row for {name} in the alert table"
    assert len(runbook[name]) > 20, f"README runbook line of {name} is empty"
    if "for" in alert:
        assert re.fullmatch(r"\d+[smh]", alert["for"])


def test_readme_lists_no_stale_alert() -> None:
    assert set(readme_runbook()) == {a["alert"] for a in alerts()}


def test_alert_names_are_unique() -> None:
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names))


def test_the_check_catches_bad_expressions() -> None:
    with pytest.raises(ValueError):
        metric_names("sum(rate(runnerscale_bus_connected[5m])")  # unclosed parenthesis
    with pytest.raises(ValueError):
        metric_names("absent(runnerscale_bus_connected[5m])")  # a range vector where a vector belongs
    assert metric_names('max by (pod) (runnerscale_bus_connected{pod="x"}) == 0 or vector(0)') == {
        "runnerscale_bus_connected"
    }
    assert "no_such_metric" not in exported_series()


def test_chart_renders_the_same_rules() -> None:
    assert yaml.safe_load(CHART_RULES.read_text()) == rule_spec(), (
        "deploy/helm/runnerscale/files/prometheus-rules.yaml must be the spec of "
        "deploy/manifests/monitoring/prometheusrule.yaml"
    )

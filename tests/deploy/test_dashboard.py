"""deploy/dashboards/runnerscale.json queries only metrics the code exports, shows every metric the
workers and listeners export on a panel (or says why not), and covers what an operator needs.

The exported metrics are read from the code and the queried ones from the parsed PromQL
(tests/deploy/exported_metrics.py)."""

from __future__ import annotations

import json
import re

import pytest

from tests.deploy.conftest import DASHBOARD, ROOT
from tests.deploy.exported_metrics import exported_families, exported_series, metric_names

CHART_DASHBOARD = ROOT / "deploy" / "helm" / "runnerscale" / "files" / "runnerscale-dashboard.json"

# Exported metric families deliberately not on a panel, each with the reason.
INTENTIONALLY_ABSENT = {
    "runnerscale_listener_patch_id": (
        "a sequence number of the patch-ID protocol for debugging a single scale set (README "
        '"Listener"): it only ever rises, so a graph of it tells an operator nothing; the desired '
        'runners it comes with are on "Desired vs registered vs busy runners"'
    ),
}


def dashboard_exprs() -> list[str]:
    """PromQL of every panel target (label_values(...) template queries are Grafana's, not PromQL:
    their metric selector is returned)."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for variable in dash["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            found = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            assert found, f"unexpected template query {query!r}"
            exprs.append(found.group(1))
    return exprs


def queried_families() -> set[str]:
    series = exported_series()
    return {series[name] for e in dashboard_exprs() for name in metric_names(e) if name in series}


def test_code_exports_the_arc_names() -> None:
    series = exported_series()
    for name in (
        "gha_desired_runners",
        "gha_started_jobs_total",
        "gha_job_startup_duration_seconds_bucket",
        "controller_runtime_reconcile_errors_total",
        "runnerscale_bus_rejected_messages_total",
        "gha_controller_running_listeners",
    ):
        assert name in series


@pytest.mark.parametrize("expr", dashboard_exprs())
def test_every_queried_metric_exists_in_the_code(expr: str) -> None:
    series = exported_series()
    names = metric_names(expr)  # raises on invalid PromQL
    assert names, f"no metric in {expr!r}"
    assert names <= set(series), f"not exported by the code: {names - set(series)}"


def test_every_exported_metric_is_on_a_panel() -> None:
    """Each metric family the code exports is queried by some panel, or listed in
    INTENTIONALLY_ABSENT with a reason; nothing is listed there that is on a panel or gone."""
    families = set(exported_families())
    queried = queried_families()
    missing = families - queried - set(INTENTIONALLY_ABSENT)
    assert not missing, f"exported but on no panel (add a panel or a reason in INTENTIONALLY_ABSENT): {sorted(missing)}"
    assert not set(INTENTIONALLY_ABSENT) & queried, "listed as absent but on a panel"
    assert set(INTENTIONALLY_ABSENT) <= families, "listed as absent but no longer exported"
    assert all(len(reason) > 40 for reason in INTENTIONALLY_ABSENT.values())


def test_failure_budget_metrics_have_their_own_panels() -> None:
    dash = json.loads(DASHBOARD.read_text())
    on_panel = {
        name: panel["title"]
        for panel in dash["panels"]
        for target in panel.get("targets", [])
        for name in metric_names(target["expr"])
    }
    for family in (
        "runnerscale_runner_set_failure_backoff_level",
        "runnerscale_runner_set_failure_backoff_seconds",
        "runnerscale_runner_set_failure_budget_failures",
        "runnerscale_runner_set_failure_backoffs_total",
        "runnerscale_runner_set_failed_runners_replaced_total",
        "runnerscale_runner_failures_total",
        "runnerscale_runner_set_max_runners_clamped_total",
    ):
        assert family in on_panel, family


def test_chart_ships_the_same_dashboard() -> None:
    assert CHART_DASHBOARD.read_bytes() == DASHBOARD.read_bytes(), (
        "copy deploy/dashboards/runnerscale.json to deploy/helm/runnerscale/files/runnerscale-dashboard.json"
    )


def test_dashboard_covers_the_operator_questions() -> None:
    queried = set().union(*(metric_names(e) for e in dashboard_exprs()))
    required = {
        # desired vs registered vs busy runners per scale set
        "gha_desired_runners",
        "gha_registered_runners",
        "gha_busy_runners",
        # assigned / running jobs
        "gha_assigned_jobs",
        "gha_running_jobs",
        # job startup / queue duration quantiles
        "gha_job_startup_duration_seconds_bucket",
        "gha_job_queue_duration_seconds_bucket",
        # reconcile errors
        "controller_runtime_reconcile_errors_total",
        # bus rejected messages
        "runnerscale_bus_rejected_messages_total",
        # listener health
        "gha_controller_running_listeners",
        "runnerscale_listener_leader",
    }
    assert required <= queried, required - queried
    assert any(
        e.startswith("histogram_quantile(") and "gha_job_startup_duration_seconds_bucket" in e
        for e in dashboard_exprs()
    )


def test_dashboard_is_importable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 30
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "namespace", "scale_set"} <= variables
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= variables, panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}"

"""deploy/dashboards/runnerscale.json queries only metrics the code exports, and covers what an
operator needs (runners, jobs, durations, reconcile errors, bus rejections, listener health).

The exported names are found by reading the code: every ``Counter``/``Gauge``/``Histogram``/
``Summary`` constructor (and the listener's ``gauge(...)`` helper) under services/ and shared/,
expanded to the series names prometheus_client exposes (``_total`` for counters; ``_bucket``,
``_sum``, ``_count`` for histograms)."""

from __future__ import annotations

import json
import re

import pytest

from tests.deploy.conftest import DASHBOARD, ROOT

_CONSTRUCTOR = re.compile(r"\b(Counter|Gauge|Histogram|Summary|gauge)\(\s*\"([a-zA-Z_:][a-zA-Z0-9_:]*)\"")


def exported_series() -> dict[str, str]:
    """series name → the metric family it belongs to."""
    out: dict[str, str] = {}
    for path in sorted([*(ROOT / "services").rglob("*.py"), *(ROOT / "shared").rglob("*.py")]):
        for kind, name in _CONSTRUCTOR.findall(path.read_text()):
            if kind == "Counter":
                base = name.removesuffix("_total")
                series = [f"{base}_total", f"{base}_created"]
            elif kind == "Histogram":
                series = [f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"]
            elif kind == "Summary":
                series = [name, f"{name}_sum", f"{name}_count", f"{name}_created"]
            else:
                series = [name]
            out.update({s: name for s in series})
    return out


PROMQL_WORDS = {
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "rate",
    "irate",
    "increase",
    "histogram_quantile",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "offset",
    "bool",
    "topk",
    "bottomk",
    "label_values",
    "clamp_min",
    "clamp_max",
    "abs",
    "delta",
    "deriv",
    "time",
    "vector",
    "scalar",
}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside label matchers, ranges, strings and
    `by (...)` lists, that are not functions or keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        word = m.group(0)
        if word in PROMQL_WORDS or re.match(r"\s*\(", text[m.end() :]) or word.startswith("$"):
            continue
        if m.start() > 0 and text[m.start() - 1] == "$":
            continue  # a Grafana variable ($__rate_interval, $namespace)
        names.add(word)
    return names


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_metric_name_extraction() -> None:
    assert metric_names(
        'histogram_quantile(0.9, sum by (le, name) (rate(gha_job_startup_duration_seconds_bucket{namespace=~"$namespace"}[$__rate_interval])))'
    ) == {"gha_job_startup_duration_seconds_bucket"}
    # label_values' second argument is a label, dropped by the caller
    assert metric_names('label_values(gha_desired_runners{namespace=~"$namespace"}, name)') == {
        "gha_desired_runners",
        "name",
    }


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
    names = metric_names(expr)
    if expr.startswith("label_values("):
        names -= {expr.rstrip(")").rpartition(",")[2].strip()}  # the label argument
    assert names, f"no metric in {expr!r}"
    assert names <= set(series), f"not exported by the code: {names - set(series)}"


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

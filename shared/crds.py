"""CustomResourceDefinitions generated from the API structs, and a structural-schema checker.

The CRDs in ``deploy/crds/`` are the output of :func:`build_crds`; a unit test fails when the
checked-in YAML differs, so structs and CRDs cannot drift apart. Regenerate with::

    python -m shared.crds --write          # rewrites deploy/crds/*.yaml in a checkout
    runnerscale crds                       # prints all CRDs (works installed: built in-process)

Schemas are structural (apiextensions.k8s.io/v1): every field typed, pod templates as
``x-kubernetes-preserve-unknown-fields`` objects, ``X | None`` fields ``nullable``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import yaml

from shared.api.constants import GROUP, VERSION
from shared.api.names import MAX_LABEL_VALUE
from shared.api.types import ALL_KINDS, KIND_BY_NAME, CustomObject
from shared.api.validation import Problem

HEADER = "# Generated from shared/api by `python -m shared.crds --write`. Do not edit by hand.\n"
DEFAULT_OUTPUT_DIR = Path(__file__).resolve().parent.parent / "deploy" / "crds"

# ARC's printer columns, verbatim (kubectl shows what ARC shows, including the two columns whose
# fields ARC never fills), then runnerscale's typed-state columns at priority 1 (`-o wide`).
_COL = tuple[str, str, str]  # (name, type, jsonPath)
PRINTER_COLUMNS: dict[str, list[dict[str, Any]]] = {}


def _columns(arc: list[_COL], wide: list[_COL] | None = None) -> list[dict[str, Any]]:
    cols: list[dict[str, Any]] = [{"jsonPath": p, "name": n, "type": t} for n, t, p in arc]
    cols += [{"jsonPath": p, "name": n, "priority": 1, "type": t} for n, t, p in wide or []]
    return cols


PRINTER_COLUMNS["AutoscalingRunnerSet"] = _columns(
    [
        ("Minimum Runners", "integer", ".spec.minRunners"),
        ("Maximum Runners", "integer", ".spec.maxRunners"),
        ("Current Runners", "integer", ".status.currentRunners"),
        ("Phase", "string", ".status.phase"),
        ("Pending Runners", "integer", ".status.pendingEphemeralRunners"),
        ("Running Runners", "integer", ".status.runningEphemeralRunners"),
        ("Finished Runners", "integer", ".status.finishedEphemeralRunners"),
        ("Deleting Runners", "integer", ".status.deletingEphemeralRunners"),
    ],
    [
        ("Generation", "integer", ".metadata.generation"),
        ("Observed Generation", "integer", ".status.observedGeneration"),
    ],
)
PRINTER_COLUMNS["EphemeralRunnerSet"] = _columns(
    [
        ("DesiredReplicas", "integer", ".spec.replicas"),
        ("CurrentReplicas", "integer", ".status.currentReplicas"),
        ("Pending Runners", "integer", ".status.pendingEphemeralRunners"),
        ("Running Runners", "integer", ".status.runningEphemeralRunners"),
        ("Finished Runners", "integer", ".status.finishedEphemeralRunners"),
        ("Deleting Runners", "integer", ".status.deletingEphemeralRunners"),
        ("Phase", "string", ".status.phase"),
    ],
    [
        ("PatchID", "integer", ".spec.patchID"),
        ("Actionable Revision", "integer", ".spec.actionableRevision"),
        ("Applied Revision", "integer", ".status.appliedActionableRevision"),
        ("Cleanup PatchID", "integer", ".status.finishedRunnerCleanupPatchID"),
    ],
)
PRINTER_COLUMNS["EphemeralRunner"] = _columns(
    [
        ("GitHub Config URL", "string", ".spec.githubConfigUrl"),
        ("RunnerId", "number", ".status.runnerId"),
        ("Phase", "string", ".status.phase"),
        ("JobRepository", "string", ".status.jobRepositoryName"),
        ("JobWorkflowRef", "string", ".status.jobWorkflowRef"),
        ("WorkflowRunId", "number", ".status.workflowRunId"),
        ("JobDisplayName", "string", ".status.jobDisplayName"),
        ("JobId", "string", ".status.jobId"),
        ("Message", "string", ".status.message"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
)
PRINTER_COLUMNS["AutoscalingListener"] = _columns(
    [
        ("GitHub Configure URL", "string", ".spec.githubConfigUrl"),
        ("AutoscalingRunnerSet Namespace", "string", ".spec.autoscalingRunnerSetNamespace"),
        ("AutoscalingRunnerSet Name", "string", ".spec.autoscalingRunnerSetName"),
    ]
)

# ARC's CRDs define no short names and no categories; runnerscale keeps it that way so that
# `kubectl get` behaves identically (and nothing can collide with other installed CRDs).
SHORT_NAMES: dict[str, list[str]] = {}


# --- schema generation ---------------------------------------------------------------------------


def _description(cls: type) -> str | None:
    doc = cls.__dict__.get("__doc__")
    if not doc:
        return None
    return " ".join(doc.strip().split("\n\n")[0].split())


def _schema(t: mi.Type) -> dict[str, Any]:
    if isinstance(t, mi.Metadata):
        inner = _schema(t.type)
        extra = dict(t.extra_json_schema or {})
        bounds = {k: extra[k] for k in ("maximum", "maxLength") if k in extra}
        return {**({"description": extra["description"]} if "description" in extra else {}), **inner, **bounds}
    if isinstance(t, mi.UnionType):
        members = [m for m in t.types if not isinstance(m, mi.NoneType)]
        nullable = len(members) != len(t.types)
        if len(members) == 2 and {type(m) for m in members} == {mi.IntType, mi.FloatType}:
            members = [mi.FloatType()]  # int | float: a JSON number
        if len(members) != 1:
            raise TypeError(f"unsupported union in CRD schema: {t}")
        schema = _schema(members[0])
        if nullable:
            schema["nullable"] = True
        return schema
    if isinstance(t, mi.BoolType):
        return {"type": "boolean"}
    if isinstance(t, mi.IntType):
        integer: dict[str, Any] = {"type": "integer"}
        if t.ge is not None:
            integer["minimum"] = t.ge
        return integer
    if isinstance(t, mi.FloatType):
        return {"type": "number"}
    if isinstance(t, (mi.StrType, mi.EnumType)):
        return {"type": "string"}
    if isinstance(t, mi.DateTimeType):
        return {"format": "date-time", "type": "string"}
    if isinstance(t, mi.ListType):
        return {"items": _schema(t.item_type), "type": "array"}
    if isinstance(t, mi.DictType):
        if isinstance(t.value_type, mi.AnyType):
            # A JSON tree (pod template / pod spec): stored verbatim, never pruned.
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"additionalProperties": _schema(t.value_type), "type": "object"}
    if isinstance(t, mi.StructType):
        return _struct_schema(t)
    raise TypeError(f"unsupported type in CRD schema: {t}")


def _struct_schema(t: mi.StructType) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    description = _description(t.cls)
    if description:
        schema["description"] = description
    properties = {f.encode_name: _schema(f.type) for f in sorted(t.fields, key=lambda f: f.encode_name)}
    if properties:
        schema["properties"] = properties
    required = sorted(f.encode_name for f in t.fields if f.required)
    if required:
        schema["required"] = required
    schema["type"] = "object"
    return schema


# Kinds whose name is put into label values (the scale-set-name label of every child): the API
# server refuses a longer name at create (README "CRDs (`deploy/crds/`, `shared.crds`)").
NAME_MAX_LENGTH: dict[str, int] = {"AutoscalingRunnerSet": MAX_LABEL_VALUE}


def object_schema(cls: type[CustomObject]) -> dict[str, Any]:
    """The openAPIV3Schema of one kind."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    fields = {f.encode_name: f for f in info.fields}
    metadata: dict[str, Any] = {"type": "object"}
    if cls.KIND in NAME_MAX_LENGTH:
        # A structural schema may restrict metadata.name and metadata.generateName, nothing else.
        metadata = {"properties": {"name": {"maxLength": NAME_MAX_LENGTH[cls.KIND], "type": "string"}}, **metadata}
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": metadata,
    }
    for name in ("spec", "status"):
        schema = _schema(fields[name].type)
        schema.pop("nullable", None)  # an absent status is absent, never null
        properties[name] = schema
    schema = {"properties": properties, "type": "object"}
    description = _description(cls)
    if description:
        schema = {"description": description, **schema}
    return schema


def build_crd(cls: type[CustomObject]) -> dict[str, Any]:
    names: dict[str, Any] = {
        "kind": cls.KIND,
        "listKind": f"{cls.KIND}List",
        "plural": cls.PLURAL,
    }
    if SHORT_NAMES.get(cls.KIND):
        names["shortNames"] = SHORT_NAMES[cls.KIND]
    names["singular"] = cls.SINGULAR
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{cls.PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": names,
            "scope": "Namespaced",
            "versions": [
                {
                    "additionalPrinterColumns": PRINTER_COLUMNS[cls.KIND],
                    "name": VERSION,
                    "schema": {"openAPIV3Schema": object_schema(cls)},
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                }
            ],
        },
    }


def build_crds() -> list[dict[str, Any]]:
    return [build_crd(cls) for cls in ALL_KINDS]


def crd_filename(crd: dict[str, Any]) -> str:
    return f"{crd['spec']['group']}_{crd['spec']['names']['plural']}.yaml"


def render_crd(crd: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(crd, sort_keys=False, default_flow_style=False, width=100)


def rendered_files() -> dict[str, str]:
    """File name -> YAML text, exactly as checked into deploy/crds/."""
    return {crd_filename(crd): render_crd(crd) for crd in build_crds()}


def render_all() -> str:
    """All CRDs as one multi-document YAML stream (what `runnerscale crds` prints)."""
    return "".join(f"---\n{text}" for _, text in sorted(rendered_files().items()))


# --- structural-schema checking (what an API server would do with a manifest) ---------------------


class SchemaReport(msgspec.Struct, frozen=True):
    """``errors`` make a server reject the object; ``pruned`` fields it would silently drop."""

    errors: list[Problem]
    pruned: list[str]

    @property
    def ok(self) -> bool:
        return not self.errors


_TYPE_CHECKS = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}


def _check(value: Any, schema: dict[str, Any], path: str, errors: list[Problem], pruned: list[str]) -> None:
    if value is None:
        if not schema.get("nullable"):
            pruned.append(path)  # a server drops null values of non-nullable fields
        return
    expected = schema.get("type")
    if expected and not _TYPE_CHECKS[expected](value):
        errors.append(Problem(path, f"must be of type {expected}, got {type(value).__name__}"))
        return
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(Problem(path, f"must be >= {schema['minimum']}"))
    if "maximum" in schema and value > schema["maximum"]:
        errors.append(Problem(path, f"must be <= {schema['maximum']}"))
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(Problem(path, f"must be at most {schema['maxLength']} characters"))
    if expected == "array":
        for i, item in enumerate(value):
            _check(item, schema.get("items", {}), f"{path}[{i}]", errors, pruned)
    elif expected == "object" and path == "$.metadata":  # the server validates the rest of ObjectMeta
        name_schema = (schema.get("properties") or {}).get("name")
        if name_schema is not None and isinstance(value.get("name"), str):
            _check(value["name"], name_schema, f"{path}.name", errors, pruned)
    elif expected == "object":
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
        for key in schema.get("required", ()):
            if key not in value:
                errors.append(Problem(f"{path}.{key}", "is required"))
        for key, item in value.items():
            child = f"{path}.{key}"
            if key in properties:
                _check(item, properties[key], child, errors, pruned)
            elif additional is not None:
                _check(item, additional, child, errors, pruned)
            elif not preserve:
                pruned.append(child)


def check_manifest(obj: dict[str, Any]) -> SchemaReport:
    """Check a JSON tree against the CRD schema of its ``kind`` (unknown kind is an error)."""
    errors: list[Problem] = []
    pruned: list[str] = []
    cls = KIND_BY_NAME.get(str(obj.get("kind"))) if isinstance(obj, dict) else None
    if cls is None:
        kind = obj.get("kind") if isinstance(obj, dict) else None
        return SchemaReport([Problem("$.kind", f"not a runnerscale kind: {kind!r}")], [])
    _check(obj, object_schema(cls), "$", errors, pruned)
    return SchemaReport(errors, pruned)


# --- CLI -----------------------------------------------------------------------------------------


def _write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered_files().items():
        path = directory / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def _stale(directory: Path) -> list[str]:
    return [
        name
        for name, text in rendered_files().items()
        if not (directory / name).exists() or (directory / name).read_text() != text
    ]


def cli_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="runnerscale crds",
        description="Print the runnerscale CRDs (generated from the API types), or write/check deploy/crds/.",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="(re)write the YAML files into --dir")
    group.add_argument("--check", action="store_true", help="exit 1 if the files in --dir are not up to date")
    parser.add_argument("--dir", type=Path, default=DEFAULT_OUTPUT_DIR, help="default: deploy/crds of this checkout")
    args = parser.parse_args(argv)
    if args.write:
        for path in _write(args.dir):
            print(f"wrote {path}", file=sys.stderr)
        return 0
    if args.check:
        stale = _stale(args.dir)
        for name in stale:
            print(f"out of date: {args.dir / name} (run: python -m shared.crds --write)", file=sys.stderr)
        return 1 if stale else 0
    sys.stdout.write(render_all())
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(sys.argv[1:]))

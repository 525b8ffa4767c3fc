"""Names and labels ARC derives from an AutoscalingRunnerSet (pure, reproducible across languages).

ARC's object-name suffixes are FNV-1a 32 hashes of a string, written in decimal and "safe
encoded" into a consonant alphabet. They are reproduced
exactly so that a listener or proxy Secret created by Go ARC keeps its name under runnerscale.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shared.actions import ConfigScope, parse_config_url
from shared.actions.errors import ConfigURLError
from shared.api.constants import LABEL_ENTERPRISE, LABEL_ORGANIZATION, LABEL_REPOSITORY

_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193
MAX_LABEL_VALUE = 63


def fnv1a_32(data: bytes) -> int:
    h = _FNV32_OFFSET
    for byte in data:
        h ^= byte
        h = (h * _FNV32_PRIME) & 0xFFFFFFFF
    return h


def safe_encode(text: str) -> str:
    """Kubernetes' ``rand.SafeEncodeString``: each character → a vowel-free alphabet."""
    return "".join(_SAFE_ALPHABET[ord(c) % len(_SAFE_ALPHABET)] for c in text)


def fnv_hash_string(text: str) -> str:
    """ARC's ``hash.FNVHashString``: decimal FNV-1a 32 of the UTF-8 bytes, safe-encoded."""
    return safe_encode(str(fnv1a_32(text.encode("utf-8"))))


def listener_name(ars_name: str, ars_namespace: str, runner_group: str, config_url: str) -> str:
    """``<ARS>-<hash(ns@group@url)[:8]>-listener`` (ARC's ``scaleSetListenerName``)."""
    suffix = fnv_hash_string(f"{ars_namespace}@{runner_group}@{config_url}")[:8]
    return f"{ars_name}-{suffix}-listener"


def runner_proxy_secret_name(ers_name: str, ers_namespace: str) -> str:
    """``<ERS>-<hash(ns)[:8]>-runner-proxy`` (ARC's ``proxyEphemeralRunnerSetSecretName``)."""
    return f"{ers_name}-{fnv_hash_string(ers_namespace)[:8]}-runner-proxy"


def trim_label_value(value: str) -> str:
    """ARC's ``trimLabelValue``: over 63 characters → first 58 + ``-trim``; else strip ``-_.``."""
    if len(value) > MAX_LABEL_VALUE:
        return value[: MAX_LABEL_VALUE - 5] + "-trim"
    return value.strip("-_.")


def url_labels(config_url: str) -> dict[str, str]:
    """The enterprise/organization/repository labels of a config URL ({} when it does not parse)."""
    try:
        cfg = parse_config_url(config_url)
    except ConfigURLError:
        return {}
    if cfg.scope is ConfigScope.ENTERPRISE:
        return {LABEL_ENTERPRISE: trim_label_value(cfg.enterprise)}
    labels = {LABEL_ORGANIZATION: trim_label_value(cfg.organization)}
    if cfg.scope is ConfigScope.REPOSITORY:
        labels[LABEL_REPOSITORY] = trim_label_value(cfg.repository)
    return labels


# --- labels and annotations copied onto derived objects (ARC's filterAndMergeLabels) --------------


def filter_labels(labels: Mapping[str, str] | None, exclude_prefixes: Iterable[str] = ()) -> dict[str, str]:
    """Drop keys starting with any of ``exclude_prefixes`` (plain prefix match, as ARC; an empty
    prefix excludes nothing)."""
    prefixes = tuple(p for p in exclude_prefixes if p)
    return {k: v for k, v in (labels or {}).items() if not (prefixes and k.startswith(prefixes))}


def filter_and_merge_labels(
    base: Mapping[str, str] | None, overwrite: Mapping[str, str] | None, exclude_prefixes: Iterable[str] = ()
) -> dict[str, str]:
    """Both maps filtered by :func:`filter_labels`, then ``overwrite`` wins."""
    prefixes = tuple(exclude_prefixes)
    merged = filter_labels(base, prefixes)
    merged.update(filter_labels(overwrite, prefixes))
    return merged


def merge_annotations(base: Mapping[str, str] | None, overwrite: Mapping[str, str] | None) -> dict[str, str]:
    """``base`` with ``overwrite`` on top (annotations are never filtered)."""
    merged = dict(base or {})
    merged.update(overwrite or {})
    return merged

"""Proxy selection from the environment (HTTPS_PROXY / HTTP_PROXY / NO_PROXY), as pure functions."""

from __future__ import annotations

import pytest
from yarl import URL

from shared.actions.http import env_proxies, proxy_for

ENV = {
    "HTTPS_PROXY": "http://upper:3128",
    "https_proxy": "http://lower:3128",
    "HTTP_PROXY": "http://plain:3128",
    "NO_PROXY": "internal.example, .corp.example,10.0.0.1",
    "PATH": "/bin",
    "EMPTY_PROXY": "",
}


def test_lower_case_names_win_and_unrelated_variables_are_ignored() -> None:
    assert env_proxies(ENV) == {
        "https": "http://lower:3128",
        "http": "http://plain:3128",
        "no": "internal.example, .corp.example,10.0.0.1",
    }


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://api.github.com/x", "http://lower:3128"),
        ("http://ghes.local/api/v3/x", "http://plain:3128"),
        ("https://internal.example/x", None),
        ("https://a.corp.example/x", None),
        ("https://10.0.0.1:8443/x", None),
        ("https://notinternal.example.org/x", "http://lower:3128"),
    ],
)
def test_environment_proxy_and_no_proxy(url: str, expected: str | None) -> None:
    assert proxy_for(URL(url), explicit=None, proxies=env_proxies(ENV)) == expected


def test_explicit_proxy_always_wins() -> None:
    assert (
        proxy_for(URL("https://internal.example/x"), explicit="http://mine:1", proxies=env_proxies(ENV))
        == "http://mine:1"
    )


def test_no_proxy_star_bypasses_everything() -> None:
    proxies = env_proxies({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*"})
    assert proxy_for(URL("https://api.github.com"), explicit=None, proxies=proxies) is None


def test_no_environment_no_proxy() -> None:
    assert proxy_for(URL("https://api.github.com"), explicit=None, proxies={}) is None

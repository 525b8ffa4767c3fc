"""Config URL parsing: scopes, hosted vs GHES API bases, typed errors."""

from __future__ import annotations

import pytest

from shared.actions import ConfigScope, ConfigURLError, parse_config_url


@pytest.mark.parametrize(
    ("url", "scope", "api_base", "reg_path"),
    [
        (
            "https://github.com/my-org",
            ConfigScope.ORGANIZATION,
            "https://api.github.com",
            "/orgs/my-org/actions/runners/registration-token",
        ),
        (
            "https://github.com/my-org/my-repo/",
            ConfigScope.REPOSITORY,
            "https://api.github.com",
            "/repos/my-org/my-repo/actions/runners/registration-token",
        ),
        (
            "https://github.com/enterprises/my-ent",
            ConfigScope.ENTERPRISE,
            "https://api.github.com",
            "/enterprises/my-ent/actions/runners/registration-token",
        ),
        (
            "https://github.com/Enterprises/my-ent",
            ConfigScope.ENTERPRISE,
            "https://api.github.com",
            "/enterprises/my-ent/actions/runners/registration-token",
        ),
        (
            "https://www.github.com/my-org",
            ConfigScope.ORGANIZATION,
            "https://api.github.com",
            "/orgs/my-org/actions/runners/registration-token",
        ),
        (
            "https://tenant.ghe.com/my-org/repo",
            ConfigScope.REPOSITORY,
            "https://api.tenant.ghe.com",
            "/repos/my-org/repo/actions/runners/registration-token",
        ),
        (
            "https://Tenant.GHE.com/org",
            ConfigScope.ORGANIZATION,
            "https://api.tenant.ghe.com",
            "/orgs/org/actions/runners/registration-token",
        ),
        (
            "http://github.localhost/org/repo",
            ConfigScope.REPOSITORY,
            "http://api.github.localhost",
            "/repos/org/repo/actions/runners/registration-token",
        ),
        (
            "https://my-instance.com/org/repo",
            ConfigScope.REPOSITORY,
            "https://my-instance.com/api/v3",
            "/repos/org/repo/actions/runners/registration-token",
        ),
        (
            "http://localhost/org/repo",
            ConfigScope.REPOSITORY,
            "http://localhost/api/v3",
            "/repos/org/repo/actions/runners/registration-token",
        ),
        (
            "http://127.0.0.1:8080/org",
            ConfigScope.ORGANIZATION,
            "http://127.0.0.1:8080/api/v3",
            "/orgs/org/actions/runners/registration-token",
        ),
        (
            "https://ghes.example.com/enterprises/ent",
            ConfigScope.ENTERPRISE,
            "https://ghes.example.com/api/v3",
            "/enterprises/ent/actions/runners/registration-token",
        ),
    ],
)
def test_scopes_and_api_bases(url: str, scope: ConfigScope, api_base: str, reg_path: str) -> None:
    config = parse_config_url(url, environ={})
    assert config.scope is scope
    assert config.api_base == api_base
    assert config.registration_token_path == reg_path
    assert config.url == url.strip("/")


def test_force_ghes_environment_makes_github_com_use_api_v3() -> None:
    config = parse_config_url("https://github.com/org", environ={"GITHUB_ACTIONS_FORCE_GHES": ""})
    assert not config.is_hosted
    assert config.api_base == "https://github.com/api/v3"


def test_fields_of_a_repository_url() -> None:
    config = parse_config_url("https://github.com/my-org/my-repo", environ={})
    assert (config.organization, config.repository, config.enterprise) == ("my-org", "my-repo", "")


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("", "empty"),
        ("https://github.com", "path segments"),
        ("https://github.com/a/b/c", "3 path segments"),
        ("ftp://github.com/org", "https://"),
        ("github.com/org", "https://"),
        ("https:///org", "no host"),
        ("https://user:pw@github.com/org", "user:password"),
        ("https://github.com/org?x=1", "query"),
        ("https://github.com/org//repo", "empty path segment"),
    ],
)
def test_invalid_urls_raise_a_typed_error_naming_the_field(url: str, fragment: str) -> None:
    with pytest.raises(ConfigURLError) as info:
        parse_config_url(url, environ={})
    assert "githubConfigUrl" in str(info.value)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_credentials_in_url_are_not_echoed() -> None:
    with pytest.raises(ConfigURLError) as info:
        parse_config_url("https://user:s3cretpassw0rd@github.com/org", environ={})
    assert "s3cretpassw0rd" not in str(info.value)

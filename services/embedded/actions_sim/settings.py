"""Start-up configuration of the simulator: who exists (the seed), credentials, behaviour knobs.

A seed file (YAML or JSON) may set any of these keys::

    orgs: [octo-org]              # any repository under a seeded org exists
    default_repo: octo-repo       # repository used by jobs that name none
    enterprise: octo-enterprise   # holds every seeded org
    runner_groups: [gpu]          # extra runner groups (ids 2, 3, ...) next to Default (id 1)
    pat: ghp_...                  # a PAT valid for every seeded scope
    app_id: 1001
    client_id: Iv1.abc            # accepted as JWT iss as well as the app id
    installation_id: 2001         # installation on the first org (next orgs: +1, +2, ...)
    app_private_key_file: app.pem # RSA; generated at start when absent
    settings: {poll_wait: 50}     # any SimSettings field
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from services.embedded.actions_sim.tls import TlsMaterial
from services.embedded.actions_sim.tokens import opaque_token
from services.embedded.actions_sim.views import SimSettings
from services.embedded.actions_sim.world import Seed


class SeedFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    orgs: list[str] | None = None
    default_repo: str | None = None
    enterprise: str | None = None
    runner_groups: list[str] | None = None
    pat: str | None = None
    app_id: int | None = None
    client_id: str | None = None
    installation_id: int | None = None
    app_private_key_file: str | None = None
    settings: SimSettings | None = None


class SimConfig(msgspec.Struct, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 0
    seed: Seed = msgspec.field(default_factory=Seed)
    pat: str = ""
    app_id: int = 1001
    client_id: str = "Iv1.actionssim0001"
    installation_id: int = 2001
    app_private_key_pem: str = ""
    settings: SimSettings = msgspec.field(default_factory=SimSettings)
    tls: TlsMaterial | None = None
    """Serve HTTPS with this certificate (clients trust ``tls.ca_pem``)."""


class SeedFileError(ValueError):
    """The seed file cannot be used; the message names the file and the field."""


def generate_private_key_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def public_key_pem(private_key_pem: str) -> str:
    key = serialization.load_pem_private_key(private_key_pem.encode(), password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError("the GitHub App private key must be an RSA key")
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def load_seed_file(path: Path) -> SeedFile:
    try:
        raw = yaml.safe_load(path.read_text())
        return msgspec.convert(raw or {}, SeedFile)
    except OSError as exc:
        raise SeedFileError(f"{path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError:
        raise SeedFileError(f"{path}: not valid YAML or JSON") from None
    except msgspec.ValidationError as exc:
        raise SeedFileError(f"{path}: {exc}") from None


def apply_seed_file(config: SimConfig, seed_file: SeedFile, base_dir: Path) -> SimConfig:
    seed = config.seed
    seed = msgspec.structs.replace(
        seed,
        orgs=seed_file.orgs or seed.orgs,
        default_repo=seed_file.default_repo or seed.default_repo,
        enterprise=seed_file.enterprise or seed.enterprise,
        runner_groups=seed_file.runner_groups if seed_file.runner_groups is not None else seed.runner_groups,
    )
    key_pem = config.app_private_key_pem
    if seed_file.app_private_key_file:
        key_path = base_dir / seed_file.app_private_key_file
        try:
            key_pem = key_path.read_text()
        except OSError as exc:
            raise SeedFileError(f"app_private_key_file {key_path}: cannot read ({exc.strerror})") from None
    return msgspec.structs.replace(
        config,
        seed=seed,
        pat=seed_file.pat or config.pat,
        app_id=seed_file.app_id or config.app_id,
        client_id=seed_file.client_id or config.client_id,
        installation_id=seed_file.installation_id or config.installation_id,
        app_private_key_pem=key_pem,
        settings=seed_file.settings or config.settings,
    )


def completed(config: SimConfig) -> SimConfig:
    """Fill in what was not given: a random PAT and a fresh RSA key pair."""
    return msgspec.structs.replace(
        config,
        pat=config.pat or opaque_token("ghp_"),
        app_private_key_pem=config.app_private_key_pem or generate_private_key_pem(),
    )

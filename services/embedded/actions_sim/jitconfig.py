"""The encoded JIT runner config the simulator issues, and its decoding by a fake runner.

Like the real one (base64 of a JSON object mapping runner file names to base64 file contents),
so tools that peek into it (garm does) see the familiar ``.runner`` and ``.credentials`` files.
The ``.credentials`` file carries the runner's own token for the simulator's runner-side API.
"""

from __future__ import annotations

import base64
import binascii
from typing import TypeVar

import msgspec

S = TypeVar("S", bound=msgspec.Struct)


class RunnerFile(msgspec.Struct, rename="camel"):
    agent_id: int
    agent_name: str
    pool_id: int
    pool_name: str
    server_url: str
    git_hub_url: str
    work_folder: str
    runner_scale_set_id: int
    ephemeral: bool = True
    disable_update: bool = True
    use_v2_flow: bool = True


class CredentialData(msgspec.Struct):
    token: str


class CredentialsFile(msgspec.Struct):
    data: CredentialData
    scheme: str = "OAuthAccessToken"


class JitConfig(msgspec.Struct):
    runner: RunnerFile
    credentials: CredentialsFile


class JitConfigError(ValueError):
    """The string is not a JIT config this simulator issued (names the broken part, not the token)."""


def encode_jit_config(config: JitConfig) -> str:
    files = {
        ".runner": base64.b64encode(msgspec.json.encode(config.runner)).decode(),
        ".credentials": base64.b64encode(msgspec.json.encode(config.credentials)).decode(),
    }
    return base64.b64encode(msgspec.json.encode(files)).decode()


def decode_jit_config(encoded: str) -> JitConfig:
    try:
        files = msgspec.json.decode(base64.b64decode(encoded, validate=True), type=dict[str, str])
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise JitConfigError("JIT config is not base64 of a JSON object of files") from None
    return JitConfig(
        runner=_jit_file(files, ".runner", RunnerFile), credentials=_jit_file(files, ".credentials", CredentialsFile)
    )


def _jit_file(files: dict[str, str], name: str, struct: type[S]) -> S:
    if name not in files:
        raise JitConfigError(f"JIT config lacks the {name} file")
    try:
        return msgspec.json.decode(base64.b64decode(files[name], validate=True), type=struct)
    except (binascii.Error, ValueError, msgspec.DecodeError) as exc:
        raise JitConfigError(f"JIT config file {name} is invalid: {type(exc).__name__}") from None

"""Base memory of a worker process (issue 10): the workers do not load what only some
credentials need. PyJWT and cryptography (~10 MB RSS) sign a GitHub App's JWT; they are imported
when an App credential signs one, not by importing a worker."""

from __future__ import annotations

import subprocess
import sys

WORKERS = (
    "services.runner.worker",
    "services.runner_set.worker",
    "services.scale_set.worker",
    "services.listener_pod.worker",
)


def test_importing_the_workers_loads_neither_pyjwt_nor_cryptography() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in WORKERS)
        + "print(sorted({m.split('.')[0] for m in sys.modules} & {'jwt', 'cryptography'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


def test_signing_an_app_jwt_still_works() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from shared.actions.auth import AppCredentials, app_jwt, jwt_expiry

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    token = app_jwt(AppCredentials(app_id="123", private_key=pem))
    assert jwt_expiry(token) is not None

import io
import json
import logging

from shared.log import configure_logging, get_logger, register_secret


def _capture() -> io.StringIO:
    buf = io.StringIO()
    configure_logging("debug", stream=buf)
    return buf


def test_log_line_is_json_with_resource_keys() -> None:
    buf = _capture()
    get_logger("t").info("created runner", namespace="ns", name="r-1")
    doc = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert doc["msg"] == "created runner" and doc["namespace"] == "ns" and doc["name"] == "r-1"
    assert doc["level"] == "info" and doc["logger"] == "t"


def test_secret_fields_and_registered_values_are_redacted() -> None:
    buf = _capture()
    register_secret("ghs_supersecretvalue")
    log = get_logger("t").bind(admin_token="abc123456")
    log.warning("request failed with ghs_supersecretvalue in body", jit_config="xyz", runner_name="r")
    line = buf.getvalue()
    assert "ghs_supersecretvalue" not in line and "abc123456" not in line and "xyz" not in line
    doc = json.loads(line.strip().splitlines()[-1])
    assert doc["runner_name"] == "r" and doc["admin_token"] == "[redacted]"


def test_exception_is_one_line_without_secret() -> None:
    buf = _capture()
    register_secret("Bearer-zzz-secret")
    try:
        raise RuntimeError("auth failed: Bearer-zzz-secret")
    except RuntimeError:
        get_logger("t").exception("call failed")
    doc = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert "Bearer-zzz-secret" not in doc["error"]
    logging.getLogger().handlers.clear()

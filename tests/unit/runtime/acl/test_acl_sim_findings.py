"""What the simulator saw go wrong is logged when its backend closes, so a daemon run on
``acl-sim`` shows it without a test reading ``backend.simulator``."""

from __future__ import annotations

from acl_testing import MakeBackend
from structlog.testing import capture_logs

from streamer.config import RuntimeConfig
from streamer.runtime import open_backend
from streamer.runtime.acl.constants import AclCode


def test_broken_rules_and_resources_left_are_logged_at_close() -> None:
    backend = open_backend(RuntimeConfig(backend="acl-sim"))
    acl = backend.simulator.acl  # type: ignore[attr-defined]
    assert acl.rt.free(0x3039) == AclCode.ERROR_INVALID_PARAM  # memory it never allocated
    # Host memory, never freed: device memory would also make reset_device refuse (rule
    # "teardown", test_acl_sim_teardown.py) and close raise.
    _, ret = acl.rt.malloc_host(1024)
    assert ret == AclCode.SUCCESS
    with capture_logs() as logs:
        backend.close()
    broken, left = logs
    assert broken["event"] == "acl_sim_rules_broken" and broken["log_level"] == "error"
    assert broken["count"] == 1
    assert broken["violations"] == [
        {
            "rule": "free",
            "api": "acl.rt.free",
            "code": AclCode.ERROR_INVALID_PARAM,
            "message": "0x3039 is not allocated",
        }
    ]
    assert left["event"] == "acl_sim_resources_left" and left["resources"] == {"allocations": 1}


def test_a_clean_run_logs_nothing_at_close(make_backend: MakeBackend) -> None:
    backend = make_backend()
    with capture_logs() as logs:
        backend.close()
    assert [e for e in logs if e["event"].startswith("acl_sim_")] == []


def test_a_second_close_logs_the_findings_no_more() -> None:
    """A daemon closes its pipeline as it stops, then again on its way out: the findings are
    logged once, by the first close."""
    backend = open_backend(RuntimeConfig(backend="acl-sim"))
    acl = backend.simulator.acl  # type: ignore[attr-defined]
    assert acl.rt.free(0x3039) == AclCode.ERROR_INVALID_PARAM
    with capture_logs() as logs:
        backend.close()
        backend.close()
    assert [e["event"] for e in logs] == ["acl_sim_rules_broken"]

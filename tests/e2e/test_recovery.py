"""A queue-mode daemon whose executions fail now and then on the device serves on: each
replica that lost an output reloads its model and goes back into rotation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamer.clients.producer import produce

from .conftest import Client, backend_settings, metric_by_label


def test_queue_mode_replicas_recover_from_lost_outputs_and_the_daemon_serves_on(
    start_daemon: Any, connect: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    """Every fifth execution fails on the device, without an output, on two replicas.
    Before, each loss took its replica out for good, and the second stopped the daemon
    (``pipeline_failed``, exit 1). Now every frame is published or fails with a reason, the
    recoveries are counted in /metrics, and the stop is clean: exit 0, no broken ACL rule
    and nothing left unreleased."""
    settings = backend_settings("acl-sim-queue", assets["blazeface_short_range"], tmp_path)
    daemon = start_daemon(
        **settings,
        runtime_extra="devices = [0, 1]\n[runtime.options]\nresult_timeout_ms = 300\n"
        "[runtime.options.sim]\nfail_every_n_executes = 5",
    )
    client: Client = connect(daemon)
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw", limit=80)
    results = client.collect(81, timeout_s=60)[:-1]
    assert [r["seq"] for r in results] == list(range(80))
    failed = [r["error"] for r in results if r["error"] is not None]
    assert all(e["reason"] == "inference_failed" for e in failed)
    assert all(len(r["detections"]) == 1 for r in results if r["error"] is None)
    assert metric_by_label(daemon, "streamer_replica_recoveries_total", "model")["face"] >= 2
    assert daemon.stop() == 0
    events = {e.get("event") for e in daemon.logs}
    assert "replica_recovered" in events
    unwanted = {"pipeline_failed", "replica_failed", "acl_sim_rules_broken"}
    assert not unwanted & events and "acl_sim_resources_left" not in events
    final = daemon.final_counts()
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]

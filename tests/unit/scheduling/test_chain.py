"""Error details of a chain's stages: each names its stage once."""

from __future__ import annotations

from streamer.errors import FrameError, Reason
from streamer.scheduling.chain import stage_error


def test_a_failure_in_a_stage_names_it_exactly_once() -> None:
    """A replica's dequeue thread names the stage; the router, folding a frame's failed
    items, must not name it again."""
    detail = "acl.mdl.execute_async failed: ACL_ERROR_GE_FAILURE (500002)"
    named = stage_error("onet", FrameError(Reason.INFERENCE_FAILED, detail))
    assert (named.reason, named.detail) == ("inference_failed", f"stage onet: {detail}")
    assert stage_error("onet", named) is named

"""A reload's hand-over of the config read to the pipeline, on a thread of its own.

Once the config file is read again (:class:`~streamer.config_read.ConfigRead`),
:meth:`Pipeline.reload <streamer.pipeline.Pipeline.reload>` loads the new chain's models,
starts it and waits for the old chain to drain: a model of hundreds of MB on a slow disk
loads for tens of seconds, one on a hung mount never, and the drain takes up to
``daemon.reload_timeout_s``. On this thread, the control loop goes on meanwhile: watchdog
pings, ``STATUS=`` lines, housekeeping, ``reload_in_progress`` lines
(:mod:`streamer.reload_progress`), and a stop or a pipeline failure acted on at once. The
thread is a daemon thread, so a load that never returns does not hold up the exit.
"""

from __future__ import annotations

import threading

from streamer.config import Config
from streamer.pipeline import Pipeline
from streamer.reload_progress import ReloadProgress, ReloadStage
from streamer.scheduling.swap import StopRequest

__all__ = ["PipelineReload"]


class PipelineReload:
    """One :meth:`Pipeline.reload <streamer.pipeline.Pipeline.reload>`, started at once.

    Args:
        pipeline: the running pipeline.
        config: the config read, validated.
        stop: set once the daemon stops: the old chain's drain is then cut short, and a
            chain loaded afterwards is released instead of swapped in.
        progress: the reload's progress, moved on to ``loading`` now, ``swapping`` by the
            pipeline.
    """

    def __init__(
        self, pipeline: Pipeline, config: Config, stop: StopRequest, progress: ReloadProgress
    ) -> None:
        self._done = threading.Event()
        self._in_force = False
        self._error: Exception | None = None
        progress.enter(ReloadStage.LOADING)
        threading.Thread(
            target=self._run, args=(pipeline, config, stop, progress), name="reload", daemon=True
        ).start()

    def wait(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for the reload to end; whether it has."""
        return self._done.wait(timeout_s)

    def result(self) -> bool | Exception:
        """Whether the whole new config is in force (see ``Pipeline.reload``), or the error
        that ended the reload half-way (a bug: the pipeline's state is then unknown); only
        once it ended.

        Raises:
            RuntimeError: the reload has not ended.
        """
        if not self._done.is_set():
            raise RuntimeError("the reload is still running")
        return self._error if self._error is not None else self._in_force

    def _run(
        self, pipeline: Pipeline, config: Config, stop: StopRequest, progress: ReloadProgress
    ) -> None:
        try:
            self._in_force = pipeline.reload(config, stop, progress)
        except Exception as exc:  # noqa: BLE001 - the control loop stops the daemon for it
            self._error = exc
        finally:
            self._done.set()

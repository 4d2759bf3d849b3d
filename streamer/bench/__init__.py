"""``streamer bench``: where the time goes, and how close the daemon is to the machine's limit.

One invocation runs every mode on the same frames, model and config, for two inputs (small
frames sent raw, camera-sized frames sent as JPEG), and reports ratios, because absolute
times on a shared machine drift (issue 8):

=============== ==========================================================================
mode            what runs
=============== ==========================================================================
``components``  each step alone on one thread: CPU time per frame of decode, preprocess,
                inference at each batch size, postprocess (:mod:`.components`)
``limit``       CPU cores ÷ the per-frame cost of those steps at the best batch size
``serial``      one thread, in process, no transport (:mod:`.serial`)
``naive``       an imagezmq-style REQ/REP receiver in a subprocess, one frame at a time,
                fed by a REQ sender process (:mod:`.naive`)
``daemon``      the real daemon as a subprocess, fed by producer processes as fast as
                ``block`` lets them; again at 50 % of that rate, with 16 sources, and at
                other ``max_size`` values (:mod:`.daemon_run`)
=============== ==========================================================================

Entry point: :func:`streamer.bench.runner.run_bench`. This package imports nothing heavy at
import time, so its subprocess entry points (:mod:`.feed`) start fast.
"""

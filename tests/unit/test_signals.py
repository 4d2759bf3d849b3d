"""A flag set by a signal handler that interrupts the flag's own methods, thousands of times
a second, in a child process (its timer signals never reach pytest)."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import signal, sys, time
from streamer.signals import SignalFlag
flag = SignalFlag()
handled = 0
def handler(signum, frame):
    global handled
    handled += 1
    flag.set()
signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.00005, 0.00005)  # as fast as the handler can run
end = time.monotonic() + 1.0
while time.monotonic() < end:
    flag.set()
    flag.clear()
    flag.wait(0.0001)
signal.setitimer(signal.ITIMER_REAL, 0, 0)
print(handled > 100, flag.is_set())
"""


def test_a_handler_interrupting_the_flag_itself_never_blocks_nor_recurses() -> None:
    """threading.Event.set takes a lock, so this loop ends in RecursionError with an Event."""
    child = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=False
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout == "True True\n"


STORM = """
import signal, time
from streamer.signals import SignalFlag
stop, reload = SignalFlag(), SignalFlag()
signal.signal(signal.SIGALRM, lambda signum, frame: reload.set())
signal.setitimer(signal.ITIMER_REAL, 0.00005, 0.00005)
for _ in range(40):  # the control loop's ticks, each under a storm of other signals
    assert not stop.wait(0.05)
signal.setitimer(signal.ITIMER_REAL, 0, 0)
print(reload.is_set())
"""


def test_the_waiter_returns_at_its_timeout_through_a_storm_of_other_signals() -> None:
    """Woken through SimpleQueue.get(timeout) instead, a signal landing as the timeout ran out
    left the control loop waiting forever (CPython up to 3.12)."""
    child = subprocess.run(
        [sys.executable, "-c", STORM], capture_output=True, text=True, timeout=60, check=False
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout == "True\n"

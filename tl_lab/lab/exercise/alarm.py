"""A time limit on the learner's code: SIGALRM raises in it after a number of seconds, so a loop that
never ends is a verdict, not a command that never returns. Used by `exercise parity` (each call of
sample.py) and the graded pytest runs (`plugin`: each test, and the collection that imports the modules)."""

from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["time_limit"]


@contextlib.contextmanager
def time_limit(seconds: float, on_alarm):
    """`on_alarm(signum, frame)`, which raises, runs in the Python code of the main thread after
    `seconds`; the handler before is put back after. In another thread no limit: signals go to the main one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)

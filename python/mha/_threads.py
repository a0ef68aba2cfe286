"""The threads of mha's calls: OMP_NUM_THREADS or the CPUs this process may run on, set_num_threads,
and one thread in a forked child (docs/python.md)."""
from __future__ import annotations

import numbers
import os

from ._fields import ArgumentError


def _default_num_threads():
    # OMP_NUM_THREADS may list a count per nesting level ("4,2"); the first is this level's.
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0])
    except ValueError:
        n = 0
    if n >= 1:
        return n
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


_num_threads = _default_num_threads()


def set_num_threads(n):
    global _num_threads
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ArgumentError(f"set_num_threads: expected an integer >= 1, got {n!r}")
    _num_threads = int(n)


def get_num_threads():
    return _num_threads


_forked = False


def _after_fork_in_child():
    # OpenMP's thread pool (libgomp's), made by any earlier parallel call of the parent (mha's or
    # torch's), is not in a forked child, and a parallel region there waits for its threads
    # forever: a DataLoader worker would hang. One thread takes no pool; set_num_threads in the
    # child asks for more where the parent never ran OpenMP (docs/python.md).
    global _num_threads, _forked
    _num_threads, _forked = 1, True


def torch_threads(count):
    """The threads of a call through mha.torch: torch's `count`, in a forked child at most mha's own."""
    return min(count, _num_threads) if _forked else count


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

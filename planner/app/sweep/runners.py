"""Runners: where a sweep's tasks run. :class:`SerialRunner` runs them in this process one
after another; :class:`RayRunner` runs them as Ray tasks on a local or remote cluster.

A runner yields (index, result) as each call finishes; a call that raised, or whose worker
kept dying, is a :class:`Failure`, so one bad point never loses the others.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fuseplan.planner.app.sweep.keys import Job
from fuseplan.planner.app.sweep.rows import Outcome, blank_row
from fuseplan.planner.app.sweep.watchdog import Watchdog, stop_leftovers
from fuseplan.planner.core.errors import InputError

__all__ = ["Call", "Failure", "Progress", "RayRunner", "Runner", "SerialRunner", "run_calls"]


@dataclass(frozen=True)
class Failure:
    """A task that raised (a bug: the row's status is ``error``, and the sweep says so), or
    whose worker died more often than it was retried, or that was cancelled."""

    message: str


Call = tuple[Callable[..., Outcome], tuple[Any, ...]]


class Runner(Protocol):
    """Runs calls and yields (index, result) as each finishes."""

    def run(self, calls: Sequence[Call]) -> Iterator[tuple[int, Outcome | Failure]]: ...


class SerialRunner:
    """Every call in this process, one after another (a baseline, and Ray-free tests)."""

    def run(self, calls: Sequence[Call]) -> Iterator[tuple[int, Outcome | Failure]]:
        """Yield each call's result in order; a call that raises is a :class:`Failure`
        (as on Ray), so one bad point does not lose the others."""
        for i, (fn, args) in enumerate(calls):
            try:
                result: Outcome | Failure = fn(*args)
            except Exception as exc:  # reported as the point's error; the sweep exits 1
                result = Failure(_raised(exc))
            yield i, result


def _raised(exc: BaseException) -> str:
    """A task's exception in one line: its type, message and the place it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    place = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    text = " ".join(str(exc).split())[:400]
    return f"{type(exc).__name__}: {text}{place}"


@dataclass
class RayRunner:
    """Calls as Ray tasks: on the cluster at ``address``, or on a Ray started on this
    machine's cores (``num_cpus``; all of them by default). A Ray already initialised in this
    process (tests, notebooks) is used as it is. A task whose worker dies is retried
    ``max_retries`` times; a task that is still running when the driver stops is cancelled."""

    address: str | None = None
    num_cpus: int | None = None
    max_retries: int = 3
    _started: bool = field(default=False, init=False)
    _temp_dir: str | None = field(default=None, init=False)
    _watchdog: Watchdog | None = field(default=None, init=False)

    def __enter__(self) -> RayRunner:
        import ray  # here, not at the top: a serial sweep never pays Ray's import

        if not ray.is_initialized():
            try:
                with _sigterm_held():
                    self._init(ray)
                    self._started = True
            except BaseException:  # Ctrl-C or SIGTERM while Ray starts: __exit__ will not run
                self.__exit__()  # (the processes of a Ray half started here are stopped too)
                raise
        return self

    def _init(self, ray: Any) -> None:
        if self.address is not None:
            try:
                ray.init(address=self.address, logging_level=logging.WARNING,
                         log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
                raise InputError(
                    f"cannot reach Ray at {self.address} ({' '.join(str(exc).split())}); "
                    "start one with `ray start --head` or drop --address to start Ray on "
                    "this machine.") from None
            return
        # A private session folder (not the shared /tmp/ray: two sweeps, or CI jobs, on one
        # machine must not meet), short enough for Ray's socket paths, and the CPUs this
        # process may use (a container or taskset may allow fewer than the machine has).
        self._temp_dir = tempfile.mkdtemp(prefix="fuseplan-ray-")
        # a driver killed outright runs no clean-up: its watchdog does it (module watchdog)
        self._watchdog = Watchdog(self._temp_dir)
        self._watchdog.start()
        ray.init(num_cpus=self.num_cpus or len(os.sched_getaffinity(0)),
                 include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False, _temp_dir=self._temp_dir)

    def __exit__(self, *exc: object) -> None:
        import ray

        if self._started:
            # a Ray started here: wait until its processes are gone (then its folder can go)
            ray.shutdown(wait_for_processes=self._temp_dir is not None)
            self._started = False
        if self._temp_dir is not None:
            # a worker the raylet was starting as it stopped (a SIGTERM to the whole process
            # group stops both at once) can outlive the shutdown and keep writing its logs
            stop_leftovers(self._temp_dir)
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None

    def run(self, calls: Sequence[Call]) -> Iterator[tuple[int, Outcome | Failure]]:
        """Submit every call, then yield results in the order they finish."""
        import ray
        from ray.exceptions import RayError, RayTaskError

        remote = {fn: ray.remote(num_cpus=1, max_retries=self.max_retries)(fn)
                  for fn in {fn for fn, _ in calls}}
        index = {remote[fn].remote(*args): i for i, (fn, args) in enumerate(calls)}
        pending = list(index)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    try:
                        result: Outcome | Failure = ray.get(ref)
                    except RayTaskError as exc:  # the task raised: a bug, not retried
                        result = Failure(_raised(exc.cause) if exc.cause is not None
                                         else str(exc).strip().splitlines()[-1][:500])
                    except RayError as exc:  # its workers kept dying, or it was cancelled
                        result = Failure(f"{type(exc).__name__}: "
                                         f"{str(exc).strip().splitlines()[-1][:400]}")
                    yield index[ref], result
        finally:
            # interrupted: stop what is still running on a cluster (a Ray started here is
            # shut down whole, which stops its tasks; cancelling them first raced a task
            # finishing meanwhile, and Ray's core then aborted the driver: exit 1)
            if self._temp_dir is None:
                for ref in pending:
                    ray.cancel(ref, force=True)


Progress = Callable[[int, int], None]


@contextmanager
def _sigterm_held() -> Iterator[None]:
    """Hold SIGTERM back while Ray starts, and keep this process's handler of it.

    ``ray.init`` replaces the handler with one that exits at once (SystemExit(15): no
    clean-up, Ray's folder left behind). And the processes it starts (GCS, raylet, their
    agents and workers) share this process's group: a SIGTERM to the group (CI cancelling a
    job) would kill them under the driver, which then crashes in Ray's core instead of
    stopping. Started with SIGTERM blocked, they keep it blocked; ``ray.shutdown`` stops
    them with SIGKILL. A SIGTERM that came meanwhile reaches the kept handler (the CLI's
    raises, as Ctrl-C) once the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = signal.getsignal(signal.SIGTERM)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if kept is None else kept)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def run_calls(runner: Runner, jobs: Sequence[Job], calls: Sequence[Call],
              keep: Callable[[Job, Outcome], None], progress: Progress | None,
              counter: list[int], total: int) -> None:
    """Run calls (one per job) through ``runner``, handing each result to ``keep`` as it
    arrives (a :class:`Failure` as an ``error`` row); ``counter[0]`` counts finished calls
    across batches and ``progress(done, total)`` hears of each."""
    with contextlib.closing(runner.run(calls)) as results:  # type: ignore[type-var]
        for i, result in results:
            job = jobs[i]
            if isinstance(result, Failure):
                result = Outcome(blank_row(job, "error", result.message))
            keep(job, result)
            counter[0] += 1
            if progress is not None:
                progress(counter[0], total)

"""The watchdog of a Ray session a sweep driver started: nothing of it outlives the driver.

``ray.shutdown`` and the runner's clean-up run when the driver ends by Ctrl-C, SIGTERM or
an error, but a driver killed outright (SIGKILL, the OOM killer) runs nothing, and Ray's
agents of its session live on. So, before Ray starts, the driver starts this module as a
process of its own session (a signal to the driver's process group does not reach it),
holding the read end of a pipe whose only write end the driver keeps. When the driver ends,
however it ends, the kernel closes that end and the read returns: the watchdog then kills
every process still running from the session folder and removes the folder. After a clean
stop the driver has removed the folder already, and the watchdog finds nothing to do.

Run as ``python -m fuseplan.planner.app.sweep.watchdog FD TEMP_DIR``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["Watchdog", "stop_leftovers"]


def stop_leftovers(temp_dir: str, wait_s: float = 10.0) -> None:
    """Kill every process still running from the Ray session in ``temp_dir`` (each names the
    folder on its command line) and wait until they are gone."""
    proc = Path("/proc")
    if not proc.is_dir():
        return
    mark = temp_dir.encode()
    left = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
                left.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    deadline = time.monotonic() + wait_s
    for pid in left:
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.02)


def alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie has ended: its parent, not us, reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class Watchdog:
    """The driver's side: :meth:`start` before Ray starts, :meth:`stop` after the clean-up.

    The write end of the pipe is not inherited by the processes Ray starts (Python makes
    descriptors non-inheritable, and subprocess closes the others), so only the driver's
    end keeps the watchdog waiting."""

    def __init__(self, temp_dir: str) -> None:
        self.temp_dir = temp_dir
        self._write: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the watchdog process (no-op where /proc is missing: nothing to find)."""
        if not Path("/proc").is_dir():
            return
        read, self._write = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(read), self.temp_dir],
                pass_fds=(read,), start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            os.close(read)

    def stop(self) -> None:
        """Release the watchdog: it finds the folder gone (or cleans what is left) and ends."""
        if self._write is not None:
            os.close(self._write)
            self._write = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


def _watch(fd: int, temp_dir: str) -> None:
    """Wait until the driver's end of the pipe closes, then stop its Ray session."""
    # The driver's Ctrl-C or SIGTERM is the driver's to handle; this process must outlive it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        try:
            if not os.read(fd, 1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    if os.path.isdir(temp_dir):
        stop_leftovers(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    _watch(int(sys.argv[1]), sys.argv[2])

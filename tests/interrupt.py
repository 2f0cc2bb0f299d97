"""Ctrl-C a running fuseplan command once its work has begun, whatever the machine's speed.

A fixed delay races the command: on an idle machine the planning finishes before the signal
(exit 0), on a loaded one the signal lands in the imports. The command's own progress
display says when the work has begun: it shows on a terminal, so the command runs with its
stderr on a pseudo-terminal, and the signal goes to its process group (as a terminal's
Ctrl-C does) as soon as the phrase of the step to interrupt appears there.

The command starts with SIGINT and SIGTERM at their defaults and unblocked, as a terminal's
foreground job does, whatever the test run inherited: a shell runs a job it puts in the
background (`make test &`, a CI step started so) with SIGINT ignored, and an ignored signal
stays ignored across exec, so the command would rightly never see the Ctrl-C.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fuseplan.planner.app.sweep.watchdog import alive

# what the progress display writes: CSI sequences (colour, cursor moves, erase), carriage
# returns, newlines and runs of text
_TOKENS = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+")


@dataclass(frozen=True)
class Interrupted:
    """How a command ended after the Ctrl-C."""

    code: int
    lines: list[str]  # what stderr said after the progress display, one entry a line
    stop_s: float  # seconds from the signal to the exit
    raw: str  # stderr as written, for assertion messages
    # its workers (process groups of their own) or any process of its group, still running
    # 10 s after it exited
    left: bool = False
    stdout: str = ""  # what the command printed on stdout (its --json document)


def as_foreground_job() -> None:
    """Before exec, in the child: SIGINT and SIGTERM at their defaults and unblocked."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _lines_after_progress(text: str, marker: str) -> list[str]:
    """The lines stderr shows once the live progress display has erased itself: the text
    replayed as a terminal would (carriage returns, cursor moves up, erased lines), the
    non-empty lines left, but any that still hold `marker`."""
    screen = [""]
    row = col = 0
    for token in _TOKENS.findall(text):
        if token == "\n":
            row, col = row + 1, 0
            screen += [""] * (row + 1 - len(screen))
        elif token == "\r":
            col = 0
        elif token.startswith("\x1b["):
            count = int(token[2:-1] or 1) if token[2:-1].isdigit() else 1
            if token.endswith("A"):
                row = max(0, row - count)
            elif token.endswith("K"):
                screen[row] = "" if token[2:-1] == "2" else screen[row][:col]
        else:
            line = screen[row].ljust(col)
            screen[row] = line[:col] + token + line[col + len(token):]
            col += len(token)
    return [line.strip() for line in screen if line.strip() and marker not in line]


def interrupt_when(binary: Path, args: list[str], marker: str, cwd: Path,
                   wait_s: float = 300.0, stop_timeout_s: float = 60.0,
                   signum: int = signal.SIGINT) -> Interrupted:
    """Run `binary args` with stderr on a pseudo-terminal, send its process group SIGINT
    (or `signum`: SIGTERM is what CI sends on cancel) once `marker` shows there; the
    command's exit, its stderr and how long it took to stop.

    Fails the calling test (AssertionError) when the command ends before the marker shows,
    or the marker does not show within `wait_s`."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(binary), *args], stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True,
                            preexec_fn=as_foreground_job,
                            env={"PATH": "/usr/bin:/bin", "COLUMNS": "100", "TERM": "xterm"})
    os.close(slave)
    seen = bytearray()
    signalled: float | None = None
    exited: float | None = None
    kids: list[int] = []
    deadline = time.monotonic() + wait_s
    try:
        while True:
            limit = deadline if signalled is None else signalled + stop_timeout_s
            # the command's exit, not the terminal's end of file, ends the wait: a worker
            # left running would hold the terminal open (and is reported as `left`)
            if signalled is not None and proc.poll() is not None:
                exited = exited or time.monotonic()
            ready, _, _ = select.select([master], [], [],
                                        max(0.0, min(limit - time.monotonic(), 0.1)))
            if not ready:
                if exited is not None or time.monotonic() >= limit:
                    break
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every writer closed the terminal (the command ended)
                break
            if not chunk:
                break
            seen += chunk
            if signalled is None and marker.encode() in seen:
                assert proc.poll() is None, "the command ended before it could be interrupted"
                kids = _children(proc.pid)  # its workers: process groups of their own
                os.killpg(proc.pid, signum)
                signalled = time.monotonic()
        if signalled is None:
            raise AssertionError(f"{marker!r} never showed on stderr: "
                                 f"{bytes(seen).decode(errors='replace')[-2000:]}")
        proc.wait(timeout=max(1.0, signalled + stop_timeout_s - time.monotonic()))
        took = (exited or time.monotonic()) - signalled
        left = _group_left(proc.pid) or _pids_left(kids)
    finally:
        os.close(master)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _kill_group(proc.pid)  # then nothing holds stdout open: reading it ends
        for pid in kids:
            _kill_pid(pid)
        printed = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        if proc.stdout is not None:
            proc.stdout.close()
    raw = bytes(seen).decode(errors="replace")
    return Interrupted(proc.returncode, _lines_after_progress(raw, marker), took, raw, left,
                       printed)


def _group_left(group: int, wait_s: float = 10.0) -> bool:
    """Whether any process of the group still runs `wait_s` after its leader exited."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.05)
    return True


def _kill_group(group: int) -> None:
    """Leave nothing of the command running after the test (whatever it asserted)."""
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def interrupt_when_loaded(binary: Path, args: list[str], library: str, cwd: Path,
                          wait_s: float = 300.0, stop_timeout_s: float = 60.0,
                          signum: int = signal.SIGINT) -> Interrupted:
    """Run `binary args`, send its process group SIGINT (or `signum`) as soon as a shared
    library whose path holds `library` is mapped into it (its imports have reached that
    extension: a moment inside fuseplan's own imports, whatever the machine's speed); how it
    ended.

    Before any such marker the interpreter itself is starting, which no program can answer
    with anything but Python's own traceback."""
    return _interrupt_once(binary, args, cwd, lambda pid: library in _read(
        Path(f"/proc/{pid}/maps")), f"{library!r} was never loaded", wait_s, stop_timeout_s,
        signum)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # the process is gone (its ending is asserted by the caller)
        return ""


def interrupt_when_workers(binary: Path, args: list[str], cwd: Path, workers: int = 2,
                           wait_s: float = 300.0, stop_timeout_s: float = 60.0,
                           signum: int = signal.SIGINT) -> Interrupted:
    """Run `binary args` (with --json: no progress display to wait for), send its process
    group `signum` as soon as `workers` worker processes of it run (its search has begun);
    how it ended, and whether any of its group outlived it."""
    return _interrupt_once(binary, args, cwd, lambda pid: len(_children(pid)) >= workers,
                           f"{workers} workers never started", wait_s, stop_timeout_s, signum,
                           look_for_left=True)


def _interrupt_once(binary: Path, args: list[str], cwd: Path, ready: Callable[[int], bool],
                    never: str, wait_s: float, stop_timeout_s: float, signum: int,
                    look_for_left: bool = False) -> Interrupted:
    """Run `binary args` with stdout and stderr piped, send its process group `signum` once
    `ready(pid)`, and tell how it ended (and, with `look_for_left`, whether any process of
    its group outlived it)."""
    proc = subprocess.Popen([str(binary), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            cwd=cwd, start_new_session=True, preexec_fn=as_foreground_job,
                            env={"PATH": "/usr/bin:/bin", "COLUMNS": "100"})
    deadline = time.monotonic() + wait_s
    left = False
    try:
        while not ready(proc.pid):
            assert proc.poll() is None, "the command ended before it could be interrupted"
            assert time.monotonic() < deadline, never
            time.sleep(0.002)
        kids = _children(proc.pid) if look_for_left else []  # workers: groups of their own
        os.killpg(proc.pid, signum)
        signalled = time.monotonic()
        printed, stderr = proc.communicate(timeout=stop_timeout_s)
        took = time.monotonic() - signalled
        left = look_for_left and (_group_left(proc.pid) or _pids_left(kids))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if look_for_left:
            _kill_group(proc.pid)
            for pid in kids:
                _kill_pid(pid)
    return Interrupted(proc.returncode, [s.strip() for s in stderr.splitlines() if s.strip()],
                       took, stderr, left, printed)


def _children(pid: int) -> list[int]:
    """The running processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = _read(entry / "stat").rsplit(")", 1)[1].split()[1]
        except IndexError:
            continue
        if int(ppid) == pid:
            found.append(int(entry.name))
    return found


def _pids_left(pids: list[int], wait_s: float = 10.0) -> bool:
    """Whether any of `pids` still runs (a zombie has ended) `wait_s` from now."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids):
            return False
        time.sleep(0.05)
    return True


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass

"""A command's peak resident memory, measured so that the test process's own size does not
leak into it.

Linux keeps a process's high-water RSS across exec: a command forked from a pytest worker
that has grown to 3 GiB reports 3 GiB whatever it used itself. So the command is started by
a small Python of its own (forked from the worker, then replaced by a fresh interpreter),
and it is that small process's child whose peak is read from wait4.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# argv: peak-file, command...; runs the command with this process's stdin/stdout/stderr,
# writes "exit peak_kib" to peak-file, and exits with the command's code
_WRAPPER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
code = os.waitstatus_to_exitcode(status)
with open(sys.argv[1], "w") as f:
    f.write(f"{code} {usage.ru_maxrss}")
sys.exit(code if code >= 0 else 128 - code)
"""


@dataclass(frozen=True)
class Run:
    """How a command ended: its exit code (negative: the signal that killed it), its peak
    resident MiB, and what it wrote."""

    code: int
    peak_mib: int
    stdout: str
    stderr: str


def peak_run(args: list[str], cwd: Path, tmp: Path, timeout_s: float) -> Run:
    """Run `args` (args[0] an absolute path) in `cwd`; a command still running after
    `timeout_s` is killed (code -9)."""
    record = tmp / f"peak-{os.getpid()}-{len(list(tmp.glob('peak-*')))}.txt"
    proc = subprocess.Popen([sys.executable, "-c", _WRAPPER, str(record), *args], cwd=cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        return Run(-9, 0, out, err)
    code, kib = record.read_text().split()
    record.unlink()
    return Run(int(code), int(kib) // 1024, out, err)

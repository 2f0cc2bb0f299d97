"""Inputs that once exhausted the machine (issue 43), run as real processes: each exits 2
within 60 s with its peak resident memory under 2 GiB (the limits the issue states), and
writes nothing. Before: `verify M /dev/zero` and `diff p.json /dev/urandom` grew to 6 GiB,
a FIFO blocked forever, YAML nested 20,000 levels died in RecursionError after 21 s, a
1 KB sweep spec of 10^8 points took 6 GiB in 34 s, `sweep --cpus 100000` 2.3 GiB."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.peak import peak_run

ROOT = Path(__file__).resolve().parents[1]
FUSEPLAN = ROOT / ".venv" / "bin" / "fuseplan"
DEMO = ROOT / "planner" / "data" / "demo.onnx"
LIMIT_MIB = 2048
LIMIT_S = 60


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model, a plan of it, a FIFO, a deeply nested YAML and a huge sweep spec."""
    d = tmp_path_factory.mktemp("bounds")
    shutil.copy(DEMO, d / "m.onnx")
    done = subprocess.run([str(FUSEPLAN), "solve", str(d / "m.onnx"), "-o", str(d / "plan.json"),
                           "--solver", "greedy"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    os.mkfifo(d / "pipe.json")
    (d / "deep.yaml").write_text("rules: " + "[" * 20000 + "]" * 20000 + "\n")
    # four axes of 100 values: 10^8 points from 2 KB
    values = {"sram.bytes": [f"{k}KiB" for k in range(64, 164)],
              "dram.bandwidth_gbps": range(1, 101), "macs_per_cycle": range(1, 101),
              "vector_ops_per_cycle": range(1, 101)}
    axes = "\n".join(f"      {k}: [{', '.join(map(str, v))}]" for k, v in values.items())
    (d / "huge.yaml").write_text(
        f"models: [{d / 'm.onnx'}]\nchips:\n  - hw: cluster4x4\n    sweep:\n{axes}\n")
    (d / "spec.yaml").write_text(f"models: [{d / 'm.onnx'}]\nchips: [{{hw: cluster4x4}}]\n")
    return d


@pytest.mark.parametrize(("args", "word"), [
    (["verify", "{w}/m.onnx", "/dev/zero"], "not a regular file"),
    (["diff", "{w}/plan.json", "/dev/urandom"], "not a regular file"),
    (["explain", "{w}/m.onnx", "/dev/urandom"], "not a regular file"),
    (["verify", "{w}/m.onnx", "{w}/pipe.json"], "FIFO"),
    (["solve", "{w}/m.onnx", "--hw", "{w}/pipe.json"], "FIFO"),
    (["rules", "check", "{w}/deep.yaml"], "levels"),
    (["solve", "{w}/m.onnx", "--rules", "{w}/deep.yaml"], "levels"),
    (["sweep", "{w}/huge.yaml", "--serial", "--out", "{w}/out"], "100,000,000 points"),
    (["sweep", "{w}/spec.yaml", "--cpus", "100000", "--out", "{w}/out"], "CPUs"),
], ids=lambda a: " ".join(a[:2]) + " " + Path(a[-1]).name if isinstance(a, list) else "")
def test_a_hostile_input_is_refused_quickly_in_little_memory(work: Path, tmp_path: Path,
                                                              args: list[str], word: str
                                                              ) -> None:
    before = sorted(os.listdir(work))
    run = peak_run([str(FUSEPLAN), *(a.format(w=work) for a in args)], work, tmp_path, LIMIT_S)
    assert run.code != -9, f"{args} still ran after {LIMIT_S} s"
    assert run.code == 2, run.stderr
    assert word in " ".join(run.stderr.split()), run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert run.peak_mib <= LIMIT_MIB, f"{args}: peak {run.peak_mib} MiB"
    assert sorted(os.listdir(work)) == before  # nothing written (no --out folder either)

"""SIGKILL at random moments of `export` and `quantize`: nothing left behind may look complete.

Whatever a killed command leaves must be either absent or whole: a ``model.onnx`` that is present loads
with every weight, its sidecar (when present) describes exactly its nodes, and no partial file sits
under a final name (staging happens in hidden temp paths that are renamed only at the end).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modelexport.onnxfile import load_onnx, read_sidecar

REPO = Path(__file__).resolve().parents[2]
SEED = 20261123


def _command(kind: str, out: Path, source: Path | None) -> list[str]:
    base = [sys.executable, "-m", "modelexport"]
    if kind == "export":
        return [
            *base,
            "export",
            "tests/models/torch_models.py:SmallCNN",
            str(out),
            "--input-shape",
            "2,1,8,8",
        ]
    return [*base, "quantize", str(source), "-o", str(out / "model_q.onnx")]


def _run_and_kill(cmd: list[str], after_s: float) -> int | None:
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=after_s)
        return proc.returncode  # finished before the kill
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def _check_whole(folder: Path) -> list[str]:
    problems = []
    for model in folder.glob("*.onnx") if folder.is_dir() else []:
        try:
            proto = load_onnx(model)
        except Exception as exc:  # noqa: BLE001 - any failure is the finding
            problems.append(f"{model.name} is present but not whole: {exc}")
            continue
        sidecar = read_sidecar(model)
        if sidecar is not None and len(sidecar["nodes"]) != len(proto.graph.node):
            problems.append(
                f"{model.name}'s sidecar describes {len(sidecar['nodes'])} nodes, not {len(proto.graph.node)}"
            )
    return problems


def _timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
    return time.perf_counter() - start


def _kill_at_random_moments(kind: str, tmp_path: Path, kills: int) -> None:
    source = None
    if kind == "quantize":
        source = tmp_path / "src"
        subprocess.run(_command("export", source, None), cwd=REPO, check=True, capture_output=True)
        source = source / "model.onnx"
    full = _timed(_command(kind, tmp_path / "probe", source))
    rng = random.Random(SEED)
    for i in range(kills):
        out = tmp_path / f"out{i}"
        _run_and_kill(_command(kind, out, source), rng.uniform(0.2, 1.05) * full)
        problems = _check_whole(out)
        assert not problems, f"{kind} killed (run {i}): " + "; ".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["export", "quantize"])
def test_twenty_kills_each(kind: str, tmp_path: Path) -> None:
    _kill_at_random_moments(kind, tmp_path, kills=20)

"""Mutated data files through the commands that read them with a model: a result or a one-line error naming the
file, never a bug. Seeded like the model-file campaign (``seed:index:what`` rebuilds a failing case).

The base files are a valid ``.npz`` for the 8 x 8 CNN and a small UTF-8 CSV; mutants damage their bytes
(truncation, bit flips, invalid UTF-8, one huge field) or their arrays (shapes, dtypes, NaN, empty).
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.fuzz.harness import problems, run_inprocess, snapshot

LIMIT_S = 30.0


def _npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def _base_npz(rng: random.Random) -> dict[str, np.ndarray]:
    n = rng.choice([1, 3, 8])
    gen = np.random.default_rng(rng.getrandbits(32))
    return {"x": gen.random((n, 1, 8, 8), dtype=np.float32), "y": gen.integers(0, 4, n)}


def _array_edit(rng: random.Random) -> tuple[str, bytes]:
    arrays = _base_npz(rng)
    x = arrays["x"]
    edits: dict[str, Callable[[], object]] = {
        "shape": lambda: arrays.__setitem__("x", x.reshape(len(x), -1)),
        "small": lambda: arrays.__setitem__("x", x[:, :, :5, :5]),
        "channels": lambda: arrays.__setitem__("x", np.repeat(x, 3, axis=1)),
        "nan": lambda: arrays.__setitem__("x", np.full_like(x, np.nan)),
        "inf": lambda: arrays.__setitem__("x", np.full_like(x, np.inf)),
        "int": lambda: arrays.__setitem__("x", (x * 255).astype(np.int64)),
        "bool": lambda: arrays.__setitem__("x", x > 0.5),
        "complex": lambda: arrays.__setitem__("x", x.astype(np.complex64)),
        "strings": lambda: arrays.__setitem__("x", np.array(["a"] * len(x))),
        "scalar": lambda: arrays.__setitem__("x", np.float32(1)),
        "empty": lambda: arrays.__setitem__("x", x[:0]),
        "labels-short": lambda: arrays.__setitem__("y", arrays["y"][:-1]),
        "labels-float": lambda: arrays.__setitem__("y", arrays["y"] + 0.5),
        "no-x": lambda: arrays.pop("x"),
        "named": lambda: arrays.__setitem__("input", arrays.pop("x")),
    }
    name = rng.choice(sorted(edits))
    edits[name]()
    return f"npz:{name}", _npz_bytes(**arrays)


def _npz_bytes_damage(rng: random.Random) -> tuple[str, bytes]:
    data = bytearray(_npz_bytes(**_base_npz(rng)))
    kind = rng.choice(["truncate", "bitflip", "overwrite"])
    if kind == "truncate":
        cut = rng.randrange(1, len(data))
        return f"npz-bytes:truncate@{cut}", bytes(data[:cut])
    positions = [rng.randrange(len(data)) for _ in range(rng.randint(1, 8))]
    for pos in positions:
        data[pos] = data[pos] ^ (1 << rng.randrange(8)) if kind == "bitflip" else rng.randrange(256)
    return f"npz-bytes:{kind}@{positions}", bytes(data)


def _csv(rng: random.Random) -> tuple[str, bytes]:
    rows = [b"text,label", b"a fine day,1", b"a bad day,0"]
    kind = rng.choice(["latin1", "nul", "long-field", "unclosed-quote", "bom", "no-rows", "ragged"])
    if kind == "latin1":
        rows[1] = "caf\xe9,1".encode("latin-1")
    elif kind == "nul":
        rows[2] = b"a\x00b,0"
    elif kind == "long-field":
        rows[1] = b"a" * rng.choice([200_000, 2_000_000]) + b",1"
    elif kind == "unclosed-quote":
        rows[1] = b'"never closed,1'
    elif kind == "bom":
        rows[0] = b"\xef\xbb\xbf" + rows[0]
    elif kind == "no-rows":
        rows = rows[:1]
    else:
        rows[2] = b"x,y,z,w"
    return f"csv:{kind}", b"\n".join(rows) + b"\n"


#: (writer, suffix, weight)
_MUTATORS: dict[str, tuple[Callable[[random.Random], tuple[str, bytes]], str, int]] = {
    "array": (_array_edit, ".npz", 4),
    "bytes": (_npz_bytes_damage, ".npz", 3),
    "csv": (_csv, ".csv", 2),
}

#: command argv after the data path's option; {model}: the CNN package, {data}: the file, {out}: a new folder
COMMANDS: dict[str, list[str]] = {
    "eval-data": ["quantize", "{model}", "-o", "{out}/", "--eval-data", "{data}"],
    "calibration": [
        "quantize",
        "{model}",
        "-o",
        "{out}/",
        "--mode",
        "static",
        "--calibration-data",
        "{data}",
    ],
    "evaluate": ["evaluate", "{model}", "--data", "{data}"],
}


def _fuzz(source: Path, root: Path, seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    names = sorted(_MUTATORS)
    weights = [_MUTATORS[n][2] for n in names]
    failures = []
    for i in range(count):
        make, suffix, _ = _MUTATORS[rng.choices(names, weights)[0]]
        what, blob = make(rng)
        folder = root / str(i)
        folder.mkdir()
        data = folder / f"data{suffix}"
        data.write_bytes(blob)
        command = rng.choice(sorted(COMMANDS))
        values = {"model": str(source), "data": str(data), "out": str(folder / "out")}
        argv = [a.format(**values) for a in COMMANDS[command]]
        before = snapshot(folder)
        outcome = run_inprocess(argv, LIMIT_S)
        found = problems(outcome, before, snapshot(folder))
        if outcome.code == 1 and str(data) not in outcome.output and "Error:" in outcome.output:
            found.append("the error does not name the data file")
        if found:
            last = outcome.output.strip().splitlines()[-2:]
            failures.append(f"{command} {seed}:{i}:{what}: {found} {last}")
    return failures


def test_check_evaluate_reads_npz(fuzz_source: Path, tmp_path: Path) -> None:
    """The harness itself: the intact files give exit 0 on every command."""
    data = tmp_path / "d.npz"
    data.write_bytes(_npz_bytes(**_base_npz(random.Random(0))))
    for command, argv in COMMANDS.items():
        values = {"model": str(fuzz_source), "data": str(data), "out": str(tmp_path / command)}
        outcome = run_inprocess([a.format(**values) for a in argv], 120)
        assert outcome.code == 0, (command, outcome.output[-2000:])


def test_mutated_data_files_fail_cleanly(fuzz_source: Path, tmp_path: Path) -> None:
    failures = _fuzz(fuzz_source, tmp_path, seed=31, count=60)
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_mutated_data_files_fail_cleanly_many(fuzz_source: Path, tmp_path: Path, seed: int) -> None:
    failures = _fuzz(fuzz_source, tmp_path, seed=3100 + seed, count=600)
    assert not failures, "\n".join(failures)


def test_eval_data_is_checked_before_quantizing(
    fuzz_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong-shape --eval-data file is refused before the quantizer runs (options are checked before work):
    the quantizer is replaced by a failing stand-in, so reaching it fails the test."""
    import modelexport.optimize.quantization as quantization

    data = tmp_path / "wrong.npz"
    data.write_bytes(_npz_bytes(x=np.zeros((3, 5), np.float32)))
    monkeypatch.setattr(
        quantization, "quantize_proto", lambda *a, **k: pytest.fail("quantized before the check")
    )
    outcome = run_inprocess(
        ["quantize", str(fuzz_source), "-o", str(tmp_path / "out") + "/", "--eval-data", str(data)], 60
    )
    assert outcome.code == 1 and str(data) in outcome.output, outcome.output[-1000:]
    assert not (tmp_path / "out").exists()

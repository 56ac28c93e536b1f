"""Tampered metadata (re-signed, so the checksum passes), hostile JSON and option values: one-line errors.

A signed file is not a trusted file: each value is checked against its schema before use. Options are
range-checked in their config dataclass before any work starts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from modelexport.metadata import schema
from modelexport.metadata._proto import read_props, rewrite_props
from tests.fuzz.harness import problems, run_inprocess, snapshot


def _resign(src: Path, dst: Path, key: str, value: object) -> None:
    """Copy ``src`` with ``key`` set to ``value`` (raw JSON) and the checksum re-computed, as an attacker would."""
    stored = dict(read_props(src))
    encoding = json.loads(stored[schema.KEY_ENCODING])
    encoding[key] = "json"
    stored[key] = json.dumps(value)
    stored[schema.KEY_ENCODING] = json.dumps(encoding)
    covered = {k: stored[k] for k in (*encoding, schema.KEY_ENCODING)}
    stored[schema.KEY_CHECKSUM] = schema._checksum(covered)
    rewrite_props(src, dst, stored)


TAMPERED = {
    "config-list": (schema.KEY_MODEL_CONFIG, [1, 2]),
    "id2label-list": (schema.KEY_MODEL_CONFIG, {"id2label": ["a", "b"]}),
    "id2label-keys": (schema.KEY_MODEL_CONFIG, {"id2label": {"x": "a"}}),
    "mean-string": (schema.KEY_PROCESSOR_CONFIG, {"image_mean": "0.5", "size": {"height": 8, "width": 8}}),
    "negative-size": (schema.KEY_PROCESSOR_CONFIG, {"size": {"height": -8, "width": 8}}),
    "resample-99": (schema.KEY_PROCESSOR_CONFIG, {"resample": 99, "size": {"height": 8, "width": 8}}),
    "inputs-dict": (schema.KEY_INPUTS, {"name": "x"}),
    "ttt-1e9": (schema.KEY_TEST_TIME_POLICY, {"ttt": "bn", "ttt_iterations": 10**9}),
    "ttt-string": (schema.KEY_TEST_TIME_POLICY, {"ttt": "bn", "ttt_iterations": "many"}),
    "deep": (schema.KEY_MODEL_CONFIG, {"a": json.loads("[" * 500 + "]" * 500)}),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_resigned_metadata_is_validated(fuzz_source: Path, fuzz_image: Path, tmp_path: Path, case: str):
    key, value = TAMPERED[case]
    folder = tmp_path / case
    shutil.copytree(fuzz_source, folder)
    _resign(fuzz_source / "model.onnx", folder / "model.onnx", key, value)
    commands = [["metadata", str(folder)], ["infer", str(folder), "--image", str(fuzz_image)]]
    if key == schema.KEY_TEST_TIME_POLICY:  # printed as is; TestTimePolicy checks it where it is used
        commands = commands[1:]
    for argv in commands:
        before = snapshot(folder)
        outcome = run_inprocess(argv, 60)
        assert not problems(outcome, before, snapshot(folder)), (argv, outcome.output)
        assert outcome.code == 1, (argv, outcome.output)
        errors = [line for line in outcome.output.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and len(errors[0]) < 400, outcome.output


def test_deep_manifest_refused_before_the_checksum(fuzz_source: Path, tmp_path: Path):
    stored = dict(read_props(fuzz_source / "model.onnx"))
    stored[schema.KEY_ENCODING] = "[" * 100_000 + "]" * 100_000
    rewrite_props(fuzz_source / "model.onnx", tmp_path / "model.onnx", stored)
    outcome = run_inprocess(["metadata", str(tmp_path / "model.onnx")], 30)
    assert outcome.code == 1 and "nested more than" in outcome.output, outcome.output


def test_metadata_set_refuses_an_invalid_value(fuzz_source: Path, tmp_path: Path):
    shutil.copytree(fuzz_source, tmp_path / "m")
    model = tmp_path / "m" / "model.onnx"
    before = model.read_bytes()
    outcome = run_inprocess(["metadata", str(model), "--set", 'hf_processor_config={"resample": 99}'], 30)
    assert outcome.code == 1 and "resample" in outcome.output, outcome.output
    assert model.read_bytes() == before


SPECS: dict[str, bytes] = {
    "number": b"5",
    "one-value-range": b'{"inputs": [{"name": "x", "shape": [2, 1, 8, 8], "range": [1]}]}',
    "string-range": b'{"inputs": [{"name": "x", "shape": [2, 1, 8, 8], "range": ["a", "b"]}]}',
    "string-shape": b'{"inputs": [{"name": "x", "shape": "2188"}]}',
    "non-utf8": b'{"inputs": [{"name": "\xff\xfe", "shape": [1]}]}',
    "deep": b"[" * 50_000 + b"]" * 50_000,
    "huge-batch": b'{"inputs": [{"name": "x", "shape": [1000000000000, 1, 8, 8]}]}',
    "huge-image": b'{"inputs": [{"name": "x", "shape": [2, 1, 100000, 100000]}]}',
}


@pytest.mark.parametrize("case", sorted(SPECS))
def test_hostile_input_specs(tmp_path: Path, case: str):
    """Refused by ``load_input_specs`` (what ``export --input-specs`` reads) before any model is loaded."""
    from modelexport.errors import InputSpecError
    from modelexport.export.config import load_input_specs

    path = tmp_path / "specs.json"
    path.write_bytes(SPECS[case])
    with pytest.raises(InputSpecError) as info:
        load_input_specs(path)
    assert "\n" not in str(info.value)
    if case.startswith("huge"):
        assert "bytes" in str(info.value) and "available" in str(info.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["profile", "{m}", "--runs", "1000000000000"],
        ["profile", "{m}", "--warmup", "1000000000000"],
        ["profile", "{m}", "--runs", "0"],
        ["quantize", "{m}", "-o", "{d}/q.onnx", "--eval-samples", "-1"],
        ["quantize", "{m}", "-o", "{d}/q.onnx", "--calibration-samples", "100000000000"],
    ],
)
def test_option_ranges_checked_before_work(fuzz_source: Path, tmp_path: Path, argv: list[str]):
    shutil.copytree(fuzz_source, tmp_path / "m")
    values = {"m": str(tmp_path / "m" / "model.onnx"), "d": str(tmp_path / "m")}
    argv = [a.format(**values) for a in argv]
    before = snapshot(tmp_path / "m")
    outcome = run_inprocess(argv, 30)
    assert not problems(outcome, before, snapshot(tmp_path / "m")), outcome.output
    assert outcome.code == 1 and outcome.seconds < 10, outcome.output


def test_decompression_bomb_is_an_inference_error(fuzz_source: Path, tmp_path: Path):
    from PIL import Image

    bomb = tmp_path / "bomb.png"
    Image.new("L", (1, 1)).save(bomb)
    data = bytearray(bomb.read_bytes())
    data[16:24] = (100_000).to_bytes(4, "big") * 2  # IHDR width, height: 10^10 pixels
    bomb.write_bytes(bytes(data))
    outcome = run_inprocess(["infer", str(fuzz_source), "--image", str(bomb)], 60)
    assert outcome.code == 1 and "Pillow" in outcome.output, outcome.output
    assert "Traceback" not in outcome.output

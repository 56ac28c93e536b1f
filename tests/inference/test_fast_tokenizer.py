"""FastTokenizer (``tokenizers`` only) gives the same feeds as transformers' tokenizer, and serving skips torch."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import AutoTokenizer

from modelexport.inference.graph import GraphInput
from modelexport.inference.processors import ONNXTokenizer, load_tokenizer
from modelexport.inference.processors.fast_tokenizer import FastTokenizer

SRC = Path(__file__).resolve().parents[2] / "src"

SINGLE = ["hello world"]
BATCH = ["hi", "the capital of france is paris .", "what a great movie , i love it !"]
QUESTIONS = ["what is the capital ?", "who lives in london ?"]
CONTEXTS = ["paris is the capital of france .", "john lives in london , a big city by the river ."]
#: (texts, pairs, tokenizer kwargs) as ONNXTokenizer and the pipelines call the tokenizer
CASES = [
    (SINGLE, None, dict(padding=True, truncation=True, max_length=64)),
    (BATCH, None, dict(padding=True, truncation=True, max_length=64)),
    (BATCH, None, dict(padding="max_length", truncation=True, max_length=16)),
    (BATCH, None, dict(padding=True, truncation=True, max_length=5)),
    (BATCH, None, dict(padding=True, return_offsets_mapping=True, return_special_tokens_mask=True)),
    (
        QUESTIONS,
        CONTEXTS,
        dict(padding=True, truncation="only_second", max_length=14, return_offsets_mapping=True),
    ),
    (QUESTIONS, CONTEXTS, dict(padding="max_length", truncation=True, max_length=12)),
]


def _folders(task_source: Any, minilm_dir: Path) -> dict[str, Path]:
    return {"tiny_bert": task_source("seq_cls"), "minilm": minilm_dir}


def _assert_same(ours: Any, theirs: Any) -> None:
    theirs = {k: np.asarray(v) for k, v in theirs.items()}
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=key)


@pytest.mark.parametrize("which", ["tiny_bert", "minilm"])
def test_same_arrays_as_transformers(which: str, task_source: Any, minilm_dir: Path) -> None:
    folder = _folders(task_source, minilm_dir)[which]
    fast = FastTokenizer.from_folder(folder)
    assert fast is not None
    ref = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    for texts, pairs, kwargs in CASES:
        args = (texts, pairs) if pairs is not None else (texts,)
        ours, theirs = fast(*args, return_tensors="np", **kwargs), ref(*args, return_tensors="np", **kwargs)
        _assert_same(ours, theirs)
        if pairs is not None:
            assert [ours.sequence_ids(i) for i in range(len(texts))] == [
                theirs.sequence_ids(i) for i in range(len(texts))
            ]
    ids = fast(BATCH, padding=True)["input_ids"][1]
    tokens = fast.convert_ids_to_tokens(ids.tolist())
    assert tokens == ref.convert_ids_to_tokens(ids.tolist())
    assert fast.convert_tokens_to_string(tokens) == ref.convert_tokens_to_string(tokens)
    assert fast.convert_tokens_to_ids(tokens) == ref.convert_tokens_to_ids(tokens)
    for name in (
        "cls_token_id",
        "sep_token_id",
        "pad_token_id",
        "unk_token",
        "mask_token",
        "model_max_length",
    ):
        assert getattr(fast, name) == getattr(ref, name), name


@pytest.mark.parametrize("seq", [None, 16])
def test_same_feeds_for_dynamic_and_fixed_graphs(seq: int | None, minilm_dir: Path) -> None:
    """The processor's feeds (cast to the graph's inputs) match with either tokenizer underneath."""
    inputs = [GraphInput(n, (None, seq), "int64") for n in ("input_ids", "attention_mask", "token_type_ids")]
    ref = ONNXTokenizer(AutoTokenizer.from_pretrained(str(minilm_dir), local_files_only=True), inputs)
    fast = ONNXTokenizer(load_tokenizer(minilm_dir), inputs)
    assert isinstance(fast.tokenizer, FastTokenizer)
    assert fast.max_length == ref.max_length
    for texts in (SINGLE, BATCH, BATCH[::-1] * 3):
        _assert_same(fast(texts=texts), ref(texts=texts))


def test_uncovered_folders_fall_back_to_transformers(
    task_source: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = task_source("seq_cls")
    no_json = tmp_path / "no_json"
    shutil.copytree(src, no_json)
    (no_json / "tokenizer.json").unlink()
    assert not isinstance(load_tokenizer(no_json), FastTokenizer)

    cased = tmp_path / "cased"  # transformers 4 rebuilds the normalizer from do_lower_case at load time
    shutil.copytree(src, cased)
    config = json.loads((cased / "tokenizer_config.json").read_text())
    (cased / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}))
    with caplog.at_level(logging.DEBUG, logger="modelexport.inference.processors.fast_tokenizer"):
        tok = load_tokenizer(cased)
    assert not isinstance(tok, FastTokenizer)
    assert "do_lower_case" in caplog.text
    assert tok(["Hello"])["input_ids"] == AutoTokenizer.from_pretrained(str(cased))(["Hello"])["input_ids"]

    fast = FastTokenizer.from_folder(src)
    assert fast is not None
    enc = fast(
        ["hello world"], padding=True, return_length=True, return_tensors="np"
    )  # not covered: delegated
    assert enc["length"].tolist() == [4]


def _run(code: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


_HEAVY = (
    "json.dumps([m for m in ('torch', 'transformers.modeling_utils', 'transformers') if m in sys.modules])"
)


def test_serving_imports_neither_torch_nor_transformers(task_export: Any) -> None:
    folder = task_export("seq_cls").output_dir
    assert (Path(folder) / "tokenizer.json").is_file()
    cli = _run(
        "import json, sys\nfrom modelexport.cli.app import main\n"
        f"try:\n    main(['infer', {str(folder)!r}, '--text', 'hi', '--json'])\nexcept SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        f"print({_HEAVY})"
    )
    assert cli == []
    api = _run(
        "import json, sys\nimport modelexport\n"
        f"pipe = modelexport.pipeline(model={str(folder)!r})\nassert pipe(['hi', 'good movie'])[0]['label']\n"
        f"print({_HEAVY})"
    )
    assert api == []
    assert _run(f"import json, sys\nimport modelexport.inference\nprint({_HEAVY})") == []


@pytest.mark.compat
@pytest.mark.parametrize("clean_up", [None, True, False])
def test_decode_equals_transformers(clean_up: bool | None, minilm_dir: Path, tmp_path: Path) -> None:
    """What the generation pipeline prints: ids -> text as transformers' tokenizer decodes them, special tokens
    kept or skipped, with the clean-up of spaces before punctuation on, off, or left to the default."""
    folder = tmp_path / "tok"
    shutil.copytree(minilm_dir, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.onnx"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("clean_up_tokenization_spaces", None)
    if clean_up is not None:
        config["clean_up_tokenization_spaces"] = clean_up
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    fast, full = FastTokenizer.from_folder(folder), AutoTokenizer.from_pretrained(str(folder))
    assert fast is not None
    rng = np.random.default_rng(0)
    sequences = [full(text)["input_ids"] for text in [*BATCH, *CONTEXTS, "it is n't so , is it ? yes !"]]
    sequences += [rng.integers(0, len(full), size=12).tolist() for _ in range(20)]
    for ids in sequences:
        for skip in (True, False):
            assert fast.decode(np.array(ids), skip_special_tokens=skip) == full.decode(
                ids, skip_special_tokens=skip
            )
    assert fast._full is None  # transformers' tokenizer was never needed
    fast.pad_token = None
    assert fast.pad_token is None and fast.pad_token_id is None
    fast.pad_token = "[SEP]"
    assert fast.pad_token_id == full.sep_token_id

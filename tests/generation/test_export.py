"""``--task text-generation-with-past``: one decoder graph with its key/value cache, tagged and verified."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from modelexport.errors import ConfigError
from modelexport.export.api import export
from modelexport.hierarchy.tags import TAG_KEY
from modelexport.metadata.schema import KEY_GENERATION, KEY_TASK
from modelexport.metadata.store import read_metadata

from .conftest import export_causal_lm

NAMES_IN = [
    "past_key_values.0.key",
    "past_key_values.0.value",
    "past_key_values.1.key",
    "past_key_values.1.value",
]
NAMES_OUT = ["logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"]


def _io(path: Path) -> tuple[list[str], list[str]]:
    model = onnx.load(str(path), load_external_data=False)
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


@pytest.mark.must
def test_graph_takes_and_returns_the_cache_with_optimum_names(llama_with_past: Any) -> None:
    _, out, result = llama_with_past
    inputs, outputs = _io(out / "model.onnx")
    assert inputs == ["input_ids", "attention_mask", "position_ids", *NAMES_IN]
    assert outputs == NAMES_OUT
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    past = next(i for i in model.graph.input if i.name == "past_key_values.0.key")
    dims = past.type.tensor_type.shape.dim
    assert dims[2].dim_param and not dims[2].dim_value, "past_sequence_length must be dynamic"


@pytest.mark.must
def test_full_coverage_topology_and_parity_on_both_steps(llama_with_past: Any) -> None:
    _, _, result = llama_with_past
    assert result.coverage["coverage_pct"] == 100.0
    assert result.topology_identical is True
    cached, first = result.parity, result.parity["first_step"]
    assert set(cached["max_abs_diff"]) == set(NAMES_OUT) == set(first["max_abs_diff"])
    assert max(cached["max_abs_diff"].values()) < 1e-4
    assert max(first["max_abs_diff"].values()) < 1e-4


def test_presents_are_tagged_with_the_attention_of_their_layer(llama_with_past: Any) -> None:
    _, out, _ = llama_with_past
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    tags = {
        o: next(p.value for p in n.metadata_props if p.key == TAG_KEY)
        for n in model.graph.node
        for o in n.output
    }
    for layer in (0, 1):
        for kind in ("key", "value"):
            assert tags[f"present.{layer}.{kind}"].endswith(f"DecoderLayer.{layer}/LlamaAttention")
    sidecar = json.loads((out / "model_hierarchy.json").read_text())
    assert json.dumps(sidecar).count("DecoderLayer.1") > 0


def test_metadata_records_cache_layout_and_generation_config(llama_with_past: Any) -> None:
    src, out, _ = llama_with_past
    meta = read_metadata(out / "model.onnx")
    assert meta[KEY_TASK] == "text-generation"
    record = meta[KEY_GENERATION]
    assert record["cache"]["layers"] == 2
    assert record["cache"]["num_key_value_heads"] == 1  # grouped-query: fewer kv heads than heads
    assert record["cache"]["head_dim"] == 16
    assert record["cache"]["dtype"] == "float32"
    assert record["cache_inputs"] == NAMES_IN and record["cache_outputs"] == NAMES_OUT[1:]
    saved = json.loads((out / "generation_config.json").read_text())
    original = json.loads((src / "generation_config.json").read_text())
    assert saved["eos_token_id"] == original["eos_token_id"] == record["generation_config"]["eos_token_id"]


@pytest.mark.optimum
def test_optimum_loads_the_folder_and_generates_like_transformers(llama_with_past: Any) -> None:
    import torch
    import transformers
    from optimum.onnxruntime import ORTModelForCausalLM

    src, out, _ = llama_with_past
    tok = transformers.AutoTokenizer.from_pretrained(str(src))
    tok.padding_side = "left"
    enc = tok(["hello world", "a longer prompt than the first"], padding=True, return_tensors="pt")
    enc.pop("token_type_ids", None)  # a BERT tokenizer with a causal LM
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    assert ort_model.can_use_cache
    ours = ort_model.generate(**enc, max_new_tokens=8, do_sample=False)
    with torch.no_grad():
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(src)).generate(
            **enc, max_new_tokens=8, do_sample=False
        )
    np.testing.assert_array_equal(ours.numpy(), ref.numpy())


def test_with_past_needs_the_dynamo_exporter(llama_with_past: Any, tmp_path: Path) -> None:
    src, _, _ = llama_with_past
    with pytest.raises(ConfigError, match="dynamo"):
        export(src, tmp_path / "x", task="text-generation-with-past", exporter="torchscript")
    assert not (tmp_path / "x").exists()


def test_a_model_without_a_cache_argument_is_refused(tmp_path: Path) -> None:
    import torch

    with pytest.raises(ConfigError, match="past_key_values"):
        export(torch.nn.Linear(4, 2), tmp_path / "x", task="text-generation-with-past")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "qwen2", "phi3"])
def test_other_decoders_export_with_past(name: str, minilm_dir: Path, tmp_path: Path) -> None:
    import torch
    import transformers

    from modelexport.inference import pipeline

    src, out, result = export_causal_lm(name, minilm_dir, tmp_path)
    assert result.coverage["coverage_pct"] == 100.0
    assert max(result.parity["max_abs_diff"].values()) < 1e-4
    assert max(result.parity["first_step"]["max_abs_diff"].values()) < 1e-4
    inputs, outputs = _io(out / "model.onnx")
    assert set(NAMES_IN) <= set(inputs) and outputs == NAMES_OUT
    pipe = pipeline("text-generation", model=out)
    ids, mask = pipe.encode(["hello world", "the quick brown fox jumps"])
    ours = pipe.generate(ids, mask, pipe.settings(max_new_tokens=10))
    with torch.no_grad():
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(src)).generate(
            torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=10, do_sample=False
        )
    np.testing.assert_array_equal(ours, ref.numpy())


@pytest.mark.regression
def test_sliding_window_layers_export_with_past_and_generate_like_transformers(
    minilm_dir: Path, tmp_path: Path
) -> None:
    """The model's own cache trims a sliding-window layer to its window, so the example's layers had different
    past lengths and the export failed; the prefill now fills a plain cache (the mask applies the window)."""
    import torch
    import transformers

    from modelexport.inference import pipeline

    src, out, result = export_causal_lm("gemma3", minilm_dir, tmp_path)
    assert result.coverage["coverage_pct"] == 100.0 and result.parity["passed"]
    pipe = pipeline("text-generation", model=out)
    prompts = ["the quick brown fox jumps over the lazy dog", "hello"]  # the first longer than the window
    ids, mask = pipe.encode(prompts)
    ours = pipe.generate(ids, mask, pipe.settings(max_new_tokens=8))
    with torch.no_grad():
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(src)).generate(
            torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=8, do_sample=False
        )
    np.testing.assert_array_equal(ours, ref.numpy())

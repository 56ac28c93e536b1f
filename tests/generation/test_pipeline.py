"""``pipeline("text-generation")`` and ``modelexport infer --max-new-tokens``: token ids equal to transformers'
``generate`` on the same PyTorch model, the cache kept in ONNX Runtime between steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelexport.cli.app import main
from modelexport.errors import ConfigError
from modelexport.inference import pipeline
from tests.helpers import message_lines

PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog"]


@pytest.fixture(scope="module")
def gen(llama_with_past: Any) -> tuple[Any, Any, Any, Any]:
    """(pipeline, PyTorch model, left-padded ids, mask) for the tiny Llama."""
    import transformers

    src, out, _ = llama_with_past
    pipe = pipeline("text-generation", model=out)
    ids, mask = pipe.encode(PROMPTS)
    return pipe, transformers.AutoModelForCausalLM.from_pretrained(str(src)).eval(), ids, mask


def _reference(model: Any, ids: np.ndarray, mask: np.ndarray, **options: Any) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), **options)
    return out.numpy()


def test_prompts_are_left_padded(gen: Any) -> None:
    _, _, ids, mask = gen
    assert mask[0, 0] == 0 and mask[0, -1] == 1 and mask[1].all()


@pytest.mark.compat
@pytest.mark.must
@pytest.mark.parametrize(
    "options",
    [{}, {"repetition_penalty": 1.3}, {"num_beams": 3}],
    ids=["greedy", "repetition-penalty", "beam-search"],
)
def test_token_ids_equal_transformers_generate(gen: Any, options: dict[str, Any]) -> None:
    pipe, model, ids, mask = gen
    ours = pipe.generate(ids, mask, pipe.settings(max_new_tokens=12, **options))
    np.testing.assert_array_equal(
        ours, _reference(model, ids, mask, max_new_tokens=12, do_sample=False, **options)
    )


def test_generation_stops_at_eos_and_pads_finished_rows(gen: Any) -> None:
    pipe, model, ids, mask = gen
    free = pipe.generate(ids, mask, pipe.settings(max_new_tokens=6))
    eos = int(free[0, ids.shape[1] + 1])  # row 0's second new token becomes the end of sequence
    saved = dict(pipe.generation_config)
    pipe.generation_config["eos_token_id"] = eos
    try:
        stopped = pipe.generate(ids, mask, pipe.settings(max_new_tokens=6))
    finally:
        pipe.generation_config = saved
    ref = _reference(
        model, ids, mask, max_new_tokens=6, do_sample=False, eos_token_id=eos, pad_token_id=pipe.pad_id
    )
    np.testing.assert_array_equal(stopped, ref)
    row0 = stopped[0, ids.shape[1] :]
    assert row0[1] == eos and (row0[2:] == pipe.pad_id).all()


@pytest.mark.parametrize("position", [1, 3])
def test_beam_search_finishes_hypotheses_at_eos_like_transformers(gen: Any, position: int) -> None:
    pipe, model, ids, mask = gen
    free = pipe.generate(ids, mask, pipe.settings(max_new_tokens=8, num_beams=3))
    eos = int(free[0, ids.shape[1] + position])
    saved = dict(pipe.generation_config)
    pipe.generation_config["eos_token_id"] = eos
    try:
        ours = pipe.generate(ids, mask, pipe.settings(max_new_tokens=8, num_beams=3))
    finally:
        pipe.generation_config = saved
    ref = _reference(
        model,
        ids,
        mask,
        max_new_tokens=8,
        num_beams=3,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=pipe.pad_id,
    )
    np.testing.assert_array_equal(ours, ref)
    assert (ours[:, ids.shape[1] :] == eos).any()


def test_sampling_is_seeded_and_narrow_filters_reduce_to_greedy(gen: Any) -> None:
    pipe, _, ids, mask = gen
    greedy = pipe.generate(ids, mask, pipe.settings(max_new_tokens=8))
    one = pipe.generate(ids, mask, pipe.settings(max_new_tokens=8, do_sample=True, seed=3, top_k=1))
    nucleus = pipe.generate(ids, mask, pipe.settings(max_new_tokens=8, do_sample=True, seed=3, top_p=1e-6))
    np.testing.assert_array_equal(one, greedy)
    np.testing.assert_array_equal(nucleus, greedy)
    hot = dict(max_new_tokens=8, do_sample=True, temperature=5.0)
    a = pipe.generate(ids, mask, pipe.settings(seed=7, **hot))
    b = pipe.generate(ids, mask, pipe.settings(seed=7, **hot))
    c = pipe.generate(ids, mask, pipe.settings(seed=8, **hot))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, greedy) and not np.array_equal(a, c)  # 30k-token vocab, flat distribution


def test_cache_stays_in_onnx_runtime_between_steps(gen: Any) -> None:
    import onnxruntime as ort

    pipe, _, ids, mask = gen
    past = pipe.cache.empty(len(ids))
    scores, past = pipe._run(pipe._step_feeds(ids, mask, ids.shape[1]), past)
    assert scores.shape == (2, pipe.model_config["vocab_size"])
    assert len(past) == 4 and all(isinstance(p, ort.OrtValue) for p in past)
    assert past[0].shape() == [2, 1, ids.shape[1], 16]


def test_output_format_follows_the_transformers_pipeline(gen: Any) -> None:
    pipe, _, _, _ = gen
    one = pipe(PROMPTS[0], max_new_tokens=5)
    assert isinstance(one, list) and set(one[0]) == {"generated_text"}
    assert one[0]["generated_text"].startswith(PROMPTS[0]) and len(one[0]["generated_text"]) > len(PROMPTS[0])
    many = pipe(PROMPTS, max_new_tokens=5)
    assert [m[0]["generated_text"][: len(p)] for m, p in zip(many, PROMPTS, strict=True)] == PROMPTS
    assert many[0] == one
    assert pipe(PROMPTS, max_new_tokens=5, batch_size=2) == many  # left padding in a batch changes nothing
    only_new = pipe(PROMPTS[0], max_new_tokens=5, return_full_text=False)
    assert one[0]["generated_text"].endswith(only_new[0]["generated_text"])


def test_options_out_of_range_fail_before_running(gen: Any) -> None:
    pipe, _, _, _ = gen
    for bad in (
        {"max_new_tokens": 0},
        {"top_p": 0.0},
        {"temperature": 0},
        {"num_beams": 2, "do_sample": True},
    ):
        with pytest.raises(ConfigError):
            pipe("hi", **bad)
    with pytest.raises(ConfigError, match="unknown generation options"):
        pipe("hi", max_tokens=3)


def test_cli_infer_generates(llama_with_past: Any, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = llama_with_past
    code = main(["infer", str(out), "--text", PROMPTS[0], "--max-new-tokens", "4", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["task"] == "text-generation"
    assert doc["predictions"][0][0]["generated_text"].startswith(PROMPTS[0])
    code = main(["infer", str(out), "--text", PROMPTS[0], "--max-new-tokens", "4", "--do-sample", "--seed", "1",
                 "--top-k", "1"])  # fmt: skip
    out = message_lines(capsys.readouterr().out)
    assert code == 0 and out[1].startswith(f"{PROMPTS[0]} -> ") and len(out[1]) > len(PROMPTS[0]) + 4, out
    assert sum(PROMPTS[0] in line for line in out) == 1, "the streamed text is printed once"


def test_cli_refuses_generation_options_for_other_tasks(tiny_bert_export: Any) -> None:
    out = Path(tiny_bert_export.output_dir)
    assert main(["infer", str(out), "--text", "hi", "--max-new-tokens", "3"]) != 0

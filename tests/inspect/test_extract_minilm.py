"""The extraction proof on the real all-MiniLM-L6-v2: every BertLayer cut out equals PyTorch within 1e-4."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from modelexport.inspect.extract import extract_module_subgraph
from tests.inspect.conftest import (
    assert_outputs_match,
    bind_inputs,
    capture_calls,
    intermediate_values,
    run_subgraph,
)


@pytest.mark.must
@pytest.mark.integration
def test_every_minilm_bert_layer_matches_torch(minilm_export: Any, minilm_dir: Path) -> None:
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(minilm_dir)).eval()
    tok = AutoTokenizer.from_pretrained(str(minilm_dir))
    enc = tok(["hierarchy tags make every layer addressable", "short one"], padding=True, return_tensors="pt")
    example = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    assert int(example["attention_mask"].sum()) < example["attention_mask"].numel()  # padded: a real 4-D mask
    layers = list(model.encoder.layer)
    assert len(layers) == 6
    captured = {}
    for i, layer in enumerate(layers):
        with torch.no_grad():
            captured[i] = capture_calls(layer, lambda: model(**example))[0]
    subs = [extract_module_subgraph(minilm_export.onnx_path, None, f"encoder.layer.{i}") for i in range(6)]
    names = sorted({i.name for s in subs for i in s.model.graph.input})
    reference = intermediate_values(
        Path(minilm_export.onnx_path), names, {k: v.numpy() for k, v in example.items()}
    )
    for i, sub in enumerate(subs):
        ins, outs = captured[i]
        feed, from_torch = bind_inputs(sub, ins, reference)
        hidden = ins[0].numpy()
        assert any(feed[n] is not None and feed[n].shape == hidden.shape and n in from_torch for n in feed)
        worst = assert_outputs_match(run_subgraph(sub, feed), outs, atol=1e-4)
        assert sub.tag == f"/BertModel/BertEncoder/BertLayer.{i}" and worst <= 1e-4

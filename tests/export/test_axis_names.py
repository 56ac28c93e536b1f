"""Dynamic dims of a dynamo export are named by meaning, as Optimum names them for the same model and task."""

from __future__ import annotations

from typing import Any

import onnx
import pytest


def _named_axes(values: Any) -> dict[str, dict[int, str]]:
    return {
        v.name: {k: d.dim_param for k, d in enumerate(v.type.tensor_type.shape.dim) if d.dim_param}
        for v in values
    }


@pytest.mark.optimum
@pytest.mark.integration
def test_tiny_bert_dims_are_named_as_optimum_names_them(tiny_bert_export: Any) -> None:
    import transformers
    from optimum.exporters.onnx.model_configs import BertOnnxConfig

    model = onnx.load(tiny_bert_export.onnx_path, load_external_data=False)
    ours_in, ours_out = _named_axes(model.graph.input), _named_axes(model.graph.output)
    assert ours_in["input_ids"] == {0: "batch_size", 1: "sequence_length"}
    theirs = BertOnnxConfig(transformers.BertConfig(), task="feature-extraction")
    assert ours_in == {name: dict(axes) for name, axes in theirs.inputs.items()}
    for name, axes in theirs.outputs.items():
        assert ours_out[name] == dict(axes), name

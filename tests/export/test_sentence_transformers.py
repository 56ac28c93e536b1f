"""sentence-transformers folders export as the whole embedding model (Optimum's ``token_embeddings`` +
``sentence_embedding``), tagged to the last node and equal to the real sentence-transformers library."""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

import modelexport
from modelexport.cli.app import main
from modelexport.errors import ConfigError, InvalidModelError
from modelexport.export import ExportConfig
from modelexport.export.embedder import POOLING_MODES, Pooling
from modelexport.export.loading import load_model
from modelexport.hierarchy.tags import TAG_KEY
from modelexport.metadata.schema import KEY_EMBEDDING
from modelexport.metadata.store import read_metadata

pytestmark = pytest.mark.integration

#: The last one is longer than the folder's max_seq_length (24): sentence-transformers truncates there.
TEXTS = ["the capital of france is paris", "hi", " ".join(["a long sentence about many things"] * 8)]
_MAX_SEQ = 24


def sentence_folder(base: Path, root: Path, pooling: Any, normalize: bool) -> Path:
    """A sentence-transformers folder (modules.json, 1_Pooling, optional Normalize) around ``base``."""
    shutil.copytree(base, root)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pooling}))
    (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": _MAX_SEQ}))
    return root


def _st_module(name: str) -> Any:
    """A sentence-transformers module class: ``sentence_transformer.modules`` since 6.0, ``models`` before."""
    pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed")
    try:
        import sentence_transformers.sentence_transformer.modules as modules
    except ImportError:
        import sentence_transformers.models as modules
    return getattr(modules, name)


def _reference(folder: Path) -> Any:
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed")
    return st.SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def mean_folder(tiny_text_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Legacy pooling keys (what all-MiniLM-L6-v2 has), mean pooling, normalized."""
    root = tmp_path_factory.mktemp("st") / "mean"
    return sentence_folder(tiny_text_base, root, {"pooling_mode_mean_tokens": True}, normalize=True)


@pytest.fixture(scope="module")
def mean_export(mean_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return modelexport.export(mean_folder, tmp_path_factory.mktemp("st_onnx") / "mean", verify_topology=True)


@pytest.mark.must
def test_the_whole_embedding_model_is_exported_and_tagged(mean_export: Any) -> None:
    model = onnx.load(str(mean_export.onnx_path))
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]  # as Optimum's
    assert [o.name for o in model.graph.output] == ["token_embeddings", "sentence_embedding"]
    assert mean_export.coverage["coverage_pct"] == 100.0 and mean_export.topology_identical
    tags = Counter(p.value for n in model.graph.node for p in n.metadata_props if p.key == TAG_KEY)
    assert sum(tags.values()) == len(model.graph.node)
    assert tags["/SentenceEmbedder/Pooling"] >= 3 and tags["/SentenceEmbedder/Normalize"] >= 2
    assert any(t.startswith("/SentenceEmbedder/BertModel/BertEncoder/BertLayer.") for t in tags)
    meta = read_metadata(mean_export.onnx_path)
    assert meta["hf_pipeline_task"] == "feature-extraction"
    assert meta[KEY_EMBEDDING] == {
        "library": "sentence-transformers",
        "output": "sentence_embedding",
        "token_output": "token_embeddings",
        "pooling": ["mean"],
        "normalize": True,
        "max_seq_length": _MAX_SEQ,
    }
    manifest = json.loads((mean_export.output_dir / "export_metadata.json").read_text())
    assert manifest["metadata"][KEY_EMBEDDING] == meta[KEY_EMBEDDING]  # the folder's record says it too
    tokenizer = json.loads((mean_export.output_dir / "tokenizer_config.json").read_text())
    assert tokenizer["model_max_length"] == _MAX_SEQ  # the packaged tokenizer truncates where it does


@pytest.mark.must
def test_pipeline_equals_sentence_transformers_encode(mean_export: Any, mean_folder: Path) -> None:
    reference = _reference(mean_folder)
    pipe = modelexport.pipeline(model=mean_export.output_dir)  # task and embedding from the metadata
    got = np.stack(pipe(TEXTS, batch_size=3, return_tensors=True))
    want = reference.encode(TEXTS, batch_size=3)
    assert got.shape == want.shape == (3, 32)
    assert np.abs(got - want).max() < 1e-5
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    tokens = pipe(TEXTS[0], output_value="token_embeddings", return_tensors=True)
    want_tokens = reference.encode(TEXTS[0], output_value="token_embeddings").numpy()
    assert np.abs(tokens[0] - want_tokens).max() < 1e-5


@pytest.mark.must
def test_infer_returns_the_sentence_embedding(
    mean_export: Any, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="modelexport")
    assert (
        main(["--log-level", "info", "infer", str(mean_export.output_dir), "--text", TEXTS[0], "--json"]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    loading = [r.getMessage() for r in caplog.records if r.name == "modelexport.inference.pipelines.factory"]
    assert any(m.startswith("session ok in") for m in loading), loading  # infer's load progress
    want = modelexport.pipeline(model=mean_export.output_dir)(TEXTS[0])
    assert doc["task"] == "feature-extraction" and len(doc["predictions"][0]) == 32
    assert np.allclose(doc["predictions"][0], want, atol=1e-6)


@pytest.mark.sanity
def test_concatenated_modes_without_normalize(tiny_text_base: Path, tmp_path: Path) -> None:
    """The newer ``pooling_mode`` list: max and cls concatenated (masked -inf fill and a gather in ONNX)."""
    folder = sentence_folder(
        tiny_text_base, tmp_path / "st", {"pooling_mode": ["max", "cls"]}, normalize=False
    )
    result = modelexport.export(folder, tmp_path / "onnx")
    assert result.coverage["coverage_pct"] == 100.0
    got = np.stack(modelexport.pipeline(model=tmp_path / "onnx")(TEXTS, batch_size=3, return_tensors=True))
    want = _reference(folder).encode(TEXTS, batch_size=3)
    assert got.shape == (3, 64) and np.abs(got - want).max() < 1e-5


@pytest.mark.must
@pytest.mark.compat
@pytest.mark.parametrize("modes", [(m,) for m in POOLING_MODES] + [("mean", "max")])
def test_pooling_equals_sentence_transformers(modes: tuple[str, ...]) -> None:
    """Every mode, on padded rows (right and left padding), equals sentence-transformers' own Pooling."""
    tokens = torch.randn(3, 7, 8, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1] * 7, [1, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1, 1]])
    import sentence_transformers as st

    theirs = _st_module("Pooling")(8, pooling_mode=modes if len(modes) > 1 else modes[0])
    want = theirs({"token_embeddings": tokens, "attention_mask": mask})["sentence_embedding"]
    rows = slice(None)
    if "weightedmean" in modes and int(st.__version__.split(".")[0]) < 6:
        rows = slice(
            0, 2
        )  # 5.x weighs a left-padded row from position 0; 6.x (and ours) from its first token
    assert torch.allclose(Pooling(modes)(tokens, mask)[rows], want[rows], atol=1e-6)


@pytest.mark.sanity
def test_folders_we_cannot_export_whole_are_refused(
    mean_folder: Path, tiny_text_base: Path, tmp_path: Path
) -> None:
    dense = tmp_path / "dense"
    shutil.copytree(mean_folder, dense)
    modules = json.loads((dense / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (dense / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(InvalidModelError, match="Dense.*not supported") as err:
        modelexport.export(dense, tmp_path / "out")
    assert "--library transformers" in (err.value.hint or "")
    assert not (tmp_path / "out").exists()
    with pytest.raises(InvalidModelError, match="not a sentence-transformers folder"):
        load_model(tiny_text_base, library="sentence-transformers")
    with pytest.raises(ConfigError, match="library must be one of"):
        ExportConfig(library="sbert")
    with pytest.raises(InvalidModelError, match="pooling mode"):
        Pooling(("median",))


@pytest.mark.sanity
def test_library_transformers_keeps_the_transformer_alone(mean_folder: Path) -> None:
    loaded = load_model(mean_folder, library="transformers")
    assert type(loaded.module).__name__ == "BertModel" and loaded.sentence is None
    whole = load_model(mean_folder)
    assert type(whole.module).__name__ == "SentenceEmbedder" and whole.source == "sentence-transformers"
    assert (
        whole.hf_config.to_dict() == loaded.hf_config.to_dict()
    )  # the metadata's config is the transformer's


@pytest.mark.slow
def test_real_all_minilm_l6_v2(minilm_dir: Path, tmp_path: Path) -> None:
    """The real all-MiniLM-L6-v2 folder (modules.json, 1_Pooling, Normalize listed) against encode()."""
    result = modelexport.export(minilm_dir, tmp_path / "onnx", verify_topology=True)
    assert result.coverage["coverage_pct"] == 100.0
    got = np.stack(modelexport.pipeline(model=tmp_path / "onnx")(TEXTS, batch_size=3, return_tensors=True))
    want = _reference(minilm_dir).encode(TEXTS, batch_size=3)
    assert got.shape == (3, 384) and np.abs(got - want).max() < 1e-5


@pytest.mark.must
@pytest.mark.compat
def test_a_folder_saved_by_the_installed_sentence_transformers(tiny_text_base: Path, tmp_path: Path) -> None:
    """What ``SentenceTransformer.save`` writes today (6.x: ``embedding_dimension``, ``pooling_mode`` and new
    module paths; 3-5.x: the ``models`` names) exports whole and equals ``encode``, long texts truncated."""
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed")
    transformer = _st_module("Transformer")(str(tiny_text_base), max_seq_length=_MAX_SEQ)
    pooling = _st_module("Pooling")(32, pooling_mode="mean")
    model = st.SentenceTransformer(modules=[transformer, pooling, _st_module("Normalize")()], device="cpu")
    model.save(str(tmp_path / "st"))
    result = modelexport.export(tmp_path / "st", tmp_path / "onnx")
    assert result.coverage["coverage_pct"] == 100.0 and result.parity["passed"]
    texts = [*TEXTS, "word " * (3 * _MAX_SEQ)]
    got = np.stack(modelexport.pipeline(model=tmp_path / "onnx")(texts, batch_size=2, return_tensors=True))
    want = st.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(texts, batch_size=2)
    assert got.shape == want.shape and np.abs(got - want).max() < 1e-5

"""``quantize`` / ``optimize`` on a multi-graph package folder: every graph transformed, a complete package out.

The package is made of tagged exports already in the session (seconds, not the ~30 s of a T5 export): the
tiny BERT as ``encoder_model.onnx`` and ``decoder_with_past_model.onnx``, the tiny classifier as
``decoder_model.onnx`` (other outputs, so a graph written under another graph's name shows). The real
encoder-decoder packages (T5, Whisper) run in ``tests/generation/test_seq2seq.py`` (slow).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from modelexport.cli.app import main
from modelexport.errors import ConfigError, OutputExistsError
from modelexport.export.api import export
from modelexport.onnxfile import (
    PACKAGE_MANIFEST,
    package_components,
    read_manifest,
    resolve_model_path,
    sidecar_path_for,
    variant_file,
)
from modelexport.optimize import optimize_model, quantize, tag_coverage
from modelexport.optimize.export_pass import package_variants
from modelexport.optimize.package import PackageResult
from modelexport.runtime.session import create_session
from tests.optimize.conftest import bert_feeds

ROLES = {
    "encoder": "encoder_model.onnx",
    "decoder": "decoder_model.onnx",
    "decoder_with_past": "decoder_with_past_model.onnx",
}
#: int8 (dynamic, per tensor) vs fp32 on the tiny BERTs: max abs diff of every output over its range (measured 0.4-0.7%).
INT8_REL_BOUND = 0.02


@pytest.fixture()
def package(tiny_bert_export: Any, seq_cls_export: Any, tmp_path: Path) -> Path:
    """A three-graph package folder: graphs with their sidecars, the classifier's config and tokenizer files,
    and a manifest that lists the graphs under ``components`` as export writes it."""
    bert, cls = Path(tiny_bert_export.output_dir), Path(seq_cls_export.output_dir)
    folder = tmp_path / "pkg"
    folder.mkdir()
    for src, name in ((bert, ROLES["encoder"]), (cls, ROLES["decoder"]), (bert, ROLES["decoder_with_past"])):
        shutil.copy(src / "model.onnx", folder / name)
        shutil.copy(src / "model_hierarchy.json", sidecar_path_for(folder / name))
    manifest = read_manifest(cls)
    for name in manifest["files"]:
        shutil.copy(cls / name, folder / name)
    graph_files = [n for f in ROLES.values() for n in (f, sidecar_path_for(f).name)]
    manifest.update(components=ROLES, files=sorted({*manifest["files"], *graph_files}))
    (folder / PACKAGE_MANIFEST).write_text(json.dumps(manifest))
    return folder


def _outputs(path: Path) -> list[str]:
    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def _run(path: Path) -> list[np.ndarray]:
    return create_session(path)[0].run(None, bert_feeds(2, seq=8, vocab=50))


def _check_package(src: Path, out: Path, result: PackageResult) -> None:
    """Every graph under its exported name, from the graph of that role, tagged, with its sidecar; the
    package's files beside them; a manifest with the graphs and nothing of the source's variants."""
    assert list(result.components) == list(ROLES)
    for role, name in ROLES.items():
        graph = onnx.load(str(out / name))
        assert _outputs(out / name) == _outputs(src / name), role
        assert tag_coverage(graph)["coverage_pct"] == 100.0, role
        sidecar = json.loads(sidecar_path_for(out / name).read_text())
        assert len(sidecar["nodes"]) == len(graph.graph.node), role
        assert result.components[role].output_path == out / name
    manifest = read_manifest(out)
    assert manifest["components"] == ROLES and "variants" not in manifest and "deployed_model" not in manifest
    assert manifest["metadata"] == read_manifest(src)["metadata"]
    assert {"config.json", "tokenizer.json"} <= set(manifest["files"]) <= set(result.files)
    assert sorted(p.name for p in out.iterdir()) == result.files
    assert resolve_model_path(out) == out / ROLES["encoder"]


@pytest.mark.smoke
def test_quantize_folder_writes_every_graph_as_a_package(package: Path, tmp_path: Path) -> None:
    out = tmp_path / "int8"
    result = quantize(package, out)
    assert isinstance(result, PackageResult) and result.kind == "quantize"
    _check_package(package, out, result)
    for role, name in ROLES.items():
        assert result.components[role].quantized_per_module, role
        for ref, got in zip(_run(package / name), _run(out / name), strict=True):
            assert np.abs(got - ref).max() <= INT8_REL_BOUND * np.ptp(ref), role


@pytest.mark.smoke
def test_optimize_folder_cli_o2_matches_the_unoptimized_graphs(
    package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o2"
    assert main(["optimize", str(package), "-o", str(out), "-O2"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"Optimized the 3 graphs of {package} -> {out}")
    assert text.count("hierarchy tags on 100.0%") == 3 and "decoder_with_past:" in text
    for name in ROLES.values():  # numerical equivalence, the export tolerance
        for ref, got in zip(_run(package / name), _run(out / name), strict=True):
            np.testing.assert_allclose(got, ref, atol=1e-4)
    assert main(["quantize", str(out), "-o", str(tmp_path / "q"), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["components"]) == list(ROLES) and doc["output"] == str(tmp_path / "q")


@pytest.mark.smoke
def test_exclude_modules_apply_to_the_graphs_that_have_them(package: Path, tmp_path: Path) -> None:
    result = quantize(package, tmp_path / "q", exclude_modules=("/BertForSequenceClassification/*Pooler",))
    excluded = {role: len(r.excluded_nodes) for role, r in result.components.items()}
    assert excluded["decoder"] > 0 and excluded["encoder"] == excluded["decoder_with_past"] == 0
    with pytest.raises(ConfigError, match="matches no module"):
        quantize(package, tmp_path / "none", exclude_modules=("*/NoSuchModule*",))
    assert not (tmp_path / "none").exists()


@pytest.mark.smoke
@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda p, o: quantize(p, o, mode="static"), ConfigError, "static quantization needs calibration"),
        (lambda p, o: quantize(p, o, eval_data=p / "x.csv"), ConfigError, "feed a dataset to one graph"),
        (lambda p, o: quantize(p, p), OutputExistsError, "is an input of this run"),
        (lambda p, o: optimize_model(p, o / "x.onnx"), ConfigError, "-o must name a folder"),
        (lambda p, o: quantize(p / ROLES["encoder"], p), OutputExistsError, "holds this run's input"),
    ],
    ids=["static", "eval-data", "in-place", "file-output", "one-graph-into-a-folder"],
)
def test_package_refusals_come_before_any_output(
    package: Path, tmp_path: Path, call: Any, error: type[Exception], message: str
) -> None:
    before = sorted(p.name for p in package.iterdir())
    with pytest.raises(error, match=message):
        call(package, tmp_path / "out")
    assert not (tmp_path / "out").exists() and sorted(p.name for p in package.iterdir()) == before


@pytest.mark.smoke
def test_an_output_folder_with_models_is_refused(package: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.onnx").write_bytes(b"")
    with pytest.raises(
        OutputExistsError, match=r"refusing to replace .*model\.onnx: this run did not create it"
    ):
        quantize(package, out)
    assert [p.name for p in out.iterdir()] == ["model.onnx"]


@pytest.mark.smoke
def test_each_graph_set_opens_with_its_own_decoders(package: Path) -> None:
    """An export with --optimize/--quantize lists each set of copies; a folder means the deployed set, a
    graph file the set it starts."""
    suffixes, deployed = package_variants("O2", "dynamic")
    assert (suffixes, deployed) == (["O2", "dynamic"], "O2")
    variants = {s: {r: variant_file(f, s) for r, f in ROLES.items()} for s in suffixes}
    assert variants["O2"]["decoder_with_past"] == "decoder_with_past_model_O2.onnx"
    for files in variants.values():
        for role, name in files.items():
            shutil.copy(package / ROLES[role], package / name)
    manifest = read_manifest(package)
    (package / PACKAGE_MANIFEST).write_text(json.dumps({**manifest, "variants": variants}))
    assert resolve_model_path(package) == package / ROLES["encoder"]
    assert package_components(package) == {r: package / f for r, f in ROLES.items()}
    manifest = {**manifest, "variants": variants, "deployed_model": variants["O2"]["encoder"]}
    (package / PACKAGE_MANIFEST).write_text(json.dumps(manifest))
    assert resolve_model_path(package) == package / "encoder_model_O2.onnx"
    for wanted in ("O2", "dynamic"):
        entry = package / variants[wanted]["encoder"]
        assert package_components(package, entry) == {r: package / f for r, f in variants[wanted].items()}
    assert package_components(package, package / ROLES["encoder"])["decoder"] == package / ROLES["decoder"]


@pytest.mark.sanity
def test_seq2seq_export_refuses_static_quantization_before_loading(tmp_path: Path) -> None:
    """Checked before the model loads: the source does not even exist."""
    with pytest.raises(ConfigError, match="--quantize static is refused") as info:
        export(
            tmp_path / "missing", tmp_path / "out", task="text2text-generation-with-past", quantize="static"
        )
    assert "--quantize dynamic" in str(info.value.hint)
    with pytest.raises(ConfigError, match="with_report is not supported"):
        export(
            tmp_path / "missing", tmp_path / "out", task="text2text-generation-with-past", with_report=True
        )
    assert not any(tmp_path.iterdir())

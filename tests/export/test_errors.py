"""Bad input: a typed error (also a builtin), a one-line CLI message with a hint, and no output left behind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import modelexport
from modelexport.cli.app import main
from modelexport.errors import (
    ExportError,
    InputSpecError,
    InvalidModelError,
    ModelExportError,
    ModelLoadError,
    ModelNotFoundError,
    OutputWriteError,
    UnsupportedOperatorError,
)
from tests.models.hf_models import tiny_hf_model
from tests.models.torch_models import mlp


@torch.library.custom_op("modelexport_test::scramble", mutates_args=())
def scramble(x: torch.Tensor) -> torch.Tensor:
    """An operator with no ONNX conversion in either exporter."""
    return x.flip(-1) * 2


@scramble.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class UsesCustomOp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scramble(self.fc(x))


def assert_no_output(path: Path) -> None:
    assert not path.exists() or not any(path.iterdir()), f"partial output left in {path}"
    leftovers = (
        [p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")]
        if path.parent.exists()
        else []
    )
    assert not leftovers, f"temp files left: {leftovers}"


@pytest.mark.sanity
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_unsupported_operator_is_named(tmp_path: Path, exporter: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(UnsupportedOperatorError, match="scramble") as info:
        modelexport.export(UsesCustomOp(), out, exporter=exporter)
    assert isinstance(info.value, RuntimeError)
    assert "ONNX compliant" in str(info.value) and "ONNX compliant" in info.value.hint
    assert_no_output(out)


@pytest.mark.sanity
@pytest.mark.compat
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_torchscript_decoders_export_on_transformers_5_and_are_a_clear_error_on_4(
    tmp_path: Path, name: str
) -> None:
    """transformers 4.57 builds decoder masks with ``torch.vmap``, which TorchScript tracing cannot follow
    (a clear error naming the dynamo exporter); transformers 5 builds them with plain tensor ops, and the
    traced graph equals PyTorch at another batch, length and padding than the example's."""
    import numpy as np

    from modelexport._transformers import major_version, transformers_version
    from modelexport.runtime import create_session

    model = tiny_hf_model(name)
    if (major_version(transformers_version()) or 0) < 5:
        with pytest.raises(ExportError) as info:
            modelexport.export(model, tmp_path / "out", exporter="torchscript")
        assert "--exporter dynamo" in info.value.hint
        assert_no_output(tmp_path / "out")
        return
    result = modelexport.export(model, tmp_path / "out", exporter="torchscript")
    assert result.parity["passed"] and result.coverage["coverage_pct"] == 100.0
    ids = torch.randint(0, 90, (3, 11), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 11, dtype=torch.int64)
    mask[0, :4] = 0
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
    session = create_session(result.onnx_path)[0]
    got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    assert np.abs(got - ref)[:, 4:].max() < 1e-4 and np.abs(got - ref)[1:].max() < 1e-4


@pytest.mark.sanity
def test_missing_path_and_offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        modelexport.export("./no/such/model", tmp_path / "out")
    assert isinstance(info.value, FileNotFoundError)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="unreachable"):
        modelexport.export("some-org/some-model", tmp_path / "out")
    assert_no_output(tmp_path / "out")


@pytest.mark.sanity
def test_unloadable_model_folder(tmp_path: Path) -> None:
    folder = tmp_path / "not_a_model"
    folder.mkdir()
    (folder / "readme.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="config.json"):
        modelexport.export(str(folder), tmp_path / "out")


@pytest.mark.sanity
def test_factory_must_return_a_module(tmp_path: Path) -> None:
    factory = tmp_path / "factory.py"
    factory.write_text("def make():\n    return 42\n\ndef broken():\n    raise RuntimeError('boom')\n")
    with pytest.raises(InvalidModelError, match="not a torch.nn.Module"):
        modelexport.export(f"{factory}:make", tmp_path / "out")
    with pytest.raises(ModelLoadError, match="boom"):
        modelexport.export(f"{factory}:broken", tmp_path / "out")
    with pytest.raises(InvalidModelError, match="no attribute"):
        modelexport.export(f"{factory}:missing", tmp_path / "out")


@pytest.mark.sanity
def test_inputs_that_do_not_match_forward(tmp_path: Path) -> None:
    two = [{"name": "pixels", "shape": [2, 6]}, {"name": "mask", "shape": [2, 6]}]
    with pytest.raises(InputSpecError, match="not parameters of forward"):
        modelexport.export(mlp(), tmp_path / "a", input_specs=two)  # forward(input) takes one
    with pytest.raises(InputSpecError, match="failed on the example inputs"):
        modelexport.export(mlp(), tmp_path / "b", input_specs=[{"name": "input", "shape": [2, 5]}])
    with pytest.raises(InputSpecError, match="dtype"):
        modelexport.export(
            mlp(), tmp_path / "c", input_specs=[{"name": "input", "shape": [2, 6], "dtype": "float99"}]
        )
    assert_no_output(tmp_path / "b")


@pytest.mark.sanity
def test_unwritable_output_keeps_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OutputWriteError) as info:
        modelexport.export(mlp(), blocker / "out")
    assert isinstance(info.value, OSError)


@pytest.mark.sanity
def test_failed_export_leaves_existing_output_untouched(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.onnx").write_bytes(b"previous")
    (out / "export_metadata.json").write_text(
        '{"written": ["model.onnx"]}'
    )  # an earlier run of ours wrote it
    with pytest.raises(UnsupportedOperatorError):  # overwrite: our earlier model.onnx may be replaced...
        modelexport.export(UsesCustomOp(), out, overwrite=True)
    assert (out / "model.onnx").read_bytes() == b"previous"  # ...but a failed export replaces nothing
    assert sorted(p.name for p in out.iterdir()) == ["export_metadata.json", "model.onnx"]


@pytest.mark.smoke
def test_cli_error_is_one_line_with_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["export", str(tmp_path / "missing"), str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("Error: model path not found")
    assert "Hint:" in err and "Traceback" not in err
    code = main(["--debug", "export", str(tmp_path / "missing"), str(tmp_path / "out")])
    assert code == 1 and "Traceback" in capsys.readouterr().err


@pytest.mark.smoke
def test_cli_bad_input_specs_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    specs = tmp_path / "specs.json"
    specs.write_text("{not json")
    code = main(
        ["export", "tests/models/torch_models.py:mlp", str(tmp_path / "out"), "--input-specs", str(specs)]
    )
    assert code == 1
    assert "not valid JSON" in capsys.readouterr().err


@pytest.mark.sanity
def test_every_error_is_also_a_builtin() -> None:
    import inspect

    import modelexport.errors as errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        if cls is ModelExportError or not isinstance(cls, type):  # first_line: the message helper
            continue
        builtin_bases = [
            b
            for b in inspect.getmro(cls)
            if b.__module__ == "builtins" and b not in (object, Exception, BaseException)
        ]
        assert builtin_bases, f"{name} should also be a builtin exception type"
        assert cls.hint, f"{name} needs a hint"


def test_first_line_never_fails_on_an_empty_message() -> None:
    """The one helper that quotes a library's message: first line, or the type's name when there is none."""
    from modelexport.errors import first_line

    assert first_line(ValueError("one\ntwo")) == "one"
    assert first_line(ValueError("")) == "ValueError"
    assert first_line(RuntimeError("  \n")) == "RuntimeError"
    assert first_line("") == ""
    assert first_line(ValueError("x" * 500), 10) == "x" * 10

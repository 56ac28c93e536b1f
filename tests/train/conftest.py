"""Trained programs shared by the train tests (trained once per session, read-only afterwards)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def digits_splits() -> tuple[Any, Any, Any]:
    """A small stratified digits subset: (train 600, val 200, test 300)."""
    from modelexport.data import load_dataset

    full = load_dataset("sklearn:digits")
    rest, test = full.split(0.17, seed=1)
    train, val = rest.split(0.25, seed=1)
    return train.subset(range(600)), val.subset(range(200)), test.subset(range(300))


@pytest.fixture(scope="session")
def trained_digits(digits_splits: tuple[Any, Any, Any]) -> Any:
    """A CompactCNN trained for 3 epochs on 600 digits, with its optimizer."""
    from modelexport.train.networks import NetworkOptions, build_network
    from modelexport.train.program import ClassifierProgram, label_accuracy, to_examples
    from modelexport.train.weights import TorchWeightOptimizer, TrainConfig

    train, val, _ = digits_splits
    program = ClassifierProgram(build_network("image_classifier", train, NetworkOptions(keep_batchnorm=True)))
    optimizer = TorchWeightOptimizer(TrainConfig(epochs=3, batch_size=32, learning_rate=3e-3, progress=False))
    optimizer.compile(program, trainset=to_examples(train), valset=to_examples(val), metric=label_accuracy)
    return program, optimizer


@pytest.fixture(scope="session")
def deployed_digits(trained_digits: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The trained digits network exported (BN kept), in a program of its own: the tests that deploy it must not
    turn ``trained_digits``' program into an ONNX one (whichever test a worker runs first)."""
    from modelexport.train.program import ClassifierProgram
    from modelexport.workflow.steps import export_network

    program, _ = trained_digits
    out = tmp_path_factory.mktemp("digits_export")
    result = export_network(program.network, out, keep_batchnorm=True)
    return ClassifierProgram(program.network), Path(result.onnx_path)


@pytest.fixture(scope="session")
def trained_text(tiny_text_base: Path, sst2_dir: Path) -> tuple[Any, Any, Any]:
    """A text classifier on the tiny BERT base, fitted to 64 SST-2 phrases (8 epochs, about a second).

    Mechanics, not accuracy: a width-32 BERT from random weights cannot generalise from 64 phrases, but it
    must fit them (the MiniLM accuracy test is slow)."""
    from modelexport.data import load_dataset
    from modelexport.train.networks import NetworkOptions, build_network
    from modelexport.train.program import ClassifierProgram, to_examples
    from modelexport.train.weights import TorchWeightOptimizer, TrainConfig

    train = load_dataset(sst2_dir / "train.csv").subset(range(64))
    network = build_network(
        "text_classifier", train, NetworkOptions(base_model=str(tiny_text_base), max_length=64)
    )
    program = ClassifierProgram(network)
    config = TrainConfig(epochs=8, batch_size=16, learning_rate=1e-2, patience=8, progress=False)
    optimizer = TorchWeightOptimizer(config)
    optimizer.compile(program, trainset=to_examples(train))
    return program, optimizer, train

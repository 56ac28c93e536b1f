"""DSPy training of torch weights: real dspy objects, measured learning on held-out data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dspy
import numpy as np
import pytest
from dspy.teleprompt import Teleprompter

from modelexport.data import load_dataset
from modelexport.errors import ConfigError, TrainingError
from modelexport.train.networks import NETWORKS, NetworkOptions, build_network
from modelexport.train.program import ClassifierProgram, label_accuracy, to_examples
from modelexport.train.weights import TorchWeightOptimizer, TrainConfig, evaluate_program


@pytest.mark.must
def test_every_network_type_is_tested() -> None:
    # image_classifier: test_cnn_learns_digits; text_classifier: the default run fits phrases with a tiny
    # BERT (test_text_classifier_fits_its_training_phrases); MiniLM learns SST-2 in the slow run
    assert set(NETWORKS) == {"image_classifier", "text_classifier"}


@pytest.mark.sanity
def test_program_is_a_dspy_module_returning_predictions(trained_digits: Any, digits_splits: Any) -> None:
    program, _ = trained_digits
    _, _, test = digits_splits
    assert isinstance(program, dspy.Module)
    pred = program(image=test.images[0])
    assert isinstance(pred, dspy.Prediction)
    assert pred.label in program.label_names and 0.0 < pred.confidence <= 1.0
    batch = program.predict_batch(test.images[:5])
    assert [p.label for p in batch][0] == pred.label
    with pytest.raises(Exception, match="classifies image inputs"):
        program(text="not an image")


@pytest.mark.smoke
def test_cnn_learns_digits(trained_digits: Any, digits_splits: Any) -> None:
    """Three epochs on 600 digits: far above chance (0.1) on 300 held-out digits."""
    program, optimizer = trained_digits
    _, _, test = digits_splits
    assert isinstance(optimizer, Teleprompter)
    summary = optimizer.summary
    assert summary.epochs_run >= 1 and summary.seconds > 0
    assert program.accuracy(test) > 0.8
    losses = [row["loss"] for row in summary.history]
    assert losses[-1] < losses[0]


@pytest.mark.sanity
def test_best_weights_are_kept(trained_digits: Any, digits_splits: Any) -> None:
    """The restored weights score the best validation value seen (dspy.Evaluate, 2-decimal percent)."""
    program, optimizer = trained_digits
    _, val, _ = digits_splits
    best = max(row["val_score"] for row in optimizer.summary.history)
    assert evaluate_program(program, to_examples(val), label_accuracy) == pytest.approx(best, abs=1e-4)
    assert optimizer.summary.val_accuracy == pytest.approx(best, abs=0.006)


@pytest.mark.sanity
def test_early_stopping_stops_when_validation_stalls() -> None:
    """A metric that drops after epoch 1: patience 1 stops after epoch 2 and keeps epoch 1."""
    ds = load_dataset("sklearn:digits").subset(range(200))
    train, val = ds.split(0.3, seed=0)
    program = ClassifierProgram(build_network("image_classifier", train))
    optimizer = TorchWeightOptimizer(TrainConfig(epochs=5, batch_size=64, patience=1, progress=False))
    calls = iter(range(10**6))

    def first_pass_only(ex: Any, pred: Any, trace: Any = None) -> float:
        return 1.0 if next(calls) < len(val) else 0.0

    optimizer.compile(program, trainset=to_examples(train), valset=to_examples(val), metric=first_pass_only)
    summary = optimizer.summary
    assert summary.epochs_run == 2 and summary.stopped_early and summary.best_epoch == 1


@pytest.mark.sanity
def test_validation_ties_keep_the_later_weights() -> None:
    """A constant metric ties every epoch: training runs to the end and keeps the last (lowest-LR) weights."""
    ds = load_dataset("sklearn:digits").subset(range(120))
    train, val = ds.split(0.3, seed=0)
    program = ClassifierProgram(build_network("image_classifier", train))
    optimizer = TorchWeightOptimizer(TrainConfig(epochs=3, batch_size=64, patience=1, progress=False))
    optimizer.compile(
        program, trainset=to_examples(train), valset=to_examples(val), metric=lambda ex, pred, trace=None: 1.0
    )
    summary = optimizer.summary
    assert summary.epochs_run == 3 and not summary.stopped_early and summary.best_epoch == 3


@pytest.mark.must
@pytest.mark.parametrize(
    "options,match",
    [
        ({"epochs": 0}, "epochs"),
        ({"batch_size": 0}, "batch_size"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": 2.0}, "learning_rate"),
        ({"patience": 0}, "patience"),
        ({"schedule": "step"}, "schedule"),
    ],
)
def test_train_config_rejects_out_of_range(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**options)


@pytest.mark.must
def test_training_errors_are_typed(trained_digits: Any) -> None:
    program, _ = trained_digits
    optimizer = TorchWeightOptimizer(TrainConfig(epochs=1, progress=False))
    with pytest.raises(TrainingError, match="empty"):
        optimizer.compile(program, trainset=[])
    bad = [dspy.Example(image=np.zeros((8, 8, 1), np.uint8), label="eleven").with_inputs("image")]
    with pytest.raises(TrainingError, match="eleven"):
        optimizer.compile(program, trainset=bad)
    with pytest.raises(TrainingError, match="ClassifierProgram"):
        optimizer.compile(dspy.Module(), trainset=bad)


@pytest.mark.must
def test_network_must_match_the_data_kind(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("text,label\ngood,1\nbad,0\n")
    with pytest.raises(ConfigError, match="needs a image dataset"):
        build_network("image_classifier", load_dataset(tmp_path / "d.csv"))
    with pytest.raises(ConfigError, match="unknown model_type"):
        build_network("nope", load_dataset(tmp_path / "d.csv"))


@pytest.mark.sanity
def test_text_classifier_fits_its_training_phrases(trained_text: Any) -> None:
    """The whole HF encoder + head trains: the loss falls and the 64 training phrases are fitted."""
    program, optimizer, train = trained_text
    losses = [row["loss"] for row in optimizer.summary.history]
    assert optimizer.summary.epochs_run == 8 and min(losses) < losses[0] / 2
    assert optimizer.summary.train_accuracy >= 0.9 and program.accuracy(train) >= 0.9
    assert program.network.module.config.id2label == {0: "0", 1: "1"}
    assert program(text="a great movie").label in {"0", "1"}


@pytest.mark.slow
@pytest.mark.integration
def test_text_classifier_learns_sst2_subset(minilm_dir: Path, sst2_dir: Path) -> None:
    """MiniLM + head, 320 SST-2 phrases, 2 epochs: above chance on 200 held-out dev phrases."""
    train = load_dataset(sst2_dir / "train.csv").subset(range(320))
    dev = load_dataset(sst2_dir / "dev.csv").subset(range(200))
    network = build_network(
        "text_classifier", train, NetworkOptions(base_model=str(minilm_dir), max_length=64)
    )
    program = ClassifierProgram(network)
    cfg = TrainConfig(epochs=2, batch_size=16, learning_rate=1e-4, progress=False)
    TorchWeightOptimizer(cfg).compile(program, trainset=to_examples(train))
    assert network.module.config.id2label == {0: "0", 1: "1"}
    assert program.accuracy(dev) > 0.65

"""The issue's own setting, on a network the defaults were never tuned on (issue 25, the final round).

The image pipeline trains on a PNG folder of digits with seed 1 (the design was tuned on seed 0's network), the
test folders are corrupted in pixel space and read through the package's processor, class by class as a folder
is read (tests/testtime/pipeline_folder.py). ``--ttt bn`` with its defaults, against plain inference, in batches
of 40 and 1, streamed as read and class-sorted. Met and pinned as measured (docs/test-time-design.md, final round):
contrast and the issue's noise 2 + contrast 2 recover 86-92%; Gaussian noise 4 recovers 56-64% with the input
denoising the package records and the gate its excess noise opens (56-61% before a class-ordered stream's batch
counted in the stem only as far as the stem sees a shift, 47-52% with the gate shut, 17-22% without denoising;
exact BN on i.i.d. batches: 45%), Gaussian noise 3 49-62% with the deep variances measured against the source
anchors the package records (26-32% without), blur 4 70-72% with its sharpening (35-42% without). Clean
class-ordered streams stay within 0.34 points of plain (2 of 597 digits) with the stem's shift gate, the class
count by support and a first batch that measures its own shift (0.67 before it, 1.01 with the gate alone), and lose up to 2 points without the gate
(``shift_gate=0``), because this network's stem variances tell classes apart. The whole table: ``python
benchmarks/test_time.py --streams --grid final``.

    .venv/bin/python -m pytest tests/testtime/test_pipeline_proof.py -m slow -s
"""

from __future__ import annotations

from pathlib import Path

import pytest

from modelexport.metadata import read_metadata
from modelexport.metadata.schema import KEY_SOURCE_ANCHORS
from tests.testtime.pipeline_folder import FolderModel, pipeline_model
from tests.testtime.robustness import COMBINED, matrix, recovery

SETS = ("contrast@4", COMBINED, "gaussian_noise@4", "gaussian_noise@3", "blur@4")
#: Recovery at least (batch 40, batch 1), the targets. Least of as read and class-sorted, measured with the source
#: anchors the package records: noise 4 60% / 49% (59% / 48% without them), noise 3 62% / 49% (32% / 26%). Before:
#: noise 4 47-48% / 52% before its excess noise opened the gate, 22% / 17% before the input denoising; blur 4
#: 70-72% with the sharpening (42% / 35% before).
FLOOR = {
    "contrast@4": (0.5, 0.3),
    COMBINED: (0.5, 0.3),
    "gaussian_noise@4": (0.5, 0.3),
    "gaussian_noise@3": (0.5, 0.3),
    "blur@4": (0.5, 0.3),
}
#: The clean class-ordered streams' measured loss (up to 0.67 points, 4 digits), pinned below the 1.01 points
#: (6 digits) of the gate alone.
CLEAN_GAP = -0.009
#: Without the shift gate the worst of them lost 2.0 points: the gate must keep at least half a point of that.
GATE_GAIN = 0.005


@pytest.fixture(scope="module")
def folder_model(tmp_path_factory: pytest.TempPathFactory) -> FolderModel:
    root: Path = tmp_path_factory.mktemp("pipeline-digits-s1")
    return pipeline_model(root, "digits", SETS, seed=1)


@pytest.mark.slow
def test_default_bn_on_the_pipelines_own_network_read_as_a_folder(folder_model: FolderModel) -> None:
    sets = {k: folder_model.sets[k] for k in ("clean", *SETS)}
    cells = matrix(
        "pipeline-digits-s1",
        folder_model.onnx_path,
        sets,
        folder_model.labels,
        (40, 1),
        ("as-is", "class-sorted"),
        ("none", "bn", "bn-ungated"),
        seed=1,
    )
    accuracy = {(c.data, c.order, c.batch, c.method): c.accuracy for c in cells}
    assert accuracy[("clean", "as-is", 40, "none")] > 0.97
    assert KEY_SOURCE_ANCHORS in read_metadata(folder_model.onnx_path)  # its calibration keeps them
    worst = {}
    for method in ("bn", "bn-ungated"):
        worst[method] = min(
            accuracy[("clean", order, batch, method)] - accuracy[("clean", order, batch, "none")]
            for order in ("as-is", "class-sorted")
            for batch in (40, 1)
        )
    assert worst["bn"] >= CLEAN_GAP, worst
    assert worst["bn"] >= worst["bn-ungated"] + GATE_GAIN, worst
    recovered = recovery(cells)
    for data, (at_40, at_1) in FLOOR.items():
        for order in ("as-is", "class-sorted"):
            assert recovered[("pipeline-digits-s1", data, order, 40, "bn")] >= at_40, (data, order)
            assert recovered[("pipeline-digits-s1", data, order, 1, "bn")] >= at_1, (data, order)


#: The seed-0 twin (the tuning network): clean streams read as the folder is read and class-sorted, batches of
#: 32 and 1, stay within this of plain (measured: -0.5 points at worst, 3 of 597 digits). Counting a stray
#: misprediction as a covered class (the coverage before the support) lost 1.0 point as read at batch 1 (6
#: digits): the deep layers followed a memory of four true classes as if it held nine.
TUNING_CLEAN_GAP = -0.008


@pytest.mark.slow
def test_stray_predictions_do_not_pull_the_deep_layers_on_the_tuning_network(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root: Path = tmp_path_factory.mktemp("pipeline-digits-s0")
    model = pipeline_model(root, "digits", (), seed=0)
    cells = matrix(
        "pipeline-digits",
        model.onnx_path,
        {"clean": model.sets["clean"]},
        model.labels,
        (32, 1),
        ("as-is", "class-sorted"),
        ("none", "bn"),
    )
    accuracy = {(c.order, c.batch, c.method): c.accuracy for c in cells}
    gaps = {k[:2]: accuracy[k] - accuracy[(*k[:2], "none")] for k in accuracy if k[2] == "bn"}
    assert min(gaps.values()) >= TUNING_CLEAN_GAP, gaps

"""A pipeline with a test-time policy keeps the user's session: shared when the graph is unchanged (TTA),
built once with the user's SessionConfig when the policy rewrites the graph (BN adaptation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelexport.inference import pipeline
from modelexport.runtime.session import SessionConfig
from modelexport.testtime.policy import TestTimePolicy
from tests.inference.conftest import plain_cnn_export
from tests.inference.tiny_tasks import CNN_LABELS, CNN_PROCESSOR

USER = SessionConfig(intra_op_num_threads=1, graph_optimization_level="basic")


@pytest.fixture(scope="module")
def cnn_bn_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plain CNN with its BatchNormalization nodes kept, task, labels and pre-processing embedded."""
    return plain_cnn_export(
        tmp_path_factory.getbasetemp(),
        "plain_cnn_bn",
        task="image-classification",
        id2label=CNN_LABELS,
        processor_config=CNN_PROCESSOR,
        keep_batchnorm=True,
    ).output_dir


def _image() -> Any:
    return np.random.default_rng(0).integers(0, 255, (8, 8), dtype=np.uint8)


@pytest.mark.regression
def test_tta_policy_shares_the_pipeline_session(cnn_bn_package: Path) -> None:
    policy = TestTimePolicy(tta_transforms=("identity", "hflip"), modality="image")
    pipe = pipeline(model=cnn_bn_package, session_config=USER, test_time_policy=policy)
    pipe(_image())
    assert pipe.test_time_engine().session is pipe.session


@pytest.mark.regression
def test_rewriting_policy_builds_its_session_with_the_users_config(cnn_bn_package: Path) -> None:
    policy = TestTimePolicy(ttt="bn", modality="image")
    pipe = pipeline(model=cnn_bn_package, session_config=USER, test_time_policy=policy)
    result = pipe([_image(), _image()[::-1]])
    engine = pipe.test_time_engine()
    assert engine.session is not pipe.session and len(result) == 2
    options = engine.session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert str(options.graph_optimization_level).endswith("ORT_ENABLE_BASIC")

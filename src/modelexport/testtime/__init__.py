"""Test-time compute on ONNX Runtime: augmentation, adaptation, iterative inference, MC dropout, ensembles.

Stable public API (other parts of modelexport and users build on these names)::

    from modelexport.testtime import TestTimeEngine, TestTimePolicy

    policy = TestTimePolicy(tta_transforms=("identity", "hflip"), tta_aggregate="mean", ttt="bn")
    engine = TestTimeEngine("out/model.onnx", policy, providers=None)     # folder, .onnx, bytes or ModelProto
    stream = engine.new_stream()                                           # one per client: adaptation state
    probs = engine.predict({"x": batch}, stream)                           # (N, C) probabilities
    result = engine.run({"x": batch}, stream)                              # + n_views, n_augmented, uncertainty
    probs = engine.predict_texts(texts, processor)                         # text TTA (strings, then tokenize)
    model = engine.adapted_model(feeds, stream)                            # the adaptation written into a copy

- ``TestTimePolicy`` (frozen, validated; ``to_dict``/``from_dict``; presets in ``POLICY_PRESETS``): TTA transforms
  and aggregator, ``modality`` (auto/image/text/tensor), ``adaptive_threshold``, ``batched``, ``ttt``
  (none/bn/tent/sar), ``statistics`` (``memory``: robust, the default; ``batch``: each batch's own),
  ``memory_size``/``stem_prior``/``deep_prior``/``shift_gate`` (memory statistics), ``denoise``/``sharpen``
  (image inputs moved toward their blur by their noise above the source's, or sharpened by their lack of detail
  below it: ``InputNoise``, ``noise_ratio``, ``sharpness``, ``restore``), ``anchors`` (a noisy stream's deep
  BN variances measured against the source images the model records: ``SourceAnchors``,
  ``calibrate_anchors``), ``ttt_iterations``,
  ``momentum``/``bn_prior`` (batch statistics), ``learning_rate``, ``episodic`` (default False: adaptation is
  continual along a stream), ``reset_every``, ``collapse_threshold``/``collapse_window`` (the collapse guard), ``label_shift_alpha``
  (the label-shift guard of batch statistics), ``prior_correction``, ``reliable_entropy``, ``mc_dropout``,
  ``seed``.
- Robust statistics (``memory``): ``StatisticsMemory`` (a class-balanced memory of each stream's recent
  examples' BN statistics) and ``StatisticsPrior`` (their blend with the source), one ONNX Runtime pass per
  batch (``graph.mix_batch_statistics``).
- Real streams (``streams``): ``StreamOrder`` (as-is, shuffle, stratified, class-sorted, dirichlet:ALPHA),
  ``CollapseGuard`` (collapse and label shift: the batch is served by the source), ``prior_correction``,
  ``Stream`` (a call without one keeps nothing); methods in ``methods.ADAPTATION_METHODS`` (``sar``: reliable entropy
  minimisation, EATA/SAR-style, in ``sar.py``).
- Registries joined by decorator: ``TRANSFORMS`` (``register_transform``), ``AGGREGATORS``,
  ``ADAPTATION_METHODS``, ``CORRUPTIONS``.
- Building blocks: ``BNAdapter`` (BN statistics in ONNX Runtime), ``tent_adapt`` / ``OnnxTorchModule`` (Tent),
  ``enable_mc_dropout`` / ``mc_summary``, ``iterate`` / ``build_loop_model`` (external loop and ONNX Loop),
  ``Ensemble``, ``corrupt`` (robustness data). Measuring a policy on a labelled dataset
  (``modelexport evaluate``) is :func:`modelexport.inference.evaluate.evaluate`, a layer up: it needs the data
  readers and the model's processor.
"""

from __future__ import annotations

from .._numeric import softmax
from .adapt import BNAdapter, BNLayer, BNState, find_bn_layers
from .aggregate import AGGREGATORS, aggregate, entropy
from .anchors import SourceAnchors
from .augment import MODALITIES, TRANSFORMS, Transform, make_views, register_transform, transforms_for
from .corruptions import CORRUPTIONS, SEVERITIES, corrupt
from .denoise import InputNoise, denoise, noise_ratio, restore, sharpen, sharpness
from .engine import TestTimeEngine, TestTimeResult, calibrate_anchors, calibrate_restoration
from .ensemble import Ensemble
from .interpreter import SUPPORTED_OPS, OnnxTorchModule
from .iterative import IterationResult, build_loop_model, iterate
from .mcdropout import MCDropoutResult, enable_mc_dropout, mc_summary
from .memory import StatisticsMemory, StatisticsPrior
from .policy import ADAPTATION_METHODS, POLICY_PRESETS, STATISTICS, TestTimePolicy, policy_preset
from .streams import CollapseGuard, Stream, StreamOrder
from .tent import tent_adapt

__all__ = [
    "ADAPTATION_METHODS",
    "AGGREGATORS",
    "BNAdapter",
    "BNLayer",
    "BNState",
    "CORRUPTIONS",
    "CollapseGuard",
    "Ensemble",
    "InputNoise",
    "IterationResult",
    "MCDropoutResult",
    "MODALITIES",
    "OnnxTorchModule",
    "POLICY_PRESETS",
    "SEVERITIES",
    "STATISTICS",
    "SourceAnchors",
    "SUPPORTED_OPS",
    "StatisticsMemory",
    "StatisticsPrior",
    "Stream",
    "StreamOrder",
    "TRANSFORMS",
    "TestTimeEngine",
    "TestTimePolicy",
    "TestTimeResult",
    "Transform",
    "aggregate",
    "build_loop_model",
    "calibrate_anchors",
    "calibrate_restoration",
    "corrupt",
    "denoise",
    "enable_mc_dropout",
    "entropy",
    "find_bn_layers",
    "iterate",
    "make_views",
    "mc_summary",
    "noise_ratio",
    "policy_preset",
    "register_transform",
    "restore",
    "sharpen",
    "sharpness",
    "softmax",
    "tent_adapt",
    "transforms_for",
]

"""``run_pipeline``: data -> DSPy training of torch weights -> export -> quantize -> test-time policy -> report.

Every option is validated in :class:`PipelineConfig` before any work starts. The stages run in order,
each a short method with a stage message; the output package is staged and moved into place only when
every stage succeeded, so a failure leaves nothing half-written. The package records which model it
deploys, so every command given the folder runs that file.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console

from .._io import write_json
from .._progress import note_progress_line, progress_bar
from ..data import Dataset
from ..inference.feeds import SampleSet, dataset_samples
from ..inference.processors import ONNXAutoProcessor
from ..metadata import write_metadata
from ..metadata.schema import (
    KEY_INPUT_NOISE,
    KEY_SOURCE_ANCHORS,
    KEY_TEST_TIME_ENSEMBLE,
    KEY_TEST_TIME_POLICY,
)
from ..onnxfile import record_deployed_model, staged_output
from ..optimize.quantization import quantize
from ..runtime.session import available_providers, fallback_said_once, resolve_providers
from ..testtime.anchors import SourceAnchors
from ..testtime.denoise import measurable
from ..testtime.engine import calibrate_anchors, calibrate_restoration
from ..testtime.policy import TestTimePolicy
from ..train.networks import NETWORKS, Network, build_network
from ..train.policy_search import (
    DEFAULT_TTA_SETS,
    PolicySearchSpace,
    PolicyTrial,
    TestTimePolicyOptimizer,
    describe_policy,
    measure_policy,
    ttt_policy,
)
from ..train.program import ClassifierProgram, to_examples
from ..train.weights import TorchWeightOptimizer, TrainingSummary
from .config import PipelineConfig, PipelineResult
from .report import (
    check_report,
    config_table,
    majority_rate,
    majority_warning,
    policy_settings,
    report_table,
)
from .steps import export_network, latency_stats, load_pipeline_data, network_options, output_plans

if TYPE_CHECKING:
    import dspy

    from ..export.result import ExportResult

__all__ = ["PipelineRun", "run_pipeline"]

log = logging.getLogger(__name__)
POLICY_KEY = KEY_TEST_TIME_POLICY
#: Examples of each split the source's input noise record is measured and calibrated on (a quantile and an
#: accuracy: a few hundred settle them), fewer for large images: at most NOISE_VALUES input values, at least
#: NOISE_MIN examples (calibration runs the model, adapted, on 24 noisy and 9 blurred copies: testtime/denoise.py).
NOISE_EXAMPLES = 256
NOISE_VALUES = 2**22
NOISE_MIN = 32
STAGES = ("data", "train", "export", "quantize", "test-time policy", "inference", "report")


class PipelineRun:
    """One run of the pipeline for a validated :class:`PipelineConfig`."""

    def __init__(self, config: PipelineConfig, console: Console | None = None) -> None:
        self.cfg = config
        self.console = console or Console(stderr=False, highlight=False)
        self.details: dict[str, Any] = {}
        self._stage = 0

    def say(self, stage: str, message: str) -> None:
        if stage in STAGES:
            self._stage = STAGES.index(stage) + 1
        self.console.print(f"[bold green][{self._stage}/{len(STAGES)}] {stage}[/]: {message}")
        note_progress_line()  # a stage line is progress: bars off a terminal wait their 5 s from here

    # ---------------------------------------------------------------------------------------------- run

    def run(self, dataset: Dataset | None = None) -> PipelineResult:
        """Every stage; a requested provider this machine lacks is said once, before the first stage."""
        skipped = resolve_providers(list(self.cfg.ep))[1]
        with fallback_said_once(skipped):
            return self._run(dataset)

    def _run(self, dataset: Dataset | None) -> PipelineResult:
        started = time.perf_counter()
        cfg = self.cfg
        plan, report_plan = output_plans(cfg)  # refused here, before any work, when it would replace a file
        full, train, val = load_pipeline_data(cfg, dataset)
        self.console.print(config_table(self._summary_rows(full, train, val)))
        self._fallback_line()
        self.say(
            "data", f"{full.describe()}; train {len(train)}, val {len(val)} (stratified, seed {cfg.seed})"
        )
        program = self._train(train, val)
        with staged_output(plan) as stage:
            staging = stage.path
            export_result = self._export(program.network, staging)
            fp32 = staging / cfg.model_file.name
            deployed, quant = self._quantize(program, fp32, staging, train, val)
            self._record_input_noise(fp32, deployed, train, val)
            test_time = self._policy(program, deployed, fp32, val)
            inference = self._inference(program, val)
            report = self._report(program, export_result, fp32, quant, test_time, inference)
            if report_plan is None:
                write_json(staging / cfg.report_file.name, report)
            record_deployed_model(staging, (cfg.quantized_file or cfg.model_file).name)
        if report_plan is not None:
            write_json(report_plan.path, report)
        final = cfg.quantized_file or cfg.model_file
        members = (str(cfg.model_file),) if self.details.get("ensemble") else ()
        program.deploy(final, cfg.ep, program.policy, ensemble=members)  # the staging copy is gone
        seconds = time.perf_counter() - started
        self.console.print(report_table(report, self.details.get("policy_label")))
        if report["training"]["at_or_below_majority"]:
            self.console.print(f"[bold red]Warning[/]: {majority_warning(report['training'])}")
        self.console.print(f"[bold]done in {seconds:.1f} s[/]; model: {final}; report: {cfg.report_file}")
        return PipelineResult(
            cfg,
            report,
            cfg.model_file,
            cfg.quantized_file,
            cfg.report_file,
            program,
            train,
            val,
            seconds,
            self.details,
        )

    def _fallback_line(self) -> None:
        """One visible line when a requested execution provider is not available here (CUDA on a CPU host)."""
        order, skipped = resolve_providers(list(self.cfg.ep))
        if skipped:  # at any --log_level: the run's sessions then say nothing more about it
            self.console.print(
                f"[bold yellow]Note[/]: {', '.join(skipped)} not available on this machine: falling back to "
                f"{', '.join(order)}"
            )

    def _summary_rows(self, full: Dataset, train: Dataset, val: Dataset) -> dict[str, Any]:
        cfg = self.cfg
        order, skipped = resolve_providers(list(cfg.ep))
        rows: dict[str, Any] = {
            "model type": cfg.model_type,
            "dataset": f"{cfg.dataset_path if full.source == '' else full.source} ({len(full)} examples, {full.num_classes} classes)",
            "split": f"train {len(train)} / val {len(val)} (val_split {cfg.val_split}, seed {cfg.seed})",
            "training": f"{cfg.epochs} epochs, batch {cfg.batch_size}, lr {cfg.learning_rate}",
            "TTA": _setting(
                cfg.tta,
                f"{', '.join(cfg.tta_transforms) or 'search default sets'}, aggregate {cfg.tta_aggregate or 'search'}",
            ),
            "TTT": _setting(
                cfg.ttt,
                f"{cfg.ttt_method}, "
                + (f"{cfg.ttt_iterations} iteration(s)" if cfg.ttt_iterations else "default iterations"),
            ),
            "MC dropout": _setting(
                None if cfg.mc_dropout is None else bool(cfg.mc_dropout), f"{cfg.mc_dropout} passes"
            ),
            "ensemble": _setting(
                None if cfg.ensemble is None else cfg.ensemble == "int8", "the model and its int8 twin"
            ),
            "policy search": ("on: decides what is left open" if cfg.optimize_policy else "off")
            + (f", latency budget {cfg.latency_budget_ms} ms" if cfg.latency_budget_ms else ""),
            "providers requested": ", ".join(cfg.ep),
            "providers used (order)": ", ".join(order)
            + (f" (unavailable: {', '.join(skipped)})" if skipped else ""),
            "providers available": ", ".join(available_providers()),
            "quantization": cfg.quantize,
            "output model": str(cfg.model_file),
        }
        if cfg.model_type == "text_classifier":
            rows["base model"] = cfg.to_dict()["base_model"]
        if cfg.quantized_file:
            rows["quantized model"] = str(cfg.quantized_file)
        rows["report"] = str(cfg.report_file)
        return rows

    # --------------------------------------------------------------------------------------- stages

    def _train(self, train: Dataset, val: Dataset) -> ClassifierProgram:
        cfg = self.cfg
        network: Network = build_network(cfg.model_type, train, network_options(cfg))
        self.say(
            "train", f"{network.describe()} with TorchWeightOptimizer (AdamW, early stop on val accuracy)"
        )
        program = ClassifierProgram(network, batch_size=cfg.batch_size, progress=cfg.progress)
        optimizer = TorchWeightOptimizer(cfg.train_config())
        optimizer.compile(program, trainset=to_examples(train), valset=to_examples(val))
        summary: TrainingSummary = optimizer.summary  # type: ignore[assignment]
        self.details["training"] = summary.to_dict()
        self.details["majority_class_rate"] = majority_rate(val)
        self.say(
            "train",
            f"{summary.epochs_run} epoch(s) in {summary.seconds:.1f} s, best epoch {summary.best_epoch}: "
            f"train acc {summary.train_accuracy:.4f}, val acc {summary.val_accuracy:.4f}",
        )
        if summary.val_accuracy <= self.details["majority_class_rate"] + 1e-9:
            self.say(
                "train",
                majority_warning(
                    {
                        "val_accuracy": summary.val_accuracy,
                        "majority_class_rate": self.details["majority_class_rate"],
                    }
                ),
            )
        return program

    def _export(self, network: Network, staging: Path) -> ExportResult:
        self.say("export", "hierarchy-tagged ONNX with metadata (labels, pre-processing), parity-checked")
        result = export_network(
            network,
            staging / self.cfg.model_file.name,
            keep_batchnorm=self.cfg.ttt is not False and NETWORKS[self.cfg.model_type].has_batchnorm,
            keep_dropout=self._mc_possible(),
        )
        worst = max((result.parity or {}).get("max_abs_diff", {}).values(), default=None)
        self.say(
            "export",
            f"{self.cfg.model_file.name}: {result.node_count} nodes, tags {result.coverage['coverage_pct']}%, parity "
            + ("not checked" if worst is None else f"{worst:.3g}"),
        )
        self.details["export"] = {
            "parity_max_abs_diff": worst,
            "coverage": result.coverage,
            "files": result.files,
        }
        return result

    def _mc_possible(self) -> bool:
        """Whether MC dropout may run: asked for, or left to the search with an fp32 deployment (quantization
        removes Dropout). Only then is Dropout kept in the export, which skips its parity check."""
        cfg = self.cfg
        if cfg.mc_dropout is not None:
            return cfg.mc_dropout > 0
        return cfg.optimize_policy and cfg.quantize == "none"

    def _quantize(
        self, program: ClassifierProgram, fp32: Path, staging: Path, train: Dataset, val: Dataset
    ) -> tuple[Path, dict[str, Any]]:
        cfg = self.cfg
        size_fp32 = fp32.stat().st_size
        program.deploy(fp32, cfg.ep)
        self.details["val_accuracy_onnx_fp32"] = program.accuracy(val)
        if cfg.quantize == "none":
            self.say("quantize", "skipped (--quantize none)")
            return fp32, {
                "mode": "none",
                "size_bytes_fp32": size_fp32,
                "size_bytes_quantized": None,
                "val_accuracy_quantized": None,
            }
        out = staging / cfg.quantized_file.name  # type: ignore[union-attr]
        samples = self._calibration(fp32, train) if cfg.quantize == "static" else None
        self.say(
            "quantize",
            f"{cfg.quantize} int8 -> {out.name}"
            + (f" (calibrated on {len(samples)} training examples)" if samples else ""),
        )
        quantize(fp32, out, mode=cfg.quantize, samples=samples, progress=cfg.progress)
        program.deploy(out, cfg.ep)
        acc = program.accuracy(val)
        self.say(
            "quantize",
            f"{size_fp32:,} -> {out.stat().st_size:,} bytes; val acc fp32 {self.details['val_accuracy_onnx_fp32']:.4f} -> int8 {acc:.4f}",
        )
        return out, {
            "mode": cfg.quantize,
            "size_bytes_fp32": size_fp32,
            "size_bytes_quantized": out.stat().st_size,
            "val_accuracy_quantized": acc,
        }

    def _calibration(self, fp32: Path, train: Dataset, limit: int = 100) -> SampleSet:
        """Examples of ``train`` (or another split) through the exported model's own processor (the path
        `quantize` uses)."""
        return dataset_samples(train, ONNXAutoProcessor.sources(fp32), limit, seed=self.cfg.seed)

    def _record_input_noise(self, fp32: Path, deployed: Path, train: Dataset, val: Dataset) -> None:
        """Image models: the training images' noise and detail floors and the denoising and sharpening
        strengths calibrated on the validation images through adapted statistics (testtime/denoise.py,
        ``calibrate_restoration``) into both models (``modelexport.input_noise``), before the policy is chosen,
        so that test-time adaptation restores inputs against them; and a few training images per class
        (``modelexport.source_anchors``), against which it measures a noisy stream's deep BN variances
        (testtime/anchors.py), where class-ordered streams of noisy validation images gain from them
        (``calibrate_anchors``) and ``--anchors`` asks for them. The pipeline's image networks take a dynamic
        batch: each calibration set runs as one batch."""
        if train.kind != "image":
            return
        images = [self._images(fp32, data) for data in (train, val)]
        (x_train, y_train), (x_val, y_val) = images
        if x_train is None or x_val is None or y_val is None:
            return
        cpu = ("CPUExecutionProvider",)
        record = calibrate_restoration(deployed, x_train, x_val, y_val, self.cfg.seed, providers=cpu)
        for path in {deployed, fp32}:
            write_metadata(path, {KEY_INPUT_NOISE: record.to_dict()})
        anchors, kept = None, False
        if self.cfg.anchors and y_train is not None:
            anchors = SourceAnchors.select(x_train, y_train, seed=self.cfg.seed)
        if anchors is not None:
            kept = calibrate_anchors(deployed, anchors, x_val, y_val, self.cfg.seed, providers=cpu)
            if kept:
                for path in {deployed, fp32}:
                    write_metadata(path, {KEY_SOURCE_ANCHORS: anchors.to_dict()})
        examples = 0 if anchors is None else len(anchors.labels)
        self.details["source_anchors"] = {"asked": self.cfg.anchors, "examples": examples, "recorded": kept}
        self.details["input_noise"] = record.to_dict()

    def _images(self, fp32: Path, data: Dataset) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Up to ``NOISE_EXAMPLES`` of ``data`` (fewer past ``NOISE_VALUES``) as the model's image input
        (N, C, H, W) and their labels; (None, None) for a model whose one input is not such an image."""
        samples = self._calibration(fp32, data, limit=NOISE_EXAMPLES)
        arrays = [next(iter(f.values())) for f in samples.feeds if len(f) == 1]
        if len(arrays) != len(samples.feeds) or not arrays or not measurable(arrays[0].shape):
            return None, None
        keep = min(len(arrays), max(NOISE_MIN, NOISE_VALUES // arrays[0].size))
        labels = None if samples.labels is None else np.asarray(samples.labels[:keep])
        return np.concatenate(arrays[:keep]).astype(np.float32, copy=False), labels

    def _policy(self, program: ClassifierProgram, deployed: Path, fp32: Path, val: Dataset) -> dict[str, Any]:
        cfg = self.cfg
        examples = to_examples(val)
        program.deploy(deployed, cfg.ep)
        twin = str(fp32) if deployed != fp32 else None
        space = cfg.search_space(has_dropout=_has_dropout(deployed), twin=twin)
        searched = cfg.optimize_policy and not self._decided(space)
        if searched:
            self.say(
                "test-time policy",
                "searching what the options leave open (TTA sets and aggregation, TTT, MC dropout, the int8 "
                "ensemble) on the validation set"
                + (f"; fixed by you: {', '.join(space.fixed)}" if space.fixed else ""),
            )
            optimizer = TestTimePolicyOptimizer(space)
            optimizer.compile(program, trainset=examples)
            result = optimizer.result
            plain, best = result.plain, result.best  # type: ignore[union-attr]
            self.details["policy_search"] = result.to_dict()  # type: ignore[union-attr]
            self.details["search_trials"] = result.trials  # type: ignore[union-attr]
            self.details["policy_stream_assumptions"] = result.stream_assumptions  # type: ignore[union-attr]
        else:
            policy, members = self._fixed_policy(program, space)
            self.say("test-time policy", f"applying {describe_policy(policy, members)} as set")
            plain = self._measure_policy(program, TestTimePolicy(), examples)
            best = self._measure_policy(program, policy, examples, members)
            best.ensemble = members
        program.deploy(deployed, cfg.ep, best.policy, ensemble=best.ensemble)
        for path in {deployed, fp32}:
            write_metadata(path, {POLICY_KEY: best.policy.to_dict()})
        if best.ensemble:  # the deployed model serves with its twin wherever it runs (infer, pipeline())
            write_metadata(
                deployed, {KEY_TEST_TIME_ENSEMBLE: {"members": [Path(m).name for m in best.ensemble]}}
            )
        self.details["policy_label"] = describe_policy(best.policy, best.ensemble)
        self.details["ensemble"] = best.ensemble
        trials = self.details["search_trials"] if searched else []
        notes = self.details["policy_search"]["notes"] if searched else []
        settings = policy_settings(cfg, best, plain, trials, searched, notes)
        self.details["settings"] = settings
        self.say(
            "test-time policy",
            f"chosen {self.details['policy_label']}: val acc {plain.accuracy:.4f} plain -> {best.accuracy:.4f}, "
            f"{best.latency_ms:.2f} ms per batch of {program.batch_size} (written to {POLICY_KEY})",
        )
        for name, entry in settings.items():
            self.say("test-time policy", f"{name}: {entry['value']} ({entry['source']})")
        return {
            "policy": best.policy.to_dict(),
            "val_accuracy_plain": plain.accuracy,
            "val_accuracy_with_policy": best.accuracy,
            "latency_ms_with_policy": round(best.latency_ms, 3),
            "settings": settings,
        }

    def _decided(self, space: PolicySearchSpace) -> bool:
        """Whether the user's options leave the search nothing to decide."""
        cfg = self.cfg
        tta = cfg.tta is False or (
            cfg.tta is True and bool(cfg.tta_transforms) and cfg.tta_aggregate is not None
        )
        ttt = cfg.ttt is False or (cfg.ttt is True and cfg.ttt_iterations is not None)
        return tta and ttt and cfg.mc_dropout is not None and cfg.ensemble is not None

    def _fixed_policy(
        self, program: ClassifierProgram, space: PolicySearchSpace
    ) -> tuple[TestTimePolicy, tuple[str, ...]]:
        """The policy the options name; what they leave open takes the model type's default (no search)."""
        cfg = self.cfg
        modality = program.backend.engine.modality  # type: ignore[union-attr]
        transforms = cfg.tta_transforms or (DEFAULT_TTA_SETS[modality][0] if cfg.tta else ())
        adapt = (
            ttt_policy(cfg.ttt_method, cfg.ttt_iterations, cfg.learning_rate) if cfg.ttt else TestTimePolicy()
        )
        policy = adapt.with_changes(
            tta_transforms=transforms,
            tta_aggregate=cfg.tta_aggregate or "mean",
            mc_dropout=cfg.mc_dropout or 0,
            seed=cfg.seed,
        )
        return policy, space.ensemble if cfg.ensemble == "int8" else ()

    def _measure_policy(
        self,
        program: ClassifierProgram,
        policy: TestTimePolicy,
        examples: list[dspy.Example],
        members: tuple[str, ...] = (),
    ) -> PolicyTrial:
        program.deploy(program.backend.model_path, self.cfg.ep, policy, ensemble=members)  # type: ignore[union-attr]
        return measure_policy(program, policy, examples)

    def _inference(self, program: ClassifierProgram, val: Dataset) -> dict[str, Any]:
        cfg, size = self.cfg, program.batch_size
        inputs = val.inputs
        batches = [inputs[i : i + size] for i in range(0, len(inputs), size)]
        self.say(
            "inference",
            f"{cfg.iterations} pass(es) over {len(val)} validation examples, batches of {size}, with the chosen policy",
        )
        times: list[float] = []
        program.probabilities(batches[0])  # warm-up
        with progress_bar(
            total=cfg.iterations * len(batches),
            desc="inference",
            unit="batch",
            disable=not cfg.progress,
            leave=False,
        ) as bar:
            for _ in range(cfg.iterations):
                for batch in batches:
                    start = time.perf_counter()
                    program.probabilities(batch)
                    times.append((time.perf_counter() - start) * 1000.0)
                    bar.update(1)
        stats = latency_stats(times, cfg.iterations * len(inputs))
        provider = getattr(program.backend, "provider", "unknown")
        self.say(
            "inference",
            f"{provider}: p50 {stats['latency_ms_p50']} ms, p95 {stats['latency_ms_p95']} ms per batch, {stats['throughput_per_s']} examples/s",
        )
        return {"provider": provider, **stats}

    def _report(
        self,
        program: ClassifierProgram,
        export_result: ExportResult,
        fp32: Path,
        quant: dict[str, Any],
        test_time: dict[str, Any],
        inference: dict[str, Any],
    ) -> dict[str, Any]:
        self.say("report", f"writing {self.cfg.report_file}")
        training = self.details["training"]
        majority = self.details["majority_class_rate"]
        below = training["val_accuracy"] <= majority + 1e-9
        return check_report(
            {
                "config": self.cfg.to_dict(),
                "training": {
                    **{k: training[k] for k in ("train_accuracy", "val_accuracy", "epochs_run", "seconds")},
                    "majority_class_rate": majority,
                    "at_or_below_majority": below,
                },
                "export": {
                    "path": str(self.cfg.model_file),
                    "parity_max_abs_diff": self.details["export"]["parity_max_abs_diff"],
                    "hierarchy_coverage": export_result.coverage.get("coverage_pct"),
                },
                "quantization": quant,
                "inference": inference,
                "test_time": test_time,
            }
        )


def _setting(value: bool | None, detail: str) -> str:
    """A test-time row of the configuration: on (with what), off, or left to the policy search."""
    if value is None:
        return "open: the policy search decides"
    return f"on (set): {detail}" if value else "off (set)"


def _has_dropout(model: Path) -> bool:
    """Whether the deployed model has Dropout nodes (MC dropout applies; quantization's graph optimization
    removes them from the int8 model)."""
    import onnx

    return any(n.op_type == "Dropout" for n in onnx.load(str(model), load_external_data=False).graph.node)


def run_pipeline(
    config: PipelineConfig | None = None,
    *,
    dataset: Dataset | None = None,
    console: Console | None = None,
    **options: object,
) -> PipelineResult:
    """Run every stage; ``options`` are :class:`PipelineConfig` fields, ``dataset`` overrides ``dataset_path``."""
    cfg = config if config is not None else PipelineConfig(**options)
    return PipelineRun(cfg, console).run(dataset)

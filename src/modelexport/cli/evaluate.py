"""``modelexport evaluate MODEL --data PATH``: measure a test-time policy (accuracy, latency, throughput)."""

from __future__ import annotations

import json

import click

from ..batch.evaluate import evaluate_batch
from ..errors import ConfigError
from ..inference.evaluate import EvaluationResult, evaluate
from ..testtime.memory import BLUR_GATE
from ..testtime.policy import STATISTICS, TestTimePolicy
from .display import echo, progress
from .options import ray_engine_options
from .test_time_options import ensemble_iteration_options, iteration_from

__all__ = ["evaluate_cmd"]


def _table(result: EvaluationResult) -> str:
    rows = [("configuration", result)] + ([("baseline (plain)", result.baseline)] if result.baseline else [])
    head = f"{'':18} {'accuracy':>9} {'p50 ms':>9} {'p95 ms':>9} {'per s':>9} {'views':>6}"
    lines = [head]
    for name, r in rows:
        lines.append(
            f"{name:18} {r.accuracy:9.4f} {r.latency_ms_p50:9.2f} {r.latency_ms_p95:9.2f} {r.throughput_per_s:9.1f} {r.n_views:6d}"
        )
    p = result.policy
    if result.extra.get("iterate"):
        x = result.extra
        lines.append(f"iterative: up to {x['iterate']} steps, feedback {x['feedback']}, {x['loop']} loop")
    if result.ensemble:
        lines.append(f"ensemble: {result.model} + {', '.join(result.ensemble)} (probabilities averaged)")
    lines.append(
        f"model {result.model}: n={result.n}, batch size {result.batch_size}, provider {result.provider}; "
        f"tta={','.join(p['tta_transforms']) or '-'} ({p['tta_aggregate']}), ttt={p['ttt']}, mc_dropout={p['mc_dropout']}"
    )
    mode = "continual (one stream)" if result.stream else "episodic (reset per batch)"
    lines.append(
        f"stream order {result.order}, {mode}; collapse-guard resets: {result.resets}, "
        f"batches served by the source: {result.fallbacks}"
    )
    if result.n_augmented and p.get("adaptive_threshold"):
        lines.append(f"adaptive TTA augmented {result.n_augmented} of {result.n} examples")
    if result.extra.get("engine") == "ray":
        x = result.extra
        lines.append(
            f"ray: {x['workers_seen']} worker(s) of {x['threads_per_worker']} thread(s); per s = the workers' "
            f"summed model-time rate; wall {x['wall_seconds']} s ({x['examples_per_s_wall']} per s, start-up included)"
        )
    if result.mean_entropy is not None:
        lines.append(f"MC dropout mean predictive entropy: {result.mean_entropy:.4f} nats")
    return "\n".join(lines)


@click.command("evaluate")
@click.argument("model", type=click.Path(exists=True))
@click.option(
    "--data",
    "data",
    required=True,
    help="Image folder, CSV/JSON/JSONL (text,label), .npz (x, y) or sklearn:digits.",
)
@click.option(
    "--tta-transforms",
    default="",
    help="Comma list of TTA transforms, e.g. identity,hflip (unknown names list the valid ones).",
)
@click.option(
    "--tta-aggregate",
    default="mean",
    show_default=True,
    help="mean, mean_logits, geometric_mean, max, median, vote, tsharpen.",
)
@click.option(
    "--tta-threshold",
    type=float,
    default=None,
    help="Adaptive TTA: augment only examples less confident than this.",
)
@click.option(
    "--ttt",
    type=click.Choice(["none", "bn", "tent", "sar"]),
    default="none",
    show_default=True,
    help="Test-time adaptation: bn statistics, tent, sar (reliable entropy minimisation, EATA/SAR-style).",
)
@click.option(
    "--statistics",
    type=click.Choice(STATISTICS.names()),
    default="memory",
    show_default=True,
    help="BN statistics: memory (robust: a class-balanced memory of the stream's recent examples, for any "
    "order and batch size) or batch (each batch's own; i.i.d. batches of 16 or more).",
)
@click.option(
    "--memory-size",
    type=click.IntRange(1, 100_000),
    default=128,
    show_default=True,
    help="--statistics memory: examples the stream's class-balanced memory holds.",
)
@click.option(
    "--stem-prior",
    type=click.FloatRange(0, None),
    default=16.0,
    show_default=True,
    help="--statistics memory: the source statistics' weight (examples) in the stem BN layers.",
)
@click.option(
    "--deep-prior",
    type=click.FloatRange(0, None),
    default=64.0,
    show_default=True,
    help="--statistics memory: the source statistics' weight (examples) in the deeper BN layers.",
)
@click.option(
    "--shift-gate",
    type=click.FloatRange(0, None),
    default=0.1,
    show_default=True,
    help="--statistics memory: the stem BN layers' variances adapt only once the memory's are this far from the "
    "source's (nats a channel; fully from twice it; 0: always), or once the inputs --denoise cleans were noisy "
    "(their excess noise); their means always follow; a stream's first batch measures it on itself. While it is "
    "shut on a class-ordered stream of a model whose inputs are restored, the deeper layers' source counts 4 times; "
    "a class-ordered stream's batch counts in the stem only as far as the stem's own shift opens it (0: none of "
    "these).",
)
@click.option(
    "--anchors/--no-anchors",
    default=True,
    show_default=True,
    help="--statistics memory: where the model records source anchors (the image pipeline writes a few training "
    "images per class) and a stream's inputs were noisier than the source's, the deeper BN layers' variances are "
    "measured on the anchors under the stream's statistics, scaled by how its examples differ from the anchors of "
    "their predicted classes, and their means moved by that difference while the memory lacks classes; "
    "--no-anchors: the source's.",
)
@click.option(
    "--denoise",
    type=click.FloatRange(0, None),
    default=None,
    help="--ttt: image inputs move toward their blur by this times their squared noise ratio above the source's, "
    "which the model must record (the image pipeline does). Default: the strength the record calibrated; 0: off.",
)
@click.option(
    "--sharpen",
    type=click.FloatRange(0, None),
    default=None,
    help="--ttt: image inputs smoother than the source's (a blur) get an unsharp mask of this times the gain "
    "that brings their detail back to the model's record, once the stream's mean loss of detail passes "
    f"{BLUR_GATE:g} (fully from {2 * BLUR_GATE:g}; a mild blur is left as it is). Default: the strength the "
    "record calibrated; 0: off.",
)
@click.option(
    "--bn-prior",
    type=float,
    default=0.0,
    show_default=True,
    help="--statistics batch: the source statistics' weight in pseudo-examples (batch of n gets n/(n+N)).",
)
@click.option(
    "--order",
    default="as-is",
    show_default=True,
    help="Stream order to test under: as-is, shuffle, class-sorted, dirichlet:ALPHA (seeded by --seed).",
)
@click.option(
    "--stream/--episodic",
    default=True,
    show_default=True,
    help="Adapt continually along the batches (one stream, the default) or reset to the source per batch.",
)
@click.option("--reset-every", type=int, default=None, help="Continual: reset to the source every N batches.")
@click.option(
    "--collapse-threshold",
    type=float,
    default=0.2,
    show_default=True,
    help="Collapse guard: reset to the source when predicted-class entropy over the stream falls below "
    "this fraction of log(C) (0: off).",
)
@click.option(
    "--label-shift-alpha",
    type=float,
    default=0.001,
    show_default=True,
    help="--statistics batch: the label-shift guard: a batch whose predicted classes fail a G-test against "
    "the stream's at this significance, or under 16 examples, is predicted by the source model (0: off).",
)
@click.option(
    "--prior-correction",
    is_flag=True,
    help="Reweight outputs by the label distribution of the last 64 predictions (class-sorted streams).",
)
@click.option(
    "--ttt-iterations",
    type=int,
    default=None,
    help="BN passes (default: one per BN layer) or Tent steps (default 1).",
)
@click.option(
    "--momentum",
    type=float,
    default=1.0,
    show_default=True,
    help="--statistics batch: 1 = test-batch statistics only; continual, the running statistics' momentum.",
)
@click.option(
    "--learning-rate", type=float, default=1e-3, show_default=True, help="Tent learning rate (Adam)."
)
@click.option(
    "--step-layers",
    type=int,
    default=1,
    show_default=True,
    help="tent/sar: the last N BN layers' scale/bias are trained, torch runs the graph from there (0: all).",
)
@click.option(
    "--mc-dropout",
    type=int,
    default=0,
    show_default=True,
    help="MC-dropout passes (needs an export with --keep-dropout).",
)
@click.option("--batch-size", type=int, default=64, show_default=True, help="Samples per ONNX Runtime run.")
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed for random TTA transforms and MC dropout."
)
@ensemble_iteration_options("", "which start at the data's values, or zeros")
@click.option("--baseline", is_flag=True, help="Also measure the plain model.")
@ray_engine_options(
    "local: this process; ray: Ray actors, the policy applied inside each (needs "
    "'modelexport[distributed]'; adaptation needs --episodic there)."
)
@click.option("--ep", "providers", default=None, help="Execution providers in order, e.g. cuda,cpu.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="Output format.",
)
def evaluate_cmd(
    model: str,
    data: str,
    tta_transforms: str,
    tta_aggregate: str,
    tta_threshold: float | None,
    ttt: str,
    statistics: str,
    memory_size: int,
    stem_prior: float,
    deep_prior: float,
    shift_gate: float,
    anchors: bool,
    denoise: float | None,
    sharpen: float | None,
    bn_prior: float,
    order: str,
    stream: bool,
    reset_every: int | None,
    collapse_threshold: float,
    label_shift_alpha: float,
    prior_correction: bool,
    ttt_iterations: int | None,
    momentum: float,
    learning_rate: float,
    step_layers: int,
    mc_dropout: int,
    batch_size: int,
    seed: int,
    ensemble: tuple[str, ...],
    iterate: int | None,
    feedback: str,
    loop: str,
    tol: float | None,
    baseline: bool,
    engine: str,
    num_workers: int,
    threads_per_worker: int,
    address: str | None,
    providers: str | None,
    fmt: str,
) -> int:
    """Accuracy, latency p50/p95 and throughput of MODEL (folder or .onnx) with a test-time policy on --data."""

    policy = TestTimePolicy(
        tta_transforms=tta_transforms,
        tta_aggregate=tta_aggregate,
        adaptive_threshold=tta_threshold,
        ttt=ttt,
        statistics=statistics,
        memory_size=memory_size,
        stem_prior=stem_prior,
        deep_prior=deep_prior,
        shift_gate=shift_gate,
        anchors=anchors,
        denoise=denoise,
        sharpen=sharpen,
        bn_prior=bn_prior,
        episodic=not stream,
        reset_every=reset_every,
        collapse_threshold=collapse_threshold,
        label_shift_alpha=label_shift_alpha,
        prior_correction=prior_correction,
        ttt_iterations=ttt_iterations,
        momentum=momentum,
        learning_rate=learning_rate,
        step_layers=step_layers,
        mc_dropout=mc_dropout,
        seed=seed,
    )
    ep = [p for p in (providers or "").split(",") if p]
    iteration = iteration_from(iterate, feedback, loop, tol)
    if engine == "local":
        if num_workers != 1 or address:
            raise click.UsageError("--num-workers and --address need --engine ray")
        with progress(f"evaluate {model} on {data}"):
            result = evaluate(
                model,
                data,
                policy,
                batch_size=batch_size,
                baseline=baseline,
                order=order,
                providers=ep,
                ensemble=ensemble,
                iteration=iteration,
            )
    else:
        if ensemble or iteration:
            raise ConfigError(
                "--ensemble and --iterate run with --engine local", hint="drop --engine ray, or those options"
            )
        with progress(f"evaluate {model} on {data} (Ray)", spinner=False):
            result = evaluate_batch(
                model,
                data,
                policy,
                engine,
                num_workers=num_workers,
                threads_per_worker=threads_per_worker,
                batch_size=batch_size,
                address=address,
                baseline=baseline,
                providers=ep,
                order=order,
            )
    if fmt == "json":
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        echo(_table(result), more="--format json")
    return 0

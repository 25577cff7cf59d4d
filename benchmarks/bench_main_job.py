"""Where `tl-geometry run`'s analysis goes, observer by observer, on captured SmolLM2-135M layers (issue 22).

Runs one forward pass over ``--n-seqs`` windows of ``--seq-len`` tokens (default 2 x 1024, the
main-job line of ``bench_scale.py``) of the embedded CPython documentation corpus, keeps what each
layer gives the observers (``hook_pattern`` at the last query, ``hook_v``), then times the main
job's four observers on those layers, each alone, the best of ``--repeat`` passes over all
layers, on one torch thread: separability (attention ranking, log grid), the envelopes, the
diagnostics and the taxonomy (with each, its best time on layer 0, where repeated tokens give
equal values, and on its slowest layer). The layers stay in memory between passes, so each figure is the
observer's own cost without the forward pass evicting its data (``analysis_s`` in a real run is
higher by that). A before/after runs this script twice, once with ``PYTHONPATH`` at the other
checkout.

Run:  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_main_job.py
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-seqs", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, mps")
    from roofline import add_allocator_flag, allocator_line, cpu_line

    add_allocator_flag(parser)
    args = parser.parse_args()

    import tl_geometry as tlg
    from tl_geometry.capture.hooks import run_streaming
    from tl_geometry.capture.observers import SeparabilityObserver
    from tl_geometry.diagnostics.observer import DiagnosticsObserver
    from tl_geometry.taxonomy.observer import TaxonomyObserver
    from tl_geometry.theory.observer import BoundsObserver

    allocator = allocator_line(args.keep_freed_memory)
    torch.set_num_threads(1)
    model = tlg.load_model("smollm2-135m", device=args.device)
    info = tlg.describe_model(model)
    tokens = tlg.corpus_tokens(model, tlg.corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len))
    batches = []

    class Keep:
        def observe(self, batch) -> None:
            batches.append(batch)

    with torch.inference_mode():
        run_streaming(
            model, info, tokens, torch.arange(args.n_seqs), range(info.n_layers), (args.seq_len - 1,), [Keep()]
        )
    observers = {
        "separability (attention, log grid)": lambda: SeparabilityObserver(info, "log"),
        "envelopes (bounds)": lambda: BoundsObserver(info, "log", 0.5, torch.float64, "measured"),
        "diagnostics": lambda: DiagnosticsObserver(info),
        "taxonomy": lambda: TaxonomyObserver(info, "log", torch.float64),
    }
    print(f"{tlg.__file__}\n{cpu_line()}\n{allocator}")
    print(f"{len(batches)} layers of {args.n_seqs} x {args.seq_len} tokens, load average {os.getloadavg()[0]:.1f}")
    total = 0.0
    for name, make in observers.items():
        best, per_layer = float("inf"), [float("inf")] * len(batches)
        for _ in range(args.repeat):
            observer = make()
            start = time.perf_counter()
            for i, batch in enumerate(batches):
                layer_start = time.perf_counter()
                observer.observe(batch)
                per_layer[i] = min(per_layer[i], time.perf_counter() - layer_start)
            best = min(best, time.perf_counter() - start)
        total += best
        slowest = max(range(len(batches)), key=per_layer.__getitem__)
        print(
            f"{name}: {best * 1e3:.0f} ms ({best * 1e3 / len(batches):.1f} ms a layer; layer 0 "
            f"{per_layer[0] * 1e3:.1f} ms, the slowest layer {batches[slowest].layer} {per_layer[slowest] * 1e3:.1f} ms)",
            flush=True,
        )
    print(f"all four: {total * 1e3:.0f} ms; load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""One process's analysis and forward times, with glibc's default allocator or freed memory kept.

The allocator is set once per process, so a comparison alternates whole processes (docs/performance.md,
"Freed memory"); each loads SmolLM2-135M, warms every kernel up, then prints the analysis seconds of
every query position of a 512-token window (log grid), of the main job and of every ``N`` (2 x 1024
tokens, the main job as ``bench_scale.py`` runs it), each ``--repeat`` times (the first call of a
job pays for the pages it is the first to touch), and the best of two plain forward passes of the
2 x 1024 tokens. The line names pyarrow's pool (pandas' text columns): its own (mimalloc) unless
``ARROW_DEFAULT_MEMORY_POOL`` names another, ``system`` being ``malloc`` (docs/performance.md,
"Measured and not taken").

Run:  for i in 1 2 3; do
        OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_allocator.py --keep-freed-memory
        OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_allocator.py
      done
      pyarrow's own pool against malloc, freed memory kept in both:
      for i in 1 2 3; do
        OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_allocator.py --keep-freed-memory --repeat 3
        ARROW_DEFAULT_MEMORY_POOL=system OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_allocator.py \
            --keep-freed-memory --repeat 3
      done
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from roofline import add_allocator_flag, allocator_line, forward_seconds

    add_allocator_flag(parser)
    parser.add_argument("--repeat", type=int, default=1, help="time each job this many times, one after the other")
    args = parser.parse_args()
    import tl_geometry as tlg

    allocator = allocator_line(args.keep_freed_memory)
    torch.set_num_threads(1)  # after the import: a count the package takes as the user's
    model = tlg.load_model("smollm2-135m")
    window = tlg.corpus_tokens(model, tlg.corpus.python_docs(n_seqs=1, seq_len=512))
    windows = tlg.corpus_tokens(model, tlg.corpus.python_docs(n_seqs=2, seq_len=1024))
    jobs = {
        "every query (1 x 512)": (window, dict(query_positions="all", ns="log", taxonomy=False)),
        "main job (2 x 1024)": (windows, dict(diagnostics=True, bounds=True, ns="log", batch_size=2)),
        "every N (2 x 1024)": (windows, dict(ns="all", taxonomy=False, batch_size=2)),
    }
    for tokens, settings in jobs.values():  # numba's kernels and the imports, untimed
        tlg.analyze(model, tokens[:, :64], progress=False, **settings)
    seconds = {
        name: [tlg.analyze(model, t, progress=False, **s).timings["analysis_s"] for _ in range(args.repeat)]
        for name, (t, s) in jobs.items()
    }
    forward = forward_seconds(model, windows, batch_size=2)  # one batch, the best of two passes
    times = ", ".join(f"{name} {', '.join(f'{x:.2f}' for x in values)} s" for name, values in seconds.items())
    print(f"{allocator}: analysis {times}; plain forward (2 x 1024) {forward:.2f} s", flush=True)


if __name__ == "__main__":
    main()

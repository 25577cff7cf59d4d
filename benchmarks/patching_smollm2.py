"""Attribution patching against exact patching of every head's output on SmolLM2-135M (IOI pairs).

The clean prompts are IOI sentences ("When Mary and John went to the store, John gave a drink to"
-> " Mary"), the corrupted ones swap the repeated name ("..., Mary gave a drink to"), built from the
tokenizer (every name one token, both prompts the same length). The metric is the logit difference
``logit(IO) - logit(S)`` at the last position, mean over the batch, normalised to 0 on the corrupted
run and 1 on the clean run. Reports, with the load average:

1. the largest difference between the stacked exact patching (``patch_head_out``) and one forward
   pass per head (``transformer_lens.patching.get_act_patch_attn_head_out_all_pos``, the old
   ``head_out``; skipped with ``--no-per-head``), and the seconds of each;
2. Pearson and Spearman correlation over heads of ``attribute_head_out`` with the exact change
   ``patch_head_out - metric(corrupted)``, the seconds of attribution and the speed-ups;
3. the heads with the largest exact effects and their attribution estimates.

Run:  HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python benchmarks/patching_smollm2.py [--pairs 2] [--no-per-head]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from scipy import stats

import tl_geometry as tlg
from tl_geometry.intervention.patching import attribute_head_out, patch_head_out

TEMPLATE = "When {a} and {b} went to the store, {s} gave a drink to"
NAMES = [("Mary", "John"), ("Alice", "Bob"), ("Sarah", "Tom"), ("Anna", "James")]


def ioi_pairs(model, n_pairs: int):
    """Clean and corrupted tokens ``[n_pairs, pos]`` and the (IO, S) answer token ids of each row."""
    tok = model.tokenizer
    clean, corrupt, answers = [], [], []
    for io, s in NAMES[:n_pairs]:
        ids = [tok.encode(" " + name, add_special_tokens=False) for name in (io, s)]
        assert all(len(i) == 1 for i in ids), f"{io}/{s} is not one token each"
        c = model.to_tokens(TEMPLATE.format(a=io, b=s, s=s))[0]
        r = model.to_tokens(TEMPLATE.format(a=io, b=s, s=io))[0]
        assert c.shape == r.shape
        clean.append(c)
        corrupt.append(r)
        answers.append((ids[0][0], ids[1][0]))
    return torch.stack(clean), torch.stack(corrupt), torch.tensor(answers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--no-per-head", action="store_true", help="skip the one-pass-per-head reference")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = tlg.load_model("smollm2-135m")
    clean, corrupt, answers = ioi_pairs(model, args.pairs)
    rows = torch.arange(len(answers))

    def logit_diff(logits):
        last = logits[:, -1]
        return (last[rows, answers[:, 0]] - last[rows, answers[:, 1]]).mean()

    with torch.inference_mode():
        clean_ld = float(logit_diff(model(clean)))
        corrupt_ld = float(logit_diff(model(corrupt)))

    def metric(logits):
        return (logit_diff(logits) - corrupt_ld) / (clean_ld - corrupt_ld)

    out: dict = {
        "pairs": args.pairs,
        "pos": clean.shape[1],
        "clean_logit_diff": clean_ld,
        "corrupt_logit_diff": corrupt_ld,
    }
    print(
        f"{args.pairs} IOI pairs of {clean.shape[1]} tokens; logit diff clean {clean_ld:.3f}, corrupted {corrupt_ld:.3f}"
    )
    t = time.perf_counter()
    attribution = attribute_head_out(model, clean, corrupt, metric)
    out["attribution_s"] = time.perf_counter() - t
    out["load_attribution"] = os.getloadavg()
    t = time.perf_counter()
    exact = patch_head_out(model, clean, corrupt, metric)
    out["stacked_exact_s"] = time.perf_counter() - t
    out["load_stacked"] = os.getloadavg()
    change = exact  # the metric is 0 on the corrupted run: the patched metric is its change
    x, y = attribution.flatten().double().numpy(), change.flatten().double().numpy()
    out["pearson"] = float(stats.pearsonr(x, y)[0])
    out["spearman"] = float(stats.spearmanr(x, y)[0])
    top = change.flatten().abs().argsort(descending=True)[:10]
    n_heads = exact.shape[1]
    out["top_heads"] = [
        {"head": f"L{int(i) // n_heads}H{int(i) % n_heads}", "exact": float(y[i]), "attribution": float(x[i])}
        for i in top
    ]
    if not args.no_per_head:
        from transformer_lens import patching

        t = time.perf_counter()
        with torch.inference_mode():
            _, cache = model.run_with_cache(clean, names_filter=lambda name: name.endswith("hook_z"))
            per_head = patching.get_act_patch_attn_head_out_all_pos(model, corrupt, cache, metric).cpu()
        out["per_head_s"] = time.perf_counter() - t
        out["load_per_head"] = os.getloadavg()
        out["max_abs_diff_stacked_vs_per_head"] = float((per_head - exact).abs().max())
        out["speedup_stacked"] = out["per_head_s"] / out["stacked_exact_s"]
        out["speedup_attribution_vs_per_head"] = out["per_head_s"] / out["attribution_s"]
    out["speedup_attribution_vs_stacked"] = out["stacked_exact_s"] / out["attribution_s"]
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

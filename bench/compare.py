#!/usr/bin/env python3
"""Join `memeff bench --json` rows with bench/torch_sdpa.py rows measured in the same call and
print a markdown table of TFLOP/s with ratios (memeff / peer): cuDNN first (PyTorch's default on
the H200), then FlashAttention-2 and the efficient kernel; optionally a bar plot.

    python3 bench/compare.py memeff_bench.json torch.json [--baseline sm80.json] \
        [--markdown table.md] [--plot out.png]

--baseline adds a column for a second memeff run (e.g. `memeff bench --backend cuda`, the
mma.sync kernels) so a kernel change is shown beside the kernel it replaces.
"""
import argparse
import json
import sys


def load_rows(path):
    with open(path) as fh:
        data = json.load(fh)
    return data["rows"] if isinstance(data, dict) else data


def key(row):
    return (int(row["B"]), int(row["H"]), int(row.get("Hkv", row["H"])), int(row["Lq"]),
            int(row["Lk"]), int(row["D"]), bool(row["causal"]), round(float(row["dropout"]), 4))


def shape_label(k):
    B, H, Hkv, Lq, Lk, D, causal, _ = k
    heads = f"{H}" if Hkv == H else f"{H}/{Hkv}kv"
    length = f"{Lq}" if Lq == Lk else f"{Lq}x{Lk}"
    return f"{B},{heads},{length},{D}{' causal' if causal else ''}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("memeff")
    ap.add_argument("torch")
    ap.add_argument("--baseline", help="a second memeff bench JSON shown beside the first")
    ap.add_argument("--markdown")
    ap.add_argument("--plot")
    a = ap.parse_args()
    ours = {key(r): r for r in load_rows(a.memeff) if "error" not in r}
    base = {key(r): r for r in load_rows(a.baseline) if "error" not in r} if a.baseline else {}
    peers = {}
    for r in load_rows(a.torch):
        if "error" not in r:
            peers.setdefault(key(r), {})[r["backend"]] = r

    def pair(r):
        return f"{r['fwd_tflops']:.0f} / {r['bwd_tflops']:.0f}" if r else "n/a"

    head = "| shape (B,H,L,D) | p | memeff fwd / bwd (backends) |"
    rule = "|---|---|---|"
    if base:
        head += " baseline fwd / bwd |"
        rule += "---|"
    head += (" cudnn fwd / bwd | flash fwd / bwd | efficient fwd / bwd | fwd vs cudnn | bwd vs cudnn "
             "| fwd vs flash | bwd vs flash | extra MiB memeff / cudnn |")
    rule += "---|---|---|---|---|---|---|---|"
    lines = [head, rule]
    plot_rows = []
    for k in sorted(ours, key=lambda k: (k[:7], k[7])):
        o, p = ours[k], peers.get(k, {})

        def ratio(name, field):
            r = p.get(name)
            return f"{o[field] / r[field]:.2f}" if r and r[field] > 0 else "n/a"

        backends = o.get("backend", "?")
        if o.get("backend_backward", backends) != backends:
            backends += " + " + o["backend_backward"]
        mem = f"{o.get('extra_mib', float('nan')):.0f} / " + (
            f"{p['cudnn']['extra_mib']:.0f}" if "cudnn" in p else "n/a")
        line = f"| {shape_label(k)} | {k[7]} | {pair(o)} ({backends}) |"
        if base:
            line += f" {pair(base.get(k))} |"
        line += (f" {pair(p.get('cudnn'))} | {pair(p.get('flash'))} | {pair(p.get('efficient'))} | "
                 f"{ratio('cudnn', 'fwd_tflops')} | {ratio('cudnn', 'bwd_tflops')} | "
                 f"{ratio('flash', 'fwd_tflops')} | {ratio('flash', 'bwd_tflops')} | {mem} |")
        lines.append(line)
        plot_rows.append((f"{shape_label(k)}\np={k[7]}", o, base.get(k), p))
    table = "\n".join(lines)
    print(table)
    if a.markdown:
        with open(a.markdown, "w") as fh:
            fh.write(table + "\n")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        names = ["memeff"] + (["baseline"] if base else []) + ["cudnn", "flash", "efficient"]
        fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.6 * len(plot_rows)), 8), sharex=True)
        for ax, field, title in ((axes[0], "fwd_tflops", "forward"), (axes[1], "bwd_tflops", "backward")):
            width = 0.8 / len(names)
            for n, name in enumerate(names):
                def value(row):
                    _, o, b, p = row
                    r = o if name == "memeff" else b if name == "baseline" else p.get(name)
                    return (r or {}).get(field, 0)
                xs = [i + (n - (len(names) - 1) / 2) * width for i in range(len(plot_rows))]
                ax.bar(xs, [value(r) for r in plot_rows], width, label=name)
            ax.set_ylabel(f"{title} TFLOP/s")
            ax.legend(ncol=len(names), fontsize=8)
        axes[1].set_xticks(range(len(plot_rows)))
        axes[1].set_xticklabels([r[0] for r in plot_rows], fontsize=7)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())

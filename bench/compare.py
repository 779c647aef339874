#!/usr/bin/env python3
"""Join `memeff bench --json` rows with bench/torch_sdpa.py rows measured in the same call and
print a markdown table of TFLOP/s with ratios (memeff / peer), optionally a bar plot.

    python3 bench/compare.py memeff_bench.json torch.json [--markdown table.md] [--plot out.png]
"""
import argparse
import json
import sys


def load_rows(path):
    with open(path) as fh:
        data = json.load(fh)
    return data["rows"] if isinstance(data, dict) else data


def key(row):
    return (int(row["B"]), int(row["H"]), int(row["Lq"]), int(row["Lk"]), int(row["D"]),
            bool(row["causal"]), round(float(row["dropout"]), 4))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("memeff")
    ap.add_argument("torch")
    ap.add_argument("--markdown")
    ap.add_argument("--plot")
    a = ap.parse_args()
    ours = {key(r): r for r in load_rows(a.memeff) if "error" not in r}
    peers = {}
    for r in load_rows(a.torch):
        if "error" not in r:
            peers.setdefault(key(r), {})[r["backend"]] = r
    lines = ["| shape (B,H,L,D,causal) | p | memeff fwd / bwd | flash fwd / bwd | efficient fwd / bwd | cudnn fwd / bwd "
             "| fwd vs flash | bwd vs flash | fwd vs eff. | bwd vs eff. | extra MiB memeff / cudnn |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    plot_rows = []
    for k in sorted(ours, key=lambda k: (k[:6], k[6])):
        o, p = ours[k], peers.get(k, {})
        def pair(r):
            return f"{r['fwd_tflops']:.0f} / {r['bwd_tflops']:.0f}" if r else "n/a"
        def ratio(name, field):
            r = p.get(name)
            return f"{o[field] / r[field]:.2f}" if r and r[field] > 0 else "n/a"
        shape = f"{k[0]},{k[1]},{k[2]},{k[4]},{'causal' if k[5] else 'full'}"
        mem = f"{o.get('extra_mib', float('nan')):.0f} / " + (f"{p['cudnn']['extra_mib']:.0f}" if "cudnn" in p else "n/a")
        lines.append(f"| {shape} | {k[6]} | {pair(o)} | {pair(p.get('flash'))} | {pair(p.get('efficient'))} | "
                     f"{pair(p.get('cudnn'))} | {ratio('flash', 'fwd_tflops')} | {ratio('flash', 'bwd_tflops')} | "
                     f"{ratio('efficient', 'fwd_tflops')} | {ratio('efficient', 'bwd_tflops')} | {mem} |")
        plot_rows.append((f"{shape}\np={k[6]}", o, p))
    table = "\n".join(lines)
    print(table)
    if a.markdown:
        with open(a.markdown, "w") as fh:
            fh.write(table + "\n")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        names = ["memeff", "flash", "efficient", "cudnn"]
        fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.6 * len(plot_rows)), 8), sharex=True)
        for ax, field, title in ((axes[0], "fwd_tflops", "forward"), (axes[1], "bwd_tflops", "backward")):
            width = 0.2
            for n, name in enumerate(names):
                vals = [(o if name == "memeff" else p.get(name, {})).get(field, 0) for _, o, p in plot_rows]
                ax.bar([i + (n - 1.5) * width for i in range(len(plot_rows))], vals, width, label=name)
            ax.set_ylabel(f"{title} TFLOP/s")
            ax.legend(ncol=4, fontsize=8)
        axes[1].set_xticks(range(len(plot_rows)))
        axes[1].set_xticklabels([r[0] for r in plot_rows], fontsize=7)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# The split-KV forward (cuda_splitkv) against the fused forwards and PyTorch's SDPA backends on
# decode shapes (issue 24), forward only: memeff bench with the split path forced on
# (cuda_splitkv first, the fused backends after it) and off (cuda_sm90, cuda), then
# bench/splitkv_torch.py where python3 imports torch, and one table of the medians.
# Usage: bench/splitkv_decode.sh OUT_DIR [BUILD_DIR]   (BUILD_DIR default: build-dev, else build)
# SPLITKV_TORCH=0 leaves out torch's rows (for a second build timed beside the same torch run).
set -uo pipefail
out="${1:?usage: bench/splitkv_decode.sh OUT_DIR [BUILD_DIR]}"
here="$(cd "$(dirname "$0")" && pwd)"
build="${2:-}"
if [ -z "$build" ]; then
  for d in "$here/../build-dev" "$here/../build"; do [ -x "$d/tools/memeff" ] && build="$d" && break; done
fi
memeff="${build:?no BUILD_DIR with tools/memeff}/tools/memeff"
mkdir -p "$out"

# B,H,Lq,Lk,D,causal,Hkv (causal 1: bottom_right here) and the dropout each is timed with.
shapes_p0=(8,32,1,8192,128,0,8 8,32,16,32768,128,1,8 1,32,1,32768,128,0,8 16,16,1,4096,64,0,16)
shapes_p1=(4,32,4,8192,128,0,8)
iters="${ITERS:-50}"

run() {  # name backend-list dropout shapes...
  local name="$1" backends="$2" p="$3"
  shift 3
  echo "== memeff bench $name p=$p ($(date +%T))" >&2
  timeout 300 "$memeff" bench --forward-only --causal-align bottom_right --iters "$iters" \
    --warmup 10 --backend "$backends" \
    --dropout "$p" --shapes "$@" --json "$out/memeff_${name}_p$p.json" 2>> "$out/memeff_bench.log" |
    tee -a "$out/memeff_bench.txt"
}
for p_shapes in "0:${shapes_p0[*]}" "0.1:${shapes_p1[*]}"; do
  p="${p_shapes%%:*}"
  read -r -a shapes <<< "${p_shapes#*:}"
  run split cuda_splitkv,cuda_sm90,cuda "$p" "${shapes[@]}"
  run fused cuda_sm90,cuda "$p" "${shapes[@]}"
  run default "" "$p" "${shapes[@]}"  # the dispatcher's choice
done

if [ "${SPLITKV_TORCH:-1}" = 0 ]; then
  echo "SPLITKV_TORCH=0: no torch rows" >&2
elif python3 -c 'import torch; assert torch.cuda.is_available()' 2> /dev/null; then
  echo "== torch SDPA ($(date +%T))" >&2
  timeout 600 python3 "$here/splitkv_torch.py" --json "$out/torch.json" \
    --shapes "${shapes_p0[@]/%/:0}" "${shapes_p1[@]/%/:0.1}" | tee "$out/torch.txt"
else
  echo "python3 with CUDA torch not found: no torch rows" >&2
fi

python3 - "$out" << 'PY'
import glob, json, os, sys
out = sys.argv[1]
rows = {}
def key(r):
    return (r["B"], r["H"], r["Hkv"], r["Lq"], r["Lk"], r["D"], r.get("causal_mode", r.get("causal")),
            r["dropout"])
for path in glob.glob(os.path.join(out, "memeff_*_p*.json")):
    name = os.path.basename(path).split("_")[1]
    for r in json.load(open(path))["rows"]:
        k = key(r)
        rows.setdefault(k, {})[name] = r.get("fwd_ms") if "error" not in r else None
        if name == "default":
            rows[k]["default_backend"] = r.get("backend")
torch_path = os.path.join(out, "torch.json")
if os.path.exists(torch_path):
    for r in json.load(open(torch_path))["rows"]:
        k = key(r)
        if k in rows and "error" not in r:
            best = rows[k].get("torch_best")
            if best is None or r["fwd_ms"] < best[0]:
                rows[k]["torch_best"] = (r["fwd_ms"], r["backend"])
fmt = lambda x: f"{x:8.4f}" if isinstance(x, float) else f"{'-':>8}"
print(f"{'B,Hq/Hkv,Lq,Lk,D,causal,p':40s} {'split':>8} {'fused':>8} {'fused/split':>11} "
      f"{'default':>8} {'(backend)':14s} {'torch best':>10} {'(backend)':10s} {'torch/split':>11}")
for k, v in sorted(rows.items()):
    B, H, Hkv, Lq, Lk, D, causal, p = k
    split, fused = v.get("split"), v.get("fused")
    tb = v.get("torch_best")
    ratio = f"{fused / split:11.2f}" if split and fused else f"{'-':>11}"
    tratio = f"{tb[0] / split:11.2f}" if split and tb else f"{'-':>11}"
    print(f"{f'{B},{H}/{Hkv},{Lq},{Lk},{D},{causal},{p}':40s} {fmt(split)} {fmt(fused)} {ratio} "
          f"{fmt(v.get('default'))} {str(v.get('default_backend', '-')):14s} "
          f"{fmt(tb[0]) if tb else fmt(None):>10} {tb[1] if tb else '-':10s} {tratio}")
PY

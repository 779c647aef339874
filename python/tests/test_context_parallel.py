# Context-parallel attention (memeff.torch.context_parallel_attention) over torch.distributed.
# Four processes are started once for the module (gloo on the CPU, the `cpu` backend); for
# N = 1, 2, 3, 4 the first N form a group and run the ring on their shards, and every rank
# compares out, lse, dq, dk, dv (and dbias), unsharded, with the single-process dense op for the
# same (seed, offset). The dropout mask is read off the ring's outputs (q = 0, V and dO the
# identity) and compared with dropout_mask, element by element. The same checks run over NCCL
# where there are enough GPUs; the block calls themselves are checked on one GPU too.
import datetime
import json
import os
import tempfile
import time
import traceback
import zlib

from typing import NamedTuple, Optional

import pytest

torch = pytest.importorskip("torch")
import memeff.torch as mt  # noqa: E402

WORLD = 4
GROUP_SIZES = (1, 2, 3, 4)


class Case(NamedTuple):
    B: int
    Hq: int
    Hkv: int
    Lq: int
    Lk: int
    D: int
    Dv: int
    causal: str
    p: float
    layout: str
    bias: Optional[str] = None  # "rows": [B, Hq, Lq, Lk]; "shared": [1, Hq, 1, Lk]
    dtype: str = "float32"
    strided: bool = False  # q, k, v, dout from [B, L, H, D] storage


# Lengths that do not cut into equal shares are passed as seq_len / kv_seq_len.
CASES = {
    "dense_p0.3": Case(2, 2, 2, 24, 24, 16, 16, "none", 0.3, "zigzag"),
    "causal_p0.3": Case(2, 2, 2, 24, 24, 16, 16, "top_left", 0.3, "zigzag"),
    "causal_contiguous": Case(1, 2, 2, 24, 24, 16, 16, "top_left", 0.3, "contiguous"),
    "causal_gqa_dv_uneven_strided": Case(1, 4, 2, 29, 29, 16, 8, "top_left", 0.3, "zigzag",
                                         strided=True),
    "dense_gqa_uneven_contiguous": Case(1, 4, 1, 23, 23, 8, 16, "none", 0.3, "contiguous"),
    "cross_lq_ne_lk": Case(1, 2, 2, 16, 40, 16, 16, "none", 0.3, "zigzag"),
    "causal_bias_rows": Case(1, 2, 2, 24, 24, 16, 16, "top_left", 0.3, "zigzag", "rows"),
    "dense_bias_shared": Case(2, 2, 2, 24, 24, 8, 8, "none", 0.3, "zigzag", "shared"),
    "no_dropout": Case(1, 2, 2, 24, 24, 16, 16, "top_left", 0.0, "zigzag"),
    "causal_bf16": Case(1, 2, 2, 32, 32, 16, 16, "top_left", 0.3, "zigzag", dtype="bfloat16"),
}
MASK_CASES = {  # (B, H, L, causal, p, layout)
    "mask_dense": (1, 2, 24, "none", 0.5, "zigzag"),
    "mask_causal": (1, 2, 24, "top_left", 0.5, "zigzag"),
    "mask_causal_uneven": (1, 1, 21, "top_left", 0.5, "contiguous"),
}
OTHER_CHECKS = ("drawn_state_is_shared", "autocast", "errors")

# fp32: the ring merges partial outputs through lse and sums per-block gradients, so it differs
# from the single call by a few roundings: at most 6e-7 of the tensor's largest magnitude was
# seen over every case here; the bound is 2e-6 of it (at least 1). One rank holding the whole
# sequence in one chunk makes the same call: equal bit for bit (on the CPU).
# bf16: each block's out, dq, dk, dv is rounded to bf16 before it is accumulated (as in the C++
# ring), about one bf16 rounding (2^-8) per block more than the single call (seen: 7e-3).
TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 2e-2}


def _assert_close(got, want, what):
    want = want.detach()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    error = (got.double() - want.double()).abs().max().item()
    bound = TOLERANCE[want.dtype] * max(1.0, want.abs().max().item())
    assert error <= bound, f"{what}: max error {error:.3g} exceeds {bound:.3g}"


def _state(name):
    h = zlib.crc32(name.encode())
    return torch.tensor([h, 7 * h + 3], dtype=torch.int64)


def _check_case(name, group, n, device, backends):
    import torch.distributed as dist
    B, Hq, Hkv, Lq, Lk, D, Dv, causal, p, layout, bias_kind, dtype, strided = CASES[name]
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device, getattr(torch, dtype))

    q, k, v = randn(B, Hq, Lq, D), randn(B, Hkv, Lk, D), randn(B, Hkv, Lk, Dv)
    dout = randn(B, Hq, Lq, Dv)
    bias = {None: None, "rows": randn(B, Hq, Lq, Lk), "shared": randn(1, Hq, 1, Lk)}[bias_kind]
    state = _state(name)

    # The single-process call over the whole sequence.
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if bias is not None:
        leaves.append(bias.clone().requires_grad_())
    out_ref, lse_ref, _ = torch.ops.memeff.fwd(
        leaves[0], leaves[1], leaves[2], leaves[3] if bias is not None else None, state, p,
        causal, None, list(backends))
    grads_ref = torch.autograd.grad(out_ref, leaves, dout)

    def shard(x):
        x = mt.context_parallel_shard(x, group, 2, layout)
        # [B, L, H, D] storage seen as [B, H, L, D], as a model's projections give it
        return x.transpose(1, 2).contiguous().transpose(1, 2) if strided else x

    local = [shard(t).detach().requires_grad_() for t in (q, k, v)]
    local_bias = None
    if bias is not None:
        local_bias = (shard(bias) if bias_kind == "rows" else bias).clone().requires_grad_()
        local.append(local_bias)
    uneven = Lq % (2 * n) != 0 or Lk % (2 * n) != 0 or Lq != Lk
    with mt.use_backends(*backends):
        out, lse = mt.context_parallel_attention(
            local[0], local[1], local[2], group, bias=local_bias, dropout_p=p, causal=causal,
            layout=layout, seq_len=Lq if uneven else None, kv_seq_len=Lk if uneven else None,
            rng_state=state, return_lse=True)
        grads = list(torch.autograd.grad(out, local, shard(dout)))
    if bias_kind == "shared":  # each rank's part of the sum over its rows
        dist.all_reduce(grads[3], group=group)

    def whole(x, length):
        return mt.context_parallel_unshard(x.detach(), group, 2, layout, seq_len=length)

    got = {"out": whole(out, Lq), "lse": whole(lse, Lq), "dq": whole(grads[0], Lq),
           "dk": whole(grads[1], Lk), "dv": whole(grads[2], Lk)}
    want = {"out": out_ref, "lse": lse_ref, "dq": grads_ref[0], "dk": grads_ref[1],
            "dv": grads_ref[2]}
    if bias is not None:
        got["dbias"] = whole(grads[3], Lq) if bias_kind == "rows" else grads[3]
        want["dbias"] = grads_ref[3]
    exact = n == 1 and layout == "contiguous" and device.type == "cpu"
    for key in got:
        if exact:
            assert torch.equal(got[key], want[key].detach()), f"{key}: not bit for bit at N = 1"
        else:
            _assert_close(got[key], want[key], key)


def _check_mask(name, group, n, device, backends):
    # q = 0: every visible score is equal, so P > 0 on every visible element. With V the identity
    # (Dv = L) out[i, j] = P_ij·Z_ij·scale, nonzero exactly where (i, j) is visible and kept (the
    # forward's mask); with dO the identity dv[j, i] = P_ij·Z_ij·scale (the backward's).
    B, H, L, causal, p, layout = MASK_CASES[name]
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    eye = torch.eye(L, device=device).expand(B, H, L, L)
    state = _state(name)

    def shard(x):
        return mt.context_parallel_shard(x, group, 2, layout)

    q = shard(torch.zeros(B, H, L, 8, device=device)).requires_grad_()
    k = shard(torch.randn(B, H, L, 8, generator=gen).to(device)).requires_grad_()
    v = shard(eye).contiguous().requires_grad_()
    seq_len = None if L % (2 * n) == 0 else L
    with mt.use_backends(*backends):
        out = mt.context_parallel_attention(q, k, v, group, dropout_p=p, causal=causal,
                                            layout=layout, seq_len=seq_len, rng_state=state)
        (dv,) = torch.autograd.grad(out, [v], shard(eye))
    keep = mt.dropout_mask((B, H, L, L), p, state).to(device)
    if causal != "none":
        keep &= torch.ones(L, L, dtype=torch.bool, device=device).tril()
    out = mt.context_parallel_unshard(out.detach(), group, 2, layout, seq_len=L)
    dv = mt.context_parallel_unshard(dv, group, 2, layout, seq_len=L)
    assert torch.equal(out != 0, keep), "the forward's mask differs from dropout_mask"
    assert torch.equal(dv.transpose(2, 3) != 0, keep), "the backward's mask differs"


def _check_drawn_state(group, n, device, backends):
    # No rng_state: each rank draws from its own generator (seeded differently here) and rank
    # 0's state is broadcast, so every rank uses one mask: the dense call's for that state.
    import torch.distributed as dist
    rank = dist.get_rank(group)
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 24, 8, generator=gen).to(device) for _ in range(3))
    torch.manual_seed(1000 + rank)
    generator = torch.Generator(device=device).manual_seed(2000 + rank)
    with mt.use_backends(*backends):
        for gen_arg in (None, generator):
            out, state = mt.context_parallel_attention(
                *(mt.context_parallel_shard(t, group) for t in (q, k, v)), group, dropout_p=0.4,
                causal=True, generator=gen_arg, return_rng_state=True)
            states = [torch.empty_like(state) for _ in range(n)]
            dist.all_gather(states, state, group=group)
            assert all(torch.equal(s, states[0]) for s in states), "ranks drew different states"
            ref, _, _ = torch.ops.memeff.fwd(q, k, v, None, state, 0.4, "top_left", None,
                                             list(backends))
            _assert_close(mt.context_parallel_unshard(out, group), ref, "out")


def _check_autocast(group, n, device, backends):
    # Under autocast q, k and v are cast to the region's dtype first (as the dense op's autocast
    # kernel does): the same as passing them cast, with fp32 gradients flowing back.
    gen = torch.Generator().manual_seed(9)
    q, k, v = (mt.context_parallel_shard(torch.randn(1, 2, 16 * n, 8, generator=gen), group)
               .to(device).requires_grad_() for _ in range(3))
    state = _state("autocast")
    with mt.use_backends(*backends):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = mt.context_parallel_attention(q, k, v, group, dropout_p=0.2, causal=True,
                                                rng_state=state)
        want = mt.context_parallel_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), group,
                                             dropout_p=0.2, causal=True, rng_state=state)
        grads = torch.autograd.grad(out.float().sum(), [q, k, v])
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


def _check_errors(group, n, device, backends):
    x = torch.randn(1, 2, 8 * n, 8, device=device)
    q = mt.context_parallel_shard(x, group)

    def refused(match, *args, **kwargs):
        with pytest.raises((ValueError, TypeError), match=match):
            mt.context_parallel_attention(*args, **kwargs)

    longer = torch.cat([q, q[:, :, :1]], dim=2)
    refused("argument `q`: expected", longer, q, q, group, seq_len=8 * n)
    refused("argument `k`: expected", q, longer, longer, group, kv_seq_len=8 * n)
    refused("argument `v`", q, q, q[:, :, :1], group)
    refused("argument `layout`", q, q, q, group, layout="diagonal")
    refused("argument `bias`", q, q, q, group, bias=torch.zeros(1, 2, 1, 8 * n + 1))
    refused("argument `dropout_p`", q, q, q, group, dropout_p=1.0)
    keys = mt.context_parallel_shard(torch.randn(1, 2, 16 * n, 8, device=device), group)
    refused("argument `causal`", q, keys, keys, group, causal="bottom_right")  # Lq != Lk
    refused("argument `q`: expected a", q[0], q, q, group)


def _worker(rank, world, backend, init_file, report_dir, device_kind):
    torch.set_num_threads(1)
    import torch.distributed as dist
    device = torch.device(device_kind, rank) if device_kind == "cuda" else torch.device("cpu")
    if device_kind == "cuda":
        torch.cuda.set_device(device)
    backends = ("cpu",) if device_kind == "cpu" else ()
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    report = {}
    for n in GROUP_SIZES:
        if n > world:
            continue
        group = dist.new_group(list(range(n)))  # every process takes part in making it
        if rank >= n:
            continue
        checks = [(name, _check_case, (name,)) for name in CASES]
        checks += [(name, _check_mask, (name,)) for name in MASK_CASES]
        checks += [("drawn_state_is_shared", _check_drawn_state, ()),
                   ("autocast", _check_autocast, ()), ("errors", _check_errors, ())]
        for name, check, args in checks:
            try:
                check(*args, group, n, device, backends)
                report[f"{n}/{name}"] = None
            except BaseException:  # (pytest's failures too) reported by the test of (N, check)
                report[f"{n}/{name}"] = f"rank {rank}: {traceback.format_exc()}"
    with open(os.path.join(report_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


def _run_world(world, backend, device_kind, timeout_s=300):
    """Starts `world` processes running every check and returns {"N/check": [errors]}."""
    import multiprocessing

    import torch.multiprocessing as mp
    # A fork server that has imported torch and memeff once forks the processes: much quicker
    # than each importing them (spawn), and unlike fork it is a fresh process, with no threads.
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "memeff.torch"])
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # the processes share the machine's cores
        try:
            context = mp.start_processes(
                _worker, args=(world, backend, init_file, tmp, device_kind), nprocs=world,
                join=False, start_method=method)
        finally:
            if saved is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"the {world} ring processes did not finish in {timeout_s} s")
        report = {}
        for rank in range(world):
            with open(os.path.join(tmp, f"rank{rank}.json")) as f:
                for key, error in json.load(f).items():
                    report.setdefault(key, [])
                    if error:
                        report[key].append(error)
        return report


def _gloo_available():
    import torch.distributed as dist
    return dist.is_available() and dist.is_gloo_available()


@pytest.fixture(scope="module")
def cpu_report():
    if not _gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    return _run_world(WORLD, "gloo", "cpu")


ALL_CHECKS = list(CASES) + list(MASK_CASES) + list(OTHER_CHECKS)


@pytest.mark.parametrize("check", ALL_CHECKS)
@pytest.mark.parametrize("n", GROUP_SIZES)
def test_ring_matches_single_process(cpu_report, n, check):
    errors = cpu_report.get(f"{n}/{check}")
    assert errors is not None, f"N = {n}, {check}: not run"
    assert not errors, "\n".join(errors)


@pytest.fixture(scope="module")
def cuda_report():
    import torch.distributed as dist
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2 or not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("needs >= 2 CUDA devices and NCCL")
    return _run_world(min(count, WORLD), "nccl", "cuda")


@pytest.mark.parametrize("check", ALL_CHECKS)
@pytest.mark.parametrize("n", GROUP_SIZES)
def test_cuda_ring_matches_single_process(cuda_report, n, check):
    if f"{n}/{check}" not in cuda_report:
        pytest.skip(f"needs {n} CUDA devices")
    errors = cuda_report[f"{n}/{check}"]
    assert not errors, "\n".join(errors)


# Without processes: the cut itself.


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("length", [24, 23, 5])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_shard_takes_the_partition_chunks(n, length, layout):
    x = torch.arange(length).view(1, 1, length, 1)
    chunks = 2 * n if layout == "zigzag" else n
    bounds = [c * length // chunks for c in range(chunks + 1)]
    seen = []
    for rank in range(n):
        mine = [rank, 2 * n - 1 - rank] if layout == "zigzag" else [rank]
        want = torch.cat([torch.arange(bounds[c], bounds[c + 1]) for c in mine])
        got = mt.context_parallel_shard(x, None, 2, layout, rank=rank, world_size=n)
        assert torch.equal(got.flatten(), want), f"rank {rank}"
        seen += got.flatten().tolist()
    assert sorted(seen) == list(range(length))


def test_shard_on_another_dim_and_its_gradient():
    x = torch.randn(2, 12, 3, 4, requires_grad=True)  # [B, L, H, D]
    part = mt.context_parallel_shard(x, dim=1, rank=1, world_size=2)
    assert torch.equal(part, torch.cat([x[:, 3:6], x[:, 6:9]], dim=1))
    (g,) = torch.autograd.grad(part.sum(), [x])
    assert g[:, 3:9].eq(1).all() and g[:, :3].eq(0).all() and g[:, 9:].eq(0).all()


def test_shard_errors():
    x = torch.zeros(1, 1, 8, 4)
    with pytest.raises(ValueError, match="argument `layout`"):
        mt.context_parallel_shard(x, layout="striped", rank=0, world_size=2)
    with pytest.raises(ValueError, match="argument `rank`"):
        mt.context_parallel_shard(x, rank=2, world_size=2)
    with pytest.raises(ValueError, match="`rank` and `world_size`"):
        mt.context_parallel_shard(x, rank=0)
    with pytest.raises(ValueError, match="argument `dim`"):
        mt.context_parallel_shard(x, dim=4, rank=0, world_size=2)
    with pytest.raises(ValueError, match="argument `align`"):
        mt.context_parallel_shard(x, align=0, rank=0, world_size=2)


def test_needs_a_process_group():
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    q = torch.zeros(1, 1, 8, 4)
    with pytest.raises(RuntimeError, match="init_process_group"):
        mt.context_parallel_attention(q, q, q)


def test_block_calls_on_the_dense_op_match_slices_of_one_call():
    # The ops' q_start/k_start/kv_block on their own: a query chunk against all keys at its
    # global rows is those rows of the whole call (mask included), and two key blocks' backward
    # with the whole out/lse sum to the whole call's gradients.
    gen = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(1, 2, 32, 16, generator=gen) for _ in range(4))
    state = torch.tensor([11, 12])
    ops = torch.ops.memeff
    args = (state, 0.3, "top_left", None, ["cpu"])
    out, lse, _ = ops.fwd(q, k, v, None, *args)
    part, part_lse, _ = ops.fwd(q[:, :, 8:20], k, v, None, *args, q_start=8)
    torch.testing.assert_close(part, out[:, :, 8:20], rtol=0, atol=1e-6)
    torch.testing.assert_close(part_lse, lse[:, :, 8:20], rtol=0, atol=1e-6)
    dq, dk, dv, _ = ops.bwd(dout, q, k, v, None, out, lse, state, 0.3, "top_left", None, False,
                            ["cpu"])
    sums = [torch.zeros_like(t) for t in (dq, dk, dv)]
    for start, stop in ((0, 13), (13, 32)):
        block = slice(start, stop)
        bdq, bdk, bdv, _ = ops.bwd(dout, q, k[:, :, block], v[:, :, block], None, out, lse, state,
                                   0.3, "top_left", None, False, ["cpu"], k_start=start,
                                   kv_block=True)
        sums[0] += bdq
        sums[1][:, :, block] += bdk
        sums[2][:, :, block] += bdv
    for name, got, want in zip(("dq", "dk", "dv"), sums, (dq, dk, dv)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    with pytest.raises(ValueError, match="q_start"):
        ops.fwd(q, k, v, None, *args, q_start=-1)


@pytest.mark.parametrize("backend", ["cuda", "cuda_sm90", "cuda_math"])
def test_block_calls_on_one_gpu_match_slices_of_one_call(backend):
    # The same on each CUDA backend, bf16, with dropout and GQA: key blocks start on the dropout
    # map's 64-key blocks (the fused kernels' condition), query slices anywhere.
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if backend == "cuda_sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuda_sm90 runs on compute capability 9.0 only")
    gen = torch.Generator().manual_seed(4)
    q, dout = (torch.randn(2, 4, 200, 64, generator=gen) for _ in range(2))
    k, v = (torch.randn(2, 2, 200, 64, generator=gen) for _ in range(2))
    q, k, v, dout = (t.to("cuda", torch.bfloat16) for t in (q, k, v, dout))
    state = torch.tensor([21, 22])
    ops = torch.ops.memeff
    args = (state, 0.2, "top_left", None, [backend])
    out, lse, _ = ops.fwd(q, k, v, None, *args)
    part, part_lse, _ = ops.fwd(q[:, :, 37:150], k, v, None, *args, q_start=37)
    torch.testing.assert_close(part, out[:, :, 37:150], rtol=0, atol=1e-2)
    torch.testing.assert_close(part_lse, lse[:, :, 37:150], rtol=0, atol=1e-4)
    dq, dk, dv, _ = ops.bwd(dout, q, k, v, None, out, lse, state, 0.2, "top_left", None, False,
                            [backend])
    sums = [torch.zeros_like(t, dtype=torch.float32) for t in (dq, dk, dv)]
    for start, stop in ((0, 64), (64, 192), (192, 200)):
        block = slice(start, stop)
        bdq, bdk, bdv, _ = ops.bwd(dout, q, k[:, :, block], v[:, :, block], None, out, lse, state,
                                   0.2, "top_left", None, False, [backend], k_start=start,
                                   kv_block=True)
        sums[0] += bdq.float()
        sums[1][:, :, block] += bdk.float()
        sums[2][:, :, block] += bdv.float()
    for name, got, want in zip(("dq", "dk", "dv"), sums, (dq, dk, dv)):
        torch.testing.assert_close(got, want.float(), rtol=2e-2, atol=3e-2,
                                   msg=lambda m: f"{backend} {name}: {m}")

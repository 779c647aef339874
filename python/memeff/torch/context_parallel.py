"""Context-parallel (ring) attention over a torch.distributed process group.

A sequence too long for one device is cut over the N ranks of a group; each rank holds its
chunks of the queries, keys and values, the K/V blocks travel around the ring by point-to-point
transfers while every rank attends its queries to the block in hand, and the partial results are
merged through their lse. The cut and the schedule are the C++ layer's (memeff::cp::Partition and
ring_schedule, through torch.ops.memeff.cp_partition / cp_schedule); each block is one
torch.ops.memeff.fwd / bwd call at global coordinates (q_start, k_start, kv_block), so the
dropout mask of the sharded run is the single-device mask. docs/context_parallel.md describes
the algorithm, docs/torch.md this API.
"""

import functools
import math
from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from .. import _C  # noqa: F401  (loading the library registers torch.ops.memeff)
from . import _causal_mode, _current_backends, _with_extras

__all__ = [
    "context_parallel_attention",
    "context_parallel_shard",
    "context_parallel_unshard",
]

_ops = torch.ops.memeff
_LAYOUTS = ("zigzag", "contiguous")
_KV_TAG, _DKV_TAG = 0, 1  # the two kinds of transfer, apart for transports that match tags


class _Chunk(NamedTuple):
    global_start: int  # first row in the whole sequence
    local_start: int  # first row in its rank's tensors
    length: int


class _Pair(NamedTuple):
    """One block call: this rank's query chunk against a key chunk of the K/V block in hand."""
    step: int  # the block of rank (rank - step) mod N is in hand
    kv_rank: int
    q: _Chunk
    k: _Chunk
    diagonal: bool  # the causal diagonal crosses it (a top_left call); else no mask


def _check_layout(layout: str) -> None:
    if layout not in _LAYOUTS:
        raise ValueError(f"memeff: argument `layout`: expected one of {_LAYOUTS}, got {layout!r}")


def _check_align(align: int) -> None:
    if not isinstance(align, int) or isinstance(align, bool) or align < 1:
        raise ValueError(f"memeff: argument `align`: expected an int >= 1, got {align!r}")


@functools.lru_cache(maxsize=256)
def _partition(length: int, ranks: int, layout: str, align: int) -> Tuple[Tuple[_Chunk, ...], ...]:
    """Every rank's chunks, in local (= global) order: memeff::cp::Partition."""
    flat = _ops.cp_partition(length, ranks, layout, align)
    chunks = [_Chunk(*flat[i:i + 3]) for i in range(0, len(flat), 3)]
    per_rank = len(chunks) // ranks
    return tuple(tuple(chunks[r * per_rank:(r + 1) * per_rank]) for r in range(ranks))


def _local_length(chunks: Sequence[_Chunk]) -> int:
    return sum(c.length for c in chunks)


@functools.lru_cache(maxsize=256)
def _schedule(q_length: int, k_length: int, ranks: int, rank: int, layout: str, align: int,
              causal: str) -> Tuple[Tuple[_Pair, ...], ...]:
    """The block calls of `rank`, grouped by ring step: memeff::cp::ring_schedule (fully masked
    pairs left out, fully visible ones unmasked)."""
    flat = _ops.cp_schedule(q_length, k_length, ranks, rank, layout, align, causal)
    steps: List[List[_Pair]] = [[] for _ in range(ranks)]
    for i in range(0, len(flat), 9):
        f = flat[i:i + 9]
        steps[f[0]].append(_Pair(f[0], f[1], _Chunk(*f[2:5]), _Chunk(*f[5:8]), bool(f[8])))
    return tuple(tuple(pairs) for pairs in steps)


def _dist():
    import torch.distributed as dist
    if not dist.is_available():
        raise RuntimeError("memeff: context parallelism needs torch.distributed, which this torch "
                           "build does not have")
    return dist


def _group_rank_and_size(group, rank: Optional[int] = None,
                         world_size: Optional[int] = None) -> Tuple[int, int]:
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError("memeff: arguments `rank` and `world_size`: give both or neither")
        if not 0 <= rank < world_size:
            raise ValueError(f"memeff: argument `rank`: expected [0, {world_size}), got {rank}")
        return rank, world_size
    dist = _dist()
    if not dist.is_initialized():
        raise RuntimeError("memeff: context parallelism needs an initialized torch.distributed "
                           "process group (torch.distributed.init_process_group); the shard "
                           "helpers also take rank= and world_size=")
    group_rank = dist.get_rank(group)
    if group_rank < 0:
        raise ValueError("memeff: argument `group`: this process is not a member of the group")
    return group_rank, dist.get_world_size(group)


def _global_rank(group, group_rank: int) -> int:
    """The global rank of a group member: what P2POp and broadcast's src take."""
    return group_rank if group is None else _dist().get_global_rank(group, group_rank)


def _normalize_dim(x: torch.Tensor, dim: int) -> int:
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"memeff: argument `dim`: expected a dimension of a {x.dim()}-dimensional "
                         f"tensor, got {dim}")
    return dim % x.dim()


def context_parallel_shard(x: torch.Tensor, group=None, dim: int = 2, layout: str = "zigzag", *,
                           align: int = 1, rank: Optional[int] = None,
                           world_size: Optional[int] = None) -> torch.Tensor:
    """This rank's share of a whole sequence: its chunks of `x` along `dim` (the sequence
    dimension; 2 for [B, H, L, D]) in ascending order, as context_parallel_attention takes them.

    layout: "zigzag" (2N chunks; rank r holds chunks r and 2N-1-r, which balances causal work) or
    "contiguous" (N chunks; rank r holds chunk r). Chunk c starts at floor(c·L / chunks) rounded
    down to a multiple of `align`, so any L works (shares then differ by a row). The rank and
    size come from `group` (default: the default group), or from rank= and world_size= without
    torch.distributed. Differentiable (narrow and cat); a view when the rank holds one chunk.
    """
    _check_layout(layout)
    _check_align(align)
    d = _normalize_dim(x, dim)
    r, n = _group_rank_and_size(group, rank, world_size)
    chunks = _partition(x.shape[d], n, layout, align)[r]
    pieces = [x.narrow(d, c.global_start, c.length) for c in chunks]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=d)


def context_parallel_unshard(x: torch.Tensor, group=None, dim: int = 2, layout: str = "zigzag", *,
                             seq_len: Optional[int] = None, align: int = 1) -> torch.Tensor:
    """The whole sequence from every rank's share (the inverse of context_parallel_shard), on
    every rank: an all-gather over `group`. seq_len is the whole length (default: the sum of the
    shares, which costs one more small all-gather). Not differentiable; for outputs and checks.
    """
    _check_layout(layout)
    _check_align(align)
    dist = _dist()
    d = _normalize_dim(x, dim)
    rank, n = _group_rank_and_size(group)
    if seq_len is None:
        mine = torch.tensor([x.shape[d]], dtype=torch.int64, device=x.device)
        lengths = [torch.empty_like(mine) for _ in range(n)]
        dist.all_gather(lengths, mine, group=group)
        seq_len = int(sum(int(t.item()) for t in lengths))
    parts = _partition(seq_len, n, layout, align)
    if x.shape[d] != _local_length(parts[rank]):
        raise ValueError(f"memeff: argument `x`: expected {_local_length(parts[rank])} rows along "
                         f"dim {d} (rank {rank}'s share of {seq_len}), got {x.shape[d]}")
    # all_gather wants equal sizes: every share padded to the longest.
    longest = max(_local_length(p) for p in parts)
    padded_shape = list(x.shape)
    padded_shape[d] = longest
    mine = x.new_zeros(padded_shape)
    mine.narrow(d, 0, x.shape[d]).copy_(x)
    gathered = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(gathered, mine, group=group)
    full_shape = list(x.shape)
    full_shape[d] = seq_len
    full = x.new_empty(full_shape)
    for piece, chunks in zip(gathered, parts):
        for c in chunks:
            full.narrow(d, c.global_start, c.length).copy_(piece.narrow(d, c.local_start, c.length))
    return full


class _Ring:
    """What one call of the ring needs besides its tensors: the group, the peers, the schedule
    and the attention's settings (the same on every rank)."""

    def __init__(self, group, rank: int, ranks: int, k_parts, schedule, k_length: int,
                 dropout_p: float, rng_state: Optional[torch.Tensor], scale: Optional[float],
                 backends: List[str]):
        self.group = group
        self.rank = rank
        self.ranks = ranks
        self.k_parts = k_parts
        self.schedule = schedule
        self.k_length = k_length
        self.dropout_p = dropout_p
        self.rng_state = rng_state
        self.scale = scale
        self.backends = backends
        self.next_peer = self.prev_peer = None
        if ranks > 1:
            self.next_peer = _global_rank(group, (rank + 1) % ranks)
            self.prev_peer = _global_rank(group, (rank - 1) % ranks)

    def block_rows(self, step: int) -> int:
        """Rows of the K/V block in hand at `step` (step N: this rank's own block again)."""
        return _local_length(self.k_parts[(self.rank - step) % self.ranks])

    def kv_block(self, pair: _Pair) -> bool:
        # A key chunk that holds every key is the whole attention: its backward may use its own
        # rule for rows that see one key. Only a strict part needs kv_block.
        return pair.k.length < self.k_length

    def exchange(self, send: torch.Tensor, recv: torch.Tensor, tag: int):
        """Starts sending `send` to the next rank and receiving `recv` from the previous one;
        returns the requests to wait on. Empty buffers are not sent: the previous rank's send
        and this rank's receive are the same block, so both sides skip it alike."""
        dist = _dist()
        ops = []
        if send.numel() > 0:
            ops.append(dist.P2POp(dist.isend, send, self.next_peer, self.group, tag))
        if recv.numel() > 0:
            ops.append(dist.P2POp(dist.irecv, recv, self.prev_peer, self.group, tag))
        return dist.batch_isend_irecv(ops) if ops else []


def _wait(requests) -> None:
    for request in requests:
        request.wait()


def _pack(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """K and V of a block in one contiguous buffer (K first): what travels."""
    return torch.cat([k.reshape(-1), v.reshape(-1)])


def _unpack(buffer: torch.Tensor, batch: int, heads: int, rows: int, d: int, dv: int):
    n = batch * heads * rows * d
    return (buffer[:n].view(batch, heads, rows, d),
            buffer[n:n + batch * heads * rows * dv].view(batch, heads, rows, dv))


def _bias_block(bias: Optional[torch.Tensor], pair: _Pair) -> Optional[torch.Tensor]:
    """The bias of one block call: the query chunk's rows (unless broadcast) and the key chunk's
    columns (the bias's columns are every key of the whole attention, in global order)."""
    if bias is None:
        return None
    if bias.shape[2] != 1:
        bias = bias.narrow(2, pair.q.local_start, pair.q.length)
    return bias.narrow(3, pair.k.global_start, pair.k.length)


def _merge(out_acc: torch.Tensor, lse_acc: torch.Tensor, out_part: torch.Tensor,
           lse_part: torch.Tensor) -> None:
    """Merges a block's partial result (out normalized over its keys, lse its log-denominator)
    into the running one, in place: lse = log(e^lse_acc + e^lse_part), out = e^(lse_acc-lse)·out
    + e^(lse_part-lse)·out_part. logaddexp of -inf and x is x exactly, so the first block a row
    sees is copied as it is and a block the row does not see (lse -inf, out 0) changes nothing;
    rows that see no key anywhere keep out = 0, lse = -inf (a finite stand-in keeps the weights
    at exp(-inf) = 0 instead of NaN)."""
    lse_part = lse_part.to(lse_acc.dtype)
    lse = torch.logaddexp(lse_acc, lse_part)
    finite = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    w_acc = torch.exp(lse_acc - finite).unsqueeze(-1)
    w_part = torch.exp(lse_part - finite).unsqueeze(-1)
    out_acc.mul_(w_acc).add_(out_part.to(out_acc.dtype) * w_part)
    lse_acc.copy_(lse)


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _ring_forward(ring: _Ring, q, k, v, bias):
    batch, hq, lq, _ = q.shape
    hkv, d, dv = k.shape[1], k.shape[3], v.shape[3]
    acc = _accumulator_dtype(q.dtype)
    out_acc = q.new_zeros((batch, hq, lq, dv), dtype=acc)
    lse_acc = q.new_full((batch, hq, lq), -math.inf, dtype=acc)
    kv = _pack(k, v) if ring.ranks > 1 else None
    for step in range(ring.ranks):
        pending, incoming = [], None
        if step + 1 < ring.ranks:  # the next block travels while this one is attended to
            incoming = kv.new_empty(batch * hkv * ring.block_rows(step + 1) * (d + dv))
            pending = ring.exchange(kv, incoming, _KV_TAG)
        k_blk, v_blk = k, v  # step 0: this rank's own block, as the caller passed it
        if step > 0:
            k_blk, v_blk = _unpack(kv, batch, hkv, ring.block_rows(step), d, dv)
        for pair in ring.schedule[step]:
            out_part, lse_part, _ = _ops.fwd(
                q.narrow(2, pair.q.local_start, pair.q.length),
                k_blk.narrow(2, pair.k.local_start, pair.k.length),
                v_blk.narrow(2, pair.k.local_start, pair.k.length), _bias_block(bias, pair),
                ring.rng_state, ring.dropout_p, "top_left" if pair.diagonal else "none",
                ring.scale, ring.backends, None, q_start=pair.q.global_start,
                k_start=pair.k.global_start)
            _merge(out_acc.narrow(2, pair.q.local_start, pair.q.length),
                   lse_acc.narrow(2, pair.q.local_start, pair.q.length), out_part, lse_part)
        _wait(pending)
        if incoming is not None:
            kv = incoming
    return out_acc.to(q.dtype), lse_acc.to(torch.float32)


def _ring_backward(ring: _Ring, dout, q, k, v, bias, out, lse, bias_grad: bool):
    batch, hq, lq, d = q.shape
    hkv, lk, dv = k.shape[1], k.shape[2], v.shape[3]
    acc = _accumulator_dtype(q.dtype)
    dq_acc = q.new_zeros((batch, hq, lq, d), dtype=acc)
    dbias_acc = bias.new_zeros(bias.shape, dtype=acc) if bias_grad else None
    kv = _pack(k, v) if ring.ranks > 1 else None
    # dK/dV of the block in hand are summed into this step's accumulator while the sum over the
    # ranks before this one (the same block: rank r-1 had it at the step before) arrives; the two
    # are added and the sum moves on to the next rank while the next step computes. After the
    # last step it arrives at the block's owner.
    dkv_pending, dkv_incoming = [], None
    for step in range(ring.ranks):
        block_rows = ring.block_rows(step)
        kv_pending, kv_incoming = [], None
        if step + 1 < ring.ranks:
            kv_incoming = kv.new_empty(batch * hkv * ring.block_rows(step + 1) * (d + dv))
            kv_pending = ring.exchange(kv, kv_incoming, _KV_TAG)
        k_blk, v_blk = (k, v) if step == 0 else _unpack(kv, batch, hkv, block_rows, d, dv)
        dkv = q.new_zeros(batch * hkv * block_rows * (d + dv), dtype=acc)
        dk_acc, dv_acc = _unpack(dkv, batch, hkv, block_rows, d, dv)
        for pair in ring.schedule[step]:
            def q_rows(t, chunk=pair.q):
                return t.narrow(2, chunk.local_start, chunk.length)

            def k_rows(t, chunk=pair.k):
                return t.narrow(2, chunk.local_start, chunk.length)

            dq_part, dk_part, dv_part, dbias_part = _ops.bwd(
                q_rows(dout), q_rows(q), k_rows(k_blk), k_rows(v_blk), _bias_block(bias, pair),
                q_rows(out), q_rows(lse), ring.rng_state, ring.dropout_p,
                "top_left" if pair.diagonal else "none", ring.scale, bias_grad, ring.backends,
                q_start=pair.q.global_start, k_start=pair.k.global_start,
                kv_block=ring.kv_block(pair))
            q_rows(dq_acc).add_(dq_part)
            k_rows(dk_acc).add_(dk_part)
            k_rows(dv_acc).add_(dv_part)
            if bias_grad:
                target = dbias_acc.narrow(3, pair.k.global_start, pair.k.length)
                if bias.shape[2] != 1:
                    target = target.narrow(2, pair.q.local_start, pair.q.length)
                target += dbias_part
        if dkv_incoming is not None:  # the ranks before this one's share of the block in hand
            _wait(dkv_pending)
            dkv += dkv_incoming
        _wait(kv_pending)
        if kv_incoming is not None:
            kv = kv_incoming
        if ring.ranks > 1:  # pass the sum on; after the last step it goes home
            dkv_incoming = dkv.new_empty(batch * hkv * ring.block_rows(step + 1) * (d + dv))
            dkv_pending = ring.exchange(dkv, dkv_incoming, _DKV_TAG)
    if dkv_incoming is not None:
        _wait(dkv_pending)
        dkv = dkv_incoming  # this rank's own block, summed over every rank
    dk, dv_ = _unpack(dkv, batch, hkv, lk, d, dv)
    dbias = dbias_acc.to(bias.dtype) if bias_grad else None
    return dq_acc.to(q.dtype), dk.to(k.dtype), dv_.to(v.dtype), dbias


class _RingAttention(torch.autograd.Function):
    """out, lse = ring forward; the backward runs the ring again with the whole out and lse.
    Every rank of the group must run both (they exchange blocks): a rank whose out does not
    reach its loss still gets a zero gradient (materialized) and takes part."""

    @staticmethod
    def forward(ctx, q, k, v, bias, ring):
        out, lse = _ring_forward(ring, q, k, v, bias)
        ctx.ring = ring
        ctx.save_for_backward(q, k, v, bias, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, bias, out, lse = ctx.saved_tensors
        bias_grad = bias is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dbias = _ring_backward(ctx.ring, dout, q, k, v, bias, out, lse, bias_grad)
        return dq, dk, dv, dbias, None


def _shared_rng_state(q: torch.Tensor, group, ranks: int,
                      generator: Optional[torch.Generator]) -> torch.Tensor:
    """One dropout (seed, offset) for every rank: each draws from its generator as the dense op
    does (so the generators of all ranks advance alike) and rank 0's is broadcast."""
    state = _ops.draw_rng_state(q, generator)
    if ranks == 1:
        return state
    dist = _dist()
    # On the device of q: the group's backend (NCCL for CUDA tensors) can carry it, and the
    # kernels read a device state at run time without a host copy.
    state = state.to(q.device)
    dist.broadcast(state, src=_global_rank(group, 0), group=group)
    return state


def context_parallel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group=None,
    *,
    bias: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    causal: Union[None, bool, str] = None,
    scale: Optional[float] = None,
    layout: str = "zigzag",
    seq_len: Optional[int] = None,
    kv_seq_len: Optional[int] = None,
    align: int = 1,
    generator: Optional[torch.Generator] = None,
    rng_state: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    return_rng_state: bool = False,
):
    """Attention over a sequence cut across the ranks of a torch.distributed group (ring
    attention), with autograd; computed by memeff's block calls at global coordinates, so the
    result (and the dropout mask) is that of one attention over the whole sequence.

    Every rank of `group` (default: the default group) calls it with its own share:
      q [B, Hq, Lq_local, D], k [B, Hkv, Lk_local, D], v [B, Hkv, Lk_local, Dv]: the rank's
        chunks in ascending order, as context_parallel_shard(x, group, dim=2, layout) cuts them
        ("zigzag": rank r holds chunks r and 2N-1-r of 2N; "contiguous": chunk r of N).
      returns out [B, Hq, Lq_local, Dv] (this rank's rows, contiguous); gradients reach q, k, v
        (and bias) as this rank's shares of the whole gradients.

    causal: None/False, True or "top_left" (row i sees keys j <= i of the whole sequence), or
      "bottom_right" for a square attention (where it is top_left).
    dropout_p: applied whenever > 0. The mask is the single-device call's for the same
      (seed, offset): rng_state when given (the same int64[2] tensor on every rank: the caller's
      promise), else each rank draws one from `generator` (default: the default generator of
      q's device) as the dense op does and rank 0's is broadcast over the group.
    scale: default 1/sqrt(D).
    bias: an additive float mask [B|1, Hq|1, Lq_local|1, Lk] (this rank's query rows, every key
      of the whole sequence in global order) or a boolean keep-mask of that shape. Its gradient is
      exact where it has its own query rows; a bias broadcast over the rows is shared by every
      rank, so each returns its rows' part of the gradient: reduce it over the group (as any
      replicated parameter's gradient).
    layout, align: the cut, as for context_parallel_shard; every rank (and the shard helpers)
      must use the same.
    seq_len, kv_seq_len: the whole query and key lengths. Default: N times the local rows, which
      is right when every rank holds the same number of rows (e.g. L a multiple of the chunk
      count). Pass them when the shares differ: a rank cannot tell an uneven cut from its own
      share, and ranks that disagree on a length would exchange blocks of different sizes.
      kv_seq_len defaults to seq_len when k has as many local rows as q.
    return_lse: also return lse [B, Hq, Lq_local] (fp32, of the whole attention; not
      differentiable). return_rng_state: also return the (seed, offset) used (on q's device;
      None without dropout). With both: (out, lse, rng_state).

    Block transfers overlap the block calls (torch.distributed.batch_isend_irecv of the next
    block before the current one is computed; asynchronous on NCCL). Under autocast q, k and v
    are cast to the region's dtype first, as the dense op does. Every rank must run the forward
    and, when one does, the backward.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"memeff: argument `{name}`: expected a [B, H, L_local, D] tensor, "
                             f"got {t.dim()} dimensions")
    if v.shape[2] != k.shape[2]:
        raise ValueError(f"memeff: argument `v`: expected {k.shape[2]} rows (as k), got "
                         f"{v.shape[2]}")
    _check_layout(layout)
    _check_align(align)
    mode = _causal_mode(False, causal, None)
    p = float(dropout_p)
    rank, ranks = _group_rank_and_size(group)

    lq, lk = q.shape[2], k.shape[2]
    q_length = ranks * lq if seq_len is None else int(seq_len)
    if kv_seq_len is not None:
        k_length = int(kv_seq_len)
    else:
        k_length = q_length if seq_len is not None and lk == lq else ranks * lk
    q_parts = _partition(q_length, ranks, layout, align)
    k_parts = _partition(k_length, ranks, layout, align)
    for name, t, length, parts, arg in (("q", q, q_length, q_parts, "seq_len"),
                                        ("k", k, k_length, k_parts, "kv_seq_len")):
        want = _local_length(parts[rank])
        if t.shape[2] != want:
            raise ValueError(f"memeff: argument `{name}`: expected {want} rows on rank {rank} "
                             f"(its share of {length} cut {layout!r} over {ranks} ranks), got "
                             f"{t.shape[2]}; pass {arg}= when the shares are uneven")

    device_type = q.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        if bias is not None and bias.is_floating_point() and bias.dtype != torch.float32:
            bias = bias.to(dtype)
    if bias is not None:
        bias = _checked_bias(bias, q, k_length)

    # Everything a rank can refuse is checked before the first collective (the state's
    # broadcast), so that a bad call fails on every rank instead of leaving the others waiting.
    schedule = _schedule(q_length, k_length, ranks, rank, layout, align, mode)
    if p != 0.0:
        _ops.dropout_threshold(p)  # refuses p outside [0, 1), naming dropout_p
    state = None
    if p > 0.0:
        if rng_state is not None:
            state = rng_state
        else:
            state = _shared_rng_state(q, group, ranks, generator)
    ring = _Ring(group, rank, ranks, k_parts, schedule, k_length, p, state,
                 None if scale is None else float(scale), list(_current_backends()))
    with torch.autocast(device_type, enabled=False):
        out, lse = _RingAttention.apply(q, k, v, bias, ring)
    return _with_extras(out, lse, state, q, return_lse, return_rng_state)


def _checked_bias(bias: torch.Tensor, q: torch.Tensor, k_length: int) -> torch.Tensor:
    """The bias as the block calls take it: 4 dimensions [B|1, Hq|1, Lq_local|1, Lk], additive
    (a boolean keep-mask becomes 0 / -inf in fp32)."""
    if bias.dtype == torch.bool:
        bias = torch.where(bias, 0.0, float("-inf")).to(torch.float32)
    elif not bias.is_floating_point():
        raise TypeError(f"memeff: argument `bias`: expected a floating-point or bool mask, got "
                        f"{bias.dtype}")
    want = (q.shape[0], q.shape[1], q.shape[2], k_length)
    if bias.dim() != 4 or bias.shape[3] != k_length or any(
            bias.shape[i] not in (1, want[i]) for i in range(3)):
        raise ValueError(f"memeff: argument `bias`: expected a shape broadcastable to [B, Hq, "
                         f"Lq_local, Lk] = {list(want)} (this rank's query rows, every key of the "
                         f"whole sequence), got {list(bias.shape)}")
    return bias

"""Lecture 10 (activations, recomputation, precision): its key measured claim and negative controls.

The claim (notebooks/10_memory_precision.ipynb, sections 1-2, `memory_bench.assert_saved`): the bytes
autograd saves for one transformer block, counted by the lecture's `SavedBytes` hook, equal the
formula to the byte: (16 sbh + a s^2 b + 4 sb) E + s^2 for the explicit softmax, 16 sbh E + a s b
E_lse + 4 sb E for F.scaled_dot_product_attention. Wrong on purpose, each must fail it:
- the fused block against the explicit formula (a model off by the a s^2 b term);
- the explicit block against a formula without the a s^2 b term;
- a counter that misses a tensor (it counts floating-point tensors only: not the causal mask).
Also pinned down: LiveBytes counts an allocation while it lives; the backward's transient model
of section 2; the offload count of section 3; the bytes the gradient hooks of section 5 send, and
section 5's claim (`precision_bench.assert_scales_with_u`): the distance a 2-byte hook puts between
its run and the exact one scales with the format's u (bf16 over fp16: 8), which a pair of runs in
one format (ratio 1) and a model off by a factor 8 must fail.
"""
import pytest
import torch
import torch.nn.functional as F

from course.memory_precision import SavedBytes, block_bytes
from helpers import tiny
from machinery import l10_memory as memory_bench, l10_precision as precision_bench
from helpers.spawn import spawn

H, A = 32, 4
POINTS = [(16, 1), (64, 1), (128, 1), (32, 3)]


def _sdpa_block(blk, x):
    b, s, h = x.shape
    qkv = blk.attn.qkv(blk.ln1(x)).split(h, dim=-1)
    q, k, v = (t.view(b, s, A, h // A).transpose(1, 2) for t in qkv)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + blk.attn.proj(o.transpose(1, 2).reshape(b, s, h))
    return x + blk.mlp(blk.ln2(x))


def _fused_bytes(s, b, elem):
    return 16 * s * b * H * elem + A * s * b * (4 if elem == 2 else elem) + 4 * s * b * elem


class _MissesATensor(SavedBytes):
    def pack(self, t):                          # floating point only: misses the causal mask
        return super().pack(t) if t.is_floating_point() else t


def _measure(counter, fused, s, b, dtype):
    blk = tiny.transformer(64, H, A, 1, 8, dtype=dtype).blocks[0]
    x = torch.randn(b, s, H, dtype=dtype, requires_grad=True)
    with counter(blk.parameters()) as saved:
        (_sdpa_block if fused else lambda m, y: m(y))(blk, x)
    return saved.bytes


def _runs(counter, fused):
    return {(dt, s, b): _measure(counter, fused, s, b, dt)
            for dt in (torch.float64, torch.bfloat16) for s, b in POINTS}


def _explicit_model(with_s2=True):
    out = {}
    for dt in (torch.float64, torch.bfloat16):
        for s, b in POINTS:
            f = block_bytes(s, b, H, A, dt.itemsize)
            out[dt, s, b] = sum(f.values()) - (0 if with_s2 else f["a s^2 b"] + f["causal mask"])
    return out


def _fused_model():
    return {(dt, s, b): _fused_bytes(s, b, dt.itemsize)
            for dt in (torch.float64, torch.bfloat16) for s, b in POINTS}


def test_the_explicit_and_the_fused_block_meet_their_formulas():
    memory_bench.assert_saved(_runs(SavedBytes, False), _explicit_model())
    memory_bench.assert_saved(_runs(SavedBytes, True), _fused_model())


def test_the_fused_block_fails_the_explicit_formula():
    with pytest.raises(AssertionError):
        memory_bench.assert_saved(_runs(SavedBytes, True), _explicit_model())


def test_a_model_without_the_s2_term_fails():
    with pytest.raises(AssertionError):
        memory_bench.assert_saved(_runs(SavedBytes, False), _explicit_model(with_s2=False))


def test_a_counter_that_misses_a_tensor_fails():
    with pytest.raises(AssertionError):
        memory_bench.assert_saved(_runs(_MissesATensor, False), _explicit_model())


def test_live_bytes_counts_an_allocation_while_it_lives():
    with memory_bench.LiveBytes() as live:
        t = torch.empty(1000, dtype=torch.float64) + 1        # 8000 bytes, from an operator
        v = t.view(10, 100)                                     # a view allocates nothing
        live.mark("alive")
        del t, v
    assert live.marks["alive"] == 8000 and live.live == 0 and live.peak >= 8000


@pytest.mark.parametrize("s", [128, 256])   # where a s^2 b E > 8 sbh E + dW
def test_the_backwards_transients_meet_section_2s_model(s):
    blk = tiny.transformer(64, H, A, 1, 8).blocks[0]
    x = torch.randn(1, s, H, dtype=torch.float64, requires_grad=True)
    inputs, dW, sbh = [x, *blk.parameters()], (12 * H * H + 13 * H) * 8, s * H * 8
    explicit = memory_bench.step_memory(lambda: blk(x), inputs)
    fused = memory_bench.step_memory(lambda: _sdpa_block(blk, x), inputs)
    memory_bench.assert_peak_model(explicit["kept"], explicit["peak"], A * s * s * 8, float("inf"))
    memory_bench.assert_peak_model(fused["kept"], fused["peak"], 0, 8 * sbh + dW)
    with pytest.raises(AssertionError):            # the explicit block has an s^2 transient
        memory_bench.assert_peak_model(explicit["kept"], explicit["peak"], 0, 8 * sbh + dW)


def test_offload_copies_every_save():
    blk = tiny.transformer(64, H, A, 1, 8).blocks[0]
    s, b = 32, 2
    log = memory_bench.SaveLog(blk.parameters())
    with log.around(torch.autograd.graph.save_on_cpu(pin_memory=True)):
        y = blk(torch.randn(b, s, H, dtype=torch.float64, requires_grad=True))
    f = block_bytes(s, b, H, A, 8)
    assert log.activations == sum(f.values()) + f["a s^2 b"]      # softmax output saved twice
    assert log.weights == (12 * H * H + 4 * H) * 8
    y.sum().backward()                                             # and it unpacks


def _cast_hook(dtype):                        # the lecture's cast_hook (section 5)
    def hook(state, bucket):
        buffer = bucket.buffer()
        half = buffer.to(dtype).div_(torch.distributed.get_world_size())
        fut = torch.distributed.all_reduce(half, async_op=True).get_future()
        return fut.then(lambda f: buffer.copy_(f.value()[0]))
    return hook


def test_the_gradient_hooks_send_what_the_model_says():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    hooks = {"exact": lambda: (None, default_hooks.allreduce_hook),
             "fp16": lambda: (None, default_hooks.fp16_compress_hook),
             "bf16": lambda: (None, _cast_hook(torch.bfloat16))}   # torch's: CUDA only
    mlp = dict(dim=8, hidden=16, depth=2)
    n = sum(p.numel() for p in tiny.model(**mlp).parameters())
    runs = spawn(precision_bench.train_with_hooks, 2, args=(hooks, 6, 0.1, mlp, 8), backend="gloo")
    for run in runs:
        assert run["exact"]["bytes"] == [4 * n] * 6 and run["fp16"]["bytes"] == [2 * n] * 6
        assert run["fp16"]["dtypes"] == ["float16"] and run["bf16"]["dtypes"] == ["bfloat16"]
    flat = {k: torch.cat([p.flatten() for p in runs[0][k]["params"]]) for k in hooks}
    d = {k: (flat[k] - flat["exact"]).norm().item() for k in ("fp16", "bf16")}
    precision_bench.assert_scales_with_u(d["bf16"], d["fp16"], 2.0**-8 / 2.0**-11)
    with pytest.raises(AssertionError):          # two runs in one format: ratio 1, not 8
        precision_bench.assert_scales_with_u(d["fp16"], d["fp16"], 2.0**-8 / 2.0**-11)
    with pytest.raises(AssertionError):          # a model off by a factor 8
        precision_bench.assert_scales_with_u(d["bf16"], d["fp16"], 2.0**-8 / 2.0**-8)


def test_a_cpu_device_needs_no_cuda_sync_and_a_gpu_still_gets_one(monkeypatch):
    # torch's PowerSGD hook calls torch.cuda.synchronize(the bucket's device) whenever CUDA is
    # available; for a CPU bucket (a gloo rank on a GPU machine) that raised on an H100.
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    with precision_bench.no_cuda_sync_for_cpu():
        torch.cuda.synchronize(torch.device("cpu"))
        torch.cuda.synchronize("cpu")
        torch.cuda.synchronize(torch.device("cuda", 0))
        torch.cuda.synchronize()
    torch.cuda.synchronize(torch.device("cpu"))      # outside: the function it found, untouched
    assert calls == [torch.device("cuda", 0), None, torch.device("cpu")]


def _table(s, b, h, a, w):
    """Section 1's table tensor by tensor, as the forward saves them (b > 1: q, k, v copies)."""
    sbh, sb = s * b * h * w, s * b * w
    ln = [sbh, sb, sb]
    return ln + [sbh, sbh, sbh, s * s, a * s * s * b * w, sbh, sbh] + ln + [sbh, 4 * sbh, 4 * sbh]


def test_the_recorded_saves_are_the_table_tensor_by_tensor():
    """Section 1's picture: the storages a run saves, in order, are the table's list (issue 48);
    the fused block records otherwise (no mask, no s x s weights), and at b = 1 q, k and v are
    views of one storage: another list, the same bytes."""
    blk = tiny.transformer(64, H, A, 1, 8).blocks[0]

    def record(x, run=blk):
        return [n for _, n in memory_bench.record_saves(lambda: run(x), blk.parameters())]

    assert record(torch.randn(2, 64, H, dtype=torch.float64)) == _table(64, 2, H, A, 8)
    assert record(torch.randn(2, 64, H, dtype=torch.float64),
                  lambda x: _sdpa_block(blk, x)) != _table(64, 2, H, A, 8)
    one = record(torch.randn(1, 64, H, dtype=torch.float64))
    assert one != _table(64, 1, H, A, 8) and sum(one) == sum(_table(64, 1, H, A, 8))

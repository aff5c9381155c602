"""The planner's counts (lecture 14): FLOPs, parameters per pipeline stage, and the collective calls and
bytes of one training step per GPU, per dimension (`traffic`). helpers/planner.py turns them into
memory and time; helpers/planner_machine.py into this machine's prediction. Import them through
`from helpers import planner` (planner.traffic, planner.param_count, ...).

A model dict: layers, hidden, heads, vocab, seq, params (None: Narayanan et al. 2021's Eq. 2), and
optionally how its parameters sit on the stages (defaults: Megatron-LM's GPT, Eq. 2's count):
layer_split (per layer, split over tp; default (P - Vh)/L), layer_whole (per layer, whole on every tp
rank: norms, row-parallel biases; 0), embed (first stage; V h), embed_split (over tp; True), head (last
stage; 0, tied to the embedding), head_split (True: vocabulary-parallel), head_whole (0), p2p_split
(True: a pipeline send carries 1/tp of the activation, Megatron's scatter/gather or sequence
parallelism's shard; False: the whole activation, as nd3d sends it).
"""
from helpers.cost import ring_all_gather, ring_all_reduce, ring_reduce_scatter

BF16 = 2                                    # bytes per 16-bit element (lecture 10, section 4)
DIMENSIONS = ("tensor", "pipeline", "data")


def param_count(model):
    """P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)): Narayanan et al. 2021, Eq. 2."""
    if model.get("params"):
        return model["params"]
    l, h, V, s = model["layers"], model["hidden"], model["vocab"], model["seq"]
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


def paper_flops(model, batch):
    """F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration, with full recomputation:
    Narayanan et al. 2021, Eq. 3, the FLOPs their teraFLOP/s figures divide by the time."""
    l, h, V, s = model["layers"], model["hidden"], model["vocab"], model["seq"]
    return 96 * batch * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def executed_flops(model, batch, recompute="none"):
    """FLOPs a step runs: 3 passes (forward, backward = 2 forwards) of 24 B s l h^2 (1 + s/(6h)) plus
    the logits' 6 B s h V; full recomputation adds a forward (then this is Eq. 3), selective only the
    attention core, 4 B s^2 h a layer (lecture 10, section 3)."""
    l, h, V, s = model["layers"], model["hidden"], model["vocab"], model["seq"]
    one_forward = 24 * batch * s * l * h * h * (1 + s / (6 * h))
    extra = {"none": 0.0, "selective": 4 * batch * s * s * h * l, "full": one_forward}[recompute]
    return 3 * one_forward + 6 * batch * s * h * V + extra


def stage_flops(model, micro_batch, tp, pp, recompute="none"):
    """FLOPs of one micro-batch on one GPU of the busiest stage, the last: its L/p layers' share / t
    and the logits' 6 b s h V (/ t if the head is vocabulary-parallel). With p = 1 this is the step's
    executed FLOPs / t; with p > 1 the last stage does more than the average by the logits."""
    s, h, V, L = model["seq"], model["hidden"], model["vocab"], model["layers"]
    head = 6 * micro_batch * s * h * V
    per_layer = (executed_flops(model, micro_batch, recompute) - head) / L
    return (L // pp) * per_layer / tp + head / (tp if model.get("head_split", True) else 1)


def _layer_params(model, tp):
    """Parameters of one layer on one GPU."""
    split = model.get("layer_split")
    if split is None:
        split = (param_count(model) - model["vocab"] * model["hidden"]) / model["layers"]
    return split / tp + model.get("layer_whole", 0)


def stage_params(model, tp, pp):
    """Parameters on one GPU of the fullest pipeline stage: its L/p layers, plus the embedding on the
    first stage and the head on the last (both with p = 1). With the defaults (Eq. 2, a tied head):
    (P - Vh)/(t p) + Vh/t, the first stage's, which holds the word embedding."""
    layers = (model["layers"] // pp) * _layer_params(model, tp)
    embed = model.get("embed", model["vocab"] * model["hidden"]) / (tp if model.get("embed_split", True) else 1)
    head = model.get("head", 0) / (tp if model.get("head_split", True) else 1) + model.get("head_whole", 0)
    return layers + embed + head if pp == 1 else layers + max(embed, head)


# ------------------------------------------------------------------- collective calls and bytes

def _dim(**kinds):
    """{"calls", "bytes", "kind": {name: calls}, "kind_bytes": {name: bytes}} from name=(calls, bytes)."""
    kinds = {k: v for k, v in kinds.items() if v[0]}
    return {"calls": sum(c for c, _ in kinds.values()), "bytes": sum(b for _, b in kinds.values()),
            "kind": {k: c for k, (c, _) in kinds.items()}, "kind_bytes": {k: b for k, (_, b) in kinds.items()}}


def traffic(model, global_batch, micro_batch, dp, tp, pp, zero=0, recompute="full", chunks=1,
            element=BF16, sequence_parallel=False):
    """Collective (and send) calls of one training step on one GPU, per dimension: {"tensor": d,
    "pipeline": d, "data": d}, each d = {"calls": n, "bytes": sum of the calls' S, "kind": {name:
    calls}, "kind_bytes": {name: bytes}}. S is nccl-tests' message size: all_reduce the tensor's
    bytes, all_gather the OUTPUT's (the gathered tensor), reduce_scatter the INPUT's, send the bytes
    sent. m = B/(d b) micro-batches; a = element * b s h, one activation; the fullest stage's
    parameters P0 (stage_params) and its L/p layers. What is counted:

    tensor (t > 1), per layer and micro-batch, Megatron's f/g as DTensor's ColwiseParallel +
      RowwiseParallel issue them (lecture 07): forward 2 all_reduce of a (the Partial outputs of the
      attention's and the MLP's row-parallel linear), backward 2 (the Partial input gradients of the
      column-parallel linears), a full recomputation 2 more. With sequence parallelism
      (SequenceParallel on the norms) each all_reduce becomes an all_gather and a reduce_scatter,
      each of S = a: the same time on a ring, twice the calls and twice the sum of S.
      Deliberately left out: the vocabulary-parallel embedding's and loss's collectives.
    pipeline (p > 1), per micro-batch and chunk, one activation forward and one gradient backward
      sent by a middle stage: 2 m v sends of a / t (p2p_split, Megatron's scatter/gather; a with
      p2p_split False). The matching receives are the neighbours' sends, not counted again.
    data (d > 1), of the bf16 gradients and parameters of P0 (lectures 05, 06):
      ZeRO-0: 1 all_reduce of S = element P0 per step (DDP's 25 MB buckets: one call here);
      ZeRO-1: 1 reduce_scatter of the gradients + 1 all_gather of the updated parameters, each S =
      element P0; ZeRO-2: a reduce_scatter per micro-batch (only a shard is kept) + 1 all_gather;
      ZeRO-3 as FSDP2's fully_shard with one unit per layer and the root unit holding the rest
      (embedding, head): per micro-batch every layer all_gathers forward and again in backward
      (reshard_after_forward=True, the default below the root), the root once (not resharded after
      forward, FSDP2's default for the root), and every unit reduce_scatters its gradients. A full
      recomputation adds no all_gather: FSDP2's pre-backward gather serves the recomputed forward.
    Not counted: the loss's and the optimizer's small collectives, gradient clipping's norm."""
    s, h, layers = model["seq"], model["hidden"], model["layers"] // pp
    m = global_batch // (dp * micro_batch)
    act = element * micro_batch * s * h
    tensor = _dim()
    if tp > 1:
        n = 2 * (3 if recompute == "full" else 2) * layers * m          # 2 per layer and pass
        if sequence_parallel:
            tensor = _dim(all_gather=(n, n * act), reduce_scatter=(n, n * act))
        else:
            tensor = _dim(all_reduce=(n, n * act))
    pipeline = _dim()
    if pp > 1:
        n = 2 * m * chunks
        pipeline = _dim(send=(n, n * act / (tp if model.get("p2p_split", True) else 1)))
    data = _dim()
    if dp > 1:
        full = element * stage_params(model, tp, pp)
        if zero == 0:
            data = _dim(all_reduce=(1, full))
        elif zero == 1:
            data = _dim(reduce_scatter=(1, full), all_gather=(1, full))
        elif zero == 2:
            data = _dim(reduce_scatter=(m, m * full), all_gather=(1, full))
        else:
            layer = element * _layer_params(model, tp)
            root = full - layers * layer                                 # embedding, head
            units = layers + (root > 0)
            data = _dim(all_gather=(m * (2 * layers + (root > 0)), m * (2 * layers * layer + root)),
                        reduce_scatter=(m * units, m * full))
    return {"tensor": tensor, "pipeline": pipeline, "data": data}


def _send(n, k, bw, alpha=0.0):
    """One message of n bytes: alpha + n/B (lecture 00)."""
    return alpha + n / bw


COST = {"all_reduce": ring_all_reduce, "all_gather": ring_all_gather, "reduce_scatter": ring_reduce_scatter,
        "send": _send}


def comm_time(dim, k, bw, alpha):
    """Seconds of one dimension's calls (a traffic() entry) on a group of k ranks: every call costs
    the ring formula of its own S (lecture 02); the formulas are affine in S, so calls x cost(mean S)."""
    return sum(c * COST[kind](dim["kind_bytes"][kind] / c, k, bw, alpha) for kind, c in dim["kind"].items())

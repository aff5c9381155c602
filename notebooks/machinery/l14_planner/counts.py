"""The planner's counts (lecture 14): FLOPs, layers and parameters per pipeline stage, and the collective
calls and bytes of one training step per GPU, per dimension (`traffic`). notebooks/machinery/l14_planner/step.py turns them
into time, notebooks/machinery/l14_planner/memory.py into memory, notebooks/machinery/l14_planner/modelled.py into a modelled node's
step. Import them through `from machinery import l14_planner as planner` (planner.traffic, planner.param_count, ...).

A model dict: layers, hidden, heads, vocab, seq, params (None: Narayanan et al. 2021's Eq. 2), and
optionally how its parameters sit on the stages (defaults: Megatron-LM's GPT, Eq. 2's count):
layer_split (per layer, split over tp; default (P - Vh)/L), layer_whole (per layer, whole on every tp
rank: norms, row-parallel biases; 0), embed (first stage; V h), embed_split (over tp; True), head (last
stage; default tied to the embedding: none with p = 1, and with p > 1 the copy of the embedding that
Megatron-LM keeps on the last stage for the logits, V h, its gradients all-reduced with the first
stage's once per step), head_split (True: vocabulary-parallel), head_whole (0), p2p_split
(True: a pipeline send carries 1/tp of the activation, Megatron's scatter/gather or sequence
parallelism's shard; False: the whole activation, as nd3d sends it); experts (E, 0: dense) and top_k
(k, 1): a mixture-of-experts model, every layer's MLP (8 h^2) replaced by E experts of 8 h^2 of which
each token visits k (lecture 12; the router's h E is left out).
"""
from helpers.cost import ring_all_gather, ring_all_reduce, ring_reduce_scatter

BF16 = 2                                    # bytes per 16-bit element (lecture 10, section 4)
DIMENSIONS = ("tensor", "context", "expert", "pipeline", "data", "expert_data")


def _moe(model):
    """(E, k): experts per layer and experts a token visits; (0, 1) for a dense model."""
    return model.get("experts", 0), model.get("top_k", 1) if model.get("experts", 0) else 1


def param_count(model):
    """P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)): Narayanan et al. 2021, Eq. 2; an MoE model has
    E - 1 more MLPs of 8 h^2 a layer."""
    if model.get("params"):
        return model["params"]
    l, h, V, s = model["layers"], model["hidden"], model["vocab"], model["seq"]
    experts = _moe(model)[0]
    extra = l * (experts - 1) * 8 * h * h if experts else 0
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h)) + extra


def paper_flops(model, batch):
    """F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration, with full recomputation:
    Narayanan et al. 2021, Eq. 3, the FLOPs their teraFLOP/s figures divide by the time."""
    l, h, V, s = model["layers"], model["hidden"], model["vocab"], model["seq"]
    return 96 * batch * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def executed_flops(model, batch, recompute="none"):
    """FLOPs a step runs: 3 passes (forward, backward = 2 forwards) of 24 B s l h^2 (1 + s/(6h)) plus
    the logits' 6 B s h V; full recomputation adds a forward (then this is Eq. 3), selective only the
    attention core, 4 B s^2 h a layer (lecture 10, section 3). An MoE token visits k MLPs: 16 (k-1)
    B s l h^2 more a forward."""
    l, h, V, s = model["layers"], model["hidden"], model["vocab"], model["seq"]
    one_forward = 24 * batch * s * l * h * h * (1 + s / (6 * h))
    one_forward += 16 * (_moe(model)[1] - 1) * batch * s * l * h * h
    extra = {"none": 0.0, "selective": 4 * batch * s * s * h * l, "full": one_forward}[recompute]
    return 3 * one_forward + 6 * batch * s * h * V + extra


# ------------------------------------------------------------------------- pipeline stages

def stage_layers(model, pp, stages=None):
    """Transformer layers per pipeline stage: `stages` as given, else L/p each."""
    return tuple(stages) if stages is not None else (model["layers"] // pp,) * pp


def stage_splits(layers, pp):
    """The splits a plan tries (Megatron-LM's first/last-stage layer counts): the middle stages k
    layers each, the first and the last the rest r = L - (p-2) k between them (the first the smaller
    half), each at least 1 and at most k; k = L/p is the equal split. Fewer layers on the first stage
    (it holds p micro-batches and the embedding) and on the last (it computes the logits)."""
    if pp <= 2:
        return [(layers,)] if pp == 1 else [(layers // 2, layers - layers // 2)]
    out = []
    for k in range(-(-layers // pp), layers // (pp - 2) + 1):
        r = layers - (pp - 2) * k
        first, last = r // 2, r - r // 2
        if 1 <= first and last <= k:
            out.append((first,) + (k,) * (pp - 2) + (last,))
    return out


def stage_flops(model, micro_batch, tp, pp, recompute="none", layers=None, last=True, cp=1):
    """FLOPs of one micro-batch on one GPU of a stage of `layers` layers (L/p) and, on the `last`, the
    logits: the layers' share / t and the logits' 6 b s h V (/ t if the head is vocabulary-parallel),
    all / cp (context parallelism splits the sequence). By default the busiest of equal stages, the
    last: with p = 1 the step's executed FLOPs / t."""
    s, h, V, L = model["seq"], model["hidden"], model["vocab"], model["layers"]
    n = L // pp if layers is None else layers
    head = 6 * micro_batch * s * h * V
    per_layer = (executed_flops(model, micro_batch, recompute) - head) / L
    logits = head / (tp if model.get("head_split", True) else 1) if last else 0
    return (n * per_layer / tp + logits) / cp


def layer_params(model, tp, ep=1):
    """(dense, expert) parameters of one layer on one GPU: the split part / tp plus the whole part;
    an MoE layer's E experts of 8 h^2 split over ep, then tp (each expert as the dense MLP)."""
    experts, h = _moe(model)[0], model["hidden"]
    split = model.get("layer_split")
    if split is None:
        split = (param_count(model) - model["vocab"] * h) / model["layers"] - experts * 8 * h * h
    return split / tp + model.get("layer_whole", 0), experts / ep * 8 * h * h / tp


def stage_param_split(model, tp, pp, stages=None, ep=1):
    """[(dense, expert)] parameters on one GPU of each stage: its layers, the embedding on the first
    and the head on the last (both with p = 1); a tied head (no "head" key) is a copy of the
    embedding on the last stage when p > 1, as Megatron-LM keeps it."""
    dense, expert = layer_params(model, tp, ep)
    split = stage_layers(model, pp, stages)
    words = model.get("embed", model["vocab"] * model["hidden"])
    embed = words / (tp if model.get("embed_split", True) else 1)
    tied = words if len(split) > 1 else 0                    # the last stage's copy, p > 1
    head = model.get("head", tied) / (tp if model.get("head_split", True) else 1) + model.get("head_whole", 0)
    return [(n * dense + (embed if i == 0 else 0) + (head if i == len(split) - 1 else 0), n * expert)
            for i, n in enumerate(split)]


def stage_params(model, tp, pp, stages=None, ep=1):
    """Parameters on one GPU of the fullest pipeline stage. With the defaults (Eq. 2, a tied head,
    equal stages): (P - Vh)/(t p) + Vh/t, the first stage's, which holds the word embedding (and the
    last's, which holds its copy when p > 1)."""
    return max(d + e for d, e in stage_param_split(model, tp, pp, stages, ep))


def fullest_stage(model, tp, pp, stages=None, ep=1):
    """The index of the stage holding the most parameters (the first among equals)."""
    split = stage_param_split(model, tp, pp, stages, ep)
    return max(range(len(split)), key=lambda i: (sum(split[i]), -i))


# ------------------------------------------------------------------- collective calls and bytes

def _dim(**kinds):
    """{"calls", "bytes", "kind": {name: calls}, "kind_bytes": {name: bytes}} from name=(calls, bytes)."""
    kinds = {k: v for k, v in kinds.items() if v[0]}
    return {"calls": sum(c for c, _ in kinds.values()), "bytes": sum(b for _, b in kinds.values()),
            "kind": {k: c for k, (c, _) in kinds.items()}, "kind_bytes": {k: b for k, (_, b) in kinds.items()}}


def _sharded(zero, m, params, grads, layer_params, layer_grads, layers):
    """The data-parallel calls of one group's weights (lectures 05, 06): `params` / `grads` the bytes
    of the stage's parameters / gradients, `layer_*` one layer's (ZeRO-3's units)."""
    if zero == 0:
        return _dim(all_reduce=(1, grads))
    if zero == 1:
        return _dim(reduce_scatter=(1, grads), all_gather=(1, params))
    if zero == 2:
        return _dim(reduce_scatter=(m, m * grads), all_gather=(1, params))
    root = params - layers * layer_params                    # embedding, head: FSDP2's root unit
    units = layers + (root > 0)
    return _dim(all_gather=(m * (2 * layers + (root > 0)), m * (2 * layers * layer_params + root)),
                reduce_scatter=(m * units, m * grads))


def traffic(model, global_batch, micro_batch, dp, tp, pp, zero=0, recompute="full", chunks=1,
            element=BF16, sequence_parallel=False, cp=1, ep=1, stages=None, main_grads=False,
            stage=None):
    """Collective (and send) calls of one training step on one GPU, per dimension: {"tensor": d,
    "context": d, "expert": d, "pipeline": d, "data": d, "expert_data": d}, each d = {"calls": n,
    "bytes": sum of the calls' S, "kind": {name: calls}, "kind_bytes": {name: bytes}}. S is nccl-tests'
    message size: all_reduce the tensor's bytes, all_gather the OUTPUT's (the gathered tensor),
    reduce_scatter the INPUT's, all_to_all and send the bytes each rank sends (and keeps). m = B/(d b)
    micro-batches; a = element * b (s/cp) h, one activation; the GPU is one of stage `stage` (None:
    its layers are the most any stage has, its parameters the fullest stage's; equal stages by
    default). What is counted:

    tensor (t > 1), per layer and micro-batch, Megatron's f/g as DTensor's ColwiseParallel +
      RowwiseParallel issue them (lecture 07): forward 2 all_reduce of a (the Partial outputs of the
      attention's and the MLP's row-parallel linear), backward 2 (the Partial input gradients of the
      column-parallel linears), a full recomputation 2 more. With sequence parallelism
      (SequenceParallel on the norms) each all_reduce becomes an all_gather and a reduce_scatter,
      each of S = a: the same time on a ring, twice the calls and twice the sum of S. In an MoE model
      with ep > 1 the MLP's pair gathers and scatters the routed tokens (Megatron-Core's alltoall
      dispatcher, experts split over tp): S = k a for those, a for the attention's.
      Deliberately left out: the vocabulary-parallel embedding's and loss's collectives.
    context (cp > 1), ring attention as lecture 11 runs it, per layer and micro-batch: forward cp-1
      sends of this rank's K and V (2 a / t: heads split over tp), backward cp-1 more and cp sends of
      their gradients, a full recomputation cp-1 more.
    expert (ep > 1, an MoE model), per layer and micro-batch: 2 all_to_all forward (dispatch, combine:
      lecture 12), 2 backward, 2 more in a full recomputation, each of S = k a / t (every token to its
      k experts, capacity factor 1; each of the t tensor-parallel ranks dispatches its 1/t of the
      tokens, the sequence-parallel shard Megatron-Core requires with tp > 1); the counts' exchange
      (E integers) is left out.
    pipeline (p > 1), per micro-batch and chunk, one activation forward and one gradient backward
      sent by a middle stage: 2 m v sends of a / t (p2p_split, Megatron's scatter/gather; a with
      p2p_split False); the first stage's first chunk sends no gradient back and the last stage's
      last chunk no activation on: m (2v - 1) there (stage None: the most a stage sends). The
      matching receives are the neighbours' sends, not counted again.
    data (d cp > 1: context-parallel ranks hold the same weights), of the stage's dense parameters P0
      (lectures 05, 06; the gradients in fp32 with main_grads, Megatron's main_grad buffer, else in
      `element`): ZeRO-0: 1 all_reduce of the gradients per step (DDP's 25 MB buckets: one call here);
      ZeRO-1: 1 reduce_scatter of the gradients + 1 all_gather of the updated parameters; ZeRO-2: a
      reduce_scatter per micro-batch (only a shard is kept) + 1 all_gather; ZeRO-3 as FSDP2's
      fully_shard with one unit per layer and the root unit holding the rest (embedding, head): per
      micro-batch every layer all_gathers forward and again in backward (reshard_after_forward=True,
      the default below the root), the root once (not resharded after forward, FSDP2's default for the
      root), and every unit reduce_scatters its gradients. A full recomputation adds no all_gather:
      FSDP2's pre-backward gather serves the recomputed forward. With pipeline parallelism ZeRO-2/3's
      per-micro-batch calls are priced as such (planner.step_time puts them in every slot).
    expert_data (an MoE model, d cp / ep > 1): the same for the experts' parameters, over the ranks
      holding the same experts.
    Not counted: the loss's and the optimizer's small collectives, gradient clipping's norm, and with
    p > 1 the all_reduce of the tied embedding's gradients between the first and the last stage
    (once per step, V h / t values: milliseconds beside a step of seconds)."""
    s, h = model["seq"] // cp, model["hidden"]
    split = stage_layers(model, pp, stages)
    layers = max(split) if stage is None else split[stage]
    m = global_batch // (dp * micro_batch)
    act = element * micro_batch * s * h
    full = recompute == "full"
    experts, k = _moe(model)
    routed = k if ep > 1 and experts else 1                  # the MLP's tokens, k copies with ep
    tensor = _dim()
    if tp > 1:
        n = 2 * (3 if full else 2) * layers * m          # 2 per layer and pass
        if sequence_parallel:                            # half of them the attention's, half the MLP's
            sp = n * act * (1 + routed) / 2
            tensor = _dim(all_gather=(n, sp), reduce_scatter=(n, sp))
        else:
            tensor = _dim(all_reduce=(n, n * act))
    context = _dim()
    if cp > 1:
        n = layers * m * ((cp - 1) * (2 + full) + cp)
        context = _dim(send=(n, n * 2 * act / tp))
    expert = _dim()
    if ep > 1 and experts:
        n = 2 * (3 if full else 2) * layers * m
        expert = _dim(all_to_all=(n, n * k * act / tp))
    pipeline = _dim()
    if pp > 1:          # an end stage sends one way for its outer chunk (None: the most sent)
        end = pp == 2 if stage is None else stage in (0, pp - 1)
        n = m * (2 * chunks - end)
        pipeline = _dim(send=(n, n * act / (tp if model.get("p2p_split", True) else 1)))
    i = fullest_stage(model, tp, pp, stages, ep) if stage is None else stage
    dense, expert_params = stage_param_split(model, tp, pp, stages, ep)[i]
    dense_layer, expert_layer = layer_params(model, tp, ep)
    grad = 4 if main_grads else element
    data = expert_data = _dim()
    if dp * cp > 1:
        data = _sharded(zero, m, element * dense, grad * dense, element * dense_layer,
                        grad * dense_layer, split[i])
    if experts and dp * cp // ep > 1:
        expert_data = _sharded(zero, m, element * expert_params, grad * expert_params,
                               element * expert_layer, grad * expert_layer, split[i])
    return {"tensor": tensor, "context": context, "expert": expert, "pipeline": pipeline,
            "data": data, "expert_data": expert_data}


def _send(n, k, bw, alpha=0.0):
    """One message of n bytes: alpha + n/B (lecture 00)."""
    return alpha + n / bw


def _all_to_all(n, k, bw, alpha=0.0):
    """Pairwise exchange: K-1 steps, in each every rank sends N/K bytes to one other (lecture 12)."""
    return (k - 1) * (alpha + n / (k * bw))


COST = {"all_reduce": ring_all_reduce, "all_gather": ring_all_gather, "reduce_scatter": ring_reduce_scatter,
        "send": _send, "all_to_all": _all_to_all}


def comm_time(dim, k, bw, alpha):
    """Seconds of one dimension's calls (a traffic() entry) on a group of k ranks: every call costs
    the ring formula of its own S (lecture 02); the formulas are affine in S, so calls x cost(mean S)."""
    return sum(c * COST[kind](dim["kind_bytes"][kind] / c, k, bw, alpha) for kind, c in dim["kind"].items())

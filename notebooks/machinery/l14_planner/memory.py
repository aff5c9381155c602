"""The planner's memory per GPU (lecture 14): weights, gradients and optimizer states of a stage, its
activations in flight, the working memory of recomputation and ZeRO-3, and the logits, per pipeline
stage; the fullest stage decides what fits. Reached as planner.memory, planner.activation_bytes_per_layer."""
from machinery.l14_planner.counts import BF16, _moe, stage_layers, stage_param_split


def activation_bytes_per_layer(model, micro_batch, tp, recompute, sequence_parallel, cp=1):
    """Bytes one layer keeps for one micro-batch, 16-bit, Korthikanti et al. 2022 (lecture 10, s. 6):
    sbh(34 + 5as/h) none, 34 sbh selective, 2 sbh full, all divided by t with sequence parallelism;
    tensor parallelism alone leaves 10 sbh (norms, dropouts, inputs) whole: sbh(10 + 24/t + 5as/(ht)).
    Context parallelism divides it all by cp (each rank keeps its s/cp tokens'). An MoE token visits
    k experts: the MLP's 19 sbh / t again for each of the k - 1 more (none or selective recomputation)."""
    s, h, a, b = model["seq"], model["hidden"], model["heads"], micro_batch
    sbh, attn = s * b * h, 5 * a * s / h
    if sequence_parallel or tp == 1:
        out = sbh * {"none": 34 + attn, "selective": 34, "full": 2}[recompute] / tp
    else:
        out = sbh * {"none": 10 + (24 + attn) / tp, "selective": 10 + 24 / tp, "full": 2}[recompute]
    if recompute != "full":
        out += (_moe(model)[1] - 1) * 19 * sbh / tp
    return out / cp


def memory(model, cluster, global_batch, micro_batch, dp, tp, pp, zero, recompute,
           sequence_parallel=True, chunks=1, cp=1, ep=1, stages=None, main_grads=False):
    """Bytes per GPU of the fullest pipeline stage (equal stages: the first, with the word embedding
    and min(p, m) micro-batches in flight), broken down, and every stage's total ("stages").
    Recomputation's working memory is what one layer rematerialises: with a full one the whole layer,
    sbh(34 + 5as/h) (/ t with sequence parallelism), with a selective one the attention core
    sbh 5as/h (the rest of the layer is kept anyway). Interleaved (v = chunks > 1): stage i holds the warm-up's chunks and one more, min(2(p - i - 1)
    + (v - 1)p + 1, m v) chunks of n/v layers (Megatron-LM's forward_backward_pipelining_with_
    interleaving); on the first stage L (1 + (p - 1)/(p v)) layers, Korthikanti et al. 2022's 4.2.3."""
    m = global_batch // (dp * micro_batch)
    per_layer = activation_bytes_per_layer(model, micro_batch, tp, recompute, sequence_parallel, cp)
    working = 0.0                                            # lecture 10, section 6: working memory
    if recompute != "none":                                  # what one layer rematerialises at a time:
        working += (activation_bytes_per_layer(model, micro_batch, tp, "none", sequence_parallel, cp)
                    - per_layer * (recompute == "selective"))   # the whole layer / its attention core
    if zero >= 3:                                            # a layer's gathered weights and grads, x2 prefetch
        experts, h = _moe(model)[0], model["hidden"]
        weights = 12 * h ** 2 if not experts else (4 + 8 * experts / ep) * h ** 2
        working += 2 * 2 * BF16 * weights / tp
    shards, expert_shards = dp * cp, dp * cp // ep           # the ranks holding the same weights
    grad = 4 if main_grads else BF16                         # Megatron's fp32 main_grad buffer
    vocab = model["vocab"] / (tp if model.get("head_split", True) else 1)
    out = []
    for i, (n, (dense, expert)) in enumerate(zip(stage_layers(model, pp, stages),
                                                 stage_param_split(model, tp, pp, stages, ep))):
        def states(nbytes, stage):                           # lecture 06's table: bf16 2 + 2 + 12
            return (nbytes * dense / (shards if zero >= stage else 1)
                    + nbytes * expert / (expert_shards if zero >= stage else 1))
        in_flight = min(pp - i, m)                           # 1F1B: stage i holds min(p - i, m) (lecture 08)
        if chunks > 1:                                       # interleaved: chunks of n/v layers in flight
            in_flight = min(2 * (pp - i - 1) + (chunks - 1) * pp + 1, m * chunks) / chunks
        # the last stage's logits of one micro-batch: bf16, and fp32 for the loss (6 bytes a value)
        logits = (BF16 + 4) * micro_batch * model["seq"] / cp * vocab if i == pp - 1 else 0.0
        mem = {"params": states(BF16, 3), "grads": states(grad, 2), "optim": states(12, 1),
               "activations": n * per_layer * in_flight, "working": working, "logits": logits}
        mem["total"] = sum(mem.values())
        out.append(mem)
    fullest = max(range(pp), key=lambda i: (out[i]["total"], -i))
    return dict(out[fullest], stage=fullest, stages=[r["total"] for r in out])

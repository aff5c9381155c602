"""Lecture 14's memory per GPU against Megatron-LM's own estimate, where their assumptions agree (issue 47).

Megatron-LM's megatron/training/theoretical_memory_usage.py (github.com/NVIDIA/Megatron-LM, read at
commit 00caa53) estimates the memory of the most loaded GPU. Its formulas, transcribed here in our
own words for a dense GPT (LayerNorm, no grouped-query attention, an MLP of 4h, tied embeddings):
- weights and optimizer (compute_weight_and_optimizer_memory): a layer holds 2h(4h + 2) + 2h^2 x 2
  = 12 h^2 + 4 h parameters (no linear biases), the block L of them and a final norm of 2h; the most
  loaded shard holds (block / p + V h) / t; 18 bytes a parameter (bf16 weights, fp32 main gradients,
  fp32 master weights and Adam's two moments), 6 + 12/d with the distributed optimizer (ZeRO-1);
- activations with sequence parallelism and selective recomputation (compute_activation_memory, from
  Korthikanti et al. 2022's Table 2): 34 s b h bytes a layer, times L (the first stage holds p
  micro-batches of L/p layers), times min(1, m/p) without interleaving or 1 + (p-1)/(p v) with v
  chunks, / t; without sequence parallelism (compute_activation_memory_without_sp) s b h (10 + 24/t)
  a layer, not divided again. Each also adds terms the planner leaves out (the embedding's input and
  dropout mask, a 5 % overhead) or counts otherwise (the output layer): not compared.
The planner agrees with the first within the biases and position embeddings Eq. 2 counts and
Megatron's formula does not (under 0.1 % on GPT-3 175B), and with the layers' activations exactly.
Negative controls: the planner without fp32 main gradients (16 bytes) and a pipeline that keeps p
micro-batches when m < p are each seen.
"""
import pytest

from machinery import l14_planner as planner
from machinery.l14_planner import paper

GPT3 = paper.gpt3("GPT-3 175B")
CLUSTER = {"gpus_per_node": 8, "nodes": 128, "memory": 80e9, "peak_flops": 989e12, "efficiency": 0.4,
           "intra_bw": 450e9, "intra_alpha": 5e-6, "inter_bw": 50e9, "inter_alpha": 10e-6}
LAYOUTS = [(16, 8, 8, 1, 1), (128, 8, 1, 1, 1), (8, 8, 16, 2, 2), (4, 8, 32, 1, 3),   # d, t, p, b, v
           (64, 4, 4, 2, 1)]


def megatron_weights_and_optimizer(model, d, t, p, distributed_optimizer):
    L, h, V = model["layers"], model["hidden"], model["vocab"]
    block = L * (12 * h * h + 4 * h) + 2 * h
    shard = (block / p + V * h) / t
    return shard * (6 + 12 / d if distributed_optimizer else 18)


def megatron_layer_activations(model, b, m, t, p, v, sequence_parallel):
    s, h, L = model["seq"], model["hidden"], model["layers"]
    per_layer = s * b * h * (34 / t if sequence_parallel else 10 + 24 / t)
    if v > 1:
        return per_layer * L * (1 + (p - 1) / (p * v))
    return per_layer * L * (min(1, m / p) if p > 1 else 1)


def planner_memory(d, t, p, b, v, zero, sp=True, main_grads=True, batch=1536):
    return planner.memory(GPT3, CLUSTER, batch, b, d, t, p, zero, "selective", sp, chunks=v,
                          main_grads=main_grads)


@pytest.mark.parametrize("d, t, p, b, v", LAYOUTS)
@pytest.mark.parametrize("zero", [0, 1])
def test_weights_and_optimizer_agree_with_megatron(d, t, p, b, v, zero):
    mem = planner_memory(d, t, p, b, v, zero)
    assert mem["stage"] == 0                                        # the most loaded: the first
    ours = mem["params"] + mem["grads"] + mem["optim"]
    theirs = megatron_weights_and_optimizer(GPT3, d, t, p, distributed_optimizer=zero == 1)
    assert ours == pytest.approx(theirs, rel=1e-3)


@pytest.mark.parametrize("d, t, p, b, v", LAYOUTS)
@pytest.mark.parametrize("sp", [True, False])
def test_layer_activations_agree_with_megatron(d, t, p, b, v, sp):
    m = 1536 // (d * b)
    mem = planner_memory(d, t, p, b, v, 1, sp=sp)
    theirs = megatron_layer_activations(GPT3, b, m, t, p, v, sp)
    assert mem["activations"] == pytest.approx(theirs, rel=1e-12)


def test_the_comparison_sees_a_wrong_byte_count_and_a_wrong_in_flight_count():
    d, t, p, b, v = LAYOUTS[0]
    mem = planner_memory(d, t, p, b, v, 0, main_grads=False)        # bf16 gradients: 16 bytes
    ours = mem["params"] + mem["grads"] + mem["optim"]
    assert ours != pytest.approx(megatron_weights_and_optimizer(GPT3, d, t, p, False), rel=1e-3)
    few = planner_memory(d, t, p, b, v, 1, batch=4 * d * b)        # m = 4 < p = 8 micro-batches
    kept_p = megatron_layer_activations(GPT3, b, p, t, p, v, True)  # as if p were in flight
    assert few["activations"] != pytest.approx(kept_p, rel=1e-3)
    assert few["activations"] == pytest.approx(megatron_layer_activations(GPT3, b, 4, t, p, v, True))

"""Reference solutions to the exercises of lecture 00 (hardware)."""
import math

REPLICATED = 2   # bytes per parameter every device keeps under ZeRO stage 2: the bf16 parameter
SHARDED = 14     # bytes per parameter split K ways: bf16 gradient, fp32 master copy, Adam's moments


def min_devices_zero2(n_params, device_bytes):
    """Fewest devices of `device_bytes` that hold the ZeRO-2 state of `n_params` parameters:
    2 n + 14 n / K <= device_bytes; math.inf when the parameters alone fill a device."""
    free = device_bytes - REPLICATED * n_params
    if free <= 0:
        return math.inf
    return max(1, math.ceil(SHARDED * n_params / free))


def allreduce_seconds(n_bytes, world_size, link_gbps, alpha_s):
    """Ring all-reduce: 2(K-1) steps, each sending n/K bytes over a link (latency + n/(K B))."""
    k = world_size
    return 2 * (k - 1) * (alpha_s + n_bytes / k / (link_gbps * 1e9))


def smallest_level(working_set, levels):
    """Name of the first (smallest) level whose size holds the working set, or None."""
    for name, size in levels:
        if working_set <= size:
            return name
    return None


def transfer_seconds(n_bytes, latency_s, gbps):
    """The alpha-beta model: t = latency + n / bandwidth."""
    return latency_s + n_bytes / (gbps * 1e9)


def half_peak_bytes(latency_s, gbps):
    """n / (a + n / B) = B / 2  <=>  n = a * B."""
    return latency_s * gbps * 1e9

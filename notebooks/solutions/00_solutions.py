"""Reference solutions to the exercises of lecture 00 (hardware)."""
import math

BYTES_PER_PARAM = 16  # bf16 parameter and gradient (2 + 2), fp32 master copy and Adam's two moments (12)


def min_devices(n_params, device_bytes):
    """Fewest devices of `device_bytes` that hold the training state of `n_params` parameters."""
    return math.ceil(n_params * BYTES_PER_PARAM / device_bytes)


def allreduce_seconds(n_bytes, world_size, link_gbps):
    """Ring all-reduce: each link carries 2(K-1)/K of the bytes; latency ignored."""
    return 2 * (world_size - 1) / world_size * n_bytes / (link_gbps * 1e9)


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

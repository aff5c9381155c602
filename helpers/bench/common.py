"""What every part of the harness shares: the collectives it knows, the columns of a row, and
sizes written as nccl-tests takes them (-b 1K -e 64M -f 2)."""

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv")
ROOTED = ("broadcast", "reduce")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
COLUMNS = ("collective", "world_size", "backend", "size", "count", "type", "redop", "root",
           "time_us", "p10_us", "p90_us", "algbw", "busbw", "wrong", "iters", "method", "ranks")
FORMAT = "helpers.bench/1"
METHODS = ("per-call", "nccl-tests")
# nccl-tests' -a: how the ranks' times of one measurement are combined (name, function)
AVERAGE = {0: ("rank 0", lambda ts: ts[0]), 1: ("mean", lambda ts: sum(ts) / len(ts)),
           2: ("min", min), 3: ("max", max)}



def parse_size(text):
    """'64M' -> 67108864, '1K' -> 1024, '4096' -> 4096 (K, M, G are powers of 1024, as in nccl-tests)."""
    if isinstance(text, (int, float)):
        return int(text)
    s = str(text).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(s[-1:], 1)
    try:
        return int(float(s[:-1] if scale > 1 else s) * scale)
    except ValueError:
        raise ValueError(f"cannot read a size from {text!r}; write e.g. 4096, 64K, 16M or 1G.") from None


def size_range(min_bytes="1K", max_bytes="64M", factor=2):
    """min, min*factor, ... up to max (inclusive): nccl-tests' -b/-e/-f sweep."""
    lo, hi = parse_size(min_bytes), parse_size(max_bytes)
    if lo < 1 or hi < lo:
        raise ValueError(f"need 1 <= min_bytes <= max_bytes, got {lo} and {hi}.")
    if factor <= 1:
        raise ValueError(f"the step factor must be > 1, got {factor}.")
    out, n = [], lo
    while n <= hi:
        out.append(int(n))
        n = n * factor
    return out

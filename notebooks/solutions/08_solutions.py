"""Reference solutions for the exercises of lecture 08 (pipeline parallelism)."""


def bubble_fraction(p, m):
    return (p - 1) / (m + p - 1)


def micro_batches_for(p, target):
    # (p-1)/(m+p-1) <= target  <=>  m >= (p-1)(1-target)/target
    m = 1
    while bubble_fraction(p, m) > target + 1e-12:
        m += 1
    return m


def peak_activations(schedule, p, m, stage):
    return m if schedule == "GPipe" else min(p - stage, m)


def stage_ranges(depth, p):
    base, extra = divmod(depth, p)
    ranges, start = [], 0
    for s in range(p):
        stop = start + base + (1 if s < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges

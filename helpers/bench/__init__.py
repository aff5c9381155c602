"""Measuring collectives the way nccl-tests does, from a notebook or from the command line.

    from helpers import bench
    rows = bench.sweep(["all_reduce", "all_gather"], world_sizes=[2, 4],
                       sizes=bench.size_range("1K", "64M", 2), warmup=5, iters=20, rounds=5)
    bench.table(rows)                       # size count type redop root time algbw busbw #wrong

The default measurement is nccl-tests' (method="nccl-tests"; its letters on the command line):
- a size sweep from -b to -e bytes, multiplied by -f each step (powers of two by default);
- -w warm-up calls first (the first collective builds the connections);
- then, per size, one barrier and -n calls back to back, the clock read once around the loop (CUDA
  events recorded on the current stream on a GPU, perf_counter on the CPU): time = loop / n;
- the ranks' times combined as -a says (0 rank 0, 1 the mean, its default, 2 min, 3 max);
- -N cycles of that, here in rounds: each round measures every size once, in a freshly shuffled order
  (the same on every rank), so a change in the machine's load falls on all sizes alike; the median
  over the rounds is reported, with their 10th and 90th percentiles as the spread (min-max up to 5
  rounds). (nccl-tests runs its cycles size after size and prints each; lecture 03 lists every
  departure of this harness from nccl-tests.)
- algbw = size / time (GB = 1e9 bytes), busbw = algbw x nccl-tests' factor (helpers.cost);
- -c 1: every benchmarked collective is checked once more after timing, from restored inputs: inputs
  hold small integers, so the result is exact in any order of summation, and the elements that
  differ from the expected result are counted (nccl-tests' `#wrong`).

A second measurement, named as such (method="per-call", --method per-call): a barrier before every
call, each call timed on every rank, per call the slowest rank's time, then the median and the
10th-90th percentiles over the calls. It measures the distribution of one call's latency, including
the barrier's release skew: useful on a noisy machine or for a latency-bound call, not comparable
with nccl-tests' numbers (lecture 03 runs both and shows where they differ). On a GPU its start event
is recorded on a stream with nothing queued, so every per-call time, at any K, includes the host's
launch of the collective, which nccl-tests' loop spreads over its calls.

Any callable can be benchmarked in place of the library's collective, as long as it has the same
meaning: pass `{"my ring": ("all_reduce", my_ring_all_reduce)}` and the harness makes the buffers,
times it, checks it and reports it with all_reduce's busbw factor. The signatures, per meaning:
    all_reduce(tensor)            in place, sum over ranks
    reduce(tensor, root)          in place, the sum lands on root
    broadcast(tensor, root)       in place, root's values everywhere
    all_gather(output, input)     output (K*c elements) = every rank's input (c elements), in rank order
    reduce_scatter(output, input) output (c elements) = this rank's chunk of the sum of the inputs (K*c)
    send_recv(send, recv)         send to rank+1, receive from rank-1 (a ring shift)

Command line (the same harness; standalone it starts its ranks with helpers.spawn, under torchrun it
runs in the ranks torchrun started):
    python -m helpers.bench --world-size 2 -b 1K -e 64M -f 2 --out results.json
    torchrun --nproc-per-node 2 -m helpers.bench -b 1K -e 64M -f 2 --out results.json
"""

from helpers.bench.cases import _Case, _pattern  # noqa: F401
from helpers.bench.common import (AVERAGE, COLLECTIVES, COLUMNS, FORMAT, METHODS, REDUCING,  # noqa: F401
                                  ROOTED, parse_size, size_range)
from helpers.bench.files import human_size, load, metadata, save, table  # noqa: F401
from helpers.bench.rank import measure_rank  # noqa: F401
from helpers.bench.sweep import combine, sweep  # noqa: F401


def main(argv=None):
    """The command (helpers/bench/__main__.py): `python -m helpers.bench -b 1K -e 64M ...`."""
    from helpers.bench.__main__ import main as command

    return command(argv)

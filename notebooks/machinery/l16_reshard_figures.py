"""Lecture 16's pictures of resharding: which rows of a tensor each loading rank reads from which
saved file. The same drawing serves the lecture's specification and what `dcp.load` did:

    with reshard_figures.recorded_reads() as log:       # on a rank, around the lecture's load
        load_sharded(model, opt, path)
    # log: [(tensor name, file, first row, end row)], one per piece read (rows of the whole tensor)
    reshard_figures.draw({"loaded on 3": reads}, rows=32, saved=[(0, 8), (8, 16), ...])

The recording wraps FileSystemReader.read_data (helpers.patching): DCP hands it the load plan, each
item a piece of a saved chunk (its MetadataIndex: the tensor and the chunk's offsets; the offsets and
lengths inside it) and the file that holds it (storage_data). It holds none of the lecture's code.
"""
import contextlib

from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.planner import LoadItemType

from helpers.patching import patched


@contextlib.contextmanager
def recorded_reads():
    """Inside, every read of a tensor through a FileSystemReader is noted: yields the list of
    (tensor name, file number, first row, end row), rows of the whole tensor (dimension 0)."""
    log = []

    def read_data(self, plan, planner):
        for item in plan.items:
            if item.type == LoadItemType.TENSOR and len(item.lengths):   # not a 0-d step
                name = self.storage_data[item.storage_index].relative_path   # __{file}_0.distcp
                start = item.storage_index.offset[0] + item.storage_offsets[0]
                log.append((item.storage_index.fqn, int(name.split("_")[2]), start,
                            start + item.lengths[0]))
        return originals["read_data"](self, plan, planner)

    with patched(FileSystemReader, read_data=read_data) as originals:
        yield log


def draw(panels, rows, saved):
    """One panel per {title: [(loading rank, file, first row, end row)]}: a bar per loading rank
    over the tensor's rows, each piece in its file's colour; above them, the saved files' rows
    (saved: [(first row, end row)] of each file)."""
    import matplotlib.pyplot as plt

    from helpers import plots

    fig, axes = plots.figure(ncols=len(panels), width=5.4 * len(panels), height=2.6)
    for ax, (title, reads) in zip(axes, panels.items()):
        for f, (a, b) in enumerate(saved):
            ax.barh(-1.3, b - a, left=a, color=plots.COLORS[f], edgecolor="white")
            ax.text((a + b) / 2, -1.3, f"file {f}", ha="center", va="center", fontsize=8)
        for q, f, a, b in reads:
            ax.barh(q, b - a, left=a, color=plots.COLORS[f], edgecolor="white")
            ax.text((a + b) / 2, q, f"{a}-{b - 1}", ha="center", va="center", fontsize=7)
        ranks = 1 + max(q for q, *_ in reads)
        ax.set_yticks([-1.3, *range(ranks)], ["saved", *[f"rank {q}" for q in range(ranks)]])
        ax.set(xlim=(0, rows), ylim=(ranks - 0.5, -1.9), xlabel="row of the tensor", title=title)
        ax.grid(False)
    plt.tight_layout()
    plt.show()

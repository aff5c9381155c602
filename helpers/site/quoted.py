"""Markdown that quotes a figure its own lecture prints (issue 49's rule, CONTRIBUTING.md).

The rule: a sentence states a claim as its asserted bound, or a fact with its source; a number of
one run appears in that run's output only, so that no other run or machine contradicts it.

The pattern: a figure is a decimal number (digits, a point, digits) of three significant digits
or more in a markdown cell, outside code spans and link targets, not a version (after "torch",
"NCCL", "CUDA", "PCIe", "Python", "v", "since" or "arXiv"). It is flagged when the same string is among the numbers the lecture's code cells printed
(stream and text/plain outputs) in an executed copy: prose that repeats a run's number. A cited
constant or a chosen size that the code also prints is allowed, per lecture, with its reason
(ALLOWED). A cell is flagged only when two or more of its figures are printed: a quoting paragraph
carries several, while one match alone can be chance (02's cited "1.07" met a measured 1.07 in one
fresh-clone run). Whole numbers are not checked (sizes, counts and years would drown the quotes),
nor shorter figures: a measured "0.5" or "2.5" is printed by chance too often.

    from helpers.site import quoted
    quoted.flagged(executed_notebook_dict, "05")   # [(cell index, [figures]), ...]
"""
import re

NUMBER = re.compile(r"(?<![\w./])(\d+\.\d+)(?![\w]|\.\d)")
VERSION = re.compile(r"(?:torch|NCCL|CUDA|PCIe|Python|v|since|arXiv:?)\s*$", re.I)

# lecture: {figure: why the markdown may say it although a cell prints it}
ALLOWED = {
    "00": {"460.8": "AMD's EPYC 9004 socket peak, cited [EPYC]",
           "31.5": "PCIe 4.0 x16 per direction, the exercise's given figure",
           "12.5": "100 GbE per port and direction (100 / 8), the reading's table"},
    "02": {"1.07": "published NVLS busbw over NVLink's 450 GB/s, cited (GPU facts, item 5)"},
    "05": {"0.189": "the H100 model's contention, cited (GPU facts, item 6)",
           "1.005": "the optional section's chosen block size (1.005 MiB)"},
    "10": {"12.1": "the compute capabilities torch's flash kernel takes, cited (sdp_utils.cpp)"},
}


def printed(nb):
    """Every decimal number the notebook's code cells printed."""
    out = set()
    for cell in nb["cells"]:
        for o in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            text = o.get("text") or o.get("data", {}).get("text/plain") or ""
            out |= set(NUMBER.findall("".join(text) if isinstance(text, list) else text))
    return out


def significant(figure):
    return len(re.sub(r"\D", "", figure).lstrip("0"))


def figures(markdown):
    """The decimal figures of a markdown cell's prose of 3 significant digits or more (no code
    spans, link targets, versions)."""
    prose = re.sub(r"`[^`]*`", " ", re.sub(r"\]\([^)]*\)", "]", markdown))
    return [m.group(1) for m in NUMBER.finditer(prose)
            if significant(m.group(1)) >= 3 and not VERSION.search(prose[:m.start()])]


QUOTES = 2   # printed figures a markdown cell must repeat to be flagged


def flagged(nb, lecture):
    """(cell index, its figures the executed notebook prints) for each markdown cell that repeats
    QUOTES or more of them, less the lecture's allowed ones."""
    shown, allowed, out = printed(nb), ALLOWED.get(lecture, {}), []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            hits = sorted({f for f in figures("".join(cell["source"]))
                           if f in shown and f not in allowed})
            if len(hits) >= QUOTES:
                out.append((i, hits))
    return out

"""helpers.site.quoted, the rule that markdown does not repeat figures its lecture prints: a
paragraph that quotes is caught (the negative control), one lone match is not (it can be chance),
and what the rule leaves alone stays alone (a version, a code span, a link target, a whole number,
a figure of two significant digits, an allowed figure). tests/test_notebooks.py applies it to every
lecture's executed run."""
from helpers.site import quoted


def notebook(markdown, printed):
    return {"cells": [{"cell_type": "markdown", "source": [markdown]},
                      {"cell_type": "code", "source": ["x"],
                       "outputs": [{"output_type": "stream", "text": [printed]}]}]}


def test_a_quoting_paragraph_is_flagged():
    nb = notebook("Two streams took 22.1 ms, the matmul alone 21.8 ms; 0.98 of it overlapped.",
                  "two streams ms  22.1  0.98\nalone  21.8\n")
    assert quoted.flagged(nb, "04") == [(0, ["21.8", "22.1"])]   # 0.98: too short for chance


def test_one_matching_figure_alone_is_not_flagged():
    nb = notebook("Published runs reach 1.07 times the link.", "ratio  1.07\n")
    assert quoted.flagged(nb, "99") == []               # one match can be chance


def test_what_the_rule_leaves_alone():
    md = ("torch 2.13 and NCCL 2.21; `0.555` in code; [a link](https://x.org/v/1.525); 512 MiB "
          "chosen; a short 2.5; the block 1.005 MiB; a figure not printed: 3.75")
    nb = notebook(md + "; and 7.25", "2.13 2.21 0.555 1.525 512 2.5 1.005 7.25 9.99\n")
    assert quoted.flagged(nb, "05") == []               # 1.005 is lecture 05's allowed block
    assert quoted.flagged(nb, "99") == [(0, ["1.005", "7.25"])]   # elsewhere, a quote


def test_every_allowed_figure_gives_its_reason():
    assert all(why.strip() for figures in quoted.ALLOWED.values() for why in figures.values())

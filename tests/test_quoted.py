"""helpers.site.quoted, the rule that markdown does not repeat a figure its lecture prints: a
quote is caught (the negative control), and what the rule leaves alone stays alone (a version, a
code span, a link target, a whole number, a figure of two significant digits, an allowed
figure). tests/test_notebooks.py applies it
to every lecture's executed run."""
from helpers.site import quoted


def notebook(markdown, printed):
    return {"cells": [{"cell_type": "markdown", "source": [markdown]},
                      {"cell_type": "code", "source": ["x"],
                       "outputs": [{"output_type": "stream", "text": [printed]}]}]}


def test_a_quoted_figure_is_flagged():
    nb = notebook("Two streams took 22.1 ms here, 0.98 of it overlapped.",
                  "two streams ms  22.1  0.98\nalone  21.8\n")
    assert quoted.flagged(nb, "04") == [(0, "22.1")]    # 0.98: too short to tell from chance


def test_what_the_rule_leaves_alone():
    md = ("torch 2.13 and NCCL 2.21; `0.555` in code; [a link](https://x.org/v/1.525); 512 MiB "
          "chosen; a short 2.5; the block 1.005 MiB; a figure not printed: 3.75")
    nb = notebook(md, "2.13 2.21 0.555 1.525 512 2.5 1.005 9.99\n")
    assert quoted.flagged(nb, "05") == []               # 1.005 is lecture 05's allowed block
    assert quoted.flagged(nb, "99") == [(0, "1.005")]   # elsewhere the same figure is a quote


def test_every_allowed_figure_gives_its_reason():
    assert all(why.strip() for figures in quoted.ALLOWED.values() for why in figures.values())

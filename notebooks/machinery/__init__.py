"""Each lecture's measuring machinery, in a module named after its lecture: lNN_topic.py serves
notebooks/NN_*.ipynb (lecture 14's planner is the package l14_planner/). What is here the lecture uses
and does not teach: instruments around its plain code, its tables and figures, its key claim's
assertion, kept runs read back. The algorithms stay in the notebook (and its #@save module in
course/); what every lecture needs is the kit in helpers/.

A lecture imports its own machinery, and a later lecture may reuse an earlier one's (lecture 07
times its layers with lecture 05's paced all-reduce); an earlier lecture never imports a later
one's, and the kit never imports any (tests/test_layout.py). Import it as the notebooks do, with
notebooks/ on the path (a notebook's folder; tests/conftest.py; bench/):

    from machinery import l05_ddp as ddp_bench
"""

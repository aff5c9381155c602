"""The lab bench every lecture shares: starting ranks, timing, checks, plots, the tiny model."""

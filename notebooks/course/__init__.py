"""The lectures' reusable pieces: one module per lecture, written by `python -m helpers.site.saved`."""

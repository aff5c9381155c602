"""The tooling around the notebooks, which no lecture imports: executing them headless (headless.py),
the course site built from the executed lectures (build.py, Sphinx's configuration in book/), the
key figures kept in images/ (images.py), the #@save modules written into notebooks/course/
(saved.py), and a lecture's reading time and shape (shape.py). It imports the kit only.

    python -m helpers.site --out build/html [--smoke]      # `make html` (build.py)
"""

"""Sphinx's configuration of the course site. helpers/site/build.py writes the source folder (the executed
lectures, an index, the downloads) and builds it with this file; see there."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # mathml.py, beside this file

project = "Distributed training, by running it"
html_title = project
extensions = ["myst_nb", "mathml"]

# MyST-NB renders the notebooks papermill executed; it never runs them again.
nb_execution_mode = "off"
nb_ipywidgets_js = {}  # no widget script from a CDN: an interact needs a kernel, the page shows its static figure
nb_merge_streams = True  # a cell's prints read as one block, as in JupyterLab
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
myst_dmath_double_inline = True  # $$...$$ inside a paragraph, as Jupyter allows it
html_math_renderer = "mathml"  # formulas drawn by the browser, offline (mathml.py)

html_theme = "sphinx_book_theme"
html_static_path = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "_static")]
html_css_files = ["site.css"]
html_theme_options = {
    "announcement": "",  # the machine the numbers come from; helpers/site/build.py sets it for each build
    "show_toc_level": 2,  # the lecture's sections and their parts in the page's table of contents
    "use_download_button": False,  # it offers the executed source; each page links the clean notebook
    "use_fullscreen_button": False,
    "home_page_in_toc": True,
}
html_show_sourcelink = False
html_copy_source = False
exclude_patterns = ["downloads", "**.ipynb_checkpoints"]
suppress_warnings = ["myst.header"]  # lectures number their sections in the text (## 3.1 ...)

"""A Sphinx math renderer that writes MathML when the page is built (html_math_renderer = "mathml").

Browsers draw MathML themselves, so the formulas read on a laptop with no network and no script;
MathJax, Sphinx's default, is fetched from a CDN and leaves raw TeX offline. latex2mathml converts.
A formula it cannot parse stays as TeX and is named on stderr, so the page still builds and
tests/test_site.py points at it (raw TeX on the page).
"""
import html
import re
import sys

from docutils import nodes


def tex_to_mathml(tex, display=False):
    from latex2mathml.converter import convert

    # latex2mathml draws \xrightarrow{label} with <mpadded> offsets that Chromium does not apply (the
    # label lands on what follows); \overset draws the same arrow and label cleanly.
    tex = re.sub(r"\\x(right|left)arrow\{([^{}]*)\}", r"\\overset{\2}{\\long\1arrow}", tex)
    try:
        return convert(tex, display="block" if display else "inline")
    except Exception as e:  # latex2mathml raises its own errors, and IndexError etc. on bad TeX
        print(f"    maths left as TeX ({type(e).__name__}: {e}): {tex!r}", file=sys.stderr)
        return html.escape(f"$${tex}$$" if display else f"${tex}$", quote=False)


def visit_math(self, node):
    self.body.append(tex_to_mathml(node.astext()))
    raise nodes.SkipNode


def visit_math_block(self, node):
    self.body.append(self.starttag(node, "div", CLASS="math"))
    self.body.append(tex_to_mathml(node.astext(), display=True) + "</div>\n")
    raise nodes.SkipNode


def setup(app):
    app.add_html_math_renderer("mathml", (visit_math, None), (visit_math_block, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}

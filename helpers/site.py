"""`make html`: execute every lecture and render the series as a static site.

    python -m helpers.site --out build/html [--smoke] [--only 00_hardware] [--save-to FOLDER]

Each notebook in notebooks/ is executed with papermill (full parameters, or SMOKE=True with
--smoke), then rendered by nbconvert with every figure embedded in the page. The site has an index
in lecture order, prev/next links on every page, and the machine that produced the numbers stated
at the top. A lecture that fails is still rendered up to its failing cell and named at the end;
the command then exits non-zero. tests/test_site.py renders the notebooks the tests executed with
write_site() and opens the pages in headless Chromium.

The maths ($...$, $$...$$, \\begin{...} in markdown cells and outputs) is turned into MathML while
the page is built, with latex2mathml: browsers draw MathML themselves, so the formulas read on a
laptop with no network, where nbconvert's MathJax (fetched from a CDN) would leave raw TeX. The
page does not load MathJax at all.
"""
import argparse
import base64
import html
import json
import mimetypes
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE_TITLE = "Distributed training, by running it"


def lectures(only=None):
    paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    return [p for p in paths if not only or any(p.stem.startswith(o) for o in only)]


def title_and_summary(nb_path, limit=420):
    """The lecture's title and its first paragraph (whole sentences, about `limit` characters)."""
    cells = json.loads(Path(nb_path).read_text())["cells"]
    text = "".join(cells[0]["source"]) if cells else ""
    title = next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")),
                 Path(nb_path).stem)
    para = next((p for p in re.split(r"\n\s*\n", text) if p.strip() and not p.lstrip().startswith("#")), "")
    para = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", " ".join(para.split()))  # [text](url) -> text
    summary = ""
    for sentence in re.split(r"(?<=[.?!])\s+(?=[A-Z])", re.sub(r"\*|`", "", para)):
        if summary and len(summary) + len(sentence) > limit:
            break
        summary = f"{summary} {sentence}".strip()
    return title, summary


def machine_line(smoke=False):
    from helpers import machine

    d = machine.describe()
    gpus = ", ".join(g["name"] for g in d["gpus"]) or "no GPU"
    return (f"Executed {time.strftime('%Y-%m-%d')} on {d['cpu']}, {d['cores']} cores, "
            f"{d['memory_gib']} GiB, {gpus}, torch {d['torch']}" + (" (SMOKE: small sizes)" if smoke else ""))


def knobs(nb_path):
    """The names the lecture's `parameters` cell assigns (its knobs)."""
    import ast

    for cell in json.loads(Path(nb_path).read_text())["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            tree = ast.parse("".join(cell["source"]))
            return {t.id for node in tree.body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
    return set()


def execute(src, dst, smoke, save_to=None):
    """Run one lecture with papermill; None, or what failed. save_to: a folder handed to the
    lectures that have a SAVE_TO knob (they write their measurements there, helpers.archive)."""
    import papermill

    params = {"SMOKE": True} if smoke else {}
    if save_to and "SAVE_TO" in knobs(src):
        params["SAVE_TO"] = str(Path(save_to).resolve())
    try:
        papermill.execute_notebook(str(src), str(dst), parameters=params, cwd=str(src.parent),
                                   kernel_name="python3", progress_bar=False,
                                   execution_timeout=1800)  # a hung cell fails, not the whole build
        return None
    except papermill.PapermillExecutionError as e:
        return f"cell {e.exec_count}: {e.ename}: {e.evalue}"
    except Exception as e:  # a cell timeout, a dead kernel: name it, render what ran, go on
        return f"{type(e).__name__}: {e}"


def embed_file(m):
    """<img src="picture.svg">, a local file a markdown cell links (relative to notebooks/) -> a data: URI."""
    f = ROOT / "notebooks" / html.unescape(m.group(2))
    if not f.is_file():
        return m.group(0)  # left as it is: tests/test_site.py reports it as an image that failed
    mime = mimetypes.guess_type(f.name)[0] or "application/octet-stream"
    return f'{m.group(1)}data:{mime};base64,{base64.b64encode(f.read_bytes()).decode()}"'


def tex_to_mathml(tex, display=False):
    """One formula as MathML, which Chromium, Firefox and Safari draw with no script and no network.
    One that latex2mathml cannot parse is left as TeX and named on stderr, so the page still builds
    and tests/test_site.py points at it (raw TeX on the page)."""
    from latex2mathml.converter import convert

    # latex2mathml draws \xrightarrow{label} with <mpadded> offsets that Chromium does not apply (the
    # label lands on what follows); \overset draws the same arrow and label cleanly.
    tex = re.sub(r"\\x(right|left)arrow\{([^{}]*)\}", r"\\overset{\2}{\\long\1arrow}", tex)
    try:
        return convert(tex, display="block" if display else "inline")
    except Exception as e:  # latex2mathml raises its own errors, and IndexError etc. on bad TeX
        print(f"    maths left as TeX ({type(e).__name__}: {e}): {tex!r}", file=sys.stderr)
        return html.escape(f"$${tex}$$" if display else f"${tex}$", quote=False)


# The lab template without MathJax (the maths is MathML already; offline the CDN script only fails)
# and with text/latex outputs rendered like markdown, so their $...$ becomes MathML too.
SITE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{% block data_latex scoped %}
<div class="jp-RenderedLatex jp-OutputArea-output {{ extra_class }}" data-mime-type="text/latex">
{{ output.data['text/latex'] | markdown2html }}
</div>
{%- endblock data_latex %}
"""


def exporter():
    """nbconvert's lab HTMLExporter with the maths turned into MathML at build time.

    nbconvert's markdown parser already finds the maths (and leaves code spans and code blocks, where
    a `$ python ...` is not maths, alone); only its renderer changes: where it writes the TeX back
    for MathJax, this one writes MathML. markdown2html is nbconvert's own, with that renderer."""
    import jinja2
    from nbconvert import HTMLExporter
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    class MathMLRenderer(IPythonRenderer):
        def inline_math(self, body):
            return tex_to_mathml(body)

        def block_math(self, body):
            return tex_to_mathml(body, display=True)

        def latex_environment(self, name, body):
            return tex_to_mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", display=True)

    class MathMLExporter(HTMLExporter):
        @jinja2.pass_context
        def markdown2html(self, context, source):
            renderer = MathMLRenderer(
                escape=False, attachments=context.get("cell", {}).get("attachments", {}),
                embed_images=self.embed_images,
                path=context.get("resources", {}).get("metadata", {}).get("path", ""),
                anchor_link_text=self.anchor_link_text, exclude_anchor_links=self.exclude_anchor_links,
                **self.lexer_options)
            return MarkdownWithMath(renderer=renderer).render(source)

    return MathMLExporter(template_name="lab", template_file="site.html.j2",
                          extra_loaders=[jinja2.DictLoader({"site.html.j2": SITE_TEMPLATE})])


def render(executed, page, nav, machine_line, title=None):
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    resources = {"metadata": {"name": title or Path(executed).stem}}
    body, _ = exporter().from_notebook_node(nb, resources=resources)
    body = re.sub(r'(<img\b[^>]*?\bsrc=")(?!data:|https?:)([^"]+)"', embed_file, body)
    header = (f'<nav style="font:14px sans-serif;padding:8px 16px;border-bottom:1px solid #ddd">'
              f'{nav}<div style="color:#555;margin-top:4px">{html.escape(machine_line)}</div></nav>')
    body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + header, body, count=1)
    Path(page).write_text(body)


def write_site(executed, out, machine_line):
    """Render executed notebooks (in lecture order) into out/: a page each and index.html."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    executed = [Path(p) for p in executed]
    rows = []
    for i, nb in enumerate(executed):
        prev = f'<a href="{executed[i - 1].stem}.html">&larr; {executed[i - 1].stem}</a> | ' if i else ""
        nxt = f' | <a href="{executed[i + 1].stem}.html">{executed[i + 1].stem} &rarr;</a>' \
            if i + 1 < len(executed) else ""
        title, summary = title_and_summary(nb)
        render(nb, out / f"{nb.stem}.html", f'{prev}<a href="index.html">index</a>{nxt}', machine_line, title)
        rows.append(f'<li><a href="{nb.stem}.html">{html.escape(title)}</a>'
                    f'<br><span style="color:#555">{html.escape(summary)}</span></li>')
    (out / "index.html").write_text(
        f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>{SITE_TITLE}</title></head>"
        "<body style='font:16px/1.5 sans-serif;max-width:760px;margin:2em auto'>"
        f"<h1>{SITE_TITLE}</h1><p style='color:#555'>{html.escape(machine_line)}</p>"
        f"<ol start='0'>{''.join(rows)}</ol></body></html>\n")
    return out / "index.html"


def main(argv=None):
    ap = argparse.ArgumentParser(description="Execute every lecture and render the site.")
    ap.add_argument("--out", default="build/html")
    ap.add_argument("--smoke", action="store_true", help="run the lectures with SMOKE=True (fast)")
    ap.add_argument("--only", nargs="*", help="lecture file prefixes, e.g. 00 03_bench")
    ap.add_argument("--save-to", help="a folder: the lectures that measure hardware (those with a SAVE_TO "
                                      "knob) write their measurements there, to keep in data/")
    a = ap.parse_args(argv)
    executed_dir = Path(a.out).parent / "executed"
    executed_dir.mkdir(parents=True, exist_ok=True)
    paths = lectures(a.only)
    failed, executed = [], []
    for i, src in enumerate(paths):
        t0 = time.time()
        print(f"[{i + 1}/{len(paths)}] executing {src.name} ...", flush=True)
        executed.append(executed_dir / src.name)
        error = execute(src, executed[-1], a.smoke, a.save_to)
        if error:
            failed.append(f"{src.name}: {error}")
        print(f"    {'FAILED: ' + error if error else 'ok'} ({time.time() - t0:.0f} s)", flush=True)
    index = write_site(executed, a.out, machine_line(a.smoke))
    print(f"site written to {index}")
    if failed:
        print("These lectures failed:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

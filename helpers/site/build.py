"""`make html`: execute every lecture and build the course site with Sphinx.

    python -m helpers.site --out build/html [--smoke] [--only 00_hardware] [--save-to FOLDER] [--images]

Each notebook in notebooks/ is executed once with papermill (full parameters, or SMOKE=True with
--smoke) into build/executed/. Sphinx then builds the site from those executed notebooks without
running them again (MyST-NB, configured in helpers/site/book/conf.py): the book theme's sidebar lists every
lecture in order, each page has its own table of contents, prev/next links and the machine that
produced its numbers in a banner; Sphinx's search works offline; each page links its notebook without
outputs and its exercises' solutions. The maths is MathML, written when the page is built
(helpers/site/book/mathml.py), so it reads with no network and no script. With --images the key figure of
each executed lecture is kept in images/ first (helpers.site.images, `make images`) and the index shows it.
A lecture that fails is still rendered up to its failing cell and named at the end; the command then
exits non-zero. tests/test_site.py builds the site from the notebooks the tests executed and opens it
in headless Chromium.
"""
import argparse
import html
import json
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITE_TITLE = "Distributed training, by running it"
REFERENCE = ("gpu_facts.md", "notation.md")    # markdown pages beside the lectures, linked from them and the index


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

    return f"Executed {time.strftime('%Y-%m-%d')} on {machine.short()}" + (" (SMOKE: small sizes)" if smoke else "")


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

    from helpers.site import headless

    params = {"SMOKE": True} if smoke else {}
    if save_to and "SAVE_TO" in knobs(src):
        params["SAVE_TO"] = str(Path(save_to).resolve())
    try:
        headless.execute(src, dst, params, timeout=1800, save_each_cell=True)  # a hung cell fails alone
        return None
    except papermill.PapermillExecutionError as e:
        return f"cell {e.exec_count}: {e.ename}: {e.evalue}"
    except Exception as e:  # a cell timeout, a dead kernel: name it, render what ran, go on
        return f"{type(e).__name__}: {e}"


def solutions_of(name):
    """The reference solutions of a lecture's exercises (notebooks/solutions/NN_solutions.py), or None."""
    path = ROOT / "notebooks" / "solutions" / f"{name[:2]}_solutions.py"
    return path if path.exists() else None


def lecture_cell(name):
    """The markdown cell put under a lecture's title on its page: the notebook to download."""
    solutions = solutions_of(name)
    links = [f"{{download}}`the notebook, without outputs <downloads/{name}>`"]
    if solutions:
        links.append(f"{{download}}`its exercises' solutions <downloads/{solutions.name}>`")
    import nbformat

    return nbformat.v4.new_markdown_cell(
        "**Run it yourself:** " + " and ".join(links) + ". The notebook imports the course's `helpers/`: "
        f"clone the repository, `make lab`, and open `notebooks/{name}` there.", metadata={"tags": ["site-downloads"]})


def index_page(executed, figures):
    """The index in MyST markdown: every lecture in order with its line and, where images/ has one,
    its key figure (helpers.site.images); the hidden toctree is the sidebar."""
    lines = [f"# {SITE_TITLE}", "",
             "An executable lecture series on how training is spread over many devices. Every lecture "
             "starts real worker processes, checks each result against a single-process reference, "
             "measures, and plots the measurement against the formula. The pages below are the "
             "lectures as they ran on the machine named above; to run them yourself, clone the "
             "repository and `make lab`.", "",
             "```{toctree}", ":hidden:", ":maxdepth: 1", "", *[nb.stem for nb in executed], "```", "",
             "Reference: [the GPU facts the lectures rely on, with their sources](gpu_facts.md); "
             "[the notation](notation.md).", ""]
    for nb in executed:
        title, summary = title_and_summary(nb)
        lines += [f"## [{title}]({nb.name})", ""]
        if nb.stem in figures:
            lines += [f"```{{figure}} images/{nb.stem}.png", ":class: key-figure",
                      f":alt: {figures[nb.stem]['alt']}", "", figures[nb.stem]["caption"], "```", ""]
        lines += [summary, ""]
    return "\n".join(lines)


def write_site(executed, out, machine_line):
    """Build the site from executed notebooks (in lecture order) into out/ with Sphinx (helpers/site/book/
    conf.py): MyST-NB renders each notebook as it ran, the book theme gives the sidebar, the page's
    contents, prev/next and search. The source folder (out + "-src") holds the executed lectures with
    their download line, the clean notebooks and solutions to download, and the index. Returns
    out/index.html."""
    import nbformat
    from sphinx.application import Sphinx

    from helpers.site import images

    out, executed = Path(out), [Path(p) for p in executed]
    src = out.with_name(out.name + "-src")
    shutil.rmtree(src, ignore_errors=True)
    (src / "downloads").mkdir(parents=True)
    for nb in executed:
        shutil.copy(ROOT / "notebooks" / nb.name, src / "downloads" / nb.name)
        solutions = solutions_of(nb.name)
        if solutions:
            shutil.copy(solutions, src / "downloads")
        node = nbformat.read(str(nb), as_version=4)
        node.cells.insert(1, lecture_cell(nb.name))
        nbformat.write(node, str(src / nb.name))
    figures = images.kept()
    if figures:
        shutil.copytree(images.FOLDER, src / "images", ignore=shutil.ignore_patterns("*.json"))
    for page in REFERENCE:   # pages the lectures link to, outside the lectures' order (an orphan)
        (src / page).write_text("---\norphan: true\n---\n" + (ROOT / "notebooks" / page).read_text())
    (src / "index.md").write_text(index_page(executed, figures))
    shutil.rmtree(out, ignore_errors=True)
    app = Sphinx(str(src), str(Path(__file__).with_name("book")), str(out),
                 str(out.with_name(out.name + "-doctrees")), "html", freshenv=True, status=None,
                 warning=sys.stderr, confoverrides={"html_theme_options.announcement": html.escape(machine_line)})
    app.build()
    if app.statuscode:
        raise RuntimeError(f"Sphinx could not build the site (status {app.statuscode})")
    return out / "index.html"


def main(argv=None):
    ap = argparse.ArgumentParser(description="Execute every lecture and render the site.")
    ap.add_argument("--out", default="build/html")
    ap.add_argument("--smoke", action="store_true", help="run the lectures with SMOKE=True (fast)")
    ap.add_argument("--only", nargs="*", help="lecture file prefixes, e.g. 00 03_bench")
    ap.add_argument("--images", action="store_true",
                    help="keep each lecture's key figure in images/ and the README (make images)")
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
    if a.images and not failed:
        from helpers.site import images

        kept = images.make(executed_dir, a.smoke, [p.stem for p in paths])
        print("key figures written to images/:", ", ".join(kept))
    index = write_site(executed, a.out, machine_line(a.smoke))
    print(f"site written to {index}")
    if failed:
        print("These lectures failed:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

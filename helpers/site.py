"""`make html`: execute every lecture and render the series as a static site.

    python -m helpers.site --out build/html [--smoke] [--only 00_hardware]

Each notebook in notebooks/ is executed with papermill (full parameters, or SMOKE=True with
--smoke), then rendered by nbconvert with every figure embedded in the page. The site has an index
in lecture order, prev/next links on every page, and the machine that produced the numbers stated
at the top. A lecture that fails is still rendered up to its failing cell and named at the end;
the command then exits non-zero.
"""
import argparse
import html
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lectures(only=None):
    paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    return [p for p in paths if not only or any(p.stem.startswith(o) for o in only)]


def title_and_summary(nb_path):
    cells = json.loads(Path(nb_path).read_text())["cells"]
    text = "".join(cells[0]["source"]) if cells else nb_path.stem
    lines = [line.strip() for line in text.splitlines()]
    title = next((line.lstrip("# ") for line in lines if line.startswith("#")), nb_path.stem)
    summary = next((line for line in lines if line and not line.startswith("#")), "")
    return title, re.sub(r"[*_`]", "", summary)


def execute(src, dst, smoke):
    import papermill

    params = {"SMOKE": True} if smoke else {}
    try:
        papermill.execute_notebook(str(src), str(dst), parameters=params, cwd=str(src.parent),
                                   kernel_name="python3", progress_bar=False,
                                   execution_timeout=1800)  # a hung cell fails, not the whole build
        return None
    except papermill.PapermillExecutionError as e:
        return f"cell {e.exec_count}: {e.ename}: {e.evalue}"


def render(executed, page, nav, machine_line):
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(executed), as_version=4)
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    header = (f'<nav style="font:14px sans-serif;padding:8px 16px;border-bottom:1px solid #ddd">'
              f'{nav}<div style="color:#555;margin-top:4px">{html.escape(machine_line)}</div></nav>')
    body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + header, body, count=1)
    page.write_text(body)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Execute every lecture and render the site.")
    ap.add_argument("--out", default="build/html")
    ap.add_argument("--smoke", action="store_true", help="run the lectures with SMOKE=True (fast)")
    ap.add_argument("--only", nargs="*", help="lecture file prefixes, e.g. 00 03_bench")
    a = ap.parse_args(argv)
    from helpers import machine

    out = Path(a.out)
    executed_dir = out.parent / "executed"
    out.mkdir(parents=True, exist_ok=True)
    executed_dir.mkdir(parents=True, exist_ok=True)
    d = machine.describe()
    gpus = ", ".join(g["name"] for g in d["gpus"]) or "no GPU"
    machine_line = (f"Executed {time.strftime('%Y-%m-%d')} on {d['cpu']}, {d['cores']} cores, "
                    f"{d['memory_gib']} GiB, {gpus}, torch {d['torch']}"
                    + (" (SMOKE: small sizes)" if a.smoke else ""))
    paths = lectures(a.only)
    failed, rows = [], []
    for i, src in enumerate(paths):
        t0 = time.time()
        print(f"[{i + 1}/{len(paths)}] executing {src.name} ...", flush=True)
        dst = executed_dir / src.name
        error = execute(src, dst, a.smoke)
        if error:
            failed.append(f"{src.name}: {error}")
        prev = f'<a href="{paths[i - 1].stem}.html">&larr; {paths[i - 1].stem}</a> | ' if i else ""
        nxt = f' | <a href="{paths[i + 1].stem}.html">{paths[i + 1].stem} &rarr;</a>' \
            if i + 1 < len(paths) else ""
        render(dst, out / f"{src.stem}.html", f'{prev}<a href="index.html">index</a>{nxt}', machine_line)
        title, summary = title_and_summary(src)
        rows.append(f'<li><a href="{src.stem}.html">{html.escape(title)}</a>'
                    f'<br><span style="color:#555">{html.escape(summary)}</span></li>')
        print(f"    {'FAILED: ' + error if error else 'ok'} ({time.time() - t0:.0f} s)", flush=True)
    (out / "index.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>Distributed training, by running it</title>"
        "<body style='font:16px/1.5 sans-serif;max-width:760px;margin:2em auto'>"
        "<h1>Distributed training, by running it</h1>"
        f"<p style='color:#555'>{html.escape(machine_line)}</p><ol start='0'>{''.join(rows)}</ol>")
    print(f"site written to {out}/index.html")
    if failed:
        print("These lectures failed:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

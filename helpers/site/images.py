"""`make images`: the series at a glance, one key figure per lecture, drawn by the lecture's own cell.

    python -m helpers.site.images build/executed      (make images runs every lecture at full sizes first)

Each lecture tags one code cell `key-figure` and captions it (the cell's metadata "caption"). From
the executed notebooks this takes that cell's last PNG, shrinks it to at most WIDTH pixels wide, and
writes images/NN_topic.png; images/figures.json keeps each caption with the machine and the date of
the run, and the README's block between START and END is rewritten from it. The site's index shows
the same pictures. The files are regenerated, never edited by hand: tests/test_consistency.py checks
that images/, figures.json, the README's block and the lectures' tags agree.
"""
import base64
import io
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "images"
INDEX = FOLDER / "figures.json"
TAG = "key-figure"
WIDTH = 720
START = "<!-- images: written by `make images` from an executed run; do not edit by hand -->"
END = "<!-- /images -->"


def key_cell(nb):
    """The lecture's cell tagged key-figure (a notebook's JSON, as a dict), or None."""
    return next((c for c in nb["cells"] if TAG in c.get("metadata", {}).get("tags", [])), None)


def key_figure(nb):
    """(PNG bytes, caption) of the executed lecture's key figure: the tagged cell's last PNG output."""
    cell = key_cell(nb)
    if cell is None:
        raise ValueError(f"no cell is tagged {TAG!r}")
    pngs = [o["data"]["image/png"] for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    if not pngs:
        raise ValueError(f"the cell tagged {TAG!r} drew no PNG (did it run?)")
    return base64.b64decode(pngs[-1]), cell["metadata"]["caption"]


def shrink(png, width=WIDTH):
    """The PNG at most `width` pixels wide, in a 256-colour palette: small files for the README."""
    from PIL import Image

    picture = Image.open(io.BytesIO(png)).convert("RGB")
    if picture.width > width:
        picture = picture.resize((width, round(picture.height * width / picture.width)), Image.LANCZOS)
    out = io.BytesIO()
    picture.quantize(256).save(out, format="PNG", optimize=True)
    return out.getvalue()


def kept():
    """What images/figures.json records: {lecture stem: {caption, alt, machine, date}}."""
    return json.loads(INDEX.read_text()) if INDEX.exists() else {}


def readme_block(figures):
    """The README's picture table, three lectures to a row, each linked to its notebook."""
    cells = [f"[![{f['alt']}](images/{stem}.png)](notebooks/{stem}.ipynb)<br>**{stem[:2]}** "
             f"{f['caption']} <sub>({f['machine']}, {f['date']})</sub>" for stem, f in figures.items()]
    rows = [cells[i:i + 3] + [""] * (3 - len(cells[i:i + 3])) for i in range(0, len(cells), 3)]
    table = ["| | | |", "|---|---|---|"] + ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join([START, *table, END])


def write_readme(figures, readme=ROOT / "README.md"):
    text = readme.read_text()
    if START not in text or END not in text:
        raise ValueError(f"{readme} has no block between {START!r} and {END!r}")
    head, rest = text.split(START, 1)
    readme.write_text(head + readme_block(figures) + rest.split(END, 1)[1])


def make(executed_dir, smoke=False, stems=None):
    """images/ from the executed lectures in executed_dir (only `stems`, when given: the folder may
    hold older runs of the others); the stems of all kept, in order."""
    FOLDER.mkdir(exist_ok=True)
    from helpers import machine

    figures, when, where = kept(), time.strftime("%Y-%m-%d"), machine.short()  # --only: the others stay
    for path in sorted(Path(executed_dir).glob("[0-9][0-9]_*.ipynb")):
        if stems is not None and path.stem not in stems:
            continue
        png, caption = key_figure(json.loads(path.read_text()))
        (FOLDER / f"{path.stem}.png").write_bytes(shrink(png))
        figures[path.stem] = {"caption": caption, "alt": f"Lecture {path.stem[:2]}: {caption}",
                              "machine": where + (" (SMOKE sizes)" if smoke else ""), "date": when}
    lectures = {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    for stem in set(figures) - lectures:         # a lecture renamed or split: its figure goes
        figures.pop(stem)
        (FOLDER / f"{stem}.png").unlink(missing_ok=True)
    figures = dict(sorted(figures.items()))
    INDEX.write_text(json.dumps(figures, indent=1) + "\n")
    write_readme(figures)
    return list(figures)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python -m helpers.site.images EXECUTED_DIR (the folder `make html` executes into: build/executed)")
    print("images/ written:", ", ".join(make(sys.argv[1])))

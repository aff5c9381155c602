"""Measurements kept with the course: one machine's numbers of a lecture, in a file the lecture plots.

A lecture with a `SAVE_TO` knob writes what it measured there with save(): NN_name.json, holding
the machine (helpers.machine.describe), the date, the parameters and the measurements. The runs
kept with the project live in data/<machine>-<date>/ (made with `python -m helpers.site --save-to
FOLDER` on that machine; see data/README.md), and runs(lecture) reads them back, so a lecture run on
a laptop can show an H100's numbers beside its own, each labelled with the machine and the date.
"""
import datetime
import json
from pathlib import Path

FORMAT = "helpers.archive/1"
DATA = Path(__file__).resolve().parent.parent / "data"


def save(folder, lecture, measurements, params=None):
    """Write `measurements` (plain data: dicts with string keys, lists, numbers) of `lecture`
    ("00_hardware", ...) to folder/lecture.json with the machine and the date; returns the path."""
    from helpers.machine import describe

    path = Path(folder) / f"{lecture}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    run = {"format": FORMAT, "lecture": lecture,
           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": describe(), "params": params or {}, "measurements": measurements}
    path.write_text(json.dumps(run, indent=1) + "\n")
    return path


def load(path):
    """A run written by save(), as a dict (format, lecture, created, machine, params, measurements)."""
    run = json.loads(Path(path).read_text())
    if run.get("format") != FORMAT:
        raise ValueError(f"{path} is not a measurements file of helpers.archive ({FORMAT}).")
    return run


def kept(data=DATA):
    """The files of the runs kept with the course: data/<machine>-<date>/NN_lecture.json (not
    data/published/, which holds others' measurements with their citations: helpers.machines)."""
    return sorted(p for p in Path(data).glob("*/*.json") if p.parent.name != "published")


def runs(lecture, data=DATA):
    """Every run of `lecture` kept in data/*/, oldest first ([] when there is none)."""
    return sorted((load(p) for p in kept(data) if p.stem == lecture), key=lambda r: r["created"])


def label(run):
    """'NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, 2026-11-23': the machine and day a run is from."""
    m = run["machine"]
    where = ", ".join(g["name"] for g in m["gpus"]) or f"{m['cpu']} ({m['cores']} cores)"
    driver = f" (driver {m['driver']})" if m.get("driver") else ""
    return f"{where}{driver}, torch {m['torch']}, {run['created'][:10]}"

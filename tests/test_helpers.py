"""Unit tests of the small shared helpers (the launcher has its own file)."""
import time

import pytest
import torch

from helpers import archive, checks, machine, plots, report, timing, tiny
from helpers.spawn import spawn


def test_require_refuses_with_the_sentence():
    checks.require(True, "never shown")
    with pytest.raises(checks.ParameterError, match="WORLD_SIZE must divide"):
        checks.require(False, "WORLD_SIZE must divide the batch.")


@pytest.mark.parametrize("ws, words", [(0, "at least 2"), (9, "at most 8"), (2.0, "whole number"),
                                       (3, "does not divide batch=16")])
def test_check_world_size_refuses_what_the_lecture_cannot_run(ws, words):
    with pytest.raises(checks.ParameterError, match=words):
        checks.check_world_size(ws, low=2, high=8, divides={"batch": 16})


def test_check_world_size_names_the_sizes_that_would_work():
    with pytest.raises(checks.ParameterError, match=r"\[1, 2, 4\]"):
        checks.check_world_size(3, low=1, high=4, divides={"batch": 8})
    checks.check_world_size(4, low=1, high=4, divides={"batch": 8})


def test_check_grades_without_raising(capsys):
    assert checks.check("sum", 3, 3) is True
    assert checks.check("sum", 4, 3) is False
    assert checks.check("tensor", torch.ones(2), torch.ones(2)) is True
    assert checks.check("tensor", torch.zeros(2), torch.ones(2)) is False
    assert checks.check("missing", None, torch.ones(2)) is False
    assert checks.check("close", torch.tensor([1.0 + 1e-9]), torch.tensor([1.0]), rtol=1e-6) is True
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[ok] sum: right." and out[1].startswith("[x] sum: not yet.")
    assert [line.split(":")[0] for line in out] == ["[ok] sum", "[x] sum", "[ok] tensor", "[x] tensor",
                                                    "[x] missing", "[ok] close"]


def test_report_prints_per_rank_and_tables(capsys):
    report.by_rank("after all_reduce", [torch.tensor([6.0]), torch.tensor([6.0])])
    report.table([{"size": 1024, "time": 0.5}], ["size", "time"])
    assert capsys.readouterr().out.splitlines() == [
        "after all_reduce", "  rank 0: [6.0]", "  rank 1: [6.0]",
        "size  time", "----  ----", "1024   0.5"]


def test_the_floor_is_its_least_round_and_above_it_subtracts_that():
    f = timing.floor([3.0, 9.0, 2.0, 4.0, 2.5])
    assert f == {"least": 2.0, "spread": 1.0}
    a = timing.above_floor([12.0, 10.0, 11.0], [3.0, 9.0, 2.0, 4.0, 2.5])
    assert a == {"median": 9.0, "tolerance": 2.0 + 1.0 + 2.0, "floor": 2.0}
    a = timing.above_floor([12.0, 10.0, 11.0], [3.0, 9.0, 2.0, 4.0, 2.5], floor_model=1.5)
    assert a["tolerance"] == 2.0 + 1.0 + 0.5


def test_summary_gives_median_and_spread():
    s = timing.summary([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["median"], s["p10"], s["p90"], s["n"]) == (3.0, 1.0, 5.0, 5)


def test_measure_times_every_call_after_warmup():
    calls = []
    samples = timing.measure(lambda: calls.append(1), warmup=3, iters=7)
    assert len(calls) == 10 and len(samples) == 7 and all(s >= 0 for s in samples)


def test_the_tiny_model_is_identical_on_every_rank():
    def fn(rank, world_size):
        return [p.detach() for p in tiny.model(dim=8, hidden=16, depth=3, seed=5).parameters()]

    here = [p.detach() for p in tiny.model(dim=8, hidden=16, depth=3, seed=5).parameters()]
    for params in spawn(fn, 2):
        assert all(torch.equal(a, b) for a, b in zip(params, here))
    other = list(tiny.model(dim=8, hidden=16, depth=3, seed=6).parameters())
    assert not torch.equal(other[0], here[0])
    assert here[0].dtype == torch.float64


def test_the_tiny_loss_of_shards_averages_to_the_full_batch_loss():
    m = tiny.model(dim=8, hidden=16, depth=2)
    x, y = tiny.batch(8, dim=8)
    full = tiny.loss(m(x), y)
    halves = (tiny.loss(m(x[:4]), y[:4]) + tiny.loss(m(x[4:]), y[4:])) / 2
    torch.testing.assert_close(full, halves, rtol=1e-12, atol=0)


def test_banner_states_the_machine_and_flags_oversubscription():
    text = machine.banner(machine.usable_cores() + 1, "gloo")
    assert machine.cpu_model() in text and "oversubscribed" in text
    assert "oversubscribed" not in machine.banner(1, "gloo")
    d = machine.describe()
    assert d["cores"] >= 1 and d["memory_gib"] > 0 and isinstance(d["gpus"], list)


def test_a_torch_older_than_the_requirement_gets_a_sentence_in_the_banner():
    import re
    from pathlib import Path

    # the GPU image of 2026-11-27 had torch 2.11.0+cu130: no dist.all_gather_single there
    old = machine.torch_too_old("2.11.0+cu130")
    assert "torch 2.11.0+cu130" in old and "2.13" in old
    assert machine.torch_too_old("2.13.0+cpu") is None and machine.torch_too_old("3.0.1") is None
    assert machine.torch_too_old() is None and "older" not in machine.banner(1, "gloo")
    pinned = re.search(r"^torch>=([\d.]+)$", (Path(__file__).parents[1] / "requirements.txt")
                       .read_text(), re.M)
    assert pinned and tuple(map(int, pinned[1].split("."))) == machine.TORCH_NEEDED


@pytest.mark.parametrize("n, label", [(4096, "4 KiB"), (3 * 2**20, "3 MiB"), (780213.36, "761.9 KiB"),
                                      (1023.9 * 2**20, "1024 MiB"), (2**31, "2 GiB"), (100, "100 B")])
def test_bytes_label_is_short_and_exact_for_powers_of_two(n, label):
    assert plots.bytes_label(n) == label


def _clock_on_a_rank(rank, world_size):
    import torch.distributed as dist

    from helpers.spawn import device

    dev = device()
    x = torch.ones(2**22, device=dev)              # 16 MiB: a collective that takes a while
    a = torch.randn(1024, 1024, device=dev)
    clock = timing.Clock(dev)
    clock.now("start")
    work = dist.all_reduce(x, async_op=True)
    clock.done("all-reduce", work)
    for _ in range(20 if dev.type == "cpu" else 200):
        a = torch.tanh(a @ a)
    clock.now("compute")
    work.wait()
    clock.now("waited")
    t = clock.read()
    assert torch.equal(x, torch.full_like(x, float(world_size)))
    return t


def test_the_clock_stamps_a_collective_when_it_finishes_and_compute_when_it_ends():
    for t in spawn(_clock_on_a_rank, 2, backend="gloo"):
        assert set(t) == {"start", "all-reduce", "compute", "waited"} and t["start"] == 0.0
        assert 0 < t["all-reduce"] <= t["waited"] and 0 < t["compute"] <= t["waited"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the clock's CUDA-event path "
                    "(on a CPU machine the test above checks the host-clock path)")
def test_on_a_gpu_the_clock_reads_the_device_not_the_launches():
    # One rank on NCCL: an out-of-place all-gather of one rank is a copy of 1 GiB within the GPU (about
    # a millisecond), queued before 200 matmuls on the default stream (tens of milliseconds). The
    # collective's stamp must come when the copy is done: after the start, long before the compute ends.
    def fn(rank, world_size):
        import torch.distributed as dist

        from helpers.spawn import device

        dev = device()
        src, out = torch.ones(2**28, device=dev), torch.empty(2**28, device=dev)
        a = torch.randn(2048, 2048, device=dev) / 50
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        clock = timing.Clock(dev)
        torch.cuda.synchronize()
        clock.now("start")
        work = gather(out, src, async_op=True)
        clock.done("copy", work)
        for _ in range(200):
            a = torch.tanh(a @ a)
        clock.now("compute")
        work.wait()
        t = clock.read()
        assert torch.equal(out, src)
        return t, dist.get_backend()

    t, backend = spawn(fn, 1)[0]
    assert backend == "nccl"
    assert 1e-4 < t["copy"] < 0.5 * t["compute"], t


def test_archive_keeps_a_run_with_its_machine_and_reads_it_back(tmp_path):
    path = archive.save(tmp_path / "here-today", "00_hardware", {"rows": [{"n": 4096, "GB/s": 1.5}]}, {"SMOKE": True})
    run = archive.load(path)
    assert run["lecture"] == "00_hardware" and run["measurements"]["rows"][0]["n"] == 4096
    assert run["machine"] == machine.describe() and run["params"] == {"SMOKE": True}
    assert [r["created"] for r in archive.runs("00_hardware", data=tmp_path)] == [run["created"]]
    assert archive.runs("04_cuda_streams", data=tmp_path) == []
    # the label names the GPUs where there are any (an H100 machine's label has no CPU), else the CPU
    where = [name for name, _ in machine.gpus()] or [machine.cpu_model()]
    assert run["created"][:10] in archive.label(run) and all(w in archive.label(run) for w in where)
    (tmp_path / "other.json").write_text('{"rows": []}')
    with pytest.raises(ValueError, match="not a measurements file"):
        archive.load(tmp_path / "other.json")


def test_every_kept_run_names_its_machine_its_day_and_a_lecture_that_plots_it():
    import json
    from pathlib import Path

    root = Path(archive.DATA)
    files = archive.kept()
    assert files, "data/ keeps at least one run"
    lectures = {p.stem: p for p in (root.parent / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    for f in files:
        run = archive.load(f)
        assert run["lecture"] == f.stem and f.stem in lectures, f
        m = run["machine"]
        assert m["cpu"] and m["cores"] >= 1 and m["torch"] and run["created"][:4].isdigit(), f
        assert run["measurements"], f
        code = "".join("".join(c["source"]) for c in json.loads(lectures[f.stem].read_text())["cells"])
        assert f'archive.runs("{f.stem}")' in code, f"{f.stem} does not plot its kept runs"
        assert f.parent.name in (root / "README.md").read_text(), f"data/README.md does not list {f.parent.name}"
    assert any(r["machine"]["gpus"] for f in files for r in [json.loads(f.read_text())]), "no GPU run is kept"


def test_the_site_hands_save_to_only_to_lectures_that_have_the_knob():
    from pathlib import Path

    from helpers.site import build as site

    notebooks = Path(archive.DATA).parent / "notebooks"
    assert "SAVE_TO" in site.knobs(notebooks / "00_hardware.ipynb")
    assert "SAVE_TO" not in site.knobs(notebooks / "01_collectives.ipynb")
    assert {"WORLD_SIZE", "SMOKE"} <= site.knobs(notebooks / "01_collectives.ipynb")


def test_a_wrong_answer_gets_one_readable_line_never_a_truncated_tensor(capsys):
    big = torch.arange(100, dtype=torch.float64)
    off = big.clone()
    off[37] += 0.5
    assert not checks.check("none", None, big)
    assert not checks.check("shape", big[:10], big)
    assert not checks.check("values", off, big, rtol=1e-9)
    assert not checks.check("list", [1.0, None], [torch.ones(2), torch.ones(2)])
    assert not checks.check("number", 3.0, 4.0)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["[x] none: not yet. Your function returned None (not written yet?).",
                     "[x] shape: not yet. expected shape (100,), got shape (10,).",
                     "[x] values: not yet. 1 of 100 values differ (tolerance rtol=1e-09, atol=0); e.g. at index 37 "
                     "got 37.5, expected 37.",
                     "[x] list: not yet. item 0: expected shape (2,), got shape ().",
                     "[x] number: not yet. expected 4.0, got 3.0."]


def test_the_tiny_transformer_is_seeded_causal_and_learnable_data_is_deterministic():
    a, b = tiny.transformer(seed=3), tiny.transformer(seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(next(tiny.transformer(seed=4).parameters()), next(a.parameters()))
    ids, targets = tiny.tokens(2, seq=12, seed=1)
    assert torch.equal(ids, tiny.tokens(2, seq=12, seed=1)[0]) and torch.equal(ids[:, 1:], targets[:, :-1])
    changed = ids.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 64          # change only the later tokens
    out, out2 = a(ids), a(changed)
    torch.testing.assert_close(out[:, :8], out2[:, :8], rtol=0, atol=1e-12)   # causal: the past never sees them
    assert not torch.equal(out[:, 8:], out2[:, 8:])
    half = (tiny.lm_loss(a(ids[:1]), targets[:1]) + tiny.lm_loss(a(ids[1:]), targets[1:])) / 2
    torch.testing.assert_close(half, tiny.lm_loss(out, targets), rtol=1e-12, atol=0)


def test_the_site_builds_from_executed_notebooks_with_maths_as_mathml(tmp_path):
    """helpers.site.build.write_site without a browser (tests/test_site.py opens the real one in Chromium)."""
    import nbformat

    from helpers.site import build as site
    from helpers.site.book.mathml import tex_to_mathml

    assert tex_to_mathml(r"\frac{N}{B}").startswith("<math") and 'display="block"' in tex_to_mathml("x", True)
    assert "<mover" in tex_to_mathml(r"a \xrightarrow{K} b")  # drawn as \overset, which Chromium places right
    executed = []
    for name in ("00_hardware.ipynb", "01_collectives.ipynb"):
        nb = nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_markdown_cell(f"# Lecture {name[:2]}: a title\n\nIt takes $2(K-1)N/(KB)$ and\n"
                                          "$$T = \\alpha + \\frac{N}{B}$$\nin a paragraph, as Jupyter allows."),
            nbformat.v4.new_code_cell("print(6 * 7)", outputs=[nbformat.v4.new_output("stream", text="42\n")])],
            metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
        executed.append(tmp_path / name)
        nbformat.write(nb, str(executed[-1]))
    index = site.write_site(executed, tmp_path / "html", "Executed here, 2 cores")
    page = (tmp_path / "html" / "01_collectives.html").read_text()
    assert page.count("<math") == 2 and "$" not in page.split("<main", 1)[-1].split("</main>")[0].replace("$ ", "")
    assert "Executed here, 2 cores" in page and 'href="00_hardware.html"' in page and "42" in page
    downloads = sorted(p.name for p in (tmp_path / "html" / "_downloads").rglob("*.*"))
    assert downloads == ["00_hardware.ipynb", "00_solutions.py", "01_collectives.ipynb", "01_solutions.py"]
    assert (tmp_path / "html" / "searchindex.js").exists() and "01_collectives" in index.read_text()


def test_numbers_become_a_float64_tensor_and_a_stub_says_not_written_yet(capsys):
    torch.testing.assert_close(checks.numbers([1, 2.5]), torch.tensor([1.0, 2.5], dtype=torch.float64))
    assert checks.numbers([1, None]) is None and checks.numbers(None) is None and checks.numbers([True]) is None
    assert checks.check("stub", checks.numbers([None, None, None]), checks.numbers([1, 2, 3])) is False
    assert "not written yet" in capsys.readouterr().out


def test_a_progress_line_is_saved_as_one_line_in_its_last_state(tmp_path):
    """Headless, as papermill and the site run a lecture: one output, the last update, never a widget
    frozen at 0 %. (In a terminal the same object draws tqdm's bar.)"""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from helpers.progress import Progress\n"
                                          "with Progress(3, 'sweep', 'launches') as bar:\n"
                                          "    for i in range(3):\n        bar.update(note=f'job {i}')")]
    NotebookClient(nb, kernel_name="python3", timeout=60).execute()
    outputs = nb.cells[0].outputs
    assert len(outputs) == 1 and outputs[0].output_type == "display_data"
    text = outputs[0].data["text/plain"]
    assert text.startswith("sweep: 3/3 launches in "), text
    assert "\n" not in text.strip()



def test_a_long_cell_shows_one_line_of_its_time_and_a_short_one_none(tmp_path):
    """watch_cells (warm_up installs it): a cell past its threshold gets one line, updated while it
    runs and left at "this cell took ... s, N launches of ranks"; a quick cell gets no output; a cell
    with its own Progress line keeps only that one. Thresholds a tenth of the lectures' 5 s."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from helpers import progress\nprogress.watch_cells(after=0.5, every=0.1)"),
                nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell("import time\nfor _ in range(2):\n    time.sleep(0.6)\n"
                                          "    progress.launched()"),
                nbformat.v4.new_code_cell("with progress.Progress(1, 'own') as bar:\n"
                                          "    time.sleep(1.0)\n    bar.update()")]
    NotebookClient(nb, kernel_name="python3", timeout=60).execute()
    assert nb.cells[1].outputs == []
    lines = [o.data["text/plain"] for o in nb.cells[2].outputs]
    assert len(lines) == 1 and lines[0].startswith("this cell took ") and lines[0].endswith(", 2 launches of ranks"), lines
    own = [o.data["text/plain"] for o in nb.cells[3].outputs]
    assert len(own) == 1 and own[0].startswith("own: 1/1"), own


class _LostWakeUp:
    """A shell socket whose message is there, but the first poll's wake-up was lost (the stall of
    helpers/site/headless.py): that poll only ends at its timeout; a new poll reads the events and finds it."""

    def __init__(self):
        self.polls = 0

    async def poll(self, timeout_ms):
        import asyncio

        self.polls += 1
        if self.polls == 1:
            await asyncio.sleep(timeout_ms / 1000)
            return 0
        return 1


def _channel():
    from jupyter_client.channels import AsyncZMQSocketChannel

    channel = AsyncZMQSocketChannel.__new__(AsyncZMQSocketChannel)
    channel.socket = _LostWakeUp()

    async def recv():
        return {"msg_type": "execute_reply"}

    channel._recv = recv
    return channel


def test_a_lost_wake_up_costs_the_client_half_a_second_not_the_cell_timeout():
    import asyncio
    from queue import Empty

    from helpers.site import headless

    headless._patch_client()
    t0 = time.monotonic()
    assert asyncio.run(_channel().get_msg(timeout=300)) == {"msg_type": "execute_reply"}
    assert time.monotonic() - t0 < 2 * headless.SLICE_S + 0.5
    # the negative control: jupyter_client's own get_msg waits out its whole timeout and misses it
    with pytest.raises(Empty):
        asyncio.run(headless.UNPATCHED["get_msg"](_channel(), timeout=1.5))


def test_patched_replaces_for_the_block_and_restores_even_after_an_error():
    import types

    from helpers.patching import patched
    box = types.SimpleNamespace(f=1, g=2)
    with patched(box, f=10) as originals:
        assert (box.f, box.g, originals) == (10, 2, {"f": 1})
    assert box.f == 1
    with pytest.raises(ValueError), patched(box, f=10, g=20):
        raise ValueError
    assert (box.f, box.g) == (1, 2)


def test_the_spread_label_says_what_summary_picked():
    """"min-max" exactly where summary's p10 and p90 are the extremes (up to 5 samples); the old
    rule, "min-max below 10", mislabelled 6 to 9 samples, whose p10 is the second smallest."""
    from helpers import timing

    for n in range(1, 31):
        s = timing.summary([float(i) for i in range(n)])
        extremes = s["p10"] == 0 and s["p90"] == n - 1
        assert (timing.spread_label(n) == "min-max") == extremes, n
    assert timing.spread_label(5) == "min-max" and timing.spread_label(7) == "p10-p90"

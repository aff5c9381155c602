"""Unit tests of the small shared helpers (the launcher has its own file)."""
import pytest
import torch

from helpers import checks, machine, plots, report, timing, tiny
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


@pytest.mark.parametrize("n, label", [(4096, "4 KiB"), (3 * 2**20, "3 MiB"), (780213.36, "761.9 KiB"),
                                      (1023.9 * 2**20, "1024 MiB"), (2**31, "2 GiB"), (100, "100 B")])
def test_bytes_label_is_short_and_exact_for_powers_of_two(n, label):
    assert plots.bytes_label(n) == label

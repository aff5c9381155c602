"""Two kinds of check every lecture uses: refusing bad parameters, and grading exercises."""
import torch


class ParameterError(ValueError):
    """A parameter the lecture cannot run with; the message says what is allowed."""


def require(condition, sentence):
    """In a notebook's validation cell: stop with `sentence` unless `condition` holds."""
    if not condition:
        raise ParameterError(sentence)


def check_world_size(world_size, low=1, high=None, divides=None):
    """Refuse a world size outside [low, high], or one that does not divide `divides` (a dict)."""
    require(isinstance(world_size, int) and not isinstance(world_size, bool),
            f"WORLD_SIZE must be a whole number, got {world_size!r}.")
    top = f" and at most {high}" if high is not None else ""
    require(world_size >= low and (high is None or world_size <= high),
            f"WORLD_SIZE must be at least {low}{top} for this lecture, got {world_size}.")
    for name, value in (divides or {}).items():
        require(value % world_size == 0,
                f"WORLD_SIZE={world_size} does not divide {name}={value}: every rank must get an "
                f"equal share, so pick a WORLD_SIZE among {[k for k in range(low, (high or value) + 1) if value % k == 0]}.")


def check(name, got, expected, rtol=0.0, atol=0.0):
    """Grade an exercise: print whether `got` matches `expected` and return True or False.

    Tensors (or lists of them) are compared with torch.testing.assert_close at the given
    tolerances (exact by default); anything else with ==. Never raises on a wrong answer.
    """
    try:
        if isinstance(expected, torch.Tensor) or (isinstance(expected, (list, tuple)) and expected
                                                  and isinstance(expected[0], torch.Tensor)):
            torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)
        elif got != expected:
            raise AssertionError(f"expected {expected!r}, got {got!r}")
    except Exception as e:  # noqa: BLE001 - a wrong answer is reported, not raised
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"[x] {name}: not yet. {first}")
        return False
    print(f"[ok] {name}: right.")
    return True

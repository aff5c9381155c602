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


def numbers(values):
    """A list of numbers as a float64 tensor, for check() to compare with a tolerance; None when any
    value is missing (a function not written yet returns None) or is not a number."""
    if values is None or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    return torch.tensor([float(v) for v in values], dtype=torch.float64)


def check(name, got, expected, rtol=0.0, atol=0.0):
    """Grade an exercise: print whether `got` matches `expected` and return True or False.

    Tensors (or lists of them) are compared with torch.testing.assert_close at the given
    tolerances (exact by default); anything else with ==. Never raises on a wrong answer; a wrong
    one gets one readable line saying how it differs (never a truncated tensor).
    """
    reason = difference(got, expected, rtol, atol)
    if reason:
        print(f"[x] {name}: not yet. {reason}")
        return False
    print(f"[ok] {name}: right.")
    return True


def difference(got, expected, rtol=0.0, atol=0.0):
    """None when `got` matches `expected`, else one line saying how it differs."""
    if got is None and expected is not None:
        return "Your function returned None (not written yet?)."
    if isinstance(expected, (list, tuple)) and not isinstance(expected, torch.Tensor):
        if not isinstance(got, (list, tuple)):
            return f"expected a list of {len(expected)}, got {short(got)}."
        if len(got) != len(expected):
            return f"expected {len(expected)} values, got {len(got)}."
        for i, (g, e) in enumerate(zip(got, expected)):
            why = difference(g, e, rtol, atol)
            if why:
                return f"item {i}: {why}" if len(expected) > 1 else why
        return None
    if isinstance(expected, torch.Tensor):
        return _tensor_difference(got, expected, rtol, atol)
    try:
        same = got == expected
        same = bool(same.all()) if isinstance(same, torch.Tensor) else bool(same)
    except Exception:  # noqa: BLE001 - values that cannot be compared differ
        same = False
    return None if same else f"expected {short(expected)}, got {short(got)}."


def _tensor_difference(got, expected, rtol, atol):
    if not isinstance(got, torch.Tensor):
        try:
            got = torch.as_tensor(got, dtype=expected.dtype)
        except Exception:  # noqa: BLE001
            return f"expected a tensor of shape {tuple(expected.shape)}, got {short(got)}."
    if got.shape != expected.shape:
        return f"expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}."
    g, e = got.detach().double().cpu().flatten(), expected.detach().double().cpu().flatten()
    bad = ~torch.isclose(g, e, rtol=rtol, atol=atol)
    if not bad.any():
        return None
    worst = int(torch.where(bad, (g - e).abs().nan_to_num(float("inf")), torch.zeros_like(g)).argmax())
    where = f" at index {worst}" if g.numel() > 1 else ""
    tol = f" (tolerance rtol={rtol:g}, atol={atol:g})" if rtol or atol else ""
    return (f"{int(bad.sum())} of {g.numel()} values differ{tol}; e.g.{where} got {g[worst].item():.6g}, "
            f"expected {e[worst].item():.6g}.")


def short(value, limit=80):
    """A repr of at most `limit` characters (tensors as their shape and first values)."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().flatten()
        head = ", ".join(f"{v:.4g}" for v in flat[:4].tolist())
        text = f"tensor of shape {tuple(value.shape)} [{head}{', ...' if flat.numel() > 4 else ''}]"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."

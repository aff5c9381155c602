"""Lecture 14's pieces that later lectures reuse, exactly as notebooks/14_planner.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import statistics


def differences(counted, formula, dims=("tensor", "data")):
    """{(dim, kind): (calls, bytes)} counted beyond the formula (negative: fewer)."""
    out = {}
    for dim in dims:
        got, want = counted.get(dim, {}), formula.get(dim, {})
        for kind in sorted(set(got.get("kind", {})) | set(want.get("kind", {}))):
            calls = got.get("kind", {}).get(kind, 0) - want.get("kind", {}).get(kind, 0)
            nbytes = (got.get("kind_bytes", {}).get(kind, 0)
                      - want.get("kind_bytes", {}).get(kind, 0))
            if calls or nbytes:
                out[dim, kind] = (calls, nbytes)
    return out

def spread(errors):
    """(median, 80th percentile) of |errors|."""
    e = sorted(abs(x) for x in errors)
    return statistics.median(e), statistics.quantiles(e, n=10, method="inclusive")[7]

def bounds(lay):                # (low, high) of predicted / emulated - 1: see above
    return (0.0, 0.10) if lay[4] else (-0.02, 0.02)

def checked(errors):            # errors: {layout: predicted / emulated - 1}
    median, p80 = spread(errors.values())
    outside = sum(not bounds(k)[0] <= e <= bounds(k)[1] for k, e in errors.items())
    return {"median |error|": median, "p80": p80, "layouts outside": outside}

def busiest_bubble(t, lay):     # a control: p - 1 slots of the busiest stage
    slot = t["compute"] + t["tensor"] + t["p2p"]
    return t["total"] - t["bubble"] + (lay[2] - 1) / lay[3] * slot

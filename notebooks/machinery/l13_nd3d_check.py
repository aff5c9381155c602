"""The check of notebooks/nd3d.py's 3D program: the single process it must equal (float64), and the
whole model assembled from every rank's slices."""
import torch

from helpers import tiny


def reference(cfg, steps, dtype=torch.float64):
    """The single process: the whole model, the whole batch, mean loss, plain SGD."""
    model = tiny.transformer(cfg["vocab"], cfg["dim"], cfg["heads"], cfg["depth"], seed=0, dtype=dtype)
    ids, targets = tiny.tokens(cfg["batch"], cfg["seq"], cfg["vocab"], seed=1)
    losses = []
    for _ in range(steps):
        model.zero_grad()
        loss = tiny.lm_loss(model(ids), targets)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= cfg["lr"] * p.grad
        losses.append(loss.item())
    return dict(losses=losses, params={n: p.detach().clone() for n, p in model.named_parameters()})


def assemble(results, like):
    """The whole model from every rank's slices; every replica (over dp, and over tp for what tp
    does not split) must agree with the others, and every entry must be owned by some rank."""
    full = {n: torch.full_like(p, float("nan")) for n, p in like.items()}
    for r in results:
        for n, part in r["params"].items():
            dim, idx = r["layout"][n]
            view = full[n] if dim is None else full[n].index_select(dim, idx)
            done = ~view.isnan()
            torch.testing.assert_close(part[done], view[done], rtol=1e-12, atol=1e-12)
            if dim is None:
                full[n] = part.clone()
            else:
                full[n].index_copy_(dim, idx, part)
    missing = [n for n, t in full.items() if t.isnan().any()]
    assert not missing, f"no rank holds {missing}"
    return full


def check(results, cfg, steps, dtype=torch.float64):
    """Assert every rank's losses and the assembled parameters equal the single process (1e-12)."""
    ref = reference(cfg, steps, dtype)
    for r in results:
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(ref["losses"]),
                                   rtol=1e-12, atol=1e-12)
    full = assemble(results, ref["params"])
    torch.testing.assert_close(full, ref["params"], rtol=1e-12, atol=1e-12)
    return max((full[n] - ref["params"][n]).abs().max().item() for n in full)

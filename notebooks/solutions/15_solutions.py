"""Reference solutions for the exercises of lecture 15 (the frameworks around DDP)."""


def device0_bytes(P, X, O, k):
    """(bytes device 0 sends, bytes it receives) in one DataParallel step."""
    sends = (k - 1) * P + (k - 1) * (X + O) // k       # replicas, input and output-gradient chunks
    receives = (k - 1) * P + (k - 1) * O // k          # gradient copies, output chunks
    return sends, receives


def chunk_rows(n, k):
    """Rows per chunk of torch.chunk(t, k) for a t of n rows."""
    size = -(-n // k)                                  # ceil(n / k)
    return [min(size, n - start) for start in range(0, n, size)]


def choose_strategy(n_params, gpu_bytes, n_gpus):
    """Lightning's strategy= for this model on n_gpus GPUs of gpu_bytes each, or None."""
    states = 16 * n_params                             # lecture 06: 2 + 2 + 12 bytes per parameter
    if states <= gpu_bytes:
        return "ddp"                                   # a whole replica fits: data parallel
    if states / n_gpus <= gpu_bytes:
        return "fsdp"                                  # fits once sharded over every GPU (ZeRO-3)
    return None


def parallel_apply_keeping_grad_mode(fns):
    """parallel_apply(fns), each thread in the caller's grad mode."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    grad = torch.is_grad_enabled()                     # the caller's, read on the caller's thread

    def run(fn):
        with torch.set_grad_enabled(grad):             # set in the worker thread, as torch's _worker
            return fn()
    with ThreadPoolExecutor(len(fns)) as pool:
        return list(pool.map(run, fns))

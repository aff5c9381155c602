"""Reference solutions for the exercises of lecture 12 (expert parallelism)."""


def split_sizes(counts, owner, r):
    """(input_split_sizes, output_split_sizes) of rank r's dispatch: the rows it sends to each
    rank (its counts summed over that rank's experts) and the rows it receives from each rank
    (their counts for r's experts)."""
    K = len(counts)
    send = [sum(c for e, c in enumerate(counts[r]) if owner[e] == j) for j in range(K)]
    recv = [sum(c for e, c in enumerate(counts[i]) if owner[e] == r) for i in range(K)]
    return send, recv


def dropless_factor(routed, n, k):
    """C = c n k / E must reach the busiest expert's count in any group."""
    experts = len(routed[0])
    return max(max(row) for row in routed) * experts / (n * k)


def strided_groups(W, ep):
    """EP group g: ranks g, g + R, ...; replicas of block j (rank r holds block r // R): the
    R consecutive ranks j R ... (j + 1) R - 1."""
    R = W // ep
    return ([list(range(g, W, R)) for g in range(R)],
            [list(range(j * R, (j + 1) * R)) for j in range(ep)])

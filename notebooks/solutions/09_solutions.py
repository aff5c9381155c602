"""Reference solutions for the exercises of lecture 09 (profiling and debugging)."""


def self_times(events):
    """{name: total self time}: each event's duration less that of the events directly inside it."""
    out, stack = {}, []
    for e in sorted(events, key=lambda e: (e["start"], -e["end"])):
        while stack and e["start"] >= stack[-1]["end"]:
            stack.pop()
        duration = e["end"] - e["start"]
        out[e["name"]] = out.get(e["name"], 0) + duration
        if stack:   # the innermost open event is this one's parent
            out[stack[-1]["name"]] -= duration
        stack.append(e)
    return out


def first_divergence(calls):
    """None if every rank issued the same collectives, else (i, each rank's i-th call or None)."""
    longest = max((len(c) for c in calls), default=0)
    for i in range(longest):
        at = [c[i] if i < len(c) else None for c in calls]
        if any(a != at[0] for a in at):
            return i, at
    return None


def exposed_after_overlap(backward, comm, buckets):
    """Exposed communication when `buckets` equal all-reduces follow a backward of `backward` ms."""
    done = 0.0
    for i in range(1, buckets + 1):
        done = max(done, i * backward / buckets) + comm / buckets
    return done - backward

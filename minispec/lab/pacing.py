"""Paced emission: a stream whose chunks and timing do not show how many drafts each step kept.

A speculative step emits n + 1 tokens at once (n accepted drafts, then the correction or bonus),
so a client that reads a stream as it comes sees every step's accepted count in the chunk sizes
and in the gaps between chunks. Those counts depend on how predictable the text is, so they say
what kind of prompt was asked (scripts/security/leakage.py measures how well; arXiv 2411.01076
identified which of 50 queries was asked from them). Pacing replaces the step's rhythm with a
fixed one:

    arrivals:  (t_i, c_i)      step i made c_i tokens available at time t_i
    paced:     chunk k of `chunk` tokens is released at
               r_k = max(r_{k-1} + interval, time the k-th chunk's last token arrived)
               with r_{-1} = t_0, the first token's arrival; the last chunk holds what is left

While the generator keeps ahead of the cadence (chunk tokens per interval), every release is
`chunk` tokens `interval` apart, whatever the steps did; when it falls behind, a release waits
for its tokens (a stall the client can see). The cost is latency: the client gets the text at
the cadence, not as fast as it was made. `whole` (one release at the end) hides everything but
the total time, at the cost of streaming itself.

    schedule(arrivals, chunk, interval)    the releases, a pure function (what the benchmark replays)
    PacedStream(on_tokens, chunk, interval)  the same schedule, live: a TokenCallback that buffers
                                           and releases from a thread; close() flushes the rest
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, Sequence

from minispec.checks import is_int
from minispec.errors import MinispecError


def check_pacing(chunk: int, interval: float) -> tuple[int, float]:
    if not is_int(chunk) or not 1 <= chunk <= 4096:
        raise MinispecError(f"pacing: chunk = {chunk!r}; expected an integer number of tokens in 1..4096")
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 <= interval <= 3600:
        raise MinispecError(f"pacing: interval = {interval!r}; expected seconds in [0, 3600]")
    return int(chunk), float(interval)


def schedule(arrivals: Sequence[tuple[float, int]], chunk: int, interval: float) -> list[tuple[float, int]]:
    """Releases [(r_k, size_k)] for arrivals [(t_i, c_i)] (t nondecreasing, c >= 0): the rule above."""
    chunk, interval = check_pacing(chunk, interval)
    check_arrivals(arrivals)
    total = sum(c for _, c in arrivals)
    releases: list[tuple[float, int]] = []
    available, i, released = 0, 0, 0
    t_ready = 0.0
    while released < total:
        size = min(chunk, total - released)
        while available < released + size:  # the time this chunk's last token arrived
            t_ready, c = arrivals[i]
            available += c
            i += 1
        t = max((releases[-1][0] if releases else arrivals[0][0]) + interval, t_ready)
        releases.append((t, size))
        released += size
    return releases


def check_arrivals(arrivals: Sequence[tuple[float, int]]) -> None:
    """Arrivals [(t_i, c_i)]: finite times in nondecreasing order, counts integers >= 0."""
    last = -math.inf
    for i, item in enumerate(arrivals):
        ok = isinstance(item, (tuple, list)) and len(item) == 2
        t, c = item if ok else (None, None)
        if not ok or isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < last \
                or not is_int(c) or c < 0:
            raise MinispecError(f"pacing: arrivals[{i}] = {item!r}; expected (time, count) with finite times in "
                                "nondecreasing order and counts >= 0")
        last = t


def whole(arrivals: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """One release of everything, when the last token arrived."""
    total = sum(c for _, c in arrivals)
    return [(arrivals[-1][0], total)] if total else []


class PacedStream:
    """A TokenCallback for generate(on_tokens=...) that passes tokens on to `deliver(tokens)` in
    chunks of `chunk` at most every `interval` seconds (schedule(), live). Call close() when the
    generation returns: it releases what is left at the cadence and waits for the thread.

    Only the tokens reach `deliver`: the accepted counts the loop reports are dropped here.
    """

    def __init__(self, deliver: Callable[[list[int]], None], chunk: int, interval: float,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.chunk, self.interval = check_pacing(chunk, interval)
        if not callable(deliver) or not callable(clock):
            raise MinispecError(f"pacing: deliver = {deliver!r}, clock = {clock!r}; expected functions")
        self.error: BaseException | None = None  # what deliver raised on the pacing thread
        self.deliver, self.clock = deliver, clock
        self.buffer: list[int] = []
        self.done = False
        self.ready = threading.Condition()
        self.releases: list[tuple[float, int]] = []  # (time, size) of every release, for inspection
        self.start: float | None = None  # the first token's arrival: r_{-1}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def __call__(self, tokens: list[int], num_accepted: int, num_drafted: int) -> None:
        self.raise_if_failed()
        with self.ready:
            if self.done:  # the thread has released its last chunk: these would never be delivered
                raise MinispecError(f"pacing: {len(tokens)} token(s) after close(); expected close() once the "
                                    "generation has returned")
            if self.start is None:
                self.start = self.clock()
            self.buffer.extend(tokens)
            self.ready.notify()

    def close(self) -> None:
        with self.ready:
            self.done = True
            self.ready.notify()
        self.thread.join()
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        """An exception of deliver's, raised on the pacing thread, raised again here (never lost)."""
        if self.error is not None:
            raise MinispecError(f"pacing: deliver raised {type(self.error).__name__}: "
                                f"{' '.join(str(self.error).split())}") from self.error

    def _run(self) -> None:
        while True:
            with self.ready:  # wait for a full chunk (or the end)
                while len(self.buffer) < self.chunk and not self.done:
                    self.ready.wait()
                if not self.buffer:
                    return
                size = min(self.chunk, len(self.buffer))
            wait = (self.releases[-1][0] if self.releases else self.start) + self.interval - self.clock()
            if wait > 0:  # at most one release per interval, the first an interval after the first token
                time.sleep(wait)
            with self.ready:
                out, self.buffer = self.buffer[:size], self.buffer[size:]
            self.releases.append((self.clock(), size))
            try:
                self.deliver(out)
            except Exception as err:  # noqa: BLE001 - user code: kept for the generating thread
                with self.ready:
                    self.error, self.buffer, self.done = err, [], True
                return

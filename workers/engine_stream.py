"""Keep the engine full: analyses stream into one running vLLM engine and each result is handed
over the moment its request finishes.

A closed batch waits for its slowest request and lets the engine drain before the next one;
decode at 16 sequences is latency-bound (on the H200 the same engine does 3.5x more with 256 in
flight). ``EngineStream`` instead admits work whenever the engine has room, up to what the
engine runs at once (its sequence cap and cache layout: ``vidlora.admission.concurrency``), with
the adapter-aware policy of ``vidlora.admission.admit`` (at most ``max_loras`` adapters in
flight, running ones refilled first, nobody starves).

One turn of the loop (``step``) is the whole story:

1. take what was offered (``offer``, from any thread);
2. if outputs were judged bad and the engine has drained, settle them with the guard (re-run
   alone, the recovery ladder, quarantine: ``Guard.settle``) - admission pauses until then, so
   every re-run and ladder step runs on an idle engine, as in a batch;
3. otherwise admit what the policy allows;
4. advance the engine one step; judge each finished output (``Guard.judge``) and hand a healthy
   one over at once (``deliver``); abort requests past their deadline.

The engine and its host are touched only by the thread that calls ``step`` (vLLM's in-process
engine is not thread-safe). Requests arrive already claimed (the database says RUNNING on this
worker), so whatever this process holds when it dies is found by the reconciler; ``drain`` and
``release`` give work back on a graceful stop.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine_patch.guard import Verdict
from vidlora.admission import Waiting, admit
from vidlora.engine_io import AnalysisOutput, AnalysisRequest, RequestError
from workers.engine_outputs import external_id, finish_output, to_output

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Held:
    """One request this stream holds, from offer to delivery."""
    req: AnalysisRequest
    since: float                      # offered (ready to run)
    engine_id: str | None = None      # vLLM's internal id while in flight
    admitted_at: float | None = None
    mates: tuple[str, ...] = ()       # request keys admitted with it (its engine batch)
    first: tuple[AnalysisOutput, Verdict] | None = None  # a bad first output awaiting the guard
    prepared: Any = None              # host.prepare(req), made by the offering thread; dropped once submitted


@dataclass(slots=True)
class StreamStats:
    admitted: int = 0
    delivered: int = 0
    output_tokens: int = 0
    admission_wait_s: float = 0.0     # summed over admitted requests
    settled: int = 0                  # outputs resolved by the guard on an idle engine
    started: float = field(default_factory=time.monotonic)


class EngineStream:
    def __init__(self, host: Any, deliver: Callable[[AnalysisRequest, AnalysisOutput, tuple[str, ...]], None], *,
                 capacity: int, fair_wait_s: float = 30.0, deadline_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.host = host
        self.deliver = deliver            # (request, output, its engine batch) -> stored
        self.capacity = max(1, int(capacity))
        self.fair_wait_s = float(fair_wait_s)
        self.deadline_s = deadline_s
        self.clock = clock
        self.stats = StreamStats()
        self._inbox: deque[Held] = deque()
        self._cv = threading.Condition()
        self._waiting: list[Held] = []
        self._running: dict[str, Held] = {}   # vLLM external request id -> held
        self._suspects: list[Held] = []
        self._ran_with = 0                    # largest running set a suspect finished in
        self._admitting = True
        self._checking = False                # draining for an adapter's first device check

    # -- any thread -------------------------------------------------------------------------
    def offer(self, requests: Sequence[AnalysisRequest]) -> None:
        """Hand requests to the stream. Each is prepared here, in the offering thread (frames
        read, prompt rendered: ``host.prepare``), not in the engine thread the GPU waits on."""
        now = self.clock()
        held = [Held(req, now, prepared=self.host.prepare(req)) for req in requests]
        with self._cv:
            self._inbox.extend(held)
            self._cv.notify_all()

    def held(self) -> int:
        """Requests this stream holds: offered, waiting, in flight or awaiting the guard."""
        with self._cv:
            return self._count()

    def held_keys(self) -> set[str]:
        with self._cv:
            # Copies first (atomic under the GIL): the engine thread changes these without the lock.
            held = (*tuple(self._inbox), *tuple(self._waiting), *tuple(self._running.values()), *tuple(self._suspects))
            return {h.req.request_key for h in held}

    def wait_for_room(self, n: int, timeout: float, backlog: int) -> bool:
        """Block until ``n`` more requests fit beside a backlog of ``backlog`` waiting ones (so
        the engine always has work to admit when a request finishes); False on timeout. An
        empty stream takes any message, one larger than its room included."""
        with self._cv:
            return self._cv.wait_for(lambda: self._count() == 0 or self._count() + n <= self.capacity + backlog,
                                     timeout)

    def wake(self) -> None:
        """Wake whoever waits for room or work (a stop is under way)."""
        with self._cv:
            self._cv.notify_all()

    def wait_for_work(self, timeout: float) -> None:
        with self._cv:
            self._cv.wait_for(lambda: bool(self._inbox), timeout)

    def in_flight_by_adapter(self) -> dict[str, int]:
        with self._cv:
            running = tuple(self._running.values())  # a copy: the engine thread changes it
        return dict(Counter(self._adapter(h) or "(base model)" for h in running))

    def _count(self) -> int:
        return len(self._inbox) + len(self._waiting) + len(self._running) + len(self._suspects)

    # -- the engine thread ------------------------------------------------------------------
    def step(self) -> bool:
        """One turn of the loop; False when there was nothing to do."""
        self._take_offers()
        if self._suspects and not self._running:
            self._settle()
        elif not self._suspects and self._admitting:
            self._admit()
        if not self._running:
            return bool(self._suspects)
        self._advance()
        return True

    def _take_offers(self) -> None:
        with self._cv:
            while self._inbox:
                self._waiting.append(self._inbox.popleft())

    def _admit(self) -> None:
        if self._checking and self._running:
            return  # an adapter's first device check waits for the engine to drain
        self._checking = False
        now = self.clock()
        by_key = {h.req.request_key: h for h in self._waiting}
        running = Counter(self._adapter(h) for h in self._running.values())
        chosen = admit([Waiting(k, self._adapter(h), h.since) for k, h in by_key.items()], running,
                       self.host.resident_adapters(), self.capacity - len(self._running),
                       int(self.host.settings.max_loras), now, self.fair_wait_s)
        mates = tuple(w.key for w in chosen)
        for w in chosen:
            held = by_key[w.key]
            if self.host.guard.is_quarantined(w.adapter):
                self._remove_waiting(held)
                why = f"adapter quarantined: {self.host.guard.quarantined[w.adapter]}"
                self._hand_over(held, None, Verdict(ok=False, reason=why, quarantined=True, runs=0))
                continue
            if not self.host.adapter_ready(held.req):
                if self._running:
                    # Its first device check runs generations: admit nothing more until the
                    # engine has drained, then check it on the idle engine.
                    self._checking = True
                    break
                self.host.register_request_adapter(held.req)
            self._remove_waiting(held)
            prepared, held.prepared = held.prepared, None
            try:
                held.engine_id = self.host.submit(held.req, prepared)
            except RequestError as exc:
                self._hand_over(held, AnalysisOutput.failed(held.req.request_key, str(exc)), Verdict.of(None))
                continue
            held.admitted_at, held.mates = self.clock(), mates
            self._running[external_id(held.engine_id)] = held
            self.stats.admitted += 1
            self.stats.admission_wait_s += held.admitted_at - held.since

    def _advance(self) -> None:
        try:
            finished = self.host.step()
        except Exception as exc:  # noqa: BLE001 - the guard decides; EngineReplaceRequired escapes it
            self._after_exception(exc)
            return
        now = self.clock()
        for out in finished:
            held = self._running.pop(out.request_id, None)
            if held is None:
                continue  # not ours (someone used the engine directly); nothing to hand over
            result = replace(to_output(held.req.request_key, out, now - (held.admitted_at or now)),
                             structured=held.req.output_schema is not None)
            verdict = self.host.guard.judge(result)
            if verdict.judged and not verdict.ok:
                held.first = (result, verdict)
                self._suspects.append(held)
                self._ran_with = max(self._ran_with, len(self._running) + 1)
                continue
            self._hand_over(held, result, verdict)
        self._abort_overdue(now)

    def _abort_overdue(self, now: float) -> None:
        if self.deadline_s is None:
            return
        late = [(rid, h) for rid, h in self._running.items() if now - (h.admitted_at or now) > self.deadline_s]
        if not late:
            return
        self.host.abort([h.engine_id for _, h in late])
        for rid, held in late:
            del self._running[rid]
            out = AnalysisOutput.failed(held.req.request_key, f"deadline of {self.deadline_s:.0f}s exceeded",
                                        latency_s=now - (held.admitted_at or now), finish_reason="deadline")
            self._hand_over(held, out, Verdict.of(None))

    def _settle(self) -> None:
        """The engine is idle: the guard resolves what was judged bad, as for a batch."""
        suspects, self._suspects = self._suspects, []
        settled = self.host.guard.settle([h.req for h in suspects], [h.first for h in suspects], self._ran_with)
        self._ran_with = 0
        for held, (out, verdict) in zip(suspects, settled):
            self.stats.settled += 1
            self._hand_over(held, out, verdict)

    def _after_exception(self, exc: Exception) -> None:
        """The engine raised with requests in flight: abort them all, and let the guard re-run
        each alone (EngineReplaceRequired goes to the worker)."""
        held = list(self._running.values())
        self._running.clear()
        try:
            self.host.abort([h.engine_id for h in held])
        except Exception:  # noqa: BLE001 - the guard's re-runs start from a clean engine anyway
            log.exception("could not abort the running set after an engine error")
        results = self.host.guard.after_exception([h.req for h in held], exc)
        for h, (out, verdict) in zip(held, results):
            self._hand_over(h, out, verdict)

    def _hand_over(self, held: Held, out: AnalysisOutput | None, verdict: Verdict) -> None:
        final = finish_output(held.req, out, verdict, getattr(self.host, "tokenizer", None))
        self.stats.delivered += 1
        self.stats.output_tokens += final.output_tokens or 0
        self.deliver(held.req, final, held.mates or (held.req.request_key,))
        with self._cv:
            self._cv.notify_all()  # room for the next claim

    def _remove_waiting(self, held: Held) -> None:
        self._waiting.remove(held)

    def _adapter(self, held: Held) -> str | None:
        return self.host.adapter_of(held.req) if (held.req.adapter_name or held.req.adapter_path) else None

    # -- stopping ---------------------------------------------------------------------------
    def drain(self, budget_s: float) -> None:
        """Stop admitting and finish what is in flight within ``budget_s`` (a graceful stop)."""
        self._admitting = False
        end = self.clock() + budget_s
        while (self._running or self._suspects) and self.clock() < end:
            self.step()

    def release(self) -> list[AnalysisRequest]:
        """Abort what is still in flight and return every request not handed over, for the
        caller to give back (the database's record); the stream holds nothing after."""
        self._take_offers()
        left = [*self._waiting, *self._running.values(), *self._suspects]
        in_flight = [h.engine_id for h in self._running.values() if h.engine_id]
        self._waiting, self._running, self._suspects = [], {}, []
        try:
            self.host.abort(in_flight)
        except Exception:  # noqa: BLE001 - the engine may be the reason we stop
            log.exception("could not abort %d requests in flight", len(in_flight))
        with self._cv:
            self._cv.notify_all()
        return [h.req for h in left]

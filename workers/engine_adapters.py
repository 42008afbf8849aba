"""The engine host's adapters: every adapter a request names reaches vLLM through
engine_patch.registration (the one adapter path), then this device's checks; and the mirror of
vLLM's two adapter LRUs that counts loads (``workers.engine_host`` says why a mirror).

A mixin of ``workers.engine_host.EngineHost``: its state (``_registered``, ``_device_verdicts``,
the lora id maps, ``_slots``, ``_cpu_cache``, the load counters) is made in the host's
``__init__``, beside the rest of the host's.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine_patch.probes import canary, check_adapters
from engine_patch.registration import Registration
from vidlora.engine_io import AnalysisRequest, RequestError
from workers.engine_memory import in_process_core

log = logging.getLogger("workers.engine_host")


def _not_served(name: str, reg: Registration) -> RequestError:
    """Why a request's adapter is not served: the adapter's refusal, or (stage "server") the
    server's fault, which is judged again at the next registration."""
    if reg.stage == "server":
        return RequestError(f"adapter {name!r} not served now: {reg.reason}")
    return RequestError(f"adapter {name!r} refused: {reg.reason}")


class EngineAdapters:
    # Every adapter reaches vLLM through engine_patch.registration (the one adapter path):
    # normalised and checked on the host, then checked on this device (vLLM loads it, it
    # changes the output vs the base model, its canary is healthy). A refused adapter never
    # reaches a batch: its requests fail with the reason, and the engine never raises or
    # rebuilds for it. Adapters are identified by the content hash of their normalised
    # weights, so one rewritten in place is a new adapter with a new vLLM id.

    def _resolve_adapter(self, req: AnalysisRequest) -> tuple[str, str] | None:
        if not req.adapter_name and not req.adapter_path:
            return None
        path = req.adapter_path
        if not path:
            root = self.settings.adapter_root
            if root is None:
                raise RequestError(f"adapter {req.adapter_name!r} has no path")
            path = str(Path(root) / str(req.adapter_name))
        name = req.adapter_name or Path(path).name
        return name, os.path.abspath(path)  # links are judged by the registry, not followed here

    def register_adapter(self, name: str, source: str) -> Registration:
        """The verdict on adapter ``name`` at ``source``: host checks, then device checks
        (once per content digest and engine). Refusals are kept and shown, never raised."""
        with self._lock:
            reg = self.adapters.register(name, source)
            if reg.ok and self.llm is not None:
                reg = self._device_check(reg)
            prev = self._registered.get(name)
            if prev is not None and prev.digest != reg.digest:
                log.warning("adapter %s changed (%s -> %s): registered anew", name, prev.digest, reg.digest)
                self.guard.release(name)  # a new adapter version starts with a clean record
            self._registered[name] = reg
            return reg

    def registrations(self) -> dict[str, dict[str, Any]]:
        """Adapter name -> its latest verdict as plain values (heartbeat, identity, doctor)."""
        return {name: reg.as_dict() for name, reg in sorted(self._registered.items())}

    def _device_check(self, reg: Registration) -> Registration:
        cached = self._device_verdicts.get(reg.digest)
        if cached is not None:
            return replace(cached, name=reg.name, source=reg.source)
        lora = self._lora_for(reg)
        try:
            # vLLM's own load, outside any batch: its errors are the adapter's, not a step's.
            self.llm.llm_engine.add_lora(lora)
            self._touch_adapters([lora.lora_int_id])
            checks, refusal = self._judge_adapter(lora)
        except Exception as exc:  # noqa: BLE001 - whatever vLLM raises refuses this adapter only
            log.warning("adapter %s: device check raised", reg.name, exc_info=True)
            verdict = reg.refuse(f"vLLM could not serve it: {type(exc).__name__}: {exc}"[:600], "device")
        else:
            verdict = (reg.refuse(refusal, "device", **checks) if refusal
                       else replace(reg, stage="device", checks=checks))
        finally:
            self._sync_mirror()
        if not verdict.ok:
            self._forget_lora(reg.digest)
        self._device_verdicts[reg.digest] = verdict
        return verdict

    def _judge_adapter(self, lora) -> tuple[dict[str, Any], str | None]:
        """The loaded adapter against the base model on this engine (it must change the output)
        and its canary (the output must be sane): the checks to record, and the reason to
        refuse it (None: serve it)."""
        if self.settings.load_format == "dummy":
            # Noise weights: the base's logprobs barely move under an adapter and its greedy
            # text repeats, so neither check can tell a good adapter from a bad one here.
            return {"device_checks": "skipped: dummy weights (load_format)"}, None
        [change] = check_adapters(self.llm, [lora])
        checks = {"max_logprob_change": round(change.max_logprob_change, 4),
                  "tokens_differ": change.tokens_differ}
        if not change.ok:
            return checks, f"{change.detail} vs the base model on this engine"
        sane = canary(self.llm, lora)
        if not sane.ok:
            return checks, f"canary with the adapter: {sane.detail}"
        return {**checks, "canary_tokens": list(sane.tokens)[:8]}, None

    def lora_request(self, name: str, path: str):
        """The LoRARequest adapter ``name`` at ``path`` is served with; RequestError with the
        registration's reason if it is refused."""
        reg = self.register_adapter(name, path)
        if not reg.ok:
            raise _not_served(name, reg)
        return self._lora_for(reg)

    def _lora_for(self, reg: Registration):
        from vllm.lora.request import LoRARequest

        if reg.digest not in self._lora_ids:
            self._new_lora_id(reg.digest, reg.name)
        lid = self._lora_ids[reg.digest]
        return LoRARequest(lora_name=self._lora_names[lid], lora_int_id=lid, lora_path=str(reg.path))

    def _new_lora_id(self, digest: str, name: str) -> None:
        # vLLM tells LoRARequests apart by name in places (sets of requests), so each id gets
        # its own; names show up in vLLM's logs and metrics, so only a reload is tagged.
        lid = self._next_lora_id
        self._next_lora_id += 1
        self._lora_names[lid] = name if name not in self._id_adapter.values() else f"{name}#{lid}"
        self._lora_ids[digest] = lid
        self._id_adapter[lid] = name

    def _forget_lora(self, digest: str | None) -> None:
        lid = self._lora_ids.pop(digest, None) if digest else None
        if lid is None:
            return
        try:
            self.llm.llm_engine.remove_lora(lid)
        except Exception:  # noqa: BLE001 - not loaded, or already gone
            pass
        self._slots.pop(lid, None)
        self._cpu_cache.pop(lid, None)

    def _current_lora(self, name: str | None):
        """The LoRARequest ``name`` is served with now (None: the base model)."""
        if name is None:
            return None
        reg = self._registered.get(name)
        if reg is None:
            root = self.settings.adapter_root
            return self.lora_request(name, str((Path(root or ".") / name).resolve()))
        if not reg.ok:
            raise _not_served(name, reg)
        return self._lora_for(reg)

    def _touch_adapters(self, lora_ids: list[int]) -> None:
        max_loras = int(self.settings.max_loras)
        max_cpu = max(int(self.settings.max_cpu_loras), max_loras)
        for lid in lora_ids:
            if lid in self._cpu_cache:
                self._cpu_cache.move_to_end(lid)
            else:
                self.adapter_disk_loads += 1
                self._cpu_cache[lid] = None
                while len(self._cpu_cache) > max_cpu:
                    evicted, _ = self._cpu_cache.popitem(last=False)
                    self._slots.pop(evicted, None)  # vLLM drops it from its slot too
            if lid in self._slots:
                self._slots.move_to_end(lid)
            else:
                self.adapter_loads += 1
                self._slots[lid] = None
                while len(self._slots) > max_loras:
                    self._slots.popitem(last=False)

    def loaded_adapters(self) -> list[int]:
        """Adapter ids the mirror believes occupy device slots, oldest first."""
        return list(self._slots)

    def resident_adapters(self) -> list[str]:
        """Adapter names the mirror believes occupy device slots, oldest first."""
        return [self._id_adapter.get(lid, str(lid)) for lid in self._slots]

    def vllm_lora_state(self) -> dict[str, list[int]] | None:
        """vLLM's own view (active = in device slots, registered = in host cache), when the
        engine runs in this process; ``None`` otherwise."""
        core = self._in_process_core()
        try:
            manager = core.model_executor.driver_worker.worker.model_runner.lora_manager
            am = manager._adapter_manager
            # ``order`` is the LRU order, oldest first (vllm.utils.cache.LRUCache).
            return {"active": list(am._active_adapters.order),
                    "registered": list(am._registered_adapters.order)}
        except AttributeError:
            return None

    def _in_process_core(self) -> Any:
        """vLLM's engine core when it runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``);
        None when it runs in another process (or no engine is built)."""
        return in_process_core(self.llm)

    def _sync_mirror(self) -> None:
        state = self.vllm_lora_state()
        if state is not None:
            self._slots = OrderedDict((lid, None) for lid in state["active"])
            self._cpu_cache = OrderedDict((lid, None) for lid in state["registered"])

"""The engine host's start-up checks (engine_patch.startup_checks says what each catches): run
once through the host's engine after the adapters are registered and before the first batch;
an adapter that fails its own is refused, an engine that fails is rebuilt eager once, and one
that still fails makes the worker refuse to start.

A mixin of ``workers.engine_host.EngineHost``.
"""

from __future__ import annotations

import logging
from typing import Any

from engine_patch.env import versions
from engine_patch.guard import EngineReplaceRequired
from engine_patch.startup_checks import StartupCheckError, StartupReport, run_checks

log = logging.getLogger("workers.engine_host")


class EngineStartupChecks:
    def startup_checks(self) -> dict[str, Any]:
        """The start-up checks through this engine, once, after the adapters are registered
        and before the first batch (engine_patch.startup_checks says what each catches).

        - An adapter whose long-prompt canary fails (the base model's passing) is refused:
          its verdict becomes a refusal at stage "startup", as any refused adapter is shown.
        - An engine-level failure (mixed-adapter decode, the no-adapter request co-batched,
          the base model's long canary) on an engine with CUDA graphs: rebuilt with
          ``enforce_eager`` and checked again, since graph replay is the failing part in the
          reports (SGLang #28371) and eager has no graphs to replay. Still failing, already
          eager, or not rebuildable in this process: ``StartupCheckError`` (the worker
          refuses to start), with the reason on the last canary the heartbeat publishes.

        Returns the report (also ``startup_report``; its summary rides on ``last_canary()``).
        """
        with self._lock:
            self.start()
            report = self._startup_round()
            mitigation = None
            if not report.ok and not self.settings.enforce_eager:
                first = report.engine_failure
                log.warning("start-up checks failed with CUDA graphs (%s): rebuilding the engine eager", first)
                self.guard.note("startup_check_failed", reason=first, mitigation="enforce_eager")
                self.settings = self.settings.model_copy(update={"enforce_eager": True})
                try:
                    self.rebuild_engine()
                except EngineReplaceRequired as exc:
                    self._record_startup(report, None)
                    raise self._refuse(f"{first}; the fallback without CUDA graphs needs a fresh process "
                                       f"({exc}): set VIDLORA_ENFORCE_EAGER=true") from exc
                report = self._startup_round()
                mitigation = f"enforce_eager: with CUDA graphs, {first}"
            self._record_startup(report, mitigation)
            if not report.ok:
                raise self._refuse(report.engine_failure or "failed")
            if mitigation:
                log.warning("start-up checks pass without CUDA graphs: serving eager (%s)", mitigation)
            return self.startup_report

    def _startup_round(self) -> StartupReport:
        # Highest rank first, then by name: the long canaries' sample (startup_checks docstring).
        accepted = sorted((r for r in self._registered.values() if r.ok), key=lambda r: (-(r.rank or 0), r.name))
        adapters = {r.name: self._lora_for(r) for r in accepted}
        report = run_checks(self.llm, adapters, max_loras=int(self.settings.max_loras))
        self._touch_adapters([lr.lora_int_id for lr in adapters.values()][: int(self.settings.max_loras)])
        self._sync_mirror()
        for name, why in report.refused.items():
            digest = self._registered[name].digest
            for other, reg in list(self._registered.items()):  # every scenario serving these weights
                if reg.digest == digest:
                    self._registered[other] = reg.refuse(f"start-up check: {why}", "startup")
            self._device_verdicts[digest] = self._registered[name]
            self._forget_lora(digest)
        return report

    def _record_startup(self, report: StartupReport, mitigation: str | None) -> None:
        self.startup_report = dict(report.as_dict(), mitigation=mitigation)

    def _refuse(self, why: str) -> StartupCheckError:
        """The error the worker refuses to start with; the reason goes on the last canary,
        which the worker publishes on its heartbeat row before it exits."""
        self.guard.note("startup_refused", reason=why)
        text = f"start-up checks: {why}"
        self.record_canary({"ok": False, "detail": text, "reason": text, "adapter": None, "step": "startup_checks",
                            "tokens": [], "versions": versions()})
        return StartupCheckError(f"this engine must not serve: {why}")

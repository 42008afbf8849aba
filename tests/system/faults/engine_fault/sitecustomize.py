"""Fault injection for tests/system/faults (on PYTHONPATH of one GPU worker only): before the first
analysis batch after VIDLORA_TEST_ENGINE_FAULT_MARK is absent, corrupt the running engine's
weights in device memory (bench.gpu.rebuild.corrupt_final_norm) and create the mark, so the
worker the supervisor starts next runs clean. Only a rebuilt engine cures the fault.
"""
import os

_MARK = os.environ.get("VIDLORA_TEST_ENGINE_FAULT_MARK")

if _MARK:
    from celery.signals import task_prerun

    @task_prerun.connect(weak=False)
    def _corrupt_once(sender=None, **_):
        if getattr(sender, "name", "") != "tasks.analyze.analyze_batch" or os.path.exists(_MARK):
            return
        from bench.gpu.rebuild import corrupt_final_norm
        from workers import runtime

        with open(_MARK, "w") as fh:
            fh.write(f"{os.getpid()} {corrupt_final_norm(runtime.get_host())}\n")

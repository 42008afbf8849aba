"""tasks.messages: every message is sent by the name of a registered task, and task modules
do not import each other (a sender never loads the task it sends to)."""

import ast
from pathlib import Path

from tasks import messages
from tasks.celery_app import get_app

TASK_MODULES = ("ingest", "prepare", "dispatch", "analyze", "reconcile")


def test_every_message_name_is_a_registered_task():
    app = get_app()
    app.loader.import_default_modules()
    names = {getattr(messages, n) for n in dir(messages) if n.isupper()}
    assert names == {f"tasks.{m}.{t}" for m, t in (("ingest", "ingest_upload"), ("prepare", "prepare_video"),
                                                    ("dispatch", "dispatch_ready"), ("analyze", "analyze_batch"),
                                                    ("reconcile", "reconcile"))}
    assert names <= set(app.tasks)


def test_task_modules_do_not_import_each_other():
    root = Path(__file__).resolve().parents[2] / "tasks"
    for module in TASK_MODULES:
        tree = ast.parse((root / f"{module}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        others = {f"tasks.{m}" for m in TASK_MODULES if m != module}
        assert not imported & others, (module, imported & others)


def test_importing_tasks_builds_no_celery_app():
    """A task module or the message names can be imported without building the app (which
    reads the settings and would connect to the broker): the composition root builds it."""
    import subprocess
    import sys

    code = ("import tasks.messages, tasks.ingest, tasks.prepare, tasks.dispatch, tasks.analyze, tasks.reconcile\n"
            "from tasks.celery_app import get_app\n"
            "print(get_app.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "0"

"""tasks.messages: every message is sent by the name of a registered task, and task modules
do not import each other (a sender never loads the task it sends to)."""

import ast
from pathlib import Path

from tasks import messages
from tasks.celery_app import app

TASK_MODULES = ("ingest", "prepare", "dispatch", "analyze", "reconcile")


def test_every_message_name_is_a_registered_task():
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

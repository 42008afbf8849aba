"""A reviewer's whole session in a real browser, against the real pipeline.

Headless Chromium signs in, uploads two generated videos for two scenarios, watches the
batch page's grid go to done without reloading (real cpu and gpu Celery workers, tiny
Qwen3.5 model in vllm), approves one result, edits a structured answer through the form
generated from its schema (and sees the change per field), filters the results page by
scenario and then by a field's facet, downloads the CSV export and checks its rows and field
columns, and checks that model or reviewer text holding markup is shown as text: no script
runs, no element appears.
A screenshot of each step goes to test-artifacts/browser/.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
import uuid

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.support.web import BROWSER_PASSWORD as PASSWORD, BROWSER_REVIEWER as REVIEWER
from tests.support.workers import describe_workers
from vidlora.samples import generate_samples

pytestmark = [pytest.mark.browser, pytest.mark.engine]

SCENARIOS = ("artifact_identification", "tomb_structure")
VIDEOS = ("tomb_corridor", "bronze_vessel")  # short h264 clips, quick to sample
HOSTILE = "<script>alert(1)</script><b>bold</b>"
HOSTILE_MODEL = "<img src=x onerror=alert(2)><b>model bold</b> & <i>more</i>"
PIPELINE_TIMEOUT_MS = 480_000


def test_review_flow(cpu_worker, gpu_worker, live_server, reviewer, browser, screenshots, corpus_dir, tmp_path):
    from vidlora.db import session_scope
    from vidlora.models import Result
    from vidlora.results.fields import final_value

    base = live_server
    videos = generate_samples(tmp_path / "upload", list(VIDEOS), tag=uuid.uuid4().hex[:8])
    context = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page_errors: list[str] = []
    page.on("pageerror", lambda e: page_errors.append(str(e)))

    def shot(name: str) -> None:
        page.screenshot(path=str(screenshots / f"{name}.png"), full_page=True)

    # 1. Sign in (any page redirects to the sign-in form first).
    page.goto(f"{base}/upload/")
    page.wait_for_selector("[data-testid=login-form]")
    shot("01-login")
    page.fill("#username", REVIEWER)
    page.fill("#password", PASSWORD)
    page.click("[data-testid=login-submit]")
    page.wait_for_selector("[data-testid=upload-form]")
    shot("02-upload-page")

    # 2. Upload two videos for two scenarios; the per-file bars reach 100%.
    page.set_input_files("[data-testid=file-input]", [str(v) for v in videos])
    assert page.locator("[data-testid=file-progress]").count() == 2
    for name in SCENARIOS:
        page.check(f"[data-testid=scenario-{name}]")
    page.fill("[data-testid=batch-name]", "browser review flow")
    shot("03-files-chosen")
    page.click("[data-testid=upload-submit]")
    page.wait_for_url(re.compile(r".*/batches/\d+$"))
    batch_id = int(page.url.rsplit("/", 1)[1])

    # 3. The batch page updates itself: mark this document, wait for every cell to be done,
    #    then check the mark is still there (no reload happened) and a cell changed live.
    page.wait_for_selector("[data-testid=batch-progress]")
    page.evaluate("window.__noReload = 'same-document'")
    first_seen = page.evaluate(
        "Array.from(document.querySelectorAll('[data-testid^=cell-]')).map(c => c.dataset.status)")
    shot("04-batch-started")
    n_cells = len(VIDEOS) * len(SCENARIOS)
    try:
        page.wait_for_function(
            """n => {
                const cells = Array.from(document.querySelectorAll('[data-testid^=cell-]'));
                return cells.length === n && cells.every(c => ['done', 'failed', 'rejected'].includes(c.dataset.status))
                    && document.querySelector('[data-testid=batch-state]').dataset.status === 'finished';
            }""",
            arg=n_cells, timeout=PIPELINE_TIMEOUT_MS, polling=500,
        )
    except PlaywrightTimeoutError:
        shot("05-batch-timeout")
        status = subprocess.run([sys.executable, "-m", "cli", "status", str(batch_id)],
                                capture_output=True, text=True, timeout=60)
        raise AssertionError(f"batch {batch_id} did not finish in {PIPELINE_TIMEOUT_MS // 1000}s:\n"
                             f"{status.stdout}{status.stderr}\n{describe_workers(cpu_worker, gpu_worker)}") from None
    shot("05-batch-finished")
    assert page.evaluate("window.__noReload") == "same-document", "the batch page reloaded"
    statuses = page.evaluate(
        "Array.from(document.querySelectorAll('[data-testid^=cell-]')).map(c => c.dataset.status)")
    assert statuses == ["done"] * n_cells, statuses
    assert first_seen != statuses, "grid was already finished at first paint; nothing was watched live"
    # The live update redrew the outcome bar and text too, and each done cell opens its result.
    assert page.get_attribute("[data-testid=batch-bar] rect[data-segment=done]", "data-count") == str(n_cells)
    assert page.inner_text("[data-testid=batch-counts]").startswith(f"{n_cells} done")
    assert page.locator("[data-testid^=cell-] a[data-testid=result-link]").count() == n_cells

    # 4. The batch's results: one per video x scenario.
    page.click("[data-testid=batch-results-link]")
    page.wait_for_selector("[data-testid=result-table]")
    rows = page.locator("[data-testid=result-table] tbody tr[data-result-id]")
    assert rows.count() == n_cells
    result_ids = [int(rows.nth(i).get_attribute("data-result-id")) for i in range(n_cells)]
    with session_scope() as session:
        scenario_of = {rid: session.get(Result, rid).analysis.scenario.name for rid in result_ids}
    tomb = [rid for rid in result_ids if scenario_of[rid] == "tomb_structure"]
    artifact = [rid for rid in result_ids if scenario_of[rid] == "artifact_identification"]
    assert len(tomb) == len(artifact) == 2
    shot("06-results")

    # 5. Approve one result by keyboard from the list's review queue: "a" approves, and the
    #    queue moves on to the next result nobody has reviewed.
    approve_id = tomb[0]
    page.click(f"[data-testid=review-link-{approve_id}]")
    page.wait_for_selector("[data-testid=review-queue]")
    page.keyboard.press("a")
    page.wait_for_url(lambda url: f"/review/results/{approve_id}?" not in url)
    assert "/review/results/" in page.url and "queue=1" in page.url
    with session_scope() as session:
        approved = session.get(Result, approve_id)
        assert approved.review_state == "approved" and [r.action for r in approved.reviews] == ["approve"]
    page.goto(f"{base}/review/results/{approve_id}")
    assert page.locator("[data-testid=history] li[data-action=approve]").count() == 1
    shot("07-approved")

    # 6. Edit a structured answer through the form generated from its schema: add a find
    #    whose decoration holds markup; the page shows the change field by field, as text.
    edit_id = artifact[0]
    page.goto(f"{base}/review/results/{edit_id}")
    page.wait_for_selector("[data-testid=schema-form]")
    assert page.locator("[data-testid=edit-text]").count() == 0  # no free-text box for a structured answer
    new = "f/finds/new"
    for field, value in (("object_type", "vessel"), ("material", "bronze"), ("condition", "intact"),
                         ("period", "han")):
        page.select_option(f"[data-testid='field-{new}/{field}']", value)
    page.fill(f"[data-testid='field-{new}/decoration']", HOSTILE[:40])
    page.fill(f"[data-testid='field-{new}/confidence']", "0.8")
    shot("08-structured-form")
    page.click(f"[data-testid=edit-{edit_id}]")
    page.wait_for_selector("[data-testid=field-diff]")
    assert page.locator("[data-testid=review-state] [data-review-state=edited]").count() == 1
    changed = page.locator("[data-testid=field-diff] tbody tr")
    paths = [changed.nth(i).get_attribute("data-path") for i in range(changed.count())]
    assert any(p.endswith(".material") for p in paths) and any(p.endswith(".decoration") for p in paths), paths
    answer_box = page.locator("[data-testid=result-answer]")
    assert HOSTILE[:40] in answer_box.inner_text()  # the literal characters are visible
    assert answer_box.locator("b, script").count() == 0
    assert page.locator("[data-testid=field-diff] b, [data-testid=field-diff] script").count() == 0
    with session_scope() as session:
        finds = session.get(Result, edit_id).edited_parsed["finds"]
        assert finds[-1] == {"object_type": "vessel", "material": "bronze", "condition": "intact", "period": "han",
                             "decoration": HOSTILE[:40], "confidence": 0.8}
    shot("09-structured-edit")

    # 7. A model answer holding HTML and script is shown as text, on its page and in the list.
    model_xss_id = tomb[1]
    with session_scope() as session:  # as if the model had written it
        result = session.get(Result, model_xss_id)
        result.parsed = {"chamber_count": 1, "chambers": [], "passages": 0, "construction": HOSTILE_MODEL,
                         "damage": []}
        result.text = json.dumps(result.parsed)
    page.goto(f"{base}/review/results/{model_xss_id}")
    answer_box = page.locator("[data-testid=result-answer]")
    assert HOSTILE_MODEL in answer_box.inner_text()
    assert answer_box.locator("img, b, i").count() == 0
    page.goto(f"{base}/results/?batch={batch_id}")
    cell = page.locator(f"tr[data-result-id='{model_xss_id}'] td.excerpt")
    assert HOSTILE_MODEL in cell.inner_text()  # the answer in one line, as text
    assert cell.locator("*").count() == 0, cell.inner_html()
    assert page.locator("main b, main script:not([src]), main img[src=x]").count() == 0
    shot("10-markup-in-results")

    # 8. Filter by scenario with the form, then by a field with its facet: the reviewer's
    #    bronze find is counted and selected.
    page.select_option("[data-testid=filter-scenario]", "artifact_identification")
    page.select_option("[data-testid=filter-batch]", str(batch_id))
    page.click("[data-testid=filter-submit]")
    page.wait_for_url(re.compile(r".*scenario=artifact_identification.*"))
    shown = page.locator("[data-testid=result-table] tbody tr[data-result-id]")
    assert sorted(int(shown.nth(i).get_attribute("data-result-id")) for i in range(shown.count())) == sorted(artifact)
    with session_scope() as session:
        bronze = sorted(rid for rid in artifact
                        if any(f.get("material") == "bronze" for f in final_value(session.get(Result, rid))["finds"]))
    assert edit_id in bronze
    facet = page.locator("[data-testid='facet-finds.material=bronze']")
    assert int(facet.get_attribute("data-count")) == len(bronze)
    shot("11-facets")
    facet.click()
    page.wait_for_selector("[data-testid=field-conditions]")
    shown = page.locator("[data-testid=result-table] tbody tr[data-result-id]")
    assert sorted(int(shown.nth(i).get_attribute("data-result-id")) for i in range(shown.count())) == bronze
    shot("12-facet-chosen")

    # 9. The CSV export carries the filter: the bronze rows, a column per field, the review.
    with page.expect_download() as info:
        page.click("[data-testid=export-csv]")
    download = info.value
    assert download.suggested_filename.endswith(".csv")
    saved = screenshots / "export.csv"
    download.save_as(saved)
    table = list(csv.DictReader(io.StringIO(saved.read_text(encoding="utf-8-sig"))))
    assert sorted(int(r["result_id"]) for r in table) == bronze
    by_id = {int(r["result_id"]): r for r in table}
    assert by_id[edit_id]["review_state"] == "edited" and by_id[edit_id]["reviewed_by"] == REVIEWER
    assert json.loads(by_id[edit_id]["field.finds"])[-1]["decoration"] == HOSTILE[:40]
    assert all(r["status"] == "done" and r["scenario"] == "artifact_identification" for r in table)

    assert dialogs == [], f"a dialog fired: {dialogs}"
    assert page_errors == [], page_errors
    context.close()

"""Issue 51 in the pages and the API: the review queue least certain first, the confidence band
filter and facet, the confidences on the review page and in every export, and calibration on
the Scenarios page and at /api/v1/scenarios/NAME/calibration."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from tests.support.structured import seed_structured
from tests.support.web import PASSWORD

ANSWER = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.9}]}
# answer confidence = the least certain field's
CONFIDENCES = [{"sealed": 0.97, "finds": 0.95}, {"sealed": 0.2, "finds": 0.99}, None,
               {"sealed": 0.999, "finds": 0.6}]


@pytest.fixture()
def auth(reviewer) -> dict[str, str]:
    import base64

    return {"Authorization": "Basic " + base64.b64encode(f"{reviewer}:{PASSWORD}".encode()).decode()}


@pytest.fixture()
def seeded(database):
    return seed_structured([ANSWER] * 4, confidences=CONFIDENCES)


def _rows(html: str) -> list[int]:
    return [int(x) for x in re.findall(r'data-result-id="(\d+)"', html)]


def test_the_queue_reads_least_certain_first_and_unknown_last(logged_in_client, seeded):
    ids = seeded.result_ids
    html = logged_in_client.get(f"/results/?scenario={seeded.scenario}&sort=uncertain").get_data(as_text=True)
    assert _rows(html) == [ids[1], ids[3], ids[0], ids[2]]
    assert re.search(f'data-testid="confidence-{ids[1]}">\\s*<span class="confidence confidence-low" data-confidence="0.2000"',
                     html)
    assert 'data-confidence="unknown" data-band="unknown"' in html and ">unknown</span>" in html
    # The review page opened from it walks the same order.
    page = logged_in_client.get(f"/review/results/{ids[1]}", query_string={
        "queue": "1", "scenario": seeded.scenario, "sort": "uncertain"}).get_data(as_text=True)
    assert 'data-testid="queue-position">1 of 4' in page
    assert f"/review/results/{ids[3]}?" in page.split('data-testid="queue-next"')[0].rsplit("<a", 1)[1]


def test_the_review_page_shows_each_fields_confidence_least_certain_first(logged_in_client, seeded):
    page = logged_in_client.get(f"/review/results/{seeded.result_ids[1]}").get_data(as_text=True)
    section = page.split('data-testid="confidences"')[1].split("</section>")[0]
    assert section.index("field-confidence-sealed") < section.index("field-confidence-finds")
    assert ">20 %</span>" in section and ">99 %</span>" in section
    old = logged_in_client.get(f"/review/results/{seeded.result_ids[2]}").get_data(as_text=True)
    assert "Not known for this answer" in old


def test_the_band_filter_and_facet_count_the_current_list(logged_in_client, seeded):
    base = f"/results/?scenario={seeded.scenario}"
    html = logged_in_client.get(base).get_data(as_text=True)
    counts = dict(re.findall(r'data-testid="facet-confidence-(\w+)" data-count="(\d+)"', html))
    assert counts == {"low": "1", "medium": "1", "high": "1", "certain": "0", "unknown": "1"}
    link = re.search(r'<a href="([^"]+)" data-testid="facet-confidence-medium"', html).group(1).replace("&amp;", "&")
    assert _rows(logged_in_client.get(link).get_data(as_text=True)) == [seeded.result_ids[3]]
    assert _rows(logged_in_client.get(base + "&confidence=unknown").get_data(as_text=True)) == [seeded.result_ids[2]]
    bad = logged_in_client.get(base + "&confidence=sure")
    assert bad.status_code == 400 and "Confidence must be one of" in bad.get_data(as_text=True)


def test_the_api_orders_filters_and_counts_by_confidence(client, auth, seeded):
    ids = seeded.result_ids
    got = client.get(f"/api/v1/results?scenario={seeded.scenario}&sort=uncertain", headers=auth).get_json()
    assert [r["result_id"] for r in got["results"]] == [ids[1], ids[3], ids[0], ids[2]]
    first = got["results"][0]
    assert first["model_confidence"] == 0.2 and first["model_field_confidence"] == {"sealed": 0.2, "finds": 0.99}
    assert got["results"][-1]["model_confidence"] is None and got["results"][-1]["model_field_confidence"] is None
    low = client.get(f"/api/v1/results?scenario={seeded.scenario}&confidence=low", headers=auth).get_json()
    assert [r["result_id"] for r in low["results"]] == [ids[1]]
    facets = client.get(f"/api/v1/results/facets?scenario={seeded.scenario}", headers=auth).get_json()
    assert {f["band"]: f["count"] for f in facets["confidence"]} == {
        "low": 1, "medium": 1, "high": 1, "certain": 0, "unknown": 1}
    assert client.get(f"/api/v1/results?confidence=maybe", headers=auth).status_code == 400


def test_every_export_carries_the_confidences(logged_in_client, seeded):
    import pyarrow.parquet as pq

    q = f"scenario={seeded.scenario}&sort=uncertain"
    rows = list(csv.DictReader(io.StringIO(
        logged_in_client.get(f"/results/export.csv?{q}").get_data(as_text=True).lstrip("\ufeff"))))
    assert [r["model_confidence"] for r in rows] == ["0.2", "0.6", "0.95", ""]
    assert json.loads(rows[0]["model_field_confidence"]) == {"finds": 0.99, "sealed": 0.2}
    lines = [json.loads(x) for x in logged_in_client.get(f"/results/export.jsonl?{q}").get_data(as_text=True).splitlines()]
    assert [x["model_confidence"] for x in lines] == [0.2, 0.6, 0.95, None]
    table = pq.read_table(io.BytesIO(logged_in_client.get(f"/results/export.parquet?{q}").data)).to_pylist()
    assert [r["model_confidence"] for r in table] == [0.2, 0.6, 0.95, None]


def test_calibration_on_the_scenarios_page_and_in_the_api(logged_in_client, client, auth, database):
    right, wrong = ANSWER, {"sealed": False, "finds": []}
    seeded = seed_structured([ANSWER] * 3, review_states=["approved", "edited", "approved"],
                             confidences=CONFIDENCES[:2] + [CONFIDENCES[3]])
    from vidlora.db import session_scope
    from vidlora.models import Result

    with session_scope() as session:
        session.get(Result, seeded.result_ids[1]).edited_parsed = wrong
    assert right != wrong
    api = client.get(f"/api/v1/scenarios/{seeded.scenario}/calibration", headers=auth).get_json()
    [version] = api["versions"]
    assert version["answers"]["count"] == 3 and version["answers"]["right"] == 2 and version["sources"] == {"reviews": 3}
    # bins: 0.2 wrong; 0.6 right; 0.95 right -> ECE = (0.2 + 0.4 + 0.05) / 3
    assert version["answers"]["ece"] == pytest.approx(0.65 / 3, abs=1e-4)
    page = logged_in_client.get("/scenarios/").get_data(as_text=True)
    table = page.split(f'data-testid="calibration-{seeded.scenario}"')[1].split("</table>")[0]
    assert 'data-version="digest-abc"' in table and "21.7 %" in table and table.count("<tr data-low=") == 3
    missing = client.get("/api/v1/scenarios/no_such_scenario/calibration", headers=auth)
    assert missing.status_code == 404


def test_the_review_page_tells_the_measured_certainty_from_the_answers_confidence_field(logged_in_client):
    """Issue 58: "How sure the model was 54 %" sat beside the answer's own "Confidence 0.9"
    with nothing telling them apart, and a list's figure did not say it was its weakest item."""
    from tests.support.structured import seed_structured

    seeded = seed_structured([{"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.9}]}],
                             confidences=[{"sealed": 0.99, "finds": 0.54}])
    page = logged_in_client.get(f"/review/results/{seeded.result_ids[0]}").get_data(as_text=True)
    explained = page.split('data-testid="certainty-explained">')[1].split("</p>")[0]
    assert "token probabilities" in explained and "not a field of the answer" in explained
    assert "least certain item" in explained


CHAMBERS = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.9,
                                       "decoration": "<img src=x onerror=alert(1)>"},
                                      {"material": "jade", "period": "tang", "confidence": 0.9},
                                      {"material": "ceramic", "period": "han", "confidence": 0.9}]}


def test_the_review_page_says_which_item_of_a_list_the_model_doubted(logged_in_client):
    """Issue 58: "an answer whose one field is a list says only that the list was doubtful, not
    which item". Through the worker's measuring and the store task, each find has its own
    figure on the review page, in the answer's order, the doubtful one marked; the API carries
    the same figures by the form's path."""
    from tests.support.structured import seed_structured
    from tests.support.worker_confidence import store_measured

    seeded = seed_structured([None])  # an analysis running on a GPU worker
    rid = store_measured(seeded.analysis_ids[0], CHAMBERS, "tang")
    page = logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True)
    section = page.split('data-testid="confidences"')[1].split("</section>")[0]

    finds = section.split('data-testid="field-confidence-finds"')[1]
    assert finds.split("</span>")[0].endswith(">30 %")  # the list: its least certain item, as before
    items = re.findall(r'<li data-testid="field-confidence-(finds/\d)" data-path="[^"]+"( class="doubtful")?', section)
    assert items == [("finds/0", ""), ("finds/1", ' class="doubtful"'), ("finds/2", "")]
    second = section.split('data-testid="field-confidence-finds/1"')[1]
    assert re.match(r'[^<]*>\s*Find 2\s', second) and ">30 %</span>" in second.split("<ul")[0]
    assert 'data-testid="check-finds/1"' in second.split("<ul")[0]
    period = second.split('data-testid="field-confidence-finds/1/period"')[1].split("</li>")[0]
    assert "period" in period and "“tang”" in period and ">30 %</span>" in period and "check" in period
    material = second.split('data-testid="field-confidence-finds/1/material"')[1].split("</li>")[0]
    assert ">99 %</span>" in material and "check" not in material
    first = section.split('data-testid="field-confidence-finds/0"')[1].split("<ul")[0]
    assert ">99 %</span>" in first and "check" not in first
    assert "(1 to check)" in finds.split("<ul")[0]
    decoration = section.split('data-testid="field-confidence-finds/0/decoration"')[1].split("</li>")[0]
    assert "“&lt;img src=x onerror=alert(1)&gt;”" in decoration and "<img" not in section  # model text, escaped
    explained = page.split('data-testid="certainty-explained">')[1].split("</p>")[0]
    assert "each item has its own figure" in explained and "below 90 %" in explained

    row = logged_in_client.get(f"/api/v1/results/{rid}").get_json()
    figures = row["model_field_confidence"]
    assert figures["finds"] == pytest.approx(0.3) and figures["finds/1"] == pytest.approx(0.3)
    assert figures["finds/1/period"] == pytest.approx(0.3) and figures["finds/0"] == pytest.approx(0.995)
    assert figures["finds/2/material"] == pytest.approx(0.995)


def test_an_answer_stored_before_items_were_measured_still_shows_its_fields(logged_in_client):
    from tests.support.structured import seed_structured

    seeded = seed_structured([CHAMBERS], confidences=[{"sealed": 0.99, "finds": 0.54}])
    page = logged_in_client.get(f"/review/results/{seeded.result_ids[0]}").get_data(as_text=True)
    section = page.split('data-testid="confidences"')[1].split("</section>")[0]
    assert 'data-testid="field-confidence-finds"' in section and "field-confidence-finds/" not in section
    assert "stored before items were measured one by one: check each item" in section

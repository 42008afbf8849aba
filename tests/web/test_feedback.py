"""The feedback loop in the web app: reviewers mark gold on the result page, the Scenarios
page shows agreement per adapter version and the gold set, and the API serves both."""

from __future__ import annotations

import base64

import pytest

from tests.support.structured import seed_structured
from tests.support.web import PASSWORD
from vidlora.db import session_scope
from vidlora.models import Result

BRONZE = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8,
                                     "decoration": "<script>alert(1)</script>"}]}
JADE = {"sealed": True, "finds": [{"material": "jade", "period": "han", "confidence": 0.8}]}


@pytest.fixture()
def reviewed(database):
    """Four results of one version: approved, edited (bronze -> jade), rejected, unreviewed."""
    from web.review.actions import apply_review

    seeded = seed_structured([BRONZE] * 4)
    with session_scope() as session:
        for rid, action, fields in zip(seeded.result_ids, ("approve", "edit", "reject"), (None, JADE, None)):
            result = session.get(Result, rid)
            apply_review(session, result, action, None, fields=fields, version=result.review_version)
    return seeded


def test_a_reviewer_marks_a_reviewed_result_gold_and_back(logged_in_client, reviewed):
    approved, _, rejected, _ = reviewed.result_ids
    page = logged_in_client.get(f"/review/results/{approved}").get_data(as_text=True)
    assert f'data-testid="gold-add-{approved}"' in page
    response = logged_in_client.post(f"/review/results/{approved}/gold", data={"gold": "1", "csrf_token": logged_in_client.csrf})
    assert response.status_code == 303
    page = logged_in_client.get(f"/review/results/{approved}").get_data(as_text=True)
    assert "Held out of training" in page and f'data-testid="gold-remove-{approved}"' in page
    gold_page = logged_in_client.get(f"/scenarios/{reviewed.scenario}/gold").get_data(as_text=True)
    assert f'data-result="{approved}"' in gold_page

    # a rejected result has no answer to be gold; the page says why
    page = logged_in_client.get(f"/review/results/{rejected}").get_data(as_text=True)
    assert f"gold-add-{rejected}" not in page and "Approve or edit this result" in page
    response = logged_in_client.post(f"/review/results/{rejected}/gold", data={"gold": "1", "csrf_token": logged_in_client.csrf})
    assert response.status_code == 400 and "review it first" in response.get_data(as_text=True)

    logged_in_client.post(f"/review/results/{approved}/gold", data={"gold": "0", "csrf_token": logged_in_client.csrf})
    with session_scope() as session:
        assert session.get(Result, approved).gold_at is None

    # A gold answer that a later review rejects leaves the gold set (it has no answer to test against).
    logged_in_client.post(f"/review/results/{approved}/gold", data={"gold": "1", "csrf_token": logged_in_client.csrf})
    with session_scope() as session:
        version = session.get(Result, approved).review_version
    logged_in_client.post(f"/review/results/{approved}", data={"action": "reject", "version": str(version),
                                                               "csrf_token": logged_in_client.csrf})
    page = logged_in_client.get(f"/review/results/{approved}").get_data(as_text=True)
    assert "Held out of training" not in page
    gold_page = logged_in_client.get(f"/scenarios/{reviewed.scenario}/gold").get_data(as_text=True)
    assert f'data-result="{approved}"' not in gold_page


def test_the_scenarios_page_shows_agreement_per_version(logged_in_client, reviewed):
    page = logged_in_client.get("/scenarios/").get_data(as_text=True)
    assert f'data-testid="agreement-{reviewed.scenario}"' in page
    section = page.split(f'data-testid="agreement-{reviewed.scenario}"')[1].split("</table>")[0]
    assert 'data-version="digest-abc" data-reviewed="3"' in section
    assert 'data-rate="approved">1 · 33 %' in section
    fields = page.split(f'data-testid="field-accuracy-{reviewed.scenario}"')[1].split("</table>")[0]
    material = fields.split('data-field="finds.material"')[1].split("</tr>")[0]
    assert 'data-right="1" data-of="2"' in material
    assert f'data-testid="gold-count-{reviewed.scenario}"' in page


def test_the_api_serves_agreement_and_the_gold_set(client, reviewer, reviewed):
    auth = {"Authorization": "Basic " + base64.b64encode(f"{reviewer}:{PASSWORD}".encode()).decode()}
    approved, edited, rejected, _ = reviewed.result_ids
    body = client.get(f"/api/v1/scenarios/{reviewed.scenario}/agreement", headers=auth).json
    (version,) = body["versions"]
    assert version["version"] == "digest-abc" and version["edited"]["count"] == 1 and version["unreviewed"] == 1
    assert client.get(f"/api/v1/scenarios/{reviewed.scenario}/agreement?version=zzz", headers=auth).json["versions"] == []
    assert client.get("/api/v1/scenarios/nope/agreement", headers=auth).status_code == 404

    marked = client.post(f"/api/v1/results/{edited}/gold", json={"gold": True}, headers=auth)
    assert marked.status_code == 200 and marked.json["gold"] is True
    refused = client.post(f"/api/v1/results/{rejected}/gold", json={"gold": True}, headers=auth)
    assert refused.status_code == 400 and "review it first" in refused.json["detail"]
    assert client.post(f"/api/v1/results/{edited}/gold", json={"gold": "yes"}, headers=auth).status_code == 400
    gold = client.get(f"/api/v1/scenarios/{reviewed.scenario}/gold", headers=auth).json["gold"]
    assert [g["result_id"] for g in gold] == [edited] and gold[0]["fields"] == JADE


def test_the_scenarios_page_shows_a_candidate_beside_the_stored_answers(logged_in_client, reviewed, tmp_path):
    """The candidate's answers as its gold run leaves them; model text is escaped."""
    from vidlora.feedback.gold import set_gold
    from vidlora.models import AdapterRelease, Scenario, utcnow

    approved, edited, _, _ = reviewed.result_ids
    candidate = {"sealed": True, "finds": [{"material": "jade", "period": "han", "confidence": 0.8,
                                            "decoration": "<img src=x onerror=alert(1)>"}]}
    with session_scope() as session:
        for rid in (approved, edited):
            set_gold(session.get(Result, rid), True, None)
        scenario = session.query(Scenario).filter_by(name=reviewed.scenario).one()
        session.add(AdapterRelease(scenario_id=scenario.id, version="cafe0123456789ab", path=str(tmp_path),
                                   status="candidate", gold_run_at=utcnow(), gold_answers={
                                       str(approved): {"text": "", "parsed": BRONZE},
                                       str(edited): {"text": "", "parsed": candidate}}))
    versions = logged_in_client.get(f"/api/v1/scenarios/{reviewed.scenario}/versions").json["versions"]
    assert [(v["version"], v["status"]) for v in versions] == [("cafe0123456789ab", "candidate")]
    assert versions[0]["comparison"]["answers_right"]["candidate"]["of"] == 2
    assert [c["result_id"] for c in versions[0]["comparison"]["changed"]] == [edited]

    page = logged_in_client.get("/scenarios/").get_data(as_text=True)
    section = page.split(f'data-testid="candidate-{reviewed.scenario}-cafe01234567"')[1].split("</section>")[0]
    whole = section.split('data-field="*"')[1].split("</tr>")[0]
    assert "<td>1 / 2</td><td>1 / 2</td>" in whole  # the candidate fixes the material, invents a decoration
    material = section.split('data-field="finds.material"')[1].split("</tr>")[0]
    assert "<td>1 / 2</td><td>2 / 2</td>" in material
    changed = section.split(f'data-testid="changed-{reviewed.scenario}"')[1]
    assert f'data-result="{edited}"' in changed and f'data-result="{approved}"' not in changed
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in changed
    gate = section.split(f'data-testid="gate-{reviewed.scenario}-cafe01234567"')[1].split("</p>")[0]
    assert "Ready to serve" in gate and versions[0]["promotable"] is True


def test_the_scenarios_page_says_why_promote_refuses_a_candidate(logged_in_client, reviewed, tmp_path):
    """A candidate whose adapter the engine refused on the gold set: the page says so in words,
    with the engine's reason (escaped: it names the adapter), and the API carries the same."""
    from vidlora.feedback.gold import set_gold
    from vidlora.models import AdapterRelease, Scenario, utcnow

    approved, edited, _, _ = reviewed.result_ids
    why = "adapter '<b>x</b>' refused: adapter changes nothing (max logprob change 0.00015): modules not placed?"
    with session_scope() as session:
        for rid in (approved, edited):
            set_gold(session.get(Result, rid), True, None)
        scenario = session.query(Scenario).filter_by(name=reviewed.scenario).one()
        session.add(AdapterRelease(scenario_id=scenario.id, version="dead0123456789ab", path=str(tmp_path),
                                   status="candidate", gold_run_at=utcnow(), gold_answers={
                                       str(rid): {"text": "", "parsed": None, "error": why} for rid in (approved, edited)}))
    [version] = logged_in_client.get(f"/api/v1/scenarios/{reviewed.scenario}/versions").json["versions"]
    assert version["promotable"] is False and version["gold_run"]["refused"] == 2
    assert version["comparison"]["candidate_answered"] == 0

    page = logged_in_client.get("/scenarios/").get_data(as_text=True)
    section = page.split(f'data-testid="candidate-{reviewed.scenario}-dead01234567"')[1].split("</section>")[0]
    assert "answered 0 of 2 gold videos; 2 refused: adapter changes nothing (max logprob change 0.00015)" in section
    gate = section.split(f'data-testid="gate-{reviewed.scenario}-dead01234567"')[1].split("</div>")[0]
    assert "Promote refuses it" in gate and "2 refused: adapter changes nothing" in gate
    changed = section.split(f'data-testid="changed-{reviewed.scenario}"')[1]
    assert "No answer (refused: adapter changes nothing" in changed and "None" not in changed


def test_confidence_is_shown_calibrated_per_adapter_version_once_enough_answers_are_reviewed(logged_in_client):
    """Issue 61: a version whose "95 %" answers are right half the time. Below the minimum count
    its confidence is shown as the model gave it; the review that reaches it refits the map, and
    the result's calibrated confidence says about 50 %, with the map's error on answers it was
    not fitted on under 5 % (the raw confidence's: 45 %)."""
    from vidlora.config import get_settings
    from web.review.actions import apply_review

    need = get_settings().calibration_min_answers
    seeded = seed_structured([BRONZE] * (need + 1), confidences=[{"sealed": 0.95, "finds": 0.95}] * (need + 1))
    with session_scope() as session:
        for i, rid in enumerate(seeded.result_ids[:-2]):  # every other answer corrected
            result = session.get(Result, rid)
            apply_review(session, result, "edit" if i % 2 else "approve", None, fields=JADE if i % 2 else None,
                         version=result.review_version)
    last, extra = seeded.result_ids[-2:]
    shown = logged_in_client.get(f"/api/v1/results/{last}").json
    assert shown["model_confidence"] == 0.95 and shown["calibrated_confidence"] is None
    [cal] = logged_in_client.get(f"/api/v1/scenarios/{seeded.scenario}/calibration").json["versions"]
    assert cal["calibrated"]["applies"] is False and cal["calibrated"]["count"] == need - 1
    page = logged_in_client.get("/scenarios/").get_data(as_text=True)
    mine = page.split(f'data-testid="calibration-{seeded.scenario}"')[1].split("</caption>")[0]
    assert f"Shown as the model gave it until {need} answers are reviewed ({need - 1} so far)" in mine

    def approve(rid: int, action: str = "approve", fields=None) -> None:
        etag = logged_in_client.get(f"/api/v1/results/{rid}").headers["ETag"]
        response = logged_in_client.post(f"/api/v1/results/{rid}/review", json={"action": action, "fields": fields},
                                         headers={"X-CSRFToken": logged_in_client.csrf, "If-Match": etag})
        assert response.status_code == 200, response.json

    approve(last)  # the review that reaches the minimum: the map applies from it on
    shown = logged_in_client.get(f"/api/v1/results/{last}").json
    assert shown["calibrated_confidence"] == pytest.approx(0.5, abs=0.03)
    approve(extra, "edit", JADE)  # one more: enough to measure it on answers it was not fitted on
    [cal] = logged_in_client.get(f"/api/v1/scenarios/{seeded.scenario}/calibration").json["versions"]
    assert cal["calibrated"]["applies"] and cal["answers"]["ece"] > 0.4
    assert cal["calibrated"]["ece_held_out"] <= 0.05
    # Beside it, what chance alone gives on that many answers: a perfect map's error.
    assert 0.0 < cal["calibrated"]["ece_floor"] < 0.1
    page = logged_in_client.get("/scenarios/").get_data(as_text=True)
    mine = page.split(f'data-testid="calibration-{seeded.scenario}"')[1].split("</caption>")[0]
    assert "Shown calibrated: expected calibration error" in mine and "not fitted on" in mine
    assert f"(chance alone gives about {100 * cal['calibrated']['ece_floor']:.1f} % on this many answers)" in mine


def test_a_scenario_card_reads_in_plain_words_with_the_machine_detail_folded(logged_in_client):
    """Issue 58: "The Scenarios cards are full of machine detail (adapter digests,
    max_tokens=1024, CLI commands)". The card shows what the scenario is, its frames, who holds
    it, its gold set, agreement and calibration in words; digests, settings and commands sit in
    its technical details, closed until opened."""
    import re

    from sqlalchemy import select

    from tests.support.visible_text import shown_text
    from vidlora.models import AdapterRelease, Scenario
    from web.review.actions import apply_review

    serving, candidate = "3f9a61c2d0b47e15" * 4, "d41e9b7702c5aa01" * 4
    seeded = seed_structured([BRONZE] * 3, confidences=[{"sealed": 0.9, "finds": 0.8}] * 3)
    with session_scope() as session:
        scenario = session.scalar(select(Scenario).where(Scenario.name == seeded.scenario))
        scenario.adapter_path, scenario.adapter_version, scenario.adapter_status = "adapters/catalogue", serving, "ok"
        scenario.generation = {"max_tokens": 1024, "temperature": 0.0}
        for rid, action, fields in zip(seeded.result_ids, ("approve", "edit", "reject"), (None, JADE, None)):
            result = session.get(Result, rid)
            result.adapter_version = serving
            apply_review(session, result, action, None, fields=fields, version=result.review_version)
        session.add(AdapterRelease(scenario_id=scenario.id, version=candidate, path="adapters/catalogue-2",
                                   status="candidate", note="retrained on 200 more finds"))

    page = logged_in_client.get("/scenarios/").get_data(as_text=True)
    card = page.split(f'data-testid="scenario-card-{seeded.scenario}"')[1].split("</article>")[0]
    shown = shown_text("<div " + card)
    assert re.search(r"[0-9a-f]{12}", shown) is None, shown
    assert "max_tokens" not in shown and "temperature=" not in shown and "vidlora " not in shown, shown
    assert "registration" not in shown and "adapters/catalogue" not in shown and seeded.scenario not in shown, shown
    # What a reviewer reads stays in view.
    for words in (seeded.scenario.replace("catalogue_", "Catalogue "), "Held by", "Frames", "Gold set: 0 results",
                  "Reviewer agreement", "Calibration", "serving version",
                  "New version, not serving yet", "retrained on 200 more finds", "Not yet run on the gold set",
                  "Technical details"):
        assert words in shown, words
    # Each part is there: agreement, calibration, the candidate, the technical details ...
    for testid in ("agreement", "calibration", f"candidate-{seeded.scenario}-{candidate[:12]}", "technical"):
        assert f'data-testid="{testid}' in card, testid
    # ... and the detail is one click away, in the card's technical details.
    technical = card.split(f'data-testid="technical-{seeded.scenario}"')[1].split("</details>")[0]
    assert serving in technical and "max_tokens=1024" in technical and "registration: " in technical
    assert f"vidlora gold export {seeded.scenario} --out DIR" in technical
    candidate_detail = card.split(f'data-testid="candidate-technical-{seeded.scenario}-{candidate[:12]}"')[1]
    assert f"vidlora eval {seeded.scenario} --compare {candidate[:12]}" in candidate_detail.split("</details>")[0]
    # The gold set's page too: the export command folded, its versions in words.
    gold = logged_in_client.get(f"/scenarios/{seeded.scenario}/gold").get_data(as_text=True)
    gold_shown = shown_text(gold.split("<main>")[1])
    assert "vidlora " not in gold_shown and "Technical details" in gold_shown

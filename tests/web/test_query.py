from __future__ import annotations

import csv
import io
import json
import re
import uuid
from datetime import date, timedelta

from sqlalchemy import text

from tests.support.web import review_version
from vidlora.db import session_scope
from vidlora.models import Analysis

XSS = "<script>alert(1)</script><b>x</b>"


def _word() -> str:
    return "zq" + uuid.uuid4().hex[:10]


def test_results_page(logged_in_client, factory):
    word = _word()
    made = factory.batch({"artifact_identification": f"amphora {word}", "tomb_structure": None})
    html = logged_in_client.get(f"/results/?batch={made.batch_id}").get_data(as_text=True)
    assert 'data-testid="filter-form"' in html and 'data-testid="export-csv"' in html
    assert f"amphora {word}" in html
    assert html.count("data-analysis-id=") == 2
    assert f'href="/results/export.csv?batch={made.batch_id}"' in html


def test_filters(logged_in_client, factory):
    made = factory.batch({"artifact_identification": "one", "tomb_structure": None, "murals_inscriptions": "three"},
                         review_state="approved")
    base = f"/results/?batch={made.batch_id}"
    count = lambda q: logged_in_client.get(base + q).get_data(as_text=True).count("data-analysis-id=")  # noqa: E731
    assert count("") == 3
    assert count("&scenario=tomb_structure") == 1
    assert count("&status=done") == 2
    assert count("&status=running") == 1
    assert count("&review_state=approved") == 2
    assert count("&review_state=rejected") == 0
    today = date.today()
    assert count(f"&date_from={today - timedelta(days=1)}&date_to={today + timedelta(days=1)}") == 3
    assert count(f"&date_from={today + timedelta(days=2)}") == 0


def test_bad_filters(logged_in_client, database):
    for query in ("status=exploded", "review_state=maybe", "batch=abc", "date_from=yesterday",
                  "date_from=2026-02-01&date_to=2026-01-01", "q=" + "x" * 600):
        response = logged_in_client.get("/results/?" + query)
        assert response.status_code == 400, query
        assert b'data-testid="filter-error"' in response.data
    assert logged_in_client.get("/results/export.csv?status=exploded").status_code == 400


def test_full_text_search_finds_a_word(logged_in_client, factory):
    word = _word()
    made = factory.batch({"artifact_identification": f"Fragments of a {word} near the threshold.",
                          "tomb_structure": "A vaulted chamber."})
    html = logged_in_client.get(f"/results/?q={word}").get_data(as_text=True)
    assert html.count("data-analysis-id=") == 1 and word in html
    # stemming: the plural form finds the singular
    html = logged_in_client.get(f"/results/?q=vaulted+chambers&batch={made.batch_id}").get_data(as_text=True)
    assert html.count("data-analysis-id=") == 1
    # web-search syntax: exclusion
    html = logged_in_client.get(f"/results/?q=chamber+-vaulted&batch={made.batch_id}").get_data(as_text=True)
    assert html.count("data-analysis-id=") == 0


def test_search_uses_edited_text(logged_in_client, factory):
    word = _word()
    rid = factory.batch({"artifact_identification": "plain"}).result_ids["artifact_identification"]
    logged_in_client.post(f"/review/results/{rid}", data={"csrf_token": logged_in_client.csrf, "action": "edit",
                                                          "version": review_version(logged_in_client, rid),
                                                          "text": f"corrected {word}"})
    assert f'data-result-id="{rid}"' in logged_in_client.get(f"/results/?q={word}").get_data(as_text=True)


def test_search_can_use_the_gin_index(database):
    from vidlora.results.query import ResultFilters, build_query

    stmt = build_query(ResultFilters(q="amphora"), postgres=True)
    with session_scope() as session:
        session.execute(text("SET LOCAL enable_seqscan = off"))
        sql = str(stmt.compile(session.get_bind(), compile_kwargs={"literal_binds": True}))
        plan = [row[0] for row in session.connection().exec_driver_sql("EXPLAIN " + sql)]
    assert any("ix_result_fts" in line for line in plan), plan


def test_a_name_search_can_use_the_trigram_indexes(database):
    """A word of a file or batch member name is found from the names' trigram indexes
    (migration 0017), not by testing every video's names (seconds at 100k videos)."""
    from vidlora.results.query import ResultFilters, build_query

    stmt = build_query(ResultFilters(q="Ölgefäß"), postgres=True)
    with session_scope() as session:
        session.execute(text("SET LOCAL enable_seqscan = off"))
        sql = str(stmt.compile(session.get_bind(), compile_kwargs={"literal_binds": True}))
        plan = "\n".join(row[0] for row in session.connection().exec_driver_sql("EXPLAIN " + sql))
    assert "ix_video_original_name_trgm" in plan and "ix_batch_item_name_trgm" in plan, plan


def test_results_page_escapes_model_output(logged_in_client, factory):
    made = factory.batch({"artifact_identification": XSS})
    html = logged_in_client.get(f"/results/?batch={made.batch_id}").get_data(as_text=True)
    assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;" in html


def test_pagination_keeps_filters(logged_in_client, factory, app, monkeypatch):
    made = factory.batch({"artifact_identification": "a", "tomb_structure": "b", "murals_inscriptions": "c"})
    monkeypatch.setitem(app.config, "PAGE_SIZE", 2)
    first = logged_in_client.get(f"/results/?batch={made.batch_id}").get_data(as_text=True)
    assert first.count("data-analysis-id=") == 2 and "1–2 of 3" in first
    assert f"batch={made.batch_id}" in first.split('rel="next"')[0].rsplit("href=", 1)[1]
    second = logged_in_client.get(f"/results/?batch={made.batch_id}&page=2").get_data(as_text=True)
    assert second.count("data-analysis-id=") == 1


def test_csv_export(logged_in_client, factory):
    made = factory.batch({"artifact_identification": "=HYPERLINK(\"http://x\")", "tomb_structure": None},
                         video_name="Grab 7 – Süd.mp4")
    response = logged_in_client.get(f"/results/export.csv?batch={made.batch_id}")
    assert response.status_code == 200 and response.mimetype == "text/csv"
    assert "attachment" in response.headers["Content-Disposition"]
    body = response.get_data(as_text=True)
    assert body.startswith("\ufeff")
    rows = list(csv.DictReader(io.StringIO(body.lstrip("\ufeff"))))
    assert len(rows) == 2
    by_scenario = {r["scenario"]: r for r in rows}
    done = by_scenario["artifact_identification"]
    assert done["text"] == "'=HYPERLINK(\"http://x\")"  # neutralised for spreadsheets
    assert done["video_name"] == "Grab 7 – Süd.mp4" and done["prompt_tokens"] == "1200"
    assert json.loads(done["health"])["schema_ok"] is True
    assert by_scenario["tomb_structure"]["status"] == "running" and by_scenario["tomb_structure"]["text"] == ""


def test_export_carries_the_review_the_batch_the_video_and_health_as_columns(logged_in_client, factory, reviewer):
    """Issue 19: an export is a catalogue someone can audit without the database."""
    made = factory.batch({"artifact_identification": "A fibula."}, name="Trench 9", video_name="t9.mp4")
    rid = made.result_ids["artifact_identification"]
    logged_in_client.post(f"/review/results/{rid}", data={"csrf_token": logged_in_client.csrf, "action": "edit",
                                                          "version": review_version(logged_in_client, rid),
                                                          "text": "A bronze fibula.", "note": "checked the register"})
    body = logged_in_client.get(f"/results/export.csv?batch={made.batch_id}").get_data(as_text=True)
    [row] = list(csv.DictReader(io.StringIO(body.lstrip("\ufeff"))))
    assert row["reviewed_by"] == reviewer and row["reviewed_at"] and row["review_note"] == "checked the register"
    assert row["final_text"] == "A bronze fibula." and row["text"] == "A fibula." and row["review_state"] == "edited"
    assert (row["batch_id"], row["batch_name"]) == (str(made.batch_id), "Trench 9")
    assert (row["video_name"], row["video_duration_s"], row["video_width"], row["video_codec"]) == ("t9.mp4", "12.5", "64", "h264")
    assert len(row["video_sha256"]) == 64
    assert (row["health_verdict"], row["health_ok"], row["health_schema_ok"], row["health_engine_runs"]) == \
        ("healthy", "true", "true", "1")
    jsonl = json.loads(logged_in_client.get(f"/results/export.jsonl?batch={made.batch_id}").get_data(as_text=True))
    assert jsonl["health_ok"] is True and jsonl["video_width"] == 64 and jsonl["review_note"] == "checked the register"


def test_jsonl_export(logged_in_client, factory):
    made = factory.batch({"artifact_identification": XSS, "murals_inscriptions": "An inscription."})
    response = logged_in_client.get(f"/results/export.jsonl?batch={made.batch_id}&status=done")
    assert response.status_code == 200 and response.mimetype == "application/x-ndjson"
    rows = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    assert {r["scenario"]: r["text"] for r in rows} == {"artifact_identification": XSS,
                                                         "murals_inscriptions": "An inscription."}
    assert all(r["final_text"] == r["text"] and r["review_state"] == "unreviewed" for r in rows)


def test_export_with_search(logged_in_client, factory):
    word = _word()
    factory.batch({"artifact_identification": f"a {word}"})
    rows = logged_in_client.get(f"/results/export.jsonl?q={word}").get_data(as_text=True).splitlines()
    assert len(rows) == 1 and word in rows[0]


def test_date_filter_boundaries(logged_in_client, factory):
    made = factory.batch()
    with session_scope() as session:
        analysis = session.get(Analysis, made.analysis_ids["artifact_identification"])
        analysis.created_at = analysis.created_at.replace(year=2020, month=3, day=15, hour=23)
    url = f"/results/?batch={made.batch_id}&date_from=2020-03-15&date_to=2020-03-15"
    assert logged_in_client.get(url).get_data(as_text=True).count("data-analysis-id=") == 1
    url = f"/results/?batch={made.batch_id}&date_from=2020-03-16"
    assert logged_in_client.get(url).get_data(as_text=True).count("data-analysis-id=") == 0


# -- structured results: facets, field conditions, exports (issue 15) -----------------------

CATALOGUE_ANSWERS = [
    {"sealed": False, "finds": [{"material": "bronze", "period": "han", "confidence": 0.9}]},
    {"sealed": True, "finds": [{"material": "jade", "period": "han", "confidence": 0.5}]},
    {"sealed": True, "finds": [{"material": "bronze", "period": "tang", "confidence": 0.3}], "damage": ["water"]},
]


def test_facets_show_counts_and_link_to_their_condition(logged_in_client, database):
    from tests.support.structured import seed_structured

    seeded = seed_structured(CATALOGUE_ANSWERS)
    html = logged_in_client.get(f"/results/?scenario={seeded.scenario}").get_data(as_text=True)
    assert 'data-testid="facets"' in html and 'data-testid="filter-where"' in html
    bronze = re.search(r'<a href="([^"]+)" data-testid="facet-finds.material=bronze" data-count="(\d+)"', html)
    assert bronze and bronze.group(2) == "2"
    page = logged_in_client.get(bronze.group(1).replace("&amp;", "&")).get_data(as_text=True)
    assert page.count("data-analysis-id=") == 2 and 'data-condition="finds.material=bronze"' in page
    assert 'data-testid="facet-sealed=true" data-count="1"' in page  # counts follow the filter
    assert 'href="/results/export.parquet?scenario=' in page and "where=finds.material%3Dbronze" in page


def test_field_conditions_from_the_query_string(logged_in_client, database):
    from tests.support.structured import seed_structured

    seeded = seed_structured(CATALOGUE_ANSWERS)
    base = f"/results/?scenario={seeded.scenario}"
    count = lambda q: logged_in_client.get(base + q).get_data(as_text=True).count("data-analysis-id=")  # noqa: E731
    assert count("&where=material%3Dbronze&where=confidence%3E%3D0.5") == 1
    assert count("&where=sealed%3Dtrue") == 2
    assert count("&where=") == 3  # an empty condition box is no condition
    response = logged_in_client.get(base + "&where=colour%3Dred")
    assert response.status_code == 400 and "has no field" in response.get_data(as_text=True)
    assert logged_in_client.get("/results/export.csv?where=material%3Dbronze").status_code == 400


def test_items_and_parquet_downloads(logged_in_client, database):
    import pyarrow.parquet as pq

    from tests.support.structured import seed_structured

    seeded = seed_structured(CATALOGUE_ANSWERS)
    items = logged_in_client.get(f"/results/export.items.csv?scenario={seeded.scenario}&where=material%3Dbronze")
    assert items.status_code == 200 and "attachment" in items.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(items.get_data(as_text=True).lstrip("\ufeff"))))
    assert sorted(r["field.finds.material"] for r in rows if r["array"] == "finds") == ["bronze", "bronze"]
    parquet = logged_in_client.get(f"/results/export.parquet?scenario={seeded.scenario}")
    assert parquet.status_code == 200 and parquet.headers["Content-Disposition"].endswith(".parquet")
    table = pq.read_table(io.BytesIO(parquet.data))
    assert sorted(r["fields"]["finds"][0]["material"] for r in table.to_pylist()) == ["bronze", "bronze", "jade"]


def test_search_finds_file_and_batch_names_and_word_beginnings(logged_in_client, factory):
    """Issue 19: the search box finds a result by its video's file name or its batch's name,
    and words match as prefixes."""
    word = _word()
    by_file = factory.batch({"artifact_identification": "plain"}, video_name=f"{word}-trench.mp4")
    by_batch = factory.batch({"artifact_identification": "plain"}, name=f"Season {word}")
    by_text = factory.batch({"artifact_identification": f"an amphora{word}s by the wall"})

    def found(q: str) -> set[int]:
        html = logged_in_client.get("/results/", query_string={"q": q}).get_data(as_text=True)
        return {int(i) for i in re.findall(r'data-analysis-id="(\d+)"', html)}

    ids = lambda *made: {m.analysis_ids["artifact_identification"] for m in made}  # noqa: E731
    assert found(word) == ids(by_file, by_batch)
    assert found(f"{word}-trench") == ids(by_file)
    assert found(f"Season {word}") == ids(by_batch)
    assert found(f"amphora{word[:6]}") == ids(by_text)  # a word's beginning finds the text
    assert found(f"amphora{word[:6]} -wall") == set()  # web-search exclusion still works


def test_sort_page_size_and_jump(logged_in_client, factory):
    made = [factory.batch({"artifact_identification": "x"}, video_name=f"{name}.mp4", name=f"sort-{_word()}")
            for name in ("bravo", "alpha", "charlie")]
    batch_ids = [m.batch_id for m in made]
    ids = [m.analysis_ids["artifact_identification"] for m in made]

    def order(**args) -> list[int]:
        rows = []
        for b in batch_ids:
            html = logged_in_client.get("/results/", query_string={"batch": b, **args}).get_data(as_text=True)
            rows += [int(i) for i in re.findall(r'data-analysis-id="(\d+)"', html)]
        return rows

    assert order() == ids  # one per batch: the sort key must come from the whole list, see below
    everything = lambda sort: [int(i) for i in re.findall(  # noqa: E731
        r'data-analysis-id="(\d+)"', logged_in_client.get("/results/", query_string={
            "q": "sort-", "sort": sort, "per_page": 200}).get_data(as_text=True)) if int(i) in ids]
    assert everything("newest") == sorted(ids, reverse=True)
    assert everything("oldest") == sorted(ids)
    assert everything("name") == [ids[1], ids[0], ids[2]]  # alpha, bravo, charlie
    assert logged_in_client.get("/results/?sort=size").status_code == 400



def test_pages_first_last_and_jump_keep_the_filter(logged_in_client, factory, app, monkeypatch):
    tag = _word()
    ids = sorted(factory.batch({"artifact_identification": "x"}, video_name=f"{n}-{tag}.mp4")
                 .analysis_ids["artifact_identification"] for n in "abc")
    monkeypatch.setitem(app.config, "PAGE_SIZE", 1)
    page = lambda **a: logged_in_client.get("/results/", query_string={"q": tag, **a}).get_data(as_text=True)  # noqa: E731
    html = page(page=2)
    assert re.findall(r'data-analysis-id="(\d+)"', html) == [str(ids[1])]
    assert f'href="/results/?q={tag}&amp;page=1" data-testid="page-first"' in html
    assert f'href="/results/?q={tag}&amp;page=3" data-testid="page-last"' in html
    jump = html.split('data-testid="page-jump"')[1].split("</form>")[0]
    assert f'<input type="hidden" name="q" value="{tag}">' in jump and 'name="page" value="2" min="1" max="3"' in jump
    # an offered page size is the reader's choice; one not offered falls back to the default
    assert page(per_page=20).count("data-analysis-id=") == 3
    assert page(per_page=100000).count("data-analysis-id=") == 1


def test_review_queue_follows_the_lists_sort(logged_in_client, factory):
    tag = _word()
    made = [factory.batch({"artifact_identification": "x"}, video_name=f"{n}-{tag}.mp4") for n in ("b", "a", "c")]
    rids = [m.result_ids["artifact_identification"] for m in made]
    html = logged_in_client.get(f"/review/results/{rids[1]}",
                                query_string={"queue": "1", "q": tag, "sort": "name"}).get_data(as_text=True)
    assert 'data-testid="queue-position">1 of 3' in html
    assert f'/review/results/{rids[0]}?' in html.split('data-testid="queue-next"')[0].rsplit("<a", 1)[1]


def test_a_filter_error_keeps_the_form_and_offers_no_download(logged_in_client, database):
    """Issue 32: a bad condition reset the scenario to "all", dropped the condition box and
    left download links for the unfiltered list."""
    from tests.support.structured import seed_structured

    seeded = seed_structured([{"sealed": True, "finds": []}])
    response = logged_in_client.get(f"/results/?scenario={seeded.scenario}&where=colour%3Dred&q=amph")
    html = response.get_data(as_text=True)
    assert response.status_code == 400 and 'data-testid="filter-error"' in html
    assert f'<option value="{seeded.scenario}" selected>' in html and 'value="amph"' in html
    assert 'data-condition="colour=red"' in html  # the condition, to fix or remove
    assert 'data-testid="export-csv"' not in html


def test_a_page_past_the_end_shows_the_last_page(logged_in_client, factory):
    """Issue 32: "49999901-10040 of 10040"."""
    made = factory.batch({"artifact_identification": "a", "tomb_structure": "b", "murals_inscriptions": "c"})
    html = logged_in_client.get(f"/results/?batch={made.batch_id}&per_page=20&page=999999").get_data(as_text=True)
    assert "1–3 of 3" in html and html.count("data-analysis-id=") == 3


def test_to_review_opens_a_page_headed_to_review(logged_in_client):
    """The navigation's "To review" opened a page headed "Results" (issue 58)."""
    page = logged_in_client.get("/review/", follow_redirects=True).get_data(as_text=True)
    assert '<h1 data-testid="results-heading">To review</h1>' in page and "<title>To review" in page
    assert "the model's doubts first" in page
    plain = logged_in_client.get("/results/").get_data(as_text=True)
    assert '<h1 data-testid="results-heading">Results</h1>' in plain


def test_a_long_list_is_counted_without_reading_it(logged_in_client, monkeypatch):
    """At 100k results an exact count read every row (half a second and more per page): past
    COUNT_EXACT_UP_TO the page and the API say "about", from PostgreSQL's estimate, and the
    per-value counts wait for a narrower filter (issue 58)."""
    from tests.support.structured import seed_structured

    seeded = seed_structured([{"sealed": True, "finds": []}] * 5)
    monkeypatch.setattr("vidlora.results.query.COUNT_EXACT_UP_TO", 3)
    page = logged_in_client.get(f"/results/?scenario={seeded.scenario}").get_data(as_text=True)
    assert re.search(r"1–\d+ of about \d", page) and 'data-testid="counts-note"' in page
    monkeypatch.setattr("vidlora.results.query.COUNT_EXACT_UP_TO", 10)
    page = logged_in_client.get(f"/results/?scenario={seeded.scenario}").get_data(as_text=True)
    assert "1–5 of 5" in page and 'data-testid="counts-note"' not in page

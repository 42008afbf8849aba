"""The OpenAPI 3 description of /api/v1, written by hand (a test checks it covers every route)."""

from __future__ import annotations

from typing import Any

from vidlora.lifecycle import AnalysisStatus, ReleaseStatus, ReviewAction, ReviewState, values
from vidlora.results.query import CONFIDENCE_BANDS, SORTS
from web.review.actions import MAX_NOTE_CHARS, MAX_TEXT_CHARS


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict, description: str = "OK") -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERRORS = {
    "400": _json(_ref("Error"), "Bad request (the detail says what to fix)"),
    "401": _json(_ref("Error"), "Not signed in, or wrong credentials"),
    "403": _json(_ref("Error"), "Signed in by browser session but the CSRF token is missing or wrong"),
    "429": _json(_ref("Error"), "Too many wrong passwords for this account: wait Retry-After seconds"),
}
NOT_FOUND = {"404": _json(_ref("Error"), "No such object")}
ETAG = {"ETag": {"description": "The result's review version (\"v3\"): send it back in If-Match",
                 "schema": {"type": "string"}}}
IF_MATCH = {"name": "If-Match", "in": "header", "schema": {"type": "string"},
            "description": "The ETag of the result as you read it (GET /results/{result_id}). Required to "
                           "approve, reject or edit (428 without it); a note needs none. If the result was "
                           "reviewed since, nothing is applied: 409 with what changed and the new ETag. "
                           "Read as RFC 9110 says: weak tags (W/\"v3\") count, a list matches if any tag "
                           "does, * is the current version."}
VERSIONED = {
    "409": _json(_ref("Conflict"), "Reviewed by someone else since your If-Match: nothing applied"),
    "412": _json(_ref("Error"), "If-Match names only versions this result never had"),
    "428": _json(_ref("Error"), "No If-Match: say which version of the result you read"),
}
ID = lambda name: {"name": name, "in": "path", "required": True,  # noqa: E731
                   "schema": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1}}
PAGING = [
    {"name": "page", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1_000_000, "default": 1}},
    {"name": "per_page", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}},
]
RESULT_FILTERS = [  # an empty value is no filter (what a form sends for "any"): allowEmptyValue
    {"allowEmptyValue": True, "name": "scenario", "in": "query", "schema": {"type": "string"}, "description": "Scenario name"},
    {"allowEmptyValue": True, "name": "review_state", "in": "query", "schema": {"type": "string", "enum": list(values(ReviewState))}},
    {"allowEmptyValue": True, "name": "status", "in": "query", "schema": {"type": "string", "enum": list(values(AnalysisStatus))},
     "description": "Analysis status"},
    {"allowEmptyValue": True, "name": "batch", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
     "description": "Videos of this batch"},
    {"allowEmptyValue": True, "name": "date_from", "in": "query", "schema": {"type": "string", "format": "date"},
     "description": "Analyses created on or after this day (UTC)"},
    {"allowEmptyValue": True, "name": "date_to", "in": "query", "schema": {"type": "string", "format": "date"},
     "description": "Analyses created on or before this day (UTC)"},
    {"allowEmptyValue": True, "name": "q", "in": "query", "schema": {"type": "string", "maxLength": 500},
     "description": "Search: each word matches the (edited) result text as a word beginning, or the "
                    "video's file name or a batch name it came in; on the text, web-search syntax: "
                    "\"phrases\", or, -exclude"},
    {"allowEmptyValue": True, "name": "sort", "in": "query", "schema": {"type": "string", "enum": list(SORTS)},
     "description": "Order of the list; by default best match when searching, else newest first; "
                    "uncertain: the model's least certain answers first (unknown ones last)"},
    {"allowEmptyValue": True, "name": "confidence", "in": "query",
     "schema": {"type": "string", "enum": list(CONFIDENCE_BANDS)},
     "description": "Only answers whose model confidence is in this band: " + ", ".join(
         f"{k} ({v})" for k, v in CONFIDENCE_BANDS.items())},
    {"name": "where", "in": "query", "style": "form", "explode": True,
     "schema": {"type": "array", "maxItems": 20, "items": {"type": "string", "maxLength": 300}},
     "description": "Field conditions on a structured scenario's answers (needs scenario), repeatable, all "
                    "must hold: FIELD OP VALUE with OP one of = != > >= < <= ~ (contains); FIELD is the "
                    "path (finds.material) or a unique ending of it (material). On an array a condition "
                    "holds when any item meets it; conditions on one array hold for the same item."},
]

# Text filters may hold anything but NUL (PostgreSQL text cannot; the server answers 400).
NO_NUL = "^[^\u0000]*$"
for _param in RESULT_FILTERS:
    _schema = _param["schema"].get("items", _param["schema"])
    if _schema.get("type") == "string" and "enum" not in _schema and "format" not in _schema:
        _schema["pattern"] = NO_NUL

EXPORTS = [("csv", "CSV", "text/csv"), ("items.csv", "per-item CSV", "text/csv"),
           ("jsonl", "JSON Lines", "application/x-ndjson"), ("parquet", "Parquet", "application/vnd.apache.parquet")]

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "properties": {
        "error": {"type": "string"}, "detail": {"type": "string"}, "status": {"type": "integer"}}},
    "Analysis": {"type": "object", "properties": {
        "id": {"type": "integer"}, "scenario": {"type": "string"},
        "status": {"type": "string", "enum": list(values(AnalysisStatus))},
        "reason": {"type": "string", "nullable": True}, "attempts": {"type": "integer"}}},
    "BatchStatus": {"type": "object", "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}, "status": {"type": "string"},
        "state": {"type": "string", "enum": ["receiving files", "analysing", "finished", "finished with problems"],
                  "description": "Where the batch stands, in words"},
        "reason": {"type": "string", "nullable": True}, "scenarios": {"type": "array", "items": {"type": "string"}},
        "finished": {"type": "boolean"}, "uploads_pending": {"type": "integer"},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "videos": {"type": "array", "items": {"type": "object", "properties": {
            "id": {"type": "integer"}, "name": {"type": "string"}, "status": {"type": "string"},
            "reason": {"type": "string", "nullable": True}, "url": {"type": "string"},
            "thumb_url": {"type": "string"}, "analyses": {"type": "array", "items": _ref("Analysis")}}}},
        "rejected": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "reason": {"type": "string"}}}},
        "skipped": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "reason": {"type": "string"}}}}}},
    "ResultRow": {"type": "object", "description": "One analysis with its result, if any. "
                  "Texts are the model's untrusted output: escape before showing as HTML.",
                  "properties": {k: {"type": t, "nullable": True} for k, t in [
                      ("analysis_id", "integer"), ("result_id", "integer"), ("video_id", "integer"),
                      ("video_name", "string"), ("scenario", "string"), ("status", "string"),
                      ("reason", "string"), ("review_state", "string"), ("text", "string"),
                      ("edited_text", "string"), ("final_text", "string"), ("prompt_tokens", "integer"),
                      ("output_tokens", "integer"), ("latency_s", "number"), ("finish_reason", "string"),
                      ("model", "string"), ("adapter", "string"), ("adapter_version", "string"),
                      ("reviewed_by", "string"), ("reviewed_at", "string"), ("engine_versions", "object"),
                      ("frame_timestamps", "array"), ("health", "object"), ("fields", "object"),
                      ("model_fields", "object"), ("created_at", "string"), ("finished_at", "string")]}},
    "Review": {"type": "object", "properties": {
        "id": {"type": "integer"}, "action": {"type": "string", "enum": list(values(ReviewAction))},
        "version": {"type": "integer", "nullable": True, "description": "The result's review version it made"},
        "user": {"type": "string", "nullable": True}, "text": {"type": "string", "nullable": True},
        "note": {"type": "string", "nullable": True}, "created_at": {"type": "string", "format": "date-time"}}},
}
SCHEMAS["ResultRow"]["properties"]["frame_timestamps"]["items"] = {"type": "number"}
_RELIABILITY = {"type": "object", "properties": {
    "count": {"type": "integer"}, "right": {"type": "integer"},
    "ece": {"type": "number", "nullable": True, "description": "Expected calibration error (0: calibrated)"},
    "bins": {"type": "array", "items": {"type": "object", "properties": {
        k: {"type": "integer" if k == "count" else "number"}
        for k in ("low", "high", "count", "confidence", "accuracy", "gap")}}}}}
SCHEMAS["Calibration"] = {"type": "object", "properties": {
    "version": {"type": "string", "nullable": True},
    "sources": {"type": "object", "additionalProperties": {"type": "integer"},
                "description": "Answers per source: reviews, gold"},
    "answers": _RELIABILITY, "fields": _RELIABILITY,
    "calibrated": {"type": "object", "description": "The version's calibration map (isotonic, refitted on every "
                   "review): whether it applies yet, the answers it needs, its error on answers it was not fitted on",
                   "properties": {"applies": {"type": "boolean"}, "minimum": {"type": "integer"},
                                  "count": {"type": "integer"}, "folds": {"type": "integer"},
                                  "ece_held_out": {"type": "number", "nullable": True},
                                  "ece_floor": {"type": "number", "nullable": True,
                                                "description": "What a perfectly calibrated confidence shows on "
                                                "the same held-out answers, on average (chance alone): "
                                                "ece_held_out near it is all this many answers can tell"},
                                  "map": {"type": "object", "nullable": True}}}}}
SCHEMAS["ResultRow"]["properties"]["model_confidence"] = {
    "type": "number", "nullable": True, "minimum": 0, "maximum": 1,
    "description": "How sure the model was of the answer: its least certain field's confidence; null: unknown"}
SCHEMAS["ResultRow"]["properties"]["model_field_confidence"] = {
    "type": "object", "nullable": True, "additionalProperties": {"type": "number"},
    "description": ("Per top-level field of the answer, the probability of the model's weakest choice in its value; "
                    "also per list item and nested field, by the edit form's path (finds/0, finds/0/material) "
                    "for answers measured since issue 58")}
SCHEMAS["ResultRow"]["properties"]["fields"]["description"] = (
    "A structured scenario's answer as data: the reviewer's edit, else the model's (model_fields)")
SCHEMAS["ResultDetail"] = {"allOf": [_ref("ResultRow"), {"type": "object", "properties": {
    "review_version": {"type": "integer", "description": "Moves on with every review (the ETag)"},
    "calibrated_confidence": {"type": "number", "nullable": True, "minimum": 0, "maximum": 1,
                              "description": "model_confidence through its adapter version's calibration map: "
                                             "how often answers like it were right; null until the version has "
                                             "VIDLORA_CALIBRATION_MIN_ANSWERS reviewed answers with a confidence"},
    "reviews": {"type": "array", "items": _ref("Review")}}}]}
SCHEMAS["Conflict"] = {"allOf": [_ref("Error"), {"type": "object", "properties": {
    "etag": {"type": "string"}, "your_version": {"type": "integer"}, "review_version": {"type": "integer"},
    "changes": {"type": "array", "items": {"type": "object", "description": "A review made since your version; "
                "an edit says which fields (fields_changed) or what text (text_before, text_after) it changed"}},
    "result": _ref("ResultDetail")}}]}


_RATE = {"type": "object", "properties": {
    "count": {"type": "integer"}, "of": {"type": "integer"}, "rate": {"type": "number", "nullable": True},
    "ci95": {"type": "array", "nullable": True, "items": {"type": "number"}}}}
SCHEMAS["Agreement"] = {"type": "object", "properties": {
    "version": {"type": "string", "nullable": True}, "results": {"type": "integer"},
    "reviewed": {"type": "integer"}, "unreviewed": {"type": "integer"},
    "approved": _RATE, "edited": _RATE, "rejected": _RATE,
    "fields": {"type": "array", "items": {"type": "object", "properties": {
        "field": {"type": "string"}, "kind": {"type": "string"}, "results": {"type": "integer"},
        "right": {"type": "integer"}, "of": {"type": "integer"}, "rate": {"type": "number", "nullable": True},
        "ci95": {"type": "array", "nullable": True, "items": {"type": "number"}}}}}}}
SCHEMAS["ResultRow"]["properties"]["gold"] = {"type": "boolean", "nullable": True,
                                              "description": "Held out of training; new versions are tested on it"}
GOLD_REQUEST = {"type": "object", "required": ["gold"], "additionalProperties": False,
                "properties": {"gold": {"type": "boolean"}}}
SCENARIO_NAME = {"name": "name", "in": "path", "required": True,
                 "schema": {"type": "string", "minLength": 1, "maxLength": 64}}


_TEXT = {"type": "string", "nullable": True, "maxLength": MAX_TEXT_CHARS,
         "description": "Action edit, free-text scenario: the corrected text, different from the current one"}
_FIELDS = {"type": "object", "nullable": True,
           "description": "Action edit, structured scenario: the corrected answer, valid against its output schema"}


def _review_shape(actions: list[str], note: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "required": ["action", *required], "additionalProperties": False, "properties": {
        "action": {"type": "string", "enum": actions}, "note": note, "text": _TEXT, "fields": _FIELDS}}


# One shape per kind of action, so what each needs is in the document: a note needs its text.
# What an edit needs depends on the result (its scenario's schema, its current text): a wrong
# one is a 400 that says why.
REVIEW_REQUEST = {"oneOf": [
    _review_shape(["approve", "reject", "edit"], {"type": "string", "nullable": True, "maxLength": MAX_NOTE_CHARS}, []),
    _review_shape(["note"], {"type": "string", "maxLength": MAX_NOTE_CHARS, "pattern": "\\S"}, ["note"]),
]}


def _tus_header(name: str, schema: dict, description: str, required: bool = True) -> dict:
    return {"name": name, "in": "header", "required": required, "schema": schema, "description": description}


TUS_RESUMABLE = _tus_header("Tus-Resumable", {"type": "string", "enum": ["1.0.0"]}, "The tus version (412 otherwise)")


def _tus_errors(*codes: str) -> dict:
    words = {"404": "No such upload (used, deleted, expired, or another account's)",
             "409": "Upload-Offset is not the server's offset (ask with HEAD), or the upload is complete",
             "412": "Tus-Resumable missing or not 1.0.0", "413": "Past the declared length, or over the per-file cap",
             "415": "Not a video or archive (by name, or by the first chunk's content)",
             "423": "Another request is writing this upload", "460": "The chunk's checksum does not match",
             "507": "Not enough free space in the media store"}
    return {code: _json(_ref("Error"), words[code]) for code in codes}


def _resumable_paths() -> dict[str, Any]:
    """tus 1.0 (core, creation, termination, checksum): docs/uploads.md. HEAD (the offset) and
    OPTIONS (discovery, public) are tus's own and answer as the protocol says."""
    key = {"name": "key", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
    return {
        "/uploads": {"post": {
            "summary": "Create a resumable upload (tus creation); send its bytes with PATCH",
            "parameters": [TUS_RESUMABLE,
                           _tus_header("Upload-Length", {"type": "integer", "minimum": 1}, "The file's size in bytes"),
                           _tus_header("Upload-Metadata", {"type": "string"},
                                       "tus metadata: `filename <base64 of the file's own name>`", required=False)],
            "responses": {"201": {"description": "Created; Location is the upload's URL", "headers": {
                "Location": {"schema": {"type": "string"}}}}, **ERRORS, **_tus_errors("412", "413", "415", "507")}}},
        "/uploads/{key}": {
            "patch": {
                "summary": "Append a chunk at Upload-Offset (tus core; Upload-Checksum sha1/sha256 optional)",
                "parameters": [key, TUS_RESUMABLE,
                               _tus_header("Upload-Offset", {"type": "integer", "minimum": 0}, "Where this chunk starts"),
                               _tus_header("Upload-Checksum", {"type": "string"}, "`sha256 <base64 digest>`",
                                           required=False)],
                "requestBody": {"required": True, "content": {"application/offset+octet-stream": {
                    "schema": {"type": "string", "format": "binary"}}}},
                "responses": {"204": {"description": "Taken; Upload-Offset is the new offset", "headers": {
                    "Upload-Offset": {"schema": {"type": "integer"}}}}, **ERRORS,
                    **_tus_errors("404", "409", "412", "413", "415", "423", "460", "507")}},
            "delete": {
                "summary": "Delete an upload and its bytes (tus termination)", "parameters": [key, TUS_RESUMABLE],
                "responses": {"204": {"description": "Deleted"}, **ERRORS, **_tus_errors("404", "409", "412")}},
        },
    }


def openapi_document(scenario_names: list[str] | None = None) -> dict[str, Any]:
    """The document; with ``scenario_names`` (the scenarios a batch may ask for now) a batch's
    scenarios are an enum of them, so a client or fuzzer knows the valid values."""
    scenario_item: dict[str, Any] = {"type": "string", "minLength": 1}
    if scenario_names:
        scenario_item = {"type": "string", "enum": list(scenario_names)}
    return {
        "openapi": "3.0.3",
        "info": {"title": "vidlora API", "version": "1",
                 "description": "Batch video analysis: start batches, follow progress, query and review "
                                "results. Scripts authenticate with an API token (created on the web app's "
                                "API tokens page or with `vidlora token create`): `Authorization: Bearer "
                                "vl_...`; a token of scope `read` may only GET (403 otherwise), `review` may "
                                "also submit batches and reviews. HTTP Basic still works (throttled after "
                                "wrong passwords). Neither needs a CSRF token; the browser session does "
                                "(send the page's token as X-CSRFToken on writes)."},
        "servers": [{"url": "/api/v1"}],
        "security": [{"token": []}, {"basic": []}, {"session": []}],
        "components": {
            "securitySchemes": {
                "token": {"type": "http", "scheme": "bearer", "bearerFormat": "vidlora API token (vl_...)",
                          "description": "Scope read: GET only. Scope review: also POST batches and reviews."},
                "basic": {"type": "http", "scheme": "basic"},
                "session": {"type": "apiKey", "in": "cookie", "name": "session"},
            },
            "schemas": SCHEMAS,
        },
        "paths": {
            "/openapi.json": {"get": {"summary": "This document", "security": [],
                                      "responses": {"200": _json({"type": "object"})}}},
            "/scenarios": {"get": {"summary": "Scenarios with adapter, prompts and the workers holding them",
                                   "responses": {"200": _json({"type": "object"}), **ERRORS}}},
            "/workers": {"get": {"summary": "GPU workers: heartbeat age, health, device, versions, canary",
                                 "responses": {"200": _json({"type": "object"}), **ERRORS}}},
            "/batches": {
                "get": {"summary": "Batches, newest first, with progress counts", "parameters": PAGING,
                        "responses": {"200": _json({"type": "object"}), **ERRORS}},
                "post": {
                    "summary": "Start a batch: upload videos or archives (or name complete resumable uploads), choose scenarios",
                    "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
                        "type": "object", "required": ["scenarios"], "properties": {
                            "files": {"type": "array", "minItems": 1, "items": {"type": "string", "format": "binary"},
                                      "description": "The files themselves (up to the form's size cap), or:"},
                            "uploads": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1},
                                        "description": "Keys of complete resumable uploads (POST /uploads)"},
                            "scenarios": {"type": "array", "minItems": 1, "items": scenario_item,
                                          "description": "Scenario names (GET /scenarios)"},
                            "name": {"type": "string"}}}}}},
                    "responses": {"201": _json({"type": "object", "properties": {
                        "batch_id": {"type": "integer"}, "url": {"type": "string"}, "page": {"type": "string"}}},
                        "Batch started"), **ERRORS, "413": _json(_ref("Error"), "Upload too large")},
                },
            },
            **_resumable_paths(),
            "/batches/{batch_id}": {"get": {
                "summary": "Progress of one batch, per video and scenario", "parameters": [ID("batch_id")],
                "responses": {"200": _json(_ref("BatchStatus")), **ERRORS, **NOT_FOUND}}},
            "/results": {"get": {
                "summary": "Analyses and results, filtered like the Results page",
                "parameters": RESULT_FILTERS + PAGING,
                "responses": {"200": _json({"type": "object", "properties": {
                    "page": {"type": "integer"}, "per_page": {"type": "integer"},
                    "total": {"type": "integer", "description": "Exact up to 10,000; past that PostgreSQL's "
                              "estimate (total_exact false). /results/facets counts exactly."},
                    "total_exact": {"type": "boolean"},
                    "filters": {"type": "object"}, "results": {"type": "array", "items": _ref("ResultRow")}}}),
                    **ERRORS}}},
            **{f"/results/export.{kind}": {"get": {
                "summary": f"The Results page's {label} export, streamed: same columns, same filters",
                # One row per item of the scenario's lists: only a scenario says which (400 without).
                "parameters": [{**p, "required": True, "allowEmptyValue": False,
                                "schema": {"type": "string", "minLength": 1, "pattern": NO_NUL}}
                               if kind == "items.csv" and p["name"] == "scenario" else p for p in RESULT_FILTERS],
                "responses": {"200": {"description": "The export, as an attachment", "content": {
                    media: {"schema": {"type": "string", "format": "binary"}}}}, **ERRORS}}}
               for kind, label, media in EXPORTS},
            "/results/facets": {"get": {
                "summary": "Counts per value of each controlled-vocabulary field of a scenario, and per model-confidence band",
                "parameters": [{**p, "required": True, "allowEmptyValue": False,
                                "schema": {"type": "string", "minLength": 1, "pattern": NO_NUL}} if p["name"] == "scenario" else p
                               for p in RESULT_FILTERS],
                "responses": {"200": _json({"type": "object", "properties": {
                    "filters": {"type": "object"}, "total": {"type": "integer"},
                    "confidence": {"type": "array", "items": {"type": "object", "properties": {
                        "band": {"type": "string"}, "label": {"type": "string"}, "count": {"type": "integer"}}}},
                    "facets": {"type": "array", "items": {"type": "object", "properties": {
                        "field": {"type": "string"}, "kind": {"type": "string"},
                        "array": {"type": "string", "nullable": True},
                        "values": {"type": "array", "items": {"type": "object", "properties": {
                            "value": {"type": "string"}, "count": {"type": "integer"},
                            "where": {"type": "string"}}}}}}}}}), **ERRORS}}},
            "/results/{result_id}": {"get": {
                "summary": "One result with its review history", "parameters": [ID("result_id")],
                "responses": {"200": {**_json(_ref("ResultDetail")), "headers": ETAG}, **ERRORS, **NOT_FOUND}}},
            "/results/{result_id}/review": {"post": {
                "summary": "Approve, reject, edit or annotate a result",
                "parameters": [ID("result_id"), IF_MATCH],
                "requestBody": {"required": True, "content": {"application/json": {"schema": REVIEW_REQUEST}}},
                "responses": {"200": {**_json(_ref("ResultDetail")), "headers": ETAG}, **ERRORS, **NOT_FOUND,
                              **VERSIONED}}},
            "/results/{result_id}/fields": {
                "get": {"summary": "A structured result's current answer as data (404 for a free-text one)",
                        "parameters": [ID("result_id")],
                        "responses": {"200": {**_json({"type": "object"}), "headers": ETAG}, **ERRORS, **NOT_FOUND}},
                "patch": {
                    "summary": "Edit some fields of a structured answer: a JSON merge patch (RFC 7396)",
                    "description": "Members of the patch replace the answer's, null removes one, nested objects "
                                   "merge; an array is replaced whole. The patched answer must fit the "
                                   "scenario's schema (400 otherwise) and is saved as an edit.",
                    "parameters": [ID("result_id"), {**IF_MATCH, "required": True},
                                   {"name": "note", "in": "query", "schema": {"type": "string", "maxLength": MAX_NOTE_CHARS},
                                    "description": "Kept with the edit in the history"}],
                    "requestBody": {"required": True, "content": {"application/merge-patch+json": {
                        "schema": {"type": "object"}}}},
                    "responses": {"200": {**_json(_ref("ResultDetail")), "headers": ETAG}, **ERRORS, **NOT_FOUND,
                                  **VERSIONED, "415": _json(_ref("Error"), "Not sent as application/merge-patch+json")}},
            },
            "/results/{result_id}/gold": {"post": {
                "summary": "Mark a reviewed (approved or edited) result as gold, or return it to training",
                "parameters": [ID("result_id"), {**IF_MATCH, "description": "Optional: with it, only the answer "
                                                 "you read is marked (409 if it was reviewed since)"}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": GOLD_REQUEST}}},
                "responses": {"200": _json(_ref("ResultDetail")), **ERRORS, **NOT_FOUND,
                              **{k: v for k, v in VERSIONED.items() if k != "428"}}}},
            "/scenarios/{name}/agreement": {"get": {
                "summary": "Per adapter version: approved / edited / rejected rates and per-field accuracy "
                           "against the reviewed answers, with counts and 95 % Wilson intervals",
                "parameters": [SCENARIO_NAME, {"name": "version", "in": "query", "allowEmptyValue": True,
                                               "schema": {"type": "string", "maxLength": 64},
                                               "description": "Only this adapter version (or a prefix of it)"}],
                "responses": {"200": _json({"type": "object", "properties": {
                    "scenario": {"type": "string"}, "versions": {"type": "array", "items": _ref("Agreement")}}}),
                    **ERRORS, **NOT_FOUND}}},
            "/scenarios/{name}/calibration": {"get": {
                "summary": "Per adapter version: the model's confidence against reviewed correctness (reviews "
                           "and the gold set), a reliability table of 10 bins and the expected calibration error, "
                           "for whole answers and for top-level fields",
                "parameters": [SCENARIO_NAME, {"name": "version", "in": "query", "allowEmptyValue": True,
                                               "schema": {"type": "string", "maxLength": 64},
                                               "description": "Only this adapter version (or a prefix of it)"}],
                "responses": {"200": _json({"type": "object", "properties": {
                    "scenario": {"type": "string"}, "versions": {"type": "array", "items": _ref("Calibration")}}}),
                    **ERRORS, **NOT_FOUND}}},
            "/scenarios/{name}/versions": {"get": {
                "summary": "The scenario's adapter versions (candidate, serving, retired), each that answered "
                           "the gold set with its comparison to the stored answers there",
                "parameters": [SCENARIO_NAME],
                "responses": {"200": _json({"type": "object", "properties": {
                    "scenario": {"type": "string"}, "serving": {"type": "string", "nullable": True},
                    "versions": {"type": "array", "items": {"type": "object", "properties": {
                        "version": {"type": "string"}, "status": {"type": "string", "enum": list(values(ReleaseStatus))},
                        "adapter": {"type": "string", "nullable": True}, "note": {"type": "string", "nullable": True},
                        "created_at": {"type": "string", "nullable": True},
                        "promoted_at": {"type": "string", "nullable": True},
                        "gold_run_at": {"type": "string", "nullable": True},
                        "comparison": {"type": "object", "nullable": True},
                        "promotable": {"type": "boolean",
                                       "description": "Whether `vidlora scenarios promote` would serve it"},
                        "blockers": {"type": "array", "items": {"type": "string"},
                                     "description": "Why promote refuses it, in words"},
                        "gold_run": {"type": "object", "description": "Its gold run: answered, refused, errors, "
                                                                      "reasons, and a summary in words"},
                        "forced_reason": {"type": "string", "nullable": True,
                                          "description": "Why it was promoted over a refusal (--force --reason)"},
                        "forced_over": {"type": "string", "nullable": True,
                                        "description": "What the check said when it was forced"}}}}}}),
                    **ERRORS, **NOT_FOUND}}},
            "/scenarios/{name}/gold": {"get": {
                "summary": "The scenario's gold set: reviewed results held out of training",
                "parameters": [SCENARIO_NAME],
                "responses": {"200": _json({"type": "object", "properties": {
                    "scenario": {"type": "string"}, "gold": {"type": "array", "items": _ref("ResultRow")}}}),
                    **ERRORS, **NOT_FOUND}}},
        },
    }

"""workers.confidence: the worker maps its tokens to text offsets with the engine's tokenizer
(the demo model's real byte-level BPE here), so a field's confidence reads the right tokens."""

from __future__ import annotations

import pytest

from vidlora.engine_io import AnalysisOutput, AnalysisRequest
from workers.confidence import WINDOW, token_ends, with_confidence

TEXT = ('{"chambers":[{"name":"墓室 north 🏺 chamber","shape":"rectangular"},{"name":"x"}],'
        '"transcription":"ΣΩ — ☥☥ ok","passages":3}')


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from demo_model import BASE

    return AutoTokenizer.from_pretrained(str(BASE))


def _slow_ends(tokenizer, ids):
    return [len(tokenizer.decode(ids[:i + 1], skip_special_tokens=True).rstrip("\ufffd")) for i in range(len(ids))]


def test_each_token_ends_where_decoding_the_whole_prefix_says_even_inside_characters(tokenizer):
    ids = tokenizer.encode(TEXT)
    assert len(ids) > 2 * WINDOW  # the windowed decoding re-anchors several times
    # Some token ends inside a character (CJK and emoji are several bytes, split by the BPE).
    assert any(tokenizer.decode(ids[:i + 1]).endswith("\ufffd") for i in range(len(ids)))
    ends = token_ends(tokenizer, ids, TEXT)
    assert ends == _slow_ends(tokenizer, ids) and ends[-1] == len(TEXT)


def test_windows_that_start_inside_a_character_fall_back_to_whole_prefixes(tokenizer, monkeypatch):
    import workers.confidence as confidence

    ids = tokenizer.encode(TEXT)
    for window in range(1, 9):  # some of these start a window inside an emoji or a CJK character
        monkeypatch.setattr(confidence, "WINDOW", window)
        assert token_ends(tokenizer, ids, TEXT) == _slow_ends(tokenizer, ids), window


def test_text_the_tokens_do_not_make_gives_no_offsets(tokenizer):
    ids = tokenizer.encode(TEXT)
    assert token_ends(tokenizer, ids, TEXT + " ") is None
    assert token_ends(tokenizer, ids[:-1], TEXT) is None


def _output(tokenizer, text, **kw):
    ids = tokenizer.encode(text)
    return AnalysisOutput("1", text, ids, 10, len(ids), 0.1, "stop", None, [-0.25] * len(ids), **kw)


def _request(schema):
    return AnalysisRequest("1", "p", None, [], [], None, None, 64, 0.0, 1.0, None, output_schema=schema)


def test_a_structured_answer_gets_its_confidences_and_others_stay_unknown(tokenizer):
    out = with_confidence(tokenizer, _request({"type": "object"}), _output(tokenizer, TEXT))
    assert out.confidence["fields"].keys() == {"chambers", "transcription", "passages"}
    assert out.confidence["answer"] == pytest.approx(0.7788, abs=1e-4)  # exp(-0.25)
    # Each chamber and its fields too, named as the review form names them (issue 58).
    assert list(out.confidence["parts"]) == ["chambers/0", "chambers/0/name", "chambers/0/shape", "chambers/1",
                                             "chambers/1/name"]
    assert with_confidence(tokenizer, _request(None), _output(tokenizer, TEXT)).confidence is None  # free text
    failed = _output(tokenizer, TEXT, error="degenerate output")
    assert with_confidence(tokenizer, _request({"type": "object"}), failed).confidence is None
    assert with_confidence(None, _request({"type": "object"}), _output(tokenizer, TEXT)).confidence is None

"""vidlora.results.rows: a row names models and adapters, never the server paths they came from."""

import pytest

from vidlora.results.rows import shown_name


@pytest.mark.parametrize("stored, shown", [
    ("/srv/models/Qwen3.6-27B/", "Qwen3.6-27B"), ("var/tiny-model/base", "base"), ("./adapters/tomb", "tomb"),
    ("Qwen/Qwen3.6-27B", "Qwen/Qwen3.6-27B"), ("tiny-qwen", "tiny-qwen"), (None, None), ("", ""),
])
def test_shown_name(stored, shown):
    assert shown_name(stored) == shown

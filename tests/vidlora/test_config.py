"""vidlora.config: one typed Settings from the environment."""

import pytest

from vidlora.config import Settings


@pytest.mark.parametrize("url", ["postgresql://u:p@db:5432/vidlora", "postgres://u:p@db:5432/vidlora",
                                 "postgresql+psycopg://u:p@db:5432/vidlora"])
def test_postgres_urls_use_the_shipped_driver(url, tmp_path):
    assert Settings(var_dir=tmp_path, database_url=url).database_url == "postgresql+psycopg://u:p@db:5432/vidlora"


def test_embedded_defaults_live_under_var_dir(tmp_path, monkeypatch):
    for name in ("VIDLORA_DATABASE_URL", "VIDLORA_BROKER_URL", "VIDLORA_ADAPTER_CACHE_DIR", "VIDLORA_ENGINE_REBUILD"):
        monkeypatch.delenv(name, raising=False)
    s = Settings(var_dir=tmp_path)
    assert s.database_url == f"sqlite:///{tmp_path / 'vidlora.db'}" and s.is_embedded
    assert s.adapter_cache_dir == tmp_path / "prepared-adapters" and s.engine_rebuild == "auto"


def test_unknown_rebuild_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="engine_rebuild"):
        Settings(var_dir=tmp_path, engine_rebuild="sometimes")


def test_generation_settings_have_one_definition():
    from vidlora.scenarios import DEFAULT_GENERATION, Generation

    assert Generation.of({}) == Generation() and Generation.of(None).repetition_penalty == 1.0
    assert Generation.of({"max_tokens": "12", "seed": None}) == Generation(max_tokens=12, seed=None)
    assert set(DEFAULT_GENERATION) == {"max_tokens", "temperature", "top_p", "seed", "repetition_penalty"}

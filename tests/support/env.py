"""Where the test services are (override with VIDLORA_TEST_PG / VIDLORA_TEST_REDIS)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN_URL = os.environ.get("VIDLORA_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("VIDLORA_TEST_REDIS", "redis://127.0.0.1:6379")

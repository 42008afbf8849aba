"""The demo model: a tiny Qwen3.5 vision-language model that sees vidlora's generated scenes,
and one LoRA adapter per shipped scenario (trained by ``demo_model.train``, shipped under
``weights/``). The demo, the pipeline tests and ``docker compose`` serve it by default; the
random-weight builder (``testmodels.tiny``) stays for shape and numerics tests."""

from pathlib import Path

WEIGHTS = Path(__file__).resolve().parent / "weights"
BASE = WEIGHTS / "base"
ADAPTERS = WEIGHTS / "adapters"

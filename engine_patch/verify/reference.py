"""The yardsticks of check (a): the adapter merged into the base weights by PEFT, and the
fp32 transformers + PEFT reference (the oracle)."""
from __future__ import annotations

import gc
import shutil
from pathlib import Path
from typing import Any

from ..env import restore_transformers_configs
from .engines import _model_is_multimodal
from .options import VerifyError


def _hf_class(model: Path):
    import transformers

    restore_transformers_configs()
    if _model_is_multimodal(model):
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def merge_adapter(model: Path, adapter: Path, out: Path) -> Path:
    """PEFT merge_and_unload in fp32, written with the base checkpoint's keys, dtypes, shards
    and every non-weight file, so vLLM loads it exactly like the base."""
    import torch
    from peft import PeftModel
    from safetensors import safe_open
    from safetensors.torch import save_file

    model, adapter, out = Path(model), Path(adapter), Path(out)
    base = _hf_class(model).from_pretrained(str(model), dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, str(adapter))
    targets = [n.removeprefix("base_model.model.") + ".weight"
               for n, m in peft.named_modules() if hasattr(m, "lora_A") and len(getattr(m, "lora_A", {})) > 0]
    merged = peft.merge_and_unload().state_dict()
    out.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    written: set[str] = set()
    for shard in sorted(model.glob("*.safetensors")):
        tensors = {}
        with safe_open(str(shard), framework="pt") as sf:
            meta = sf.metadata()
            for k in sf.keys():
                orig = sf.get_tensor(k)
                if k in merged:
                    tensors[k] = merged[k].to(orig.dtype).contiguous()
                    written.add(k)
                else:
                    tensors[k] = orig
        save_file(tensors, str(out / shard.name), metadata=meta)
    missing = [t for t in targets if t not in written]
    if missing:
        raise VerifyError(f"merged weights {missing[:3]} have no key in {model}'s checkpoint "
                          "(model class renames keys); merge yourself and pass --merged")
    del base, peft, merged
    gc.collect()
    return out


class Reference:
    """transformers + PEFT (unmerged) in float32 on `device`: the oracle."""

    def __init__(self, model: Path, adapters: list[Path], device: str, dtype: str):
        import torch
        from peft import PeftModel

        torch.backends.cuda.matmul.allow_tf32 = False  # an fp32 oracle must really be fp32
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        self.device = device
        base = _hf_class(model).from_pretrained(str(model), dtype=getattr(torch, dtype)).to(device).eval()
        self.names = [f"a{i}" for i in range(len(adapters))]
        self.model = PeftModel.from_pretrained(base, str(adapters[0]), adapter_name=self.names[0])
        for name, path in zip(self.names[1:], adapters[1:]):
            self.model.load_adapter(str(path), adapter_name=name)
        self.model.eval()

    def score(self, seq: list[int], adapter_index: int | None, chunk: int = 2048,
              mm: dict[str, Any] | None = None) -> dict:
        """`mm`: extra model inputs sized for `seq` (pixel values, grids, mm_token_type_ids)."""
        import contextlib

        import torch

        inner = self.model.get_base_model()
        ctx = contextlib.nullcontext()
        if adapter_index is None:
            ctx = self.model.disable_adapter()
        else:
            self.model.set_adapter(self.names[adapter_index])
        ids = torch.tensor([seq], device=self.device)
        extra = {k: v.to(self.device) if hasattr(v, "to") else v for k, v in (mm or {}).items()}
        if "pixel_values_videos" in extra:  # the vision tower runs in the oracle's dtype too
            extra["pixel_values_videos"] = extra["pixel_values_videos"].to(next(inner.parameters()).dtype)
        with torch.no_grad(), ctx:
            hidden = inner.model(input_ids=ids, **extra).last_hidden_state[0]
            head = inner.get_output_embeddings()
            lp, top = [], []
            for s in range(0, len(seq) - 1, chunk):  # logits of a long prompt x a big vocab in pieces
                logits = head(hidden[s:min(s + chunk, len(seq) - 1)]).float().log_softmax(-1)
                nxt = ids[0, s + 1:s + 1 + logits.shape[0]]
                lp += logits.gather(1, nxt[:, None])[:, 0].tolist()
                top += logits.argmax(-1).tolist()
        return {"lp": lp, "top": top}

"""Fine-tune one demo-model adapter from a training set that ``vidlora export-training`` wrote:
the next version of a scenario's adapter, learnt from what its reviewers corrected.

    python -m demo_model.finetune --data EXPORT_DIR --adapter demo_model/weights/adapters/NAME \\
        --out DIR [--steps 20] [--lr 1e-3]

It reads the export the way the common trainers do: each JSON Lines row's ``messages`` (system,
user with the ``<video>`` placeholder, assistant) and its ``videos`` entry (the frame files, in
time order) with ``video_timestamps``; nothing is looked up in vidlora's database. The frames go
through the base model's own processor with the prompt the engine builds
(``demo_model.data.Encoder``), the loss is on the reviewed answer's tokens, and only the
adapter's weights move. The result is a PEFT adapter folder (bf16, as the shipped ones), which
``engine_patch.registration`` serves like any other.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from demo_model import BASE
from demo_model.data import Encoder, ScenarioText, collate

VIDEO_TAG = "<video>"
SEED = 2026


class ExportError(ValueError):
    pass


def read_export(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The manifest and the examples of an export, each as (system, prompt, frame paths,
    timestamps, answer), checked against the format the export claims."""
    folder = Path(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    examples = []
    for n, line in enumerate((folder / manifest["file"]).read_text().splitlines(), 1):
        row = json.loads(line)
        roles = [m["role"] for m in row["messages"]]
        if roles not in (["user", "assistant"], ["system", "user", "assistant"]):
            raise ExportError(f"line {n}: messages must be [system,] user, assistant; got {roles}")
        by_role = {m["role"]: m["content"] for m in row["messages"]}
        if not by_role["user"].startswith(VIDEO_TAG) or len(row["videos"]) != 1:
            raise ExportError(f"line {n}: one video, its {VIDEO_TAG} placeholder first in the user turn")
        frames, stamps = row["videos"][0], row["video_timestamps"][0]
        if len(frames) != len(stamps):
            raise ExportError(f"line {n}: {len(frames)} frames but {len(stamps)} timestamps")
        examples.append({"system": by_role.get("system"), "prompt": by_role["user"][len(VIDEO_TAG):],
                         "frames": [folder / f for f in frames], "timestamps": [float(t) for t in stamps],
                         "answer": by_role["assistant"]})
    return manifest, examples


def load_frames(paths: list[Path]) -> np.ndarray:
    from PIL import Image

    out = []
    for p in paths:
        with Image.open(p) as im:
            out.append(np.asarray(im.convert("RGB"), dtype=np.uint8))
    return np.stack(out)


def encode(base: Path, examples: list[dict[str, Any]], sampling: dict[str, Any]) -> tuple[Encoder, list[dict[str, Any]]]:
    texts = {ex["prompt"]: ScenarioText("export", ex["system"], ex["prompt"], sampling) for ex in examples}
    if len(texts) != 1:
        raise ExportError("an export holds one scenario's prompt; found several")
    encoder = Encoder(base, {"export": next(iter(texts.values()))})
    return encoder, [encoder.frames_example("export", load_frames(ex["frames"]), ex["timestamps"], ex["answer"])
                     for ex in examples]


def finetune(data: Path, adapter: Path, out: Path, steps: int, lr: float = 1e-3, batch: int = 4,
             base: Path = BASE, log=print) -> dict[str, Any]:
    """Train ``adapter`` further on the export in ``data``; the new version goes to ``out``."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5ForConditionalGeneration

    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    manifest, examples = read_export(data)
    if not examples:
        raise ExportError(f"{data} holds no examples")
    encoder, encoded = encode(base, examples, manifest.get("sampling") or {})
    model = Qwen3_5ForConditionalGeneration.from_pretrained(str(base), torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(steps):
        picked = [encoded[rng.randrange(len(encoded))] for _ in range(min(batch, len(encoded)))]
        b = collate(picked, encoder.tokenizer.pad_token_id)
        logits = model(**{k: v for k, v in b.items() if k != "labels"}).logits.float()[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), b["labels"][:, 1:], ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(round(float(loss.detach()), 4))
        log(f"step {step + 1} loss {losses[-1]}")
    tmp = Path(out).with_name(f".{Path(out).name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    shutil.rmtree(out, ignore_errors=True)
    Path(out).mkdir(parents=True)
    weights = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(str(tmp / "adapter_model.safetensors")).items()}
    save_file(weights, str(Path(out) / "adapter_model.safetensors"))
    config = json.loads((tmp / "adapter_config.json").read_text())
    config.update(base_model_name_or_path=None, inference_mode=True, target_modules=sorted(config["target_modules"]))
    (Path(out) / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(tmp)
    record = {"data": manifest.get("dataset_name"), "scenario": manifest.get("scenario"), "examples": len(examples),
              "from_adapter_versions": manifest.get("adapter_versions"), "steps": steps, "lr": lr, "losses": losses}
    (Path(out) / "FINETUNE.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a folder `vidlora export-training` wrote")
    parser.add_argument("--adapter", type=Path, required=True, help="the adapter version to start from")
    parser.add_argument("--out", type=Path, required=True, help="where the new version goes")
    parser.add_argument("--base", type=Path, default=BASE)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args(argv)
    record = finetune(args.data, args.adapter, args.out, args.steps, args.lr, base=args.base)
    print(json.dumps({k: record[k] for k in ("examples", "steps", "losses")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

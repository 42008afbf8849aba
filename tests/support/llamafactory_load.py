"""Run by .venv-llamafactory's Python: LLaMA-Factory's own loading of an export, as
``llamafactory-cli train RECIPE [key=value ...]`` does it before it builds the model (its
argument parser on the recipe, its tokenizer and processor, its template, ``get_dataset``), then
each example's video tensors as its collator makes them. Writes, per example, the prompt ids
(label -100), the response ids, the video grids and the pixel values (``OUT/N.npy``) to
``OUT/examples.json``. Standalone: LLaMA-Factory's venv has no vidlora.

    python tests/support/llamafactory_load.py OUT RECIPE [key=value ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(out: Path, recipe: str, overrides: list[str]) -> None:
    import numpy as np

    sys.argv = ["llamafactory-cli", recipe, *overrides]
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.extras.constants import IGNORE_INDEX
    from llamafactory.hparams import get_train_args, read_args
    from llamafactory.model import load_tokenizer

    model_args, data_args, training_args, _, _ = get_train_args(read_args())
    modules = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(modules["tokenizer"], data_args)
    dataset = get_dataset(template, model_args, data_args, training_args, stage="sft", **modules)["train_dataset"]
    examples = []
    for n, ex in enumerate(dataset):
        ids, labels = list(ex["input_ids"]), list(ex["labels"])
        cut = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
        videos = ex["videos"]
        mm = template.mm_plugin.get_mm_inputs([], videos, [], [0], [len(videos)], [0], [ids], modules["processor"])
        np.save(out / f"{n}.npy", mm["pixel_values_videos"].float().numpy())
        examples.append({"prompt_ids": ids[:cut], "response_ids": ids[cut:],
                         "video_grid_thw": mm["video_grid_thw"].tolist(), "template": data_args.template})
    (out / "examples.json").write_text(json.dumps(examples))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])

"""Spike (issue 16): can a tiny model with the real Qwen3.5 VL architecture learn the three
scene kinds from video, how big must it be, how fast does it train? Base model only, all
three tasks with their own prompts; teacher-forced exact-answer accuracy on fresh seeds.

Runs anywhere torch + transformers (Qwen3_5ForConditionalGeneration) exist; no processor:
frames are patchified here the way Qwen's video processor does (mean/std 0.5, temporal patch
2, 2x2 merge order).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from testmodels import tiny  # noqa: E402
from vidlora import scenes  # noqa: E402

# The device run sets OUT (files it returns); elsewhere results go under the repo's var/.
OUT = Path(os.environ.get("OUT") or Path(__file__).resolve().parents[1] / "var" / "seeing-spike")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
PROMPTS = {"artifact": "List every artifact visible in this video.",
           "tomb": "Describe the tomb structure shown.",
           "mural": "Transcribe any inscription you can read."}
FRAMES, SIZE, P, M, TP = 8, 224, 16, 2, 2


def patchify(frames: np.ndarray) -> tuple[torch.Tensor, list[int]]:
    x = torch.from_numpy(frames).float().div(255).sub(0.5).div(0.5)  # T H W C
    x = x.permute(0, 3, 1, 2)  # T C H W
    t, c, h, w = x.shape
    gt, gh, gw = t // TP, h // P, w // P
    x = x.reshape(gt, TP, c, gh // M, M, P, gw // M, M, P)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * TP * P * P), [gt, gh, gw]


def build(tok, hidden: int, layers: int, vdepth: int, vhidden: int):
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    ids = {t: tok.convert_tokens_to_ids(t) for t in tiny.SPECIAL_TOKENS}
    text = dict(tiny.TEXT_CONFIG, vocab_size=len(tok), eos_token_id=ids["<|im_end|>"], bos_token_id=None,
                pad_token_id=ids["<|endoftext|>"], hidden_size=hidden, intermediate_size=hidden * 2,
                num_hidden_layers=layers,
                layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4))
    text.pop("full_attention_interval", None)
    vision = dict(tiny.VISION_CONFIG, depth=vdepth, hidden_size=vhidden, intermediate_size=vhidden * 2,
                  num_heads=max(2, vhidden // 32), out_hidden_size=hidden)
    cfg = Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
                        architectures=["Qwen3_5ForConditionalGeneration"])
    torch.manual_seed(0)
    return Qwen3_5ForConditionalGeneration(cfg), ids


def _render(args):
    kind, seed = args
    return scenes.render(scenes.random_scene(kind, seed), FRAMES, SIZE)


FRAME_CACHE: dict = {}


def prerender(keys) -> None:
    """Render scenes in parallel up front (numpy drawing would starve the GPU otherwise)."""
    import multiprocessing as mp

    todo = [k for k in keys if k not in FRAME_CACHE]
    with mp.get_context("fork").Pool(max(1, (os.cpu_count() or 2) - 1)) as pool:
        for key, frames in zip(todo, pool.map(_render, todo, chunksize=16)):
            FRAME_CACHE[key] = frames


def example(tok, ids, kind: str, seed: int):
    scene = scenes.random_scene(kind, seed)
    frames = FRAME_CACHE.get((kind, seed))
    pix, grid = patchify(frames if frames is not None else scenes.render(scene, FRAMES, SIZE))
    per_frame = grid[1] * grid[2] // (M * M)
    # As Qwen3-VL's processor expands a video: a timestamped block per temporal patch.
    blocks = "".join(f"<{i * TP / 4:.1f} seconds><|vision_start|>" + "<|video_pad|>" * per_frame + "<|vision_end|>"
                     for i in range(grid[0]))
    prompt = (f"<|im_start|>user\n<|vision_start|>{blocks}<|vision_end|>"
              f"{PROMPTS[kind]}<|im_end|>\n<|im_start|>assistant\n")
    answer = json.dumps(scenes.expected_answer(scene), separators=(",", ":")) + "<|im_end|>"
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    a_ids = tok(answer, add_special_tokens=False)["input_ids"]
    return p_ids, a_ids, pix, grid


VIDEO_PAD = None  # set in run()


def batchify(items, pad_id):
    n = max(len(p) + len(a) for p, a, *_ in items)
    input_ids = torch.full((len(items), n), pad_id)
    labels = torch.full((len(items), n), -100)
    attn = torch.zeros((len(items), n), dtype=torch.long)
    for i, (p, a, _, _) in enumerate(items):
        seq = p + a
        input_ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, len(p):len(seq)] = torch.tensor(a)
        attn[i, :len(seq)] = 1
    pix = torch.cat([it[2] for it in items])
    grid = torch.tensor([it[3] for it in items])
    return input_ids, labels, attn, pix, grid


def forward(model, input_ids, attn, pix, grid, labels=None):
    import inspect

    extra = {}
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:
        extra["mm_token_type_ids"] = ((input_ids == VIDEO_PAD).long() * 2).to(DEV)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=DEV == "cuda"):
        return model(input_ids=input_ids.to(DEV), attention_mask=attn.to(DEV),
                     labels=None if labels is None else labels.to(DEV),
                     pixel_values_videos=pix.to(DEV, model.dtype), video_grid_thw=grid.to(DEV), **extra)


def run(hidden, layers, vdepth, vhidden, steps, batch, lr, log):
    global VIDEO_PAD
    tok = tiny.build_tokenizer()
    model, ids = build(tok, hidden, layers, vdepth, vhidden)
    VIDEO_PAD = ids["<|video_pad|>"]
    model.to(DEV, dtype=torch.float32).train()  # fp32 master weights; bf16 autocast on the GPU
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    pad = ids["<|endoftext|>"]
    rng = np.random.default_rng(0)
    pool_n = int(os.environ.get("SPIKE_POOL", "3000"))
    pool = [(str(k), int(sd)) for k, sd in zip(rng.choice(scenes.KINDS, pool_n), rng.integers(0, 1_000_000, pool_n))]
    eval_keys = [(k, 10_000_000 + sd) for k in scenes.KINDS for sd in range(48)]
    t_render = time.time()
    prerender(pool + eval_keys)
    render_s = time.time() - t_render
    evals = {k: [example(tok, ids, k, 10_000_000 + sd) for sd in range(48)] for k in scenes.KINDS}
    max_s = float(os.environ.get("SPIKE_MAX_S", "1e9"))
    t0 = time.time()
    row = {"hidden": hidden, "layers": layers, "vdepth": vdepth, "vhidden": vhidden, "params": params,
           "bf16_mb": params * 2 / 1e6, "steps": steps, "batch": batch, "lr": lr, "curve": []}
    row["render_s"] = round(render_s, 1)
    for step in range(1, steps + 1):
        items = [example(tok, ids, *pool[int(i)]) for i in rng.integers(0, len(pool), batch)]
        input_ids, labels, attn, pix, grid = batchify(items, pad)
        out = forward(model, input_ids, attn, pix, grid, labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        over = time.time() - t0 > max_s
        if step % int(os.environ.get("SPIKE_EVAL_EVERY", "200")) == 0 or step == steps or over:
            acc = evaluate(model, evals, pad)
            row["curve"].append({"step": step, "s": round(time.time() - t0, 1), "loss": round(out.loss.item(), 4), **acc})
            log(json.dumps(row["curve"][-1]))
        if over:
            log(f"time cap {max_s}s reached at step {step}")
            break
    row["train_s"] = round(time.time() - t0, 1)
    return row


@torch.no_grad()
def evaluate(model, evals, pad) -> dict:
    model.eval()
    acc = {}
    for kind, items in evals.items():
        ok = 0
        for i in range(0, len(items), 16):
            input_ids, labels, attn, pix, grid = batchify(items[i:i + 16], pad)
            logits = forward(model, input_ids, attn, pix, grid).logits
            pred = logits[:, :-1].argmax(-1).cpu()
            tgt = labels[:, 1:]
            mask = tgt != -100
            ok += int(((pred == tgt) | ~mask).all(1).sum())
        acc[kind] = ok / len(items)
    model.train()
    return acc


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    logf = (OUT / "spike.log").open("a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    configs = json.loads(os.environ.get("SPIKE_CONFIGS", "[[128, 4, 4, 128, 1500, 32, 0.002]]"))
    rows = []
    for cfg in configs:
        log(f"config {cfg}")
        try:
            rows.append(run(*cfg, log=log))
        except Exception as exc:  # record and go on to the next config
            log(f"config {cfg} failed: {type(exc).__name__}: {exc}")
        (OUT / "spike.json").write_text(json.dumps(rows, indent=1))

"""What the payload carries for one vLLM release: the production lock's pins, less what the device
image already has or the device's runs never import (build.sh calls this; issue 57).

usage: python3 gpukit/payload/carry.py LOCK [--explain] [--base LOCK] [--pin NAME]
  LOCK       requirements/lock-gpu.txt, or the lock scripts/lock.sh writes for another vLLM
             (GPU_VLLM=X GPU_LOCK_OUT=FILE scripts/lock.sh gpu)
  --explain  every locked package with its decision and the rule's reason, not just the pins
  --base     the lock (or the built MANIFEST.txt) of the full payload already installed: leave
             out every pin it shares, so a part set for this release installs over it

Prints `name==version`, one a line: the dependencies to carry. vllm, torch, triton and torchvision
are not among them: build.sh carries those by mode (the `stack` lines of --explain).
Rules, in order (carry-rules.txt and device-image.txt beside this file):
1. `skip NAME` in carry-rules.txt: not carried (its reason says why the device's runs need none)
2. `carry NAME`: carried at the lock's version although the image has the package (the engine's
   numbers or its model loading depend on that version)
3. a package of the device image (device-image.txt): taken from the image
4. anything else: carried at the lock's version
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STACK = ("vllm", "torch", "triton", "torchvision")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line (hash lines and comments skipped), or of
    every wheel a built payload's MANIFEST.txt lists (a payload built before issue 57 carried a
    hand list, not a lock: `over` must then leave out only what that payload really has)."""
    pins = {}
    for line in path.read_text().splitlines():
        m = (re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;\\]+)", line)
             or re.match(r"^([A-Za-z0-9][A-Za-z0-9._]*)-([^-]+)-[^ ]*\.whl ", line))
        if m:
            pins[norm(m.group(1))] = m.group(2)
    if "vllm" not in pins:
        raise SystemExit(f"{path}: no vllm== pin or vllm wheel; not a GPU lock or payload MANIFEST")
    return pins


def read_rules(path: Path = HERE / "carry-rules.txt") -> dict[str, tuple[str, str]]:
    """name -> (carry|skip, reason)."""
    rules = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        body, _, why = line.partition("#")
        if not body.strip():
            continue
        verb, name = body.split()
        if verb not in ("carry", "skip") or not why.strip():
            raise SystemExit(f"{path}:{n}: expected 'carry|skip NAME  # reason'")
        rules[norm(name)] = (verb, why.strip())
    return rules


def read_image(path: Path = HERE / "device-image.txt") -> set[str]:
    return {norm(x) for x in path.read_text().split() if x and not x.startswith("#")} - {""}


def decide(pins: dict[str, str], rules: dict[str, tuple[str, str]], image: set[str],
           base: dict[str, str] | None = None) -> list[tuple[str, str, str, str]]:
    """(name, version, decision, reason) for every locked package, in lock order."""
    out = []
    for name, ver in pins.items():
        if name in STACK:
            out.append((name, ver, "stack", "carried by build.sh's mode"))
            continue
        verb, why = rules.get(name, (None, ""))
        if verb == "skip":
            decision, reason = "skip", why
        elif verb == "carry":
            decision, reason = "carry", why
        elif name in image:
            decision, reason = "image", "the device image has it"
        else:
            decision, reason = "carry", "the device image lacks it"
        if decision == "carry" and base is not None and base.get(name) == ver:
            decision, reason = "base", "the same pin is in the base payload"
        out.append((name, ver, decision, reason))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lock", type=Path)
    ap.add_argument("--explain", action="store_true")
    ap.add_argument("--base", type=Path)
    ap.add_argument("--pin", metavar="NAME", help="print NAME's version in LOCK and stop")
    a = ap.parse_args(argv)
    pins = read_lock(a.lock)
    if a.pin:
        print(pins.get(norm(a.pin), ""))
        return 0
    base = read_lock(a.base) if a.base else None
    rows = decide(pins, read_rules(), read_image(), base)
    unknown = sorted(set(read_rules()) - set(pins))
    for name, ver, decision, reason in rows:
        if a.explain:
            print(f"{decision:5} {name}=={ver}  # {reason}")
        elif decision == "carry":
            print(f"{name}=={ver}")
    if unknown:
        print(f"carry.py: rules for packages this lock does not have: {', '.join(unknown)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

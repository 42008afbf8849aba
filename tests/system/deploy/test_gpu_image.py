"""The production GPU image (docker/gpu.Dockerfile), built the way CI builds it and checked on
a machine without a GPU (building needs none).

`docker/ci/build.sh ci gpu` builds it on the debootstrapped Debian base (no registry), with
vLLM's CUDA build and the torch it pins from requirements/lock-gpu.txt, hashes checked and
`pip check` clean. Then, in containers with no network: torch, vLLM and engine_patch import and
engine_patch's patches apply against the installed vLLM (every patch is either applied or
skipped with its reason; with no GPU some probes skip); and `vidlora doctor` says in words that
no GPU is present. The dependency layer comes from Docker's build cache while the lock is
unchanged, so in CI this costs the app layer and the checks, not the download.

Needs a Docker engine; VIDLORA_REQUIRE_STACK=1 (set by .ci/run) makes its absence a failure.
The build time and the image's size are printed at the end of the run; cold and warm numbers
are in bench/results/gpu_image.md.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.support.docker import require_docker
from tests.support.env import ROOT
from tests.support.reports import report

pytestmark = [pytest.mark.stack, pytest.mark.timeout(3600)]

TAG = "ci"
IMAGE = f"vidlora-gpu:{TAG}"
# engine_patch.apply() logs one line per patch: "applied NAME: what it covers" or "skip NAME (why)".
PATCH_LINE = re.compile(r"^engine_patch: (applied|skip) (\S+?)(?:: (.*)| \((.*)\))$", re.M)


def _pin(path: str, name: str) -> str:
    return re.search(rf"^{re.escape(name)}==(\S+)", (ROOT / path).read_text(), re.M).group(1)


@dataclass
class Built:
    image: str
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def run(self, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """A command in a fresh container of the image, with no network: nothing it does may
        need a hub or an index."""
        return subprocess.run(["docker", "run", "--rm", "--network", "none", self.image, *argv],
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def gpu_image(artifacts_dir) -> Iterator[Built]:
    require_docker(compose=False)
    t0 = time.monotonic()
    built = subprocess.run([str(ROOT / "docker/ci/build.sh"), TAG, "gpu"], capture_output=True, text=True,
                           timeout=3000)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-8000:]
    b = Built(IMAGE)
    b.timings["build.sh ci gpu (base image + GPU image)"] = time.monotonic() - t0
    found = re.search(rf"^build: gpu {TAG} in (\d+) s$", built.stdout, re.M)
    assert found, built.stdout
    b.timings["  docker build gpu.Dockerfile"] = float(found.group(1))
    size = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", IMAGE], capture_output=True, text=True)
    assert size.returncode == 0, size.stderr
    b.notes.append(f"image {IMAGE}: {int(size.stdout) / 1e9:.2f} GB")
    try:
        yield b
    finally:
        text = "\n".join(["| step | seconds |", "|---|---:|", *(f"| {k} | {v:.0f} |" for k, v in b.timings.items()),
                          "", *b.notes])
        report("GPU image (docker/gpu.Dockerfile on the CI base)", text)
        (artifacts_dir / "gpu-image.md").write_text(text + "\n")


def test_the_image_runs_the_locked_vllm_and_engine_patch_applies(gpu_image: Built, artifacts_dir):
    code = (
        "import json, logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
        "import torch, vllm, engine_patch\n"
        "applied = engine_patch.apply()\n"
        "print('FACTS', json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
        "      'vllm': vllm.__version__, 'applied': applied, 'modules': engine_patch._PATCH_MODULES}))\n"
    )
    t0 = time.monotonic()
    out = gpu_image.run("python", "-c", code)
    gpu_image.timings["import torch, vllm, engine_patch; apply()"] = time.monotonic() - t0
    (artifacts_dir / "gpu-image-engine-patch.log").write_text(out.stdout + out.stderr)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    found = re.search(r"^FACTS (.*)$", out.stdout, re.M)
    assert found, out.stdout[-3000:]
    facts = json.loads(found.group(1))
    # The versions the lock names, not whatever pip found: vLLM's CUDA build and its torch.
    assert facts["vllm"] == _pin("requirements/gpu.txt", "vllm") == _pin("requirements/lock-gpu.txt", "vllm")
    assert facts["torch"].split("+")[0] == _pin("requirements/lock-gpu.txt", "torch")
    assert facts["cuda"], f"torch {facts['torch']} is not a CUDA build"
    # The NVIDIA runtime's driver floor is the CUDA this torch was built for.
    env = subprocess.run(["docker", "image", "inspect", "-f", "{{json .Config.Env}}", gpu_image.image],
                         capture_output=True, text=True, check=True)
    assert f"NVIDIA_REQUIRE_CUDA=cuda>={facts['cuda']}" in json.loads(env.stdout), env.stdout
    # Every patch said what it did against this vLLM: applied, or skipped with a reason.
    said = {name: (verdict, (covers or why).strip()) for verdict, name, covers, why in PATCH_LINE.findall(out.stdout)}
    assert sorted(said) == sorted(facts["modules"]), out.stdout[-4000:]
    assert sorted(n for n, (v, _) in said.items() if v == "applied") == sorted(facts["applied"])
    assert all(why for _, why in said.values()), said
    assert f"engine_patch: {len(facts['applied'])} patch(es) applied" in out.stdout, out.stdout[-2000:]
    gpu_image.notes.append(f"vLLM {facts['vllm']}, torch {facts['torch']} (CUDA {facts['cuda']})")
    gpu_image.notes += [f"engine_patch {name}: {verdict} ({why})" for name, (verdict, why) in sorted(said.items())]


def test_doctor_says_no_gpu_is_present(gpu_image: Built, artifacts_dir):
    t0 = time.monotonic()
    # The embedded database (default settings): the doctor's other checks pass, so its verdict
    # on the GPU stands out.
    out = gpu_image.run("sh", "-c", "vidlora db upgrade >/dev/null && vidlora doctor")
    gpu_image.timings["vidlora db upgrade && vidlora doctor"] = time.monotonic() - t0
    (artifacts_dir / "gpu-image-doctor.txt").write_text(out.stdout + out.stderr)
    lines = {m.group(2): (m.group(1), m.group(3))
             for m in re.finditer(r"^\[(ok  |FAIL)\] ([^:]+): (.*)$", out.stdout, re.M)}
    assert "gpu" in lines, out.stdout + out.stderr[-3000:]
    mark, detail = lines["gpu"]
    vllm = _pin("requirements/gpu.txt", "vllm")
    assert mark == "FAIL" and detail.startswith("no GPU present: no NVIDIA driver is visible"), detail
    assert f"vLLM {vllm} is the CUDA build" in detail, detail
    # Everything but the GPU (and the GPU workers, which need one) is fine in the image.
    for name in ("database", "migrations", "broker", "media store", "ffmpeg"):
        assert lines.get(name, ("missing",))[0] == "ok  ", (name, out.stdout)
    assert out.returncode == 1, out.stdout
    gpu_image.notes.append(f"vidlora doctor: [FAIL] gpu: {detail}")


# Run in the image: ldd -r on every compiled extension of vLLM, with torch's and the nvidia-*
# wheels' library folders on the search path (vLLM's extensions carry no RPATH; importing torch
# loads those libraries first). Prints {extension: [missing libraries, undefined symbols]}.
LINK_CHECK = """
import glob, json, os, re, subprocess, sysconfig
site = sysconfig.get_paths()["purelib"]
libs = sorted({os.path.dirname(p) for p in glob.glob(site + "/torch/lib/*.so*")
               + glob.glob(site + "/nvidia/**/lib/*.so*", recursive=True)})
env = dict(os.environ, LD_LIBRARY_PATH=":".join(libs))
found = {}
for so in sorted(glob.glob(site + "/vllm/**/*.so", recursive=True)):
    out = subprocess.run(["ldd", "-r", so], capture_output=True, text=True, env=env)
    text = out.stdout + out.stderr
    found[os.path.relpath(so, site)] = [sorted(set(re.findall(r"^\\s*(\\S+) => not found", text, re.M))),
                                        sorted(set(re.findall(r"undefined symbol: (\\S+)", text)))]
print(json.dumps(found))
"""


def test_vllms_cuda_kernels_link_against_the_installed_torch_and_cuda(gpu_image: Built):
    """Without a GPU vLLM falls back to its CPU platform and never loads its CUDA kernels, so
    import alone would not notice kernels built for another torch. ldd does: the only library
    missing may be the driver's libcuda.so.1 (the NVIDIA runtime mounts it), and the only
    unresolved symbols the driver API's (cu*) and the interpreter's (Py*)."""
    out = gpu_image.run("python", "-c", LINK_CHECK, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    # The kernels' names change between releases (0.26: _C, 0.33: _C_stable_libtorch).
    kernels = [so for so in found if re.search(r"/_\w*C\w*\.abi3\.so$", so)]
    assert len(kernels) >= 3, sorted(found)
    for so, (missing, undefined) in found.items():
        assert set(missing) <= {"libcuda.so.1"}, (so, missing)
        assert all(re.match(r"_?Py|cu[A-Z]", sym) for sym in undefined), (so, undefined)
    needs_driver = sorted(so for so, (missing, _) in found.items() if missing)
    assert set(kernels) & set(needs_driver), "no CUDA kernel needs the driver: not a CUDA build?"
    gpu_image.notes.append(f"{len(found)} compiled vLLM extensions link; {len(needs_driver)} wait only for the "
                           "host's libcuda.so.1")


def test_the_ca_bundle_is_in_no_layer(gpu_image: Built):
    # build.sh hands the machine's CA bundle to pip as a BuildKit secret.
    probe = gpu_image.run("sh", "-c", "ls -A /run/secrets 2>/dev/null; env | grep -c PIP_CERT || true", timeout=120)
    assert probe.returncode == 0 and probe.stdout.split() == ["0"], (probe.stdout, probe.stderr)

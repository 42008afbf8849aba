"""Video probing and frame sampling (see docs in probe.py, sampling.py, frames.py, decoders.py)."""

from __future__ import annotations

from vidlora.media.frames import SampledFrames, sample_video
from vidlora.media.probe import BadVideo, ProbeInfo, probe
from vidlora.media.sampling import SamplingPolicy, plan_timestamps, target_size

__all__ = [
    "BadVideo", "ProbeInfo", "probe", "SamplingPolicy", "plan_timestamps", "target_size",
    "SampledFrames", "sample_video",
]

"""How the command line shows a batch: per video, per scenario, with reasons."""

from __future__ import annotations

import click
from vidlora.lifecycle import AnalysisStatus


def wait_and_show(batch_id: int, timeout: float) -> int:
    """Print the batch once finished (exit code 0) or at the timeout (3)."""
    from vidlora.status import wait

    view = wait(batch_id, timeout)
    if view is None:
        raise click.ClickException(f"no batch {batch_id}")
    print_batch(view)
    return 0 if view.finished else 3


def print_batch(view) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in sorted(view.analysis_counts.items())) or "none yet"
    click.echo(f"batch {view.id} '{view.name}' [{view.state}] scenarios: {', '.join(view.scenarios)}")
    click.echo(f"  analyses: {counts}; {view.outcome}")
    if view.reason:
        click.echo(f"  note: {view.reason}")
    for video in view.videos:
        shape = f"{video.width}x{video.height} {video.duration_s or 0:.1f}s {video.codec}" if video.width else ""
        click.echo(f"  video {video.id} {video.name} [{video.status}] {shape}")
        if video.reason:
            click.echo(f"      reason: {video.reason}")
        for analysis in video.analyses:
            line = f"      {analysis.scenario:<28} {analysis.status}"
            if analysis.reason and analysis.status != AnalysisStatus.DONE:
                line += f"  ({analysis.reason})"
            click.echo(line)
    for name, reason in view.rejected:
        click.echo(f"  rejected {name}: {reason}")
    for name, reason in view.skipped:
        click.echo(f"  skipped  {name}: {reason}")

"""docs/monitoring/: the scrape config points at the compose services and ports that serve
metrics, and every alert and dashboard panel uses only metrics vidlora exports."""

from __future__ import annotations

import json
import re

import yaml

from tests.support.env import ROOT

MONITORING = ROOT / "docs" / "monitoring"
STATE_METRICS = {"vidlora_queue_depth", "vidlora_analyses", "vidlora_workers"}


def _exported() -> set[str]:
    from prometheus_client import REGISTRY

    import vidlora.metrics  # noqa: F401  (declares the event metrics)

    names = set(STATE_METRICS)
    for family in REGISTRY.collect():
        if family.name.startswith("vidlora_"):
            names |= {family.name, *(s.name for s in family.samples)}
            names |= {family.name + suffix for suffix in ("_total", "_bucket", "_count", "_sum")}
    return names


def _used(expr: str) -> set[str]:
    return set(re.findall(r"\bvidlora_[a-z_]+", expr))


def test_alerts_and_dashboard_use_only_exported_metrics():
    exported = _exported()
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"][0]["rules"]
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [r["expr"] for r in rules] + [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    unknown = set().union(*map(_used, exprs)) - exported
    assert not unknown, unknown
    assert {r["alert"] for r in rules} >= {"VidloraGpuWorkerDown", "VidloraQueueGrowing", "VidloraGuardFailuresRising"}


def test_scrape_targets_are_compose_services_on_their_metrics_ports():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    port = compose["x-app-environment"]["VIDLORA_METRICS_PORT"]
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    for job in config["scrape_configs"]:
        targets = [t for c in job.get("static_configs", []) for t in c["targets"]]
        targets += [f"{d['names'][0]}:{d['port']}" for d in job.get("dns_sd_configs", [])]
        for target in targets:
            host, target_port = target.rsplit(":", 1)
            assert host in services, target
            assert target_port == ("8000" if host == "web" else str(port)), target
    mounts = {m["source"] for m in services["prometheus"]["volumes"] if m["type"] == "bind"}
    assert mounts == {"./docs/monitoring/prometheus.yml", "./docs/monitoring/alerts.yml"}

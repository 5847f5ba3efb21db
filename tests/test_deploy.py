"""Every file an operator copies from deploy/ parses and refers to what exists."""

import configparser
import json
import pathlib
import re
import tomllib

import yaml

from wakustore.node.metrics import NodeMetrics

DEPLOY = pathlib.Path(__file__).resolve().parent.parent / "deploy"


def test_systemd_unit_parses_and_runs_serve():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(DEPLOY / "systemd" / "wakustore.service")
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    assert "wakustore serve" in unit["Service"]["ExecStart"]
    assert unit["Service"]["KillSignal"] == "SIGTERM"


def test_compose_file_describes_two_nodes_on_one_spark_connect_server():
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    services = compose["services"]
    assert {"spark", "node-a", "node-b"} <= set(services)
    for name in ("node-a", "node-b"):
        assert "sc://spark:15002" in services[name]["command"]
        assert any(v.startswith("tables:") for v in services[name]["volumes"])
        assert services[name]["environment"]["WAKUSTORE_SHARED_TABLE"] == "true"
    for service in services.values():
        dockerfile = service["build"].get("dockerfile")
        if dockerfile:
            context = (DEPLOY / "compose" / service["build"]["context"]).resolve()
            assert (context / dockerfile).is_file()


def test_kubernetes_manifests_parse_and_mount_the_shared_table():
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "wakustore.yaml").read_text()) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "PersistentVolumeClaim", "ConfigMap", "Deployment", "StatefulSet", "Service"} <= kinds
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["node.toml"]
    import tomllib

    assert tomllib.loads(config)["engine"].startswith("sc://")
    assert tomllib.loads(config)["shared_table"] is True
    for doc in docs:
        assert doc["metadata"].get("namespace", "wakustore") == "wakustore"


def test_containerfiles_copy_existing_paths():
    root = DEPLOY.parent
    for line in (DEPLOY / "container" / "Containerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (root / source).exists(), source


def test_containerfile_copies_every_package_folder():
    """`pip install .` in the image needs every folder pyproject.toml maps."""
    root = DEPLOY.parent
    folders = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    copied = {line.split()[1] for line in (DEPLOY / "container" / "Containerfile").read_text().splitlines()
              if line.startswith("COPY ")}
    assert folders <= copied, sorted(folders - copied)


def test_grafana_dashboard_uses_only_metrics_the_node_exports():
    dashboard = json.loads((DEPLOY / "grafana" / "wakustore-dashboard.json").read_text())
    exported = set()
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    for metric in NodeMetrics().registry.collect():
        exported |= {metric.name + suffix for suffix in suffixes[metric.type]}
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"wakustore_[a-z_]+", target["expr"]))
    assert used and used <= exported

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


# What an operator sets for an S3-compatible store (README, "A fleet").
S3_KEYS = {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ALLOW_HTTP"}


def _bucket_of(table_root: str) -> str:
    assert table_root.startswith("s3://"), table_root
    return table_root.removeprefix("s3://").split("/", 1)[0]


def test_compose_file_describes_two_nodes_on_sail_in_cluster_mode_and_a_minio_bucket():
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    services = compose["services"]
    assert {"minio", "bucket", "sail", "node-a", "node-b", "spark", "spark-master", "spark-worker-1"} <= set(services)
    sail = services["sail"]
    assert sail["environment"]["SAIL_MODE"] == "local-cluster"
    assert S3_KEYS <= set(sail["environment"])
    for name in ("node-a", "node-b"):
        node = services[name]
        env = node["environment"]
        assert env["WAKUSTORE_ENGINE"] == "${WAKUSTORE_ENGINE:-sc://sail:15002}"
        assert env["WAKUSTORE_SHARED_TABLE"] == "true"
        assert S3_KEYS <= set(env)
        # The nodes and the engine reach the same store with the same keys.
        assert {k: env[k] for k in S3_KEYS} == {k: sail["environment"][k] for k in S3_KEYS}
        assert env["AWS_ENDPOINT_URL"].startswith("http://minio:")
        assert (
            f"mb --ignore-existing fleet/{_bucket_of(env['WAKUSTORE_TABLE_ROOT'])}" in services["bucket"]["command"][0]
        )
        assert node["depends_on"]["bucket"]["condition"] == "service_completed_successfully"
        assert any(v.endswith(":/var/lib/wakustore") for v in node["volumes"])
    assert services["minio"]["environment"]["MINIO_ROOT_USER"] == services["node-a"]["environment"]["AWS_ACCESS_KEY_ID"]
    assert (
        services["minio"]["environment"]["MINIO_ROOT_PASSWORD"]
        == (services["node-a"]["environment"]["AWS_SECRET_ACCESS_KEY"])
    )
    # Spark with Delta: a standalone cluster and one Spark Connect server
    # on it, all from the project's Spark image, off by default.
    spark = services["spark"]
    assert spark["profiles"] == ["spark"]
    assert spark["command"][:3] == ["python", "-m", "wakustore.storage.spark_server"]
    assert "--s3" in spark["command"] and "spark://spark-master:7077" in spark["command"]
    assert S3_KEYS <= set(spark["environment"])
    for name in ("spark-master", "spark-worker-1", "spark-worker-2"):
        assert services[name]["profiles"] == ["spark"]
        assert services[name]["build"]["dockerfile"] == "deploy/container/spark-connect.Containerfile"
    assert "spark://spark-master:7077" in services["spark-worker-2"]["command"]
    for service in services.values():
        dockerfile = service.get("build", {}).get("dockerfile")
        if dockerfile:
            context = (DEPLOY / "compose" / service["build"]["context"]).resolve()
            assert (context / dockerfile).is_file()


def test_kubernetes_manifests_run_sail_in_cluster_mode_on_a_minio_bucket():
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "wakustore.yaml").read_text()) if d]
    kinds = {d["kind"] for d in docs}
    assert {
        "Namespace",
        "Secret",
        "ConfigMap",
        "Deployment",
        "StatefulSet",
        "Service",
        "Job",
        "ServiceAccount",
        "Role",
        "RoleBinding",
    } <= kinds
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    config = tomllib.loads(by_name["ConfigMap", "wakustore-config"]["data"]["node.toml"])
    assert config["engine"] == "sc://sail.wakustore.svc:15002"
    assert config["shared_table"] is True
    secret = by_name["Secret", "wakustore-storage"]["stringData"]
    assert S3_KEYS <= set(secret)
    assert secret["AWS_ENDPOINT_URL"].startswith("http://minio.wakustore.svc:")
    assert by_name["Service", "minio"] and by_name["Service", "sail"]
    job = by_name["Job", "minio-bucket"]["spec"]["template"]["spec"]["containers"][0]
    assert f"mb --ignore-existing fleet/{_bucket_of(config['table_root'])}" in job["args"][0]

    sail = by_name["Deployment", "sail"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in sail["containers"][0]["env"]}
    assert env["SAIL_MODE"] in {"kubernetes-cluster", "local-cluster"}
    assert {"SAIL_KUBERNETES__IMAGE", "SAIL_KUBERNETES__DRIVER_POD_NAME", "SAIL_CLUSTER__DRIVER_EXTERNAL_HOST"} <= set(
        env
    )
    assert sail["serviceAccountName"] == "sail"
    rules = by_name["Role", "sail-workers"]["rules"]
    assert any("pods" in r["resources"] and {"create", "delete", "watch"} <= set(r["verbs"]) for r in rules)
    binding = by_name["RoleBinding", "sail-workers"]
    assert binding["subjects"][0]["name"] == "sail" and binding["roleRef"]["name"] == "sail-workers"

    for workload in (sail, by_name["StatefulSet", "wakustore"]["spec"]["template"]["spec"]):
        assert {"secretRef": {"name": "wakustore-storage"}} in workload["containers"][0]["envFrom"]
    for doc in docs:
        assert doc["metadata"].get("namespace", "wakustore") == "wakustore"


def test_kubernetes_spark_manifests_run_one_connect_server_on_a_standalone_cluster():
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "spark.yaml").read_text()) if d]
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert {("Deployment", "spark-master"), ("Service", "spark-master"), ("Deployment", "spark-worker")} <= set(by_name)
    connect = by_name["Deployment", "spark"]
    assert connect["spec"]["replicas"] == 1 and connect["spec"]["strategy"]["type"] == "Recreate"
    container = connect["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["python", "-m", "wakustore.storage.spark_server"]
    assert "spark://spark-master.wakustore.svc:7077" in container["command"] and "--s3" in container["command"]
    assert {"secretRef": {"name": "wakustore-storage"}} in container["envFrom"]
    assert by_name["Service", "spark"]["spec"]["ports"][0]["port"] == 15002
    worker = by_name["Deployment", "spark-worker"]["spec"]["template"]["spec"]["containers"][0]
    assert worker["command"][-1] == "spark://spark-master.wakustore.svc:7077"
    for doc in docs:
        assert doc["metadata"]["namespace"] == "wakustore"


def test_spark_image_installs_the_node_and_its_pinned_jars():
    text = (DEPLOY / "container" / "spark-connect.Containerfile").read_text()
    assert "pip install --no-cache-dir ." in text
    assert "python -m wakustore.storage.spark_jars" in text
    assert "openjdk-17-jre-headless" in text


def test_sail_image_installs_the_pysail_the_node_requires():
    requirement = next(
        d
        for d in tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["dependencies"]
        if d.startswith("pysail")
    )
    assert f'"{requirement}"' in (DEPLOY / "container" / "sail.Containerfile").read_text()


def test_containerfiles_copy_existing_paths():
    root = DEPLOY.parent
    for name in ("Containerfile", "spark-connect.Containerfile"):
        for line in (DEPLOY / "container" / name).read_text().splitlines():
            if line.startswith("COPY "):
                for source in line.split()[1:-1]:
                    assert (root / source).exists(), source


def test_containerfile_copies_every_package_folder():
    """`pip install .` in the image needs the folder pyproject.toml finds
    the packages under (src/, links) and every folder a package's link
    leads to."""
    root = DEPLOY.parent
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    base = root / setuptools["package-dir"][""]
    folders = {setuptools["package-dir"][""]} | {
        str((base / package.replace(".", "/")).resolve().relative_to(root)) for package in setuptools["packages"]
    }
    copied = {
        line.split()[1]
        for line in (DEPLOY / "container" / "Containerfile").read_text().splitlines()
        if line.startswith("COPY ")
    }
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
            used |= set(re.findall(r"wakustore_[a-z0-9_]+", target["expr"]))
    assert used and used <= exported


def test_grafana_dashboard_shows_every_metric_the_node_exports():
    """An operator finds each family on the dashboard (a new metric gets a panel)."""
    dashboard = json.loads((DEPLOY / "grafana" / "wakustore-dashboard.json").read_text())
    shown = " ".join(target["expr"] for panel in dashboard["panels"] for target in panel["targets"])
    families = {metric.name for metric in NodeMetrics().registry.collect()}
    assert families
    assert sorted(name for name in families if name not in shown) == []
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])


def test_readme_lists_every_metric_family():
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    missing = []
    for metric in NodeMetrics().registry.collect():
        name = metric.name + ("_total" if metric.type == "counter" else "")
        if name.startswith("wakustore_process_"):
            name = "wakustore_process_*"
        if f"`{name}`" not in section:
            missing.append(name)
    assert missing == []


def test_sample_node_toml_names_every_key_with_its_default():
    """deploy/node.toml, uncommented, is a valid configuration equal to the
    defaults, and names every key (it cannot drift from NodeConfig)."""
    import dataclasses

    from wakustore.node.config import NodeConfig

    text = (DEPLOY / "node.toml").read_text()
    uncommented = "\n".join(
        line[2:].split("  #", 1)[0] for line in text.splitlines() if re.match(r"# [a-z_0-9]+ = ", line)
    )
    values = tomllib.loads(uncommented)
    defaults = NodeConfig()
    assert sorted(values) == sorted(f.name for f in dataclasses.fields(NodeConfig))
    for name, value in values.items():
        default = getattr(defaults, name)
        assert (str(default) if isinstance(default, pathlib.Path) else default) == (
            str(pathlib.Path(value)) if isinstance(default, pathlib.Path) else value
        ), name

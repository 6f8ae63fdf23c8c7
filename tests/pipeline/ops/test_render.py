"""`longdoc render`: KubeRay manifests that parse and carry the spec's values."""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import typer
import yaml
from typer.testing import CliRunner

from pipeline.ops.render import RenderOptions, date_expression, render, render_manifests
from schemas.loading import load_spec, spec_from_dict

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "jobs" / "sample-summarize.yaml"

_app = typer.Typer()
_app.command("render")(render)
_app.command("noop")(lambda: None)  # two commands keep typer from flattening the app


def _render(*args: str) -> tuple[int, list[dict], str]:
    r = CliRunner().invoke(_app, ["render", *args])
    docs = list(yaml.safe_load_all(r.stdout)) if r.exit_code == 0 else []
    return r.exit_code, docs, r.output


def _workers(doc: dict) -> list[dict]:
    spec = doc["spec"] if doc["kind"] == "RayJob" else doc["spec"]["jobTemplate"]
    return spec["rayClusterSpec"]["workerGroupSpecs"]


def test_rayjob_cpu_from_sample_spec():
    code, docs, out = _render(str(SAMPLE), "--date", "2026-01-31", "--image", "reg.example/longdoc:7",
                              "--secret", "longdoc-s3", "--namespace", "batch")
    assert code == 0, out
    cm, rj = docs
    assert cm["kind"] == "ConfigMap" and rj["kind"] == "RayJob" and rj["apiVersion"] == "ray.io/v1"
    assert rj["metadata"] == {"name": "sample-summarize-2026-01-31", "namespace": "batch",
                              "labels": {"app.kubernetes.io/name": "longdoc", "longdoc/job": "sample-summarize"}}
    # The embedded spec is the resolved spec, identical to what `longdoc run` would load.
    assert spec_from_dict(yaml.safe_load(cm["data"]["job.yaml"])) == load_spec(SAMPLE)
    spec = rj["spec"]
    assert spec["entrypoint"] == "longdoc run /etc/longdoc/job.yaml --date 2026-01-31"
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 600 and spec["activeDeadlineSeconds"] == 21600
    head = spec["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"] == {"num-cpus": "0"}
    assert head["template"]["spec"]["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]
    (group,) = _workers(rj)
    assert group["groupName"] == "cpu-workers"
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 1  # resources.actors
    (c,) = group["template"]["spec"]["containers"]
    assert c["image"] == "reg.example/longdoc:7"
    assert c["resources"]["limits"] == {"cpu": "3", "memory": "8Gi"}  # num_cpus 2 + 1, no GPU
    assert c["envFrom"] == [{"secretRef": {"name": "longdoc-s3"}}]
    assert "enableInTreeAutoscaling" not in spec["rayClusterSpec"]


def test_raycronjob_gpu_autoscaling_and_timezone():
    code, docs, out = _render(
        str(SAMPLE), "--kind", "raycronjob", "--schedule", "30 1 * * *", "--timezone", "Europe/Zurich",
        "--date-offset-days", "-1", "--set", "resources.actors=[2,6]", "--set", "resources.num_gpus=1",
        "--set", "resources.compress_num_gpus=0.5", "--set", "resources.compress_actors=4",
        "--max-failed-fraction", "0.1",
    )
    assert code == 0, out
    cm, cron = docs
    assert cron["kind"] == "RayCronJob" and cron["metadata"]["name"] == "sample-summarize"
    assert cron["spec"]["schedule"] == "CRON_TZ=Europe/Zurich 30 1 * * *"
    job = cron["spec"]["jobTemplate"]
    assert job["shutdownAfterJobFinishes"] is True
    assert job["entrypoint"].endswith("--max-failed-fraction 0.1")
    gen, comp = _workers(cron)
    assert gen["groupName"] == "gpu-workers"
    assert (gen["replicas"], gen["minReplicas"], gen["maxReplicas"]) == (2, 2, 6)
    lim = gen["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert lim["nvidia.com/gpu"] == "1" and lim["cpu"] == "3"
    # 4 compression actors x 0.5 GPU pack onto 2 one-GPU pods.
    assert comp["groupName"] == "compress-gpu-workers" and comp["replicas"] == 2
    assert comp["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert job["rayClusterSpec"]["enableInTreeAutoscaling"] is True
    assert yaml.safe_load(cm["data"]["job.yaml"])["resources"]["actors"] == [2, 6]


@pytest.mark.parametrize(("tz", "offset"), [("UTC", 0), ("Pacific/Auckland", -1)])
def test_computed_run_date_evaluates_in_a_shell(tz, offset):
    expr = date_expression(RenderOptions(timezone=tz, date_offset_days=offset))
    got = subprocess.run(["sh", "-c", f"echo {expr}"], capture_output=True, text=True, check=True)
    want = (datetime.now(ZoneInfo(tz)) + timedelta(days=offset)).date().isoformat()
    assert got.stdout.strip() == want


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kind", "deployment"], "allowed: rayjob, raycronjob"),
        (["--kind", "raycronjob", "--schedule", "every night"], "cron expression"),
        (["--timezone", "Mars Base"], "IANA zone"),
        (["--date", "31.01.2026"], "YYYY-MM-DD"),
        (["--set", "resources.num_gpus=-1"], "resources.num_gpus"),
    ],
)
def test_bad_values_exit_2_naming_the_value(args, message):
    code, _, out = _render(str(SAMPLE), *args)
    assert code == 2 and message in out


def test_name_sanitised_for_kubernetes():
    job = spec_from_dict({"name": "Nightly_QA.v2", "input": {"uri": "s3://b/x"}})
    cm, rj = render_manifests(job, RenderOptions(run_date="2026-03-01", ray_version="2.60.0"))
    assert rj["metadata"]["name"] == "nightly-qa-v2-2026-03-01" and cm["metadata"]["name"].endswith("-spec")


@pytest.mark.parametrize(("path", "kind"), [("rayjob-sample.yaml", "RayJob"),
                                             ("raycronjob-nightly.yaml", "RayCronJob")])
def test_example_manifests_in_infra_are_valid(path, kind):
    cm, doc = yaml.safe_load_all((ROOT / "infra" / path).read_text())
    assert doc["kind"] == kind and cm["kind"] == "ConfigMap"
    job = spec_from_dict(yaml.safe_load(cm["data"]["job.yaml"]))
    assert job.input.uri.startswith("s3://") and job.output.uri.startswith("s3://")
    assert all(g["template"]["spec"]["containers"][0]["envFrom"] for g in _workers(doc))

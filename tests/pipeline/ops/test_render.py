"""`longdoc render`: KubeRay manifests that parse and carry the spec's values."""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import jsonschema
import kubernetes_validate
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


#: The sample spec writes to a local folder, which render refuses (a pod's disk): the
#: renders below give an object-store output unless they test the output themselves.
S3_OUT = ("--set", "output.uri=s3://b/out/{job}")


def _render(*args: str) -> tuple[int, list[dict], str]:
    if not any(a.startswith("output.uri=") for a in args) and "--output-pvc" not in args:
        args = (*args, *S3_OUT)
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
    assert spec_from_dict(yaml.safe_load(cm["data"]["job.yaml"])) == load_spec(SAMPLE, [S3_OUT[1]])
    spec = rj["spec"]
    assert spec["entrypoint"] == "longdoc run /etc/longdoc/job.yaml --date 2026-01-31 --runner ray"
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 600 and spec["activeDeadlineSeconds"] == 21600
    assert spec["backoffLimit"] == 1
    head = spec["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"] == {"num-cpus": "0"}
    assert head["template"]["spec"]["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]
    (group,) = _workers(rj)
    assert group["groupName"] == "cpu-workers"
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 1  # resources.actors
    (c,) = group["template"]["spec"]["containers"]
    assert c["image"] == "reg.example/longdoc:7"
    assert c["resources"]["limits"] == {"cpu": "2", "memory": "8Gi"}  # num_cpus auto (1 on a cluster) + 1, no GPU
    assert c["envFrom"] == [{"secretRef": {"name": "longdoc-s3"}}]
    assert "enableInTreeAutoscaling" not in spec["rayClusterSpec"]
    pod = group["template"]["spec"]
    assert "tolerations" not in pod and "serviceAccountName" not in pod  # CPU pod, no options
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_raycronjob_gpu_autoscaling_and_timezone():
    code, docs, out = _render(
        str(SAMPLE), "--kind", "raycronjob", "--schedule", "30 1 * * *", "--timezone", "Europe/Zurich",
        "--date-offset-days", "-1", "--set", "resources.actors=[2,6]", "--set", "resources.num_gpus=1", "--set", "resources.num_cpus=2",
        "--set", "compression={method: rag, target_tokens: 512}",
        "--set", "resources.compress_num_gpus=0.5", "--set", "resources.compress_actors=4",
        "--max-failed-fraction", "0.1", "--service-account", "longdoc-runner",
        "--toleration", "dedicated=batch:NoSchedule",
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
    assert lim["nvidia.com/gpu"] == "1" and lim["cpu"] == "3"  # num_cpus 2 + 1
    # 4 RAG actors x 0.5 GPU pack onto 2 one-GPU pods.
    assert comp["groupName"] == "compress-gpu-workers" and comp["replicas"] == 2
    assert comp["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert job["rayClusterSpec"]["enableInTreeAutoscaling"] is True
    assert yaml.safe_load(cm["data"]["job.yaml"])["resources"]["actors"] == [2, 6]
    for pod in [g["template"]["spec"] for g in (gen, comp)]:
        assert pod["serviceAccountName"] == "longdoc-runner"
        assert pod["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}]
    head = job["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "batch",
                                    "effect": "NoSchedule"}]  # no GPU toleration on the head


@pytest.mark.parametrize("method", ["finch", "truncate", "none"])
def test_no_compression_gpu_group_without_rag(method):
    job = spec_from_dict({"name": "n", "input": {"uri": "s3://b/x"}, "output": {"uri": "s3://b/out/{job}"},
                          "compression": {"method": method} | ({"target_tokens": 256} if method != "none" else {}),
                          "resources": {"num_gpus": 1, "compress_num_gpus": 1, "compress_actors": 2}})
    _, rj = render_manifests(job, RenderOptions(ray_version="2.60.0"))
    assert [g["groupName"] for g in _workers(rj)] == ["gpu-workers"]


@pytest.mark.parametrize(("actors", "gpus", "pods", "per_pod_gpu", "cpu", "mem"), [
    (4, 0.25, (1, 1), "1", "5", "32Gi"),        # 4 x 0.25 GPU -> one pod, one GPU
    ([2, 8], 0.25, (1, 2), "1", "5", "32Gi"),   # autoscaling bounds in pods
    (3, 0.5, (2, 2), "1", "3", "16Gi"),         # 2 per pod, the last pod half used
    (2, 1.5, (2, 2), "2", "2", "8Gi"),          # > 1 GPU: a pod each, whole GPUs
    (3, 0.0, (3, 3), None, "2", "8Gi"),         # CPU: a pod per actor
    (2, 0.25, (1, 1), "1", "3", "16Gi"),        # fewer actors than share a GPU: the pod sized for them
])
def test_fractional_gpus_pack_onto_pods(actors, gpus, pods, per_pod_gpu, cpu, mem):
    job = spec_from_dict({"name": "n", "input": {"uri": "s3://b/x"}, "output": {"uri": "s3://b/out/{job}"},
                          "resources": {"actors": actors, "num_gpus": gpus, "num_cpus": 1}})
    _, rj = render_manifests(job, RenderOptions(ray_version="2.60.0"))
    (g,) = _workers(rj)
    assert (g["minReplicas"], g["maxReplicas"]) == pods
    lim = g["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert lim.get("nvidia.com/gpu") == per_pod_gpu and lim["cpu"] == cpu and lim["memory"] == mem
    assert ("tolerations" in g["template"]["spec"]) == (per_pod_gpu is not None)


def test_the_edges_of_the_options_reach_the_manifest():
    """A date offset of a whole leap year either way is allowed, and --max-failed-fraction 0
    (fail the night on any failed row) is written into the entrypoint, not dropped as unset."""
    from pipeline.ops.render import entrypoint

    job = spec_from_dict({"name": "n", "input": {"uri": "s3://b/x"}, "output": {"uri": "s3://b/out/{job}"}})
    for days in (-366, 366):
        render_manifests(job, RenderOptions(ray_version="2.60.0", date_offset_days=days))
    cmd = entrypoint(RenderOptions(run_date="2026-01-31", max_failed_fraction=0.0))
    assert shlex.split(cmd)[-2:] == ["--max-failed-fraction", "0.0"]


@pytest.mark.parametrize(("tz", "offset"), [("UTC", 0), ("Pacific/Auckland", -1)])
def test_computed_run_date_evaluates_in_a_shell(tz, offset):
    expr = date_expression(RenderOptions(timezone=tz, date_offset_days=offset))
    got = subprocess.run(["sh", "-c", f"echo {expr}"], capture_output=True, text=True, check=True)
    want = (datetime.now(ZoneInfo(tz)) + timedelta(days=offset)).date().isoformat()
    assert got.stdout.strip() == want


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kind", "deployment"], "'deployment' is not one of 'rayjob', 'raycronjob'"),
        (["--kind", "raycronjob", "--schedule", "every night"], "--schedule 'every night' has 2 field(s)"),
        (["--schedule", "61 2 * * *"], "minute field '61': 61 is out of range"),
        (["--timezone", "Mars Base"], "--timezone 'Mars Base'"),
        (["--timezone", "Mars/Olympus_Mons"], "not a known IANA time zone"),
        (["--date", "31.01.2026"], "YYYY-MM-DD"),
        (["--kind", "raycronjob", "--date", "2026-01-31"], "every night would run that same date"),
        (["--set", "resources.num_gpus=-1"], "resources.num_gpus"),
        (["--toleration", "nvidia.com/gpu:Never"], "--toleration"),
        (["--service-account", "Bad_Name"], "--service-account"),
        (["--shm-size", "lots"], "--shm-size"),
        (["--backoff-limit", "-1"], "--backoff-limit"),
        (["--secret", "My Secret"], "--secret"),
    ],
)
def test_bad_values_exit_2_naming_the_value(args, message):
    code, _, out = _render(str(SAMPLE), *args)
    # the message as one line: typer boxes an Enum option's refusal and wraps it in the box
    assert code == 2 and message in " ".join(out.replace("│", " ").split())


def test_name_sanitised_for_kubernetes():
    job = spec_from_dict({"name": "Nightly_QA.v2", "input": {"uri": "s3://b/x"}, "output": {"uri": "s3://b/out/{job}"}})
    cm, rj = render_manifests(job, RenderOptions(run_date="2026-03-01", ray_version="2.60.0"))
    assert rj["metadata"]["name"] == "nightly-qa-v2-2026-03-01" and cm["metadata"]["name"].endswith("-spec")
    digits = spec_from_dict({"name": "2026-report", "input": {"uri": "s3://b/x"}, "output": {"uri": "s3://b/out/{job}"}})
    assert render_manifests(digits, RenderOptions(ray_version="2.60.0"))[1]["metadata"]["name"] == "j-2026-report"


_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize(("kind", "date", "limit"), [("rayjob", "2026-03-01", 47), ("rayjob", None, 47),
                                                      ("raycronjob", None, 41)])
def test_long_names_are_cut_without_collisions(kind, date, limit):
    stem = "contracts-nightly-question-answering-for-the-legal-department-"
    names = set()
    for suffix in ("emea", "apac", "us"):
        job = spec_from_dict({"name": stem + suffix, "input": {"uri": "s3://b/x"}, "output": {"uri": "s3://b/out/{job}"}})
        _, doc = render_manifests(job, RenderOptions(kind=kind, run_date=date, ray_version="2.60.0"))
        name = doc["metadata"]["name"]
        assert len(name) <= limit and _DNS1035.match(name), name
        assert name.startswith("contracts-nightly") and (date is None or name.endswith(date))
        assert len(doc["metadata"]["labels"]["longdoc/job"]) <= 63
        names.add(name)
    assert len(names) == 3


@pytest.mark.parametrize(("path", "kind"), [("rayjob-sample.yaml", "RayJob"),
                                             ("raycronjob-nightly.yaml", "RayCronJob")])
def test_example_manifests_in_infra_are_valid(path, kind):
    cm, doc = yaml.safe_load_all((ROOT / "infra" / path).read_text())
    assert doc["kind"] == kind and cm["kind"] == "ConfigMap"
    job = spec_from_dict(yaml.safe_load(cm["data"]["job.yaml"]))
    assert job.input.uri.startswith("s3://") and job.output.uri.startswith("s3://")
    assert all(g["template"]["spec"]["containers"][0]["envFrom"] for g in _workers(doc))
    assert schema_errors([cm, doc]) == []
    assert doc["spec"].get("backoffLimit", doc["spec"].get("jobTemplate", {}).get("backoffLimit")) == 1
    # The command in the file's header, run with today's code, renders the file's manifests.
    text = (ROOT / "infra" / path).read_text()
    header = [line[1:].strip() for line in text.splitlines() if line.startswith("# ")]
    command = " ".join(h for h in header if not h.startswith(("Apply:", "Every night"))).replace("\\", " ")
    args = shlex.split(command.removeprefix("Rendered by: longdoc render"))
    code, docs, out = _render(*args)
    assert code == 0, out
    assert docs == [cm, doc], f"infra/{path} is stale: render it again with the command in its header"


# ----------------------------------------------------------------------------- schema checks
# Kubernetes objects against the Kubernetes OpenAPI schemas (kubernetes-validate, strict:
# unknown fields fail); RayJob / RayCronJob against a JSON Schema derived from the KubeRay
# v1.6.2 CRDs (infra/kuberay-schema/, pod templates checked as Kubernetes PodTemplates).
K8S_VERSION = "1.33.0"
KUBERAY_SCHEMAS = {v: json.loads((ROOT / "infra" / "kuberay-schema" / f"kuberay-v{v}.json").read_text())
                   for v in ("1.6.2", "1.7.0")}


def schema_errors(docs: list[dict], kuberay: str = "1.6.2") -> list[str]:
    """Every schema violation of rendered manifests against the Kubernetes schemas and the
    CRD schema of KubeRay ``kuberay``, as readable strings (empty = valid)."""
    errors: list[str] = []
    for doc in docs:
        if doc["apiVersion"] == "v1":
            errors += _k8s_errors(doc)
            continue
        v = jsonschema.Draft202012Validator(KUBERAY_SCHEMAS[kuberay][doc["kind"]])
        errors += [f"{doc['kind']} {'/'.join(map(str, e.path))}: {e.message}" for e in v.iter_errors(doc)]
        spec = doc["spec"] if doc["kind"] == "RayJob" else doc["spec"]["jobTemplate"]
        cluster = spec["rayClusterSpec"]
        templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
        for t in templates:
            errors += _k8s_errors({"apiVersion": "v1", "kind": "PodTemplate",
                                   "metadata": {"name": "t"}, "template": t})
    return errors


def _k8s_errors(obj: dict) -> list[str]:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{obj['kind']}: {e.message} at {'/'.join(map(str, e.path))}"]
    return []


@pytest.mark.parametrize("args", [
    [],
    ["--date", "2026-01-31", "--namespace", "batch", "--secret", "longdoc-s3", "--service-account", "runner"],
    ["--kind", "raycronjob", "--timezone", "Europe/Zurich", "--set", "resources.actors=[1,4]",
     "--set", "resources.num_gpus=0.25", "--toleration", "dedicated=batch:NoSchedule", "--shm-size", "0"],
    ["--set", "compression={method: rag, target_tokens: 512}", "--set", "resources.compress_num_gpus=0.5",
     "--set", "resources.compress_actors=3", "--set", "resources.num_gpus=2", "--no-gpu-toleration"],
])
def test_rendered_manifests_pass_kubernetes_and_kuberay_schemas(args):
    code, docs, out = _render(str(SAMPLE), *args)
    assert code == 0, out
    assert schema_errors(docs) == []


def test_schema_check_catches_mistakes():
    """The check is not a rubber stamp: typical slips in either schema are reported."""
    _, docs, _ = _render(str(SAMPLE), "--set", "resources.num_gpus=1")
    cm, rj = docs
    bad = copy.deepcopy(rj)
    bad["spec"]["shutdownAfterJobFinish"] = True  # misspelt: the API server would drop it
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "two"
    pod = bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    pod["tolerations"][0]["operator"] = ["Exists"]
    bad_cm = copy.deepcopy(cm) | {"data": {"job.yaml": 7}}
    errors = schema_errors([bad_cm, bad])
    assert any("shutdownAfterJobFinish" in e for e in errors)
    assert any("replicas" in e for e in errors)
    assert any(e.startswith("PodTemplate") for e in errors)
    assert any(e.startswith("ConfigMap") for e in errors)


def test_render_warns_about_local_paths_missing_secrets_and_registryless_images():
    """The manifest renders, and stderr names what will fail on the pods."""
    r = CliRunner().invoke(_app, ["render", str(SAMPLE), *S3_OUT])
    assert r.exit_code == 0 and list(yaml.safe_load_all(r.stdout))
    assert "warning: input.uri" in r.stderr and "is a local path" in r.stderr and "pod's own disk" in r.stderr
    assert "image 'longdoc:0.1.0' names no registry" in r.stderr and "e.g. ghcr.io/ORG/longdoc:1.0" in r.stderr
    r = CliRunner().invoke(_app, ["render", str(SAMPLE), "--set", "input.uri=s3://b/in/",
                                  "--set", "output.uri=s3://b/out/{job}"])
    assert "object storage and no --secret" in r.stderr and "local path" not in r.stderr
    r = CliRunner().invoke(_app, ["render", str(SAMPLE), "--set", "input.uri=s3://b/in/",
                                  "--set", "output.uri=s3://b/out/{job}", "--secret", "s3-creds",
                                  "--image", "registry.example.com/longdoc:0.1.0"])
    assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr


def test_a_nightly_manifest_names_the_feature_gate_the_zone_prefix_and_the_clock_changes():
    """What applies cleanly and then fails at night: said on stderr, the manifest still rendered."""
    base = ["render", str(SAMPLE), "--kind", "raycronjob", "--set", "input.uri=s3://b/in/",
            "--set", "output.uri=s3://b/out/{job}", "--secret", "s3-creds", "--image", "registry.example.com/longdoc:1"]
    r = CliRunner().invoke(_app, [*base, "--schedule", "0 2 * * *", "--timezone", "Europe/Berlin"])
    assert r.exit_code == 0 and list(yaml.safe_load_all(r.stdout)), r.stderr
    assert "--feature-gates=RayCronJob=true" in r.stderr and "v1.7 refuses it" in r.stderr
    assert "Europe/Berlin skips" in r.stderr and "Europe/Berlin repeats" in r.stderr and "'30 3 * * *'" in r.stderr
    r = CliRunner().invoke(_app, [*base, "--schedule", "30 3 * * *", "--timezone", "Europe/Berlin"])
    assert "skips" not in r.stderr and "repeats" not in r.stderr and "feature gate" in r.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["--kind", "raycronjob", "--schedule", "0 2 31 2 *"], "--schedule '0 2 31 2 *' never fires"),
    (["--deadline-seconds", "0"], "--deadline-seconds 0: allowed: a whole number from 1 to"),
])
def test_what_kuberay_would_refuse_or_fire_at_once_is_refused_here(args, said):
    r = CliRunner().invoke(_app, ["render", str(SAMPLE), *args])
    assert r.exit_code == 2 and said in r.stderr and not r.stdout, r.stderr


def test_kuberay_1_7_gets_the_zone_in_spec_time_zone_not_the_schedule():
    """v1.7 refuses a TZ in the schedule and, without spec.timeZone, fires in the operator's
    own zone: the zone goes to spec.timeZone (UTC too), the name fits v1.7's 36 characters."""
    base = [str(SAMPLE), "--kind", "raycronjob", "--schedule", "30 3 * * *", "--kuberay-version", "1.7"]
    code, docs, out = _render(*base, "--timezone", "Europe/Zurich")
    assert code == 0, out
    cron = docs[1]["spec"]
    assert cron["schedule"] == "30 3 * * *" and cron["timeZone"] == "Europe/Zurich"
    assert "v1.7 refuses it" not in out
    assert schema_errors(docs, "1.7.0") == []
    assert any("timeZone" in e for e in schema_errors(docs, "1.6.2"))  # v1.6's CRD has no such field
    code, docs, out = _render(*base)
    assert code == 0 and docs[1]["spec"]["timeZone"] == "UTC" and docs[1]["spec"]["schedule"] == "30 3 * * *"
    # v1.6 (the default) keeps the prefix it reads and says what to do on v1.7
    code, docs, out = _render(str(SAMPLE), "--kind", "raycronjob", "--timezone", "Europe/Zurich")
    assert docs[1]["spec"]["schedule"] == "CRON_TZ=Europe/Zurich 0 2 * * *" and "timeZone" not in docs[1]["spec"]
    assert "--kuberay-version 1.7" in " ".join(out.split())
    long = spec_from_dict({"name": "contracts-nightly-question-answering-emea", "input": {"uri": "s3://b/x"}, "output": {"uri": "s3://b/out/{job}"}})
    _, doc = render_manifests(long, RenderOptions(kind="raycronjob", kuberay_version="1.7", ray_version="2.60.0"))
    assert len(doc["metadata"]["name"]) <= 36 and _DNS1035.match(doc["metadata"]["name"])


@pytest.mark.parametrize(("output", "said"), [
    ("out/{job}", "output.uri 'out/{job}' is a local path"),
    ("file:///srv/out/{job}", "is a local path"),
    ("memory://out/{job}", "in one process's memory"),
])
def test_an_output_that_dies_with_the_cluster_is_refused_with_the_fix(output, said):
    """The cluster is deleted after the job: rows on a pod's disk would be gone after a
    run that reported success. Refused, naming object storage and --output-pvc."""
    r = CliRunner().invoke(_app, ["render", str(SAMPLE), "--set", f"output.uri={output}"])
    assert r.exit_code == 2 and not r.stdout and said in r.stderr, r.stderr
    assert "s3://" in r.stderr and ("--output-pvc" in r.stderr or "memory" in said)


def test_output_pvc_mounts_the_claim_above_the_output_on_every_ray_pod():
    code, docs, out = _render(str(SAMPLE), "--set", "output.uri=/data/longdoc/{job}", "--output-pvc", "nightly-out",
                              "--set", "compression={method: rag, target_tokens: 512}",
                              "--set", "resources.compress_num_gpus=1", "--set", "resources.num_gpus=1")
    assert code == 0, out
    cluster = docs[1]["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in
                                                             cluster["workerGroupSpecs"]]
    assert len(pods) == 3  # head (the date's commit), generate and compress workers (write tasks)
    for pod in pods:
        assert {"name": "output", "persistentVolumeClaim": {"claimName": "nightly-out"}} in pod["volumes"]
        assert {"name": "output", "mountPath": "/data/longdoc"} in pod["containers"][0]["volumeMounts"]
    assert "output.uri" not in out  # no warning left for the output
    assert schema_errors(docs) == []
    # without a placeholder the root's parent is mounted: the run records sit beside the root
    _, docs, _ = _render(str(SAMPLE), "--set", "output.uri=/data/out", "--output-pvc", "o")
    head = docs[1]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "output", "mountPath": "/data"} in head["volumeMounts"]
    for args, said in ((["--set", "output.uri=out/{job}", "--output-pvc", "o"], "absolute path"),
                       ([*S3_OUT, "--output-pvc", "o"], "is not a path"),  # object storage and a volume
                       (["--set", "output.uri=/data/{job}", "--output-pvc", "Bad_Claim"], "--output-pvc"),
                       # a mount over what the pods need: the spec's own mount, the image's home, /tmp
                       (["--set", "output.uri=/etc/longdoc/{job}", "--output-pvc", "o"], "over /etc/longdoc"),
                       (["--set", "output.uri=/home/ray/out", "--output-pvc", "o"], "over /home/ray"),
                       (["--set", "output.uri=/home/{job}", "--output-pvc", "o"], "over /home/ray"),
                       (["--set", "output.uri=/tmp/out", "--output-pvc", "o"], "over /tmp")):
        code, _, out = _render(str(SAMPLE), *args)
        assert code == 2 and said in " ".join(out.split()), out


def test_a_spec_longdoc_run_would_refuse_is_refused_at_render_not_retried_on_clusters():
    """KubeRay retries a refused night like a failed one (by status, not exit code), each
    time on a fresh cluster: what `longdoc run` refuses in the spec alone is refused here."""
    r = CliRunner().invoke(_app, ["render", str(SAMPLE), *S3_OUT, "--set", "generation.max_new_tokens=8000",
                                  "--set", "compression.target_tokens=4000"])
    assert r.exit_code == 2 and not r.stdout, r.stderr
    assert "`longdoc run` would refuse this spec" in r.stderr and "compression.target_tokens: got 4000" in r.stderr
    assert "allowed: at most" in r.stderr

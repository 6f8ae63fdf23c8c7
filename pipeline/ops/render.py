"""Render KubeRay manifests (RayJob or RayCronJob) for a job spec.

Targets KubeRay v1.6 (``apiVersion: ray.io/v1``; RayCronJob is alpha there and needs
the operator's RayCronJob feature). Contract of the output, a multi-document YAML:

1. A ConfigMap ``<name>-spec`` holding the *resolved* spec (``--set`` overrides
   applied, every default written out) as ``job.yaml``. The spec travels as a
   ConfigMap rather than inline in the entrypoint so that it stays readable with
   ``kubectl get cm``, can be updated with ``kubectl apply`` between nightly runs, and
   never meets shell quoting. It is mounted read-only on the head pod, where KubeRay
   runs the job driver.
2. A RayJob (or a RayCronJob whose ``jobTemplate`` is that RayJob spec) whose
   entrypoint is ``longdoc run /etc/longdoc/job.yaml --date D``. Without ``--date``
   the date is computed when the job starts (``$(TZ=<timezone> date +%F)``, shifted by
   ``--date-offset-days``), so each nightly run writes its own partition.
   The cluster is sized from ``resources``: one worker pod per generate actor
   (``actors`` = replicas, ``[min, max]`` = autoscaling bounds), ``num_cpus`` + 1 CPU
   per pod (room for tokenize actors and read/write tasks), ``nvidia.com/gpu`` limits
   when ``num_gpus > 0``, a separate GPU group for GPU compression actors, and a head
   with ``num-cpus: 0`` so no work lands on it.
3. Credentials never appear here: ``--secret NAME`` adds ``envFrom: secretRef`` to
   every container (e.g. a Secret holding AWS_ACCESS_KEY_ID / AWS_ENDPOINT_URL).

RayCronJob has no time zone field in KubeRay v1.6; its controller parses schedules
with robfig/cron, which accepts a ``CRON_TZ=<zone>`` prefix (KubeRay logs a warning
that this is not officially supported). ``--timezone`` therefore prefixes the
schedule and also sets the zone of the computed run date.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
import yaml

from schemas.spec import JobSpec

SPEC_MOUNT = "/etc/longdoc"
DEFAULT_IMAGE = "longdoc:0.1.0"
_CRON_RE = re.compile(r"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|(\S+\s+){4}\S+)$")
_TZ_RE = re.compile(r"^[A-Za-z_]+(/[A-Za-z0-9_+-]+)*$")


@dataclass(frozen=True)
class RenderOptions:
    kind: str = "rayjob"  # rayjob | raycronjob
    image: str = DEFAULT_IMAGE
    namespace: str | None = None
    schedule: str = "0 2 * * *"
    timezone: str = "UTC"
    run_date: str | None = None  # fixed date; None = computed when the job starts
    date_offset_days: int = 0
    max_failed_fraction: float | None = None
    ttl_seconds: int = 600
    deadline_seconds: int = 6 * 3600
    worker_memory: str = "8Gi"
    head_memory: str = "4Gi"
    secrets: tuple[str, ...] = field(default_factory=tuple)
    ray_version: str | None = None


def k8s_name(name: str, max_len: int = 40) -> str:
    """A DNS-1123 label from a job name (KubeRay appends suffixes, so keep it short)."""
    s = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:max_len].rstrip("-")
    if not s:
        raise ValueError(f"job name {name!r} has no letters or digits to build a Kubernetes name")
    return s


def _check(opts: RenderOptions) -> None:
    if opts.kind not in ("rayjob", "raycronjob"):
        raise ValueError(f"kind {opts.kind!r} is not supported; allowed: rayjob, raycronjob")
    if not _CRON_RE.match(opts.schedule.strip()):
        raise ValueError(f"schedule {opts.schedule!r} is not a 5-field cron expression or @daily-style macro")
    if not _TZ_RE.match(opts.timezone):
        raise ValueError(f"timezone {opts.timezone!r} is not an IANA zone name like Europe/Zurich")
    for s in opts.secrets:
        k8s_name(s, 253)


def date_expression(opts: RenderOptions) -> str:
    """The --date argument: a literal date, or a shell expression evaluated at job start."""
    if opts.run_date:
        return opts.run_date
    shift = f" -d '{opts.date_offset_days:+d} day'" if opts.date_offset_days else ""
    return f'"$(TZ={opts.timezone} date{shift} +%F)"'


def entrypoint(opts: RenderOptions) -> str:
    cmd = f"longdoc run {SPEC_MOUNT}/job.yaml --date {date_expression(opts)}"
    if opts.max_failed_fraction is not None:
        cmd += f" --max-failed-fraction {opts.max_failed_fraction}"
    return cmd


def _container(name: str, opts: RenderOptions, cpu: int, memory: str, gpus: int) -> dict[str, Any]:
    res: dict[str, Any] = {"requests": {"cpu": str(cpu), "memory": memory},
                           "limits": {"cpu": str(cpu), "memory": memory}}
    if gpus:
        res["limits"]["nvidia.com/gpu"] = str(gpus)
        res["requests"]["nvidia.com/gpu"] = str(gpus)
    c: dict[str, Any] = {"name": name, "image": opts.image, "resources": res}
    if opts.secrets:
        c["envFrom"] = [{"secretRef": {"name": s}} for s in opts.secrets]
    return c


def _worker_group(group: str, replicas: tuple[int, int], pod: dict[str, Any]) -> dict[str, Any]:
    lo, hi = replicas
    return {
        "groupName": group,
        "replicas": lo,
        "minReplicas": lo,
        "maxReplicas": hi,
        "rayStartParams": {},
        "template": {"spec": {"containers": [pod]}},
    }


def cluster_spec(job: JobSpec, opts: RenderOptions, configmap: str) -> dict[str, Any]:
    """rayClusterSpec sized from ``job.resources`` (see the module docstring)."""
    res = job.resources
    actors = (res.actors, res.actors) if isinstance(res.actors, int) else tuple(res.actors)
    head = _container("ray-head", opts, cpu=2, memory=opts.head_memory, gpus=0)
    head["ports"] = [{"containerPort": 6379, "name": "gcs-server"},
                     {"containerPort": 8265, "name": "dashboard"},
                     {"containerPort": 10001, "name": "client"}]
    head["volumeMounts"] = [{"name": "job-spec", "mountPath": SPEC_MOUNT, "readOnly": True}]
    gpus = math.ceil(res.num_gpus)
    worker = _container("ray-worker", opts, cpu=math.ceil(res.num_cpus) + 1,
                        memory=opts.worker_memory, gpus=gpus)
    groups = [_worker_group("gpu-workers" if gpus else "cpu-workers", actors, worker)]
    if res.compress_num_gpus > 0:
        # Fractional compression actors pack onto whole-GPU pods.
        n = math.ceil(res.compress_actors * res.compress_num_gpus / math.ceil(res.compress_num_gpus))
        pod = _container("ray-worker", opts, cpu=math.ceil(res.compress_actors / n) + 1,
                         memory=opts.worker_memory, gpus=math.ceil(res.compress_num_gpus))
        groups.append(_worker_group("compress-gpu-workers", (n, n), pod))
    spec: dict[str, Any] = {
        "rayVersion": opts.ray_version or _ray_version(),
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": "0"},  # the head only runs the driver
            "template": {"spec": {
                "containers": [head],
                "volumes": [{"name": "job-spec", "configMap": {"name": configmap}}],
            }},
        },
        "workerGroupSpecs": groups,
    }
    if actors[0] != actors[1]:
        spec["enableInTreeAutoscaling"] = True
    return spec


def _ray_version() -> str:
    from importlib.metadata import version

    return version("ray")


def render_manifests(job: JobSpec, opts: RenderOptions) -> list[dict[str, Any]]:
    """[ConfigMap, RayJob | RayCronJob] as plain dicts (see the module docstring)."""
    _check(opts)
    # A fixed date names the RayJob per date, so applying it twice is a no-op, like
    # `longdoc submit` refusing a second submission of one job and date.
    name = k8s_name(job.name, 30) + (f"-{opts.run_date}" if opts.run_date else "")
    cm_name = f"{name}-spec"
    labels = {"app.kubernetes.io/name": "longdoc", "longdoc/job": k8s_name(job.name, 63)}
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    cm_meta = {**meta, "name": cm_name}
    spec_yaml = yaml.safe_dump(job.model_dump(mode="json"), sort_keys=False)
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": cm_meta,
                 "data": {"job.yaml": spec_yaml}}
    rayjob = {
        "entrypoint": entrypoint(opts),
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": opts.ttl_seconds,
        "activeDeadlineSeconds": opts.deadline_seconds,
        "rayClusterSpec": cluster_spec(job, opts, cm_name),
    }
    if opts.kind == "rayjob":
        doc = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": meta, "spec": rayjob}
    else:
        sched = opts.schedule.strip()
        if opts.timezone != "UTC":
            sched = f"CRON_TZ={opts.timezone} {sched}"
        doc = {"apiVersion": "ray.io/v1", "kind": "RayCronJob", "metadata": meta,
               "spec": {"schedule": sched, "jobTemplate": rayjob}}
    return [configmap, doc]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the embedded spec) as readable ``|`` blocks."""


def _str(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    style = "|" if "\n" in s else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(docs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=200)


def render(
    spec: Annotated[str, typer.Argument(help="Job spec YAML.")],
    kind: Annotated[str, typer.Option(help="rayjob | raycronjob.")] = "rayjob",
    schedule: Annotated[str, typer.Option(help="Cron schedule (raycronjob).")] = "0 2 * * *",
    timezone: Annotated[str, typer.Option(help="IANA zone of the schedule and run date.")] = "UTC",
    image: Annotated[str, typer.Option(help="Container image built from infra/Dockerfile.")] = DEFAULT_IMAGE,
    namespace: Annotated[str | None, typer.Option(help="Kubernetes namespace.")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a spec field.")] = None,
    date: Annotated[str | None, typer.Option(help="Fixed run date (default: the day the job starts).")] = None,
    date_offset_days: Annotated[int, typer.Option(help="Shift the computed run date, e.g. -1 = yesterday.")] = 0,
    max_failed_fraction: Annotated[float | None, typer.Option(help="Passed to longdoc run.")] = None,
    secret: Annotated[list[str] | None, typer.Option(help="Secret whose keys become env vars (repeatable).")] = None,
    ttl_seconds: Annotated[int, typer.Option(help="Delete the cluster this long after the job ends.")] = 600,
    deadline_seconds: Annotated[int, typer.Option(help="Stop the job after this many seconds.")] = 6 * 3600,
    worker_memory: Annotated[str, typer.Option(help="Memory per worker pod.")] = "8Gi",
) -> None:
    """Print KubeRay manifests (ConfigMap + RayJob or RayCronJob) for SPEC."""
    from pipeline.ops.submit import resolve_run_date
    from schemas.loading import SpecError, load_spec

    try:
        job = load_spec(spec, list(overrides or []))
        opts = RenderOptions(
            kind=kind, image=image, namespace=namespace, schedule=schedule, timezone=timezone,
            run_date=resolve_run_date(date) if date else None, date_offset_days=date_offset_days,
            max_failed_fraction=max_failed_fraction, ttl_seconds=ttl_seconds,
            deadline_seconds=deadline_seconds, worker_memory=worker_memory,
            secrets=tuple(secret or ()),
        )
        typer.echo(to_yaml(render_manifests(job, opts)), nl=False)
    except (SpecError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None

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
   entrypoint is ``longdoc run /etc/longdoc/job.yaml --date D --runner ray``. Without ``--date``
   the date is computed when the job starts (``$(TZ=<timezone> date +%F)``, shifted by
   ``--date-offset-days``), so each nightly run writes its own partition.
   The cluster is sized from ``resources``: generate actors packed onto worker pods
   (``pack``: a pod per actor on CPU or with >= 1 GPU each; fractional GPUs share a
   one-GPU pod, e.g. 4 actors of 0.25 GPU -> one pod), ``actors`` = replicas or
   ``[min, max]`` autoscaling bounds (in pods), ``num_cpus`` per actor + 1 CPU per pod
   (room for tokenize actors and read/write tasks), ``--worker-memory`` per actor,
   ``nvidia.com/gpu`` limits when ``num_gpus > 0``, a GPU group for compression only
   when the spec runs a text-compression stage that asks for GPUs (``rag`` with
   ``compress_num_gpus > 0``; Finch/AutoCompressor run inside the generate actor),
   and a head with ``num-cpus: 0`` so no work lands on it.
   Every Ray pod gets a memory-backed ``/dev/shm`` (``--shm-size``; Ray's object store
   lives there, and container runtimes default it to 64 MiB), the
   ``--service-account`` if given, ``--toleration``s, and GPU pods tolerate the
   ``nvidia.com/gpu`` taint GPU node pools carry. ``backoffLimit`` (``--backoff-limit``)
   retries a failed RayJob on a fresh cluster; reruns resume, so a retry redoes only
   the rows that are missing or failed for a retryable reason. KubeRay (v1.6.2, v1.7.0)
   retries by the Ray job's status, not its exit code: a refusal (``longdoc run`` exit
   2) is retried too, each retry paying a cluster's start, and nothing in the RayJob
   can say otherwise (the submitter Job KubeRay builds takes no ``podFailurePolicy``,
   and its exit code is ``ray job logs``', not the driver's). So a spec ``longdoc run``
   would refuse is refused here instead (``pipeline.plan.spec_problems``, the checks
   ``validate`` runs that need no input and nothing of this machine).
   Names follow KubeRay v1.6's limits (RayJob <= 47 chars, RayCronJob <= 41, DNS-1035
   labels): a longer name is cut and gets a hash suffix of the full name, so two long
   job names never collide.
3. Credentials never appear here: ``--secret NAME`` adds ``envFrom: secretRef`` to
   every container (e.g. a Secret holding AWS_ACCESS_KEY_ID / AWS_ENDPOINT_URL).
4. The output outlives the cluster: ``output.uri`` is object storage (``s3://``, ``gs://``,
   any remote fsspec scheme), or an absolute path on the PersistentVolumeClaim
   ``--output-pvc`` mounts on every Ray pod (write tasks run on the workers, the date's
   commit in the driver on the head). A local path without one, or ``memory://``, is
   refused (``output_mount``): the rows would land on a pod's own disk and go with the
   cluster ``shutdownAfterJobFinishes`` deletes, after a run that reports success.

RayCronJob has no time zone field in KubeRay v1.6; its controller parses schedules
with robfig/cron, which accepts a ``CRON_TZ=<zone>`` prefix (KubeRay logs a warning
that this is not officially supported). ``--timezone`` therefore prefixes the
schedule and also sets the zone of the computed run date. KubeRay v1.7 refuses any
``TZ`` in the schedule and reads ``spec.timeZone`` instead (without it: the operator's
local zone), so ``--kuberay-version 1.7`` writes the zone there, always, UTC included,
and cuts RayCronJob names to v1.7's 36 characters (its child RayJob takes a
``-<Unix minute>`` suffix of up to 11 characters, v1.6's took 6). Schedules and zones are
checked here (pipeline/ops/schedule.py) so a bad one fails before ``kubectl apply``.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Annotated, Any

import typer
import yaml

from pipeline.choices import choice
from pipeline.ops.schedule import (
    check_cron,
    check_timezone,
    clear_schedule,
    dst_problems,
    fires_within,
)
from schemas.spec import JobSpec
from stages.compression import method_for

SPEC_MOUNT = "/etc/longdoc"
DEFAULT_IMAGE = "longdoc:0.1.0"
MAX_RAYJOB_NAME = 47  # KubeRay v1.6: RayCluster names <= 53, a RayJob's cluster adds 6
MAX_RAYCRONJOB_NAME = 41  # the controller names each run's RayJob <cron name>-<5 chars>
#: KubeRay v1.7 names each run's RayJob <cron name>-<Unix minute> (up to 11 chars) and
#: refuses a RayCronJob name over 36 (utils.MaxRayCronJobNameLength).
MAX_RAYCRONJOB_NAME_V17 = 36
#: The KubeRay operator versions ``--kuberay-version`` renders for (their CRDs differ in
#: RayCronJob's time zone and name limit; infra/kuberay-schema/ has a schema of each).
KUBERAY_VERSIONS = ("1.6", "1.7")
KubeRayVersion = choice("KubeRayVersion", KUBERAY_VERSIONS)
_KUBERAY_DEFAULT = KubeRayVersion("1.6")
#: Folders of a Ray pod a volume must not be mounted at, over or inside: the job's spec, Ray's
#: shared memory and session files (/tmp), the image's working folder and home (its model
#: cache, infra/Dockerfile), and the system's own.
POD_PATHS = (SPEC_MOUNT, "/dev", "/tmp", "/app", "/home/ray", "/etc", "/usr", "/var", "/bin", "/sbin", "/lib",
             "/lib64", "/opt", "/proc", "/sys", "/root", "/run", "/boot")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_QUALIFIED = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_INT32_MAX = 2**31 - 1
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?\Z")
#: The manifests ``--kind`` renders: one run (RayJob) or a schedule of runs (RayCronJob).
KINDS = ("rayjob", "raycronjob")
Kind = choice("Kind", KINDS)


@dataclass(frozen=True)
class RenderOptions:
    kind: str = "rayjob"  # one of KINDS
    image: str = DEFAULT_IMAGE
    namespace: str | None = None
    schedule: str = "0 2 * * *"
    timezone: str = "UTC"
    run_date: str | None = None  # fixed date; None = computed when the job starts
    date_offset_days: int = 0
    max_failed_fraction: float | None = None
    ttl_seconds: int = 600
    deadline_seconds: int = 6 * 3600
    backoff_limit: int = 1
    worker_memory: str = "8Gi"  # per generate actor
    head_memory: str = "4Gi"
    shm_size: str = "2Gi"  # "0" = no /dev/shm volume
    service_account: str | None = None
    tolerations: tuple[str, ...] = field(default_factory=tuple)  # key[=value][:effect]
    gpu_toleration: bool = True
    secrets: tuple[str, ...] = field(default_factory=tuple)
    ray_version: str | None = None
    kuberay_version: str = "1.6"  # one of KUBERAY_VERSIONS: the operator the manifests are for
    output_pvc: str | None = None  # PersistentVolumeClaim mounted where a path output.uri writes


def k8s_name(name: str, max_len: int = 63) -> str:
    """A DNS-1035 label (lowercase, starts with a letter) of at most ``max_len`` chars.

    A name that has to be cut keeps its head and gets ``-<6 hex>`` of the sha256 of the
    full name, so two long names that share a prefix still differ.
    """
    s = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]+", "-", name.lower())).strip("-")
    if not s:
        raise ValueError(f"job name {name!r} has no letters or digits to build a Kubernetes name")
    if not s[0].isalpha():
        s = "j-" + s  # DNS-1035: a label starts with a letter
    if len(s) <= max_len:
        return s
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    return s[: max_len - 7].rstrip("-") + "-" + digest


def pack(num_gpus: float, actors: int) -> tuple[int, int]:
    """(actors per pod, GPUs per pod) for actors asking ``num_gpus`` each.

    CPU actors and actors of >= 1 GPU get a pod each (``ceil(num_gpus)`` GPUs); actors
    of a GPU fraction share one-GPU pods (0.25 -> 4 per pod), never more than exist.
    """
    if num_gpus <= 0:
        return 1, 0
    gpus = max(1, math.ceil(num_gpus - 1e-9))
    per = max(1, math.floor(gpus / num_gpus + 1e-9))
    return min(per, max(actors, 1)), gpus


def scale_quantity(q: str, n: int, option: str) -> str:
    """A Kubernetes quantity times ``n`` ("8Gi" x 4 -> "32Gi")."""
    m = _QUANTITY.match(q)
    if not m:
        raise ValueError(f"{option} {q!r} is not a quantity like 8Gi, 512Mi or 2G")
    v = float(m.group(1)) * n
    return f"{int(v) if v.is_integer() else round(v, 3)}{m.group(2) or ''}"


def toleration(text: str) -> dict[str, str]:
    """``key[=value][:effect]`` -> a Kubernetes toleration (Exists when no value)."""
    spec, _, effect = text.partition(":")
    key, eq, value = spec.partition("=")
    if not _QUALIFIED.match(key) or len(key) > 316:
        raise ValueError(f"--toleration {text!r}: key {key!r} is not a Kubernetes qualified name")
    if effect and effect not in _EFFECTS:
        raise ValueError(f"--toleration {text!r}: effect {effect!r}; allowed: {', '.join(_EFFECTS)}")
    t = {"key": key, "operator": "Equal" if eq else "Exists"}
    if eq:
        t["value"] = value
    if effect:
        t["effect"] = effect
    return t


def _check(opts: RenderOptions) -> None:
    if opts.kind not in KINDS:
        raise ValueError(f"--kind {opts.kind!r} is not supported; allowed: {', '.join(KINDS)}")
    if opts.kuberay_version not in KUBERAY_VERSIONS:
        raise ValueError(f"--kuberay-version {opts.kuberay_version!r} is not supported; "
                         f"allowed: {', '.join(KUBERAY_VERSIONS)}")
    check_cron(opts.schedule, "--schedule")
    check_timezone(opts.timezone, "--timezone")
    for name, value, low in (("--ttl-seconds", opts.ttl_seconds, 0), ("--deadline-seconds", opts.deadline_seconds, 1),
                             ("--backoff-limit", opts.backoff_limit, 0)):
        # Kubernetes stores these as 32-bit integers; KubeRay refuses a deadline of 0 after apply.
        if not low <= value <= _INT32_MAX:
            raise ValueError(f"{name} {value}: allowed: a whole number from {low} to {_INT32_MAX}")
    if opts.kind == "raycronjob" and not fires_within(opts.schedule, datetime.now()):
        # robfig/cron gives up on it and KubeRay v1.6 then starts a job at once, and again
        raise ValueError(f"--schedule {opts.schedule!r} never fires (no such date within five years); "
                         "allowed: a schedule with a real date, e.g. '30 3 * * *'")
    if opts.kind == "raycronjob" and opts.run_date:  # every night would redo that one date
        raise ValueError(f"--date {opts.run_date} with --kind raycronjob: every night would run that same date; "
                         "leave --date out (each night runs the day it starts; --date-offset-days -1 = the day before)")
    if not -366 <= opts.date_offset_days <= 366:
        raise ValueError(f"--date-offset-days {opts.date_offset_days}: allowed: -366 to 366 (days)")
    f = opts.max_failed_fraction
    # Written into the nightly entrypoint: a value `longdoc run` refuses would fail every night.
    if f is not None and not (math.isfinite(f) and 0.0 <= f <= 1.0):
        raise ValueError(f"--max-failed-fraction: got {f}; allowed: 0 to 1")
    for s in opts.secrets:
        if len(s) > 253 or not _DNS1123_SUBDOMAIN.match(s):
            raise ValueError(f"--secret {s!r} is not a Secret name (lowercase DNS-1123 subdomain)")
    for opt, v in (("--namespace", opts.namespace), ("--service-account", opts.service_account)):
        if v is not None and (len(v) > (63 if opt == "--namespace" else 253)
                              or not (_DNS1123_LABEL if opt == "--namespace" else _DNS1123_SUBDOMAIN).match(v)):
            raise ValueError(f"{opt} {v!r} is not a valid Kubernetes name (lowercase letters, digits, '-')")
    scale_quantity(opts.worker_memory, 1, "--worker-memory")
    scale_quantity(opts.head_memory, 1, "--head-memory")
    scale_quantity(opts.shm_size, 1, "--shm-size")
    for t in opts.tolerations:
        toleration(t)
    if opts.output_pvc is not None and (len(opts.output_pvc) > 253 or not _DNS1123_SUBDOMAIN.match(opts.output_pvc)):
        raise ValueError(f"--output-pvc {opts.output_pvc!r} is not a PersistentVolumeClaim name "
                         "(lowercase DNS-1123 subdomain)")


def output_mount(job: JobSpec, opts: RenderOptions) -> str | None:
    """Where ``--output-pvc`` is mounted (None: the output is object storage, no mount), or
    ValueError naming the fix when the rows would not outlive the cluster.

    The mount is the folder above everything the run writes: the fixed part of the path
    before its first placeholder, cut at the last ``/`` (``/data/out/{job}`` -> ``/data/out``;
    without a placeholder the root's parent, ``/data/out`` -> ``/data``), so the run records
    in the root's sibling ``<root>.runs/`` land on the volume too.
    """
    uri = job.output.uri
    local = "://" not in uri or uri.startswith("file://")
    if not local:
        if uri.startswith("memory://"):  # an fsspec memory filesystem lives and dies in one process
            raise ValueError(f"output.uri {uri!r} is in one process's memory: on the cluster the rows are "
                             "lost when the job ends; use --set output.uri=s3://BUCKET/longdoc/{job} (or gs://)")
        if opts.output_pvc:
            raise ValueError(f"--output-pvc {opts.output_pvc} with output.uri {uri!r}: the output is not "
                             "a path; leave --output-pvc out, or set output.uri to a path on the volume")
        return None
    path = uri.removeprefix("file://")
    if not opts.output_pvc:
        raise ValueError(
            f"output.uri {uri!r} is a local path: on the cluster the rows would land on a pod's own disk and "
            "be deleted with the cluster after the job; use --set output.uri=s3://BUCKET/longdoc/{job} "
            "(or gs://), or an absolute path on a shared volume with --output-pvc CLAIM "
            "(a ReadWriteMany PersistentVolumeClaim, mounted on every Ray pod)")
    # A relative path resolves against each process's working directory, which need not
    # be the same in the driver and the Ray workers.
    head = path.split("{", 1)[0] if "{" in path else path.rstrip("/")
    mount = head.rsplit("/", 1)[0]
    if not path.startswith("/") or not mount:
        raise ValueError(f"output.uri {uri!r} with --output-pvc: name an absolute path below the "
                         "volume's mount point, e.g. --set output.uri=/data/longdoc/{job} (mounted at /data/longdoc)")
    hidden = [p for p in POD_PATHS if mount == p or mount.startswith(p + "/") or p.startswith(mount + "/")]
    if hidden:
        raise ValueError(f"output.uri {uri!r} with --output-pvc mounts the volume at {mount}, over {hidden[0]}, "
                         "which the Ray pods need (the job's spec, Ray's shared memory and session files, the "
                         "image's code, model cache and system folders); choose a folder of its own, e.g. "
                         "--set output.uri=/data/longdoc/{job} (mounted at /data/longdoc)")
    return mount


def date_expression(opts: RenderOptions) -> str:
    """The --date argument: a literal date, or a shell expression evaluated at job start."""
    if opts.run_date:
        return opts.run_date
    shift = f" -d '{opts.date_offset_days:+d} day'" if opts.date_offset_days else ""
    return f'"$(TZ={opts.timezone} date{shift} +%F)"'


def entrypoint(opts: RenderOptions) -> str:
    # --runner ray: a RayJob runs on its RayCluster (see pipeline/ops/submit.py build_entrypoint).
    cmd = f"longdoc run {SPEC_MOUNT}/job.yaml --date {date_expression(opts)} --runner ray"
    if opts.max_failed_fraction is not None:
        cmd += f" --max-failed-fraction {opts.max_failed_fraction}"
    return cmd


def _container(name: str, opts: RenderOptions, cpu: int, memory: str, gpus: int,
               output_at: str | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {"requests": {"cpu": str(cpu), "memory": memory},
                           "limits": {"cpu": str(cpu), "memory": memory}}
    if gpus:
        res["limits"]["nvidia.com/gpu"] = str(gpus)
        res["requests"]["nvidia.com/gpu"] = str(gpus)
    c: dict[str, Any] = {"name": name, "image": opts.image, "resources": res}
    if opts.secrets:
        c["envFrom"] = [{"secretRef": {"name": s}} for s in opts.secrets]
    mounts = []
    if _shm(opts):
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if output_at:
        mounts.append({"name": "output", "mountPath": output_at})
    if mounts:
        c["volumeMounts"] = mounts
    return c


def _shm(opts: RenderOptions) -> bool:
    return float(_QUANTITY.match(opts.shm_size).group(1)) > 0  # type: ignore[union-attr]


def _pod_spec(opts: RenderOptions, container: dict[str, Any], gpu: bool,
              volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Ray pod: the container, /dev/shm, service account and tolerations."""
    spec: dict[str, Any] = {"containers": [container]}
    vols = list(volumes or [])
    if _shm(opts):
        # Ray's object store lives in /dev/shm; runtimes give containers 64 MiB of it.
        vols.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": opts.shm_size}})
    if opts.output_pvc:
        vols.append({"name": "output", "persistentVolumeClaim": {"claimName": opts.output_pvc}})
    if vols:
        spec["volumes"] = vols
    if opts.service_account:
        spec["serviceAccountName"] = opts.service_account
    tols = ([dict(GPU_TOLERATION)] if gpu and opts.gpu_toleration else []) + [
        toleration(t) for t in opts.tolerations]
    if tols:
        spec["tolerations"] = tols
    return spec


def _worker_group(group: str, pods: tuple[int, int], pod_spec: dict[str, Any]) -> dict[str, Any]:
    lo, hi = pods
    return {
        "groupName": group,
        "replicas": lo,
        "minReplicas": lo,
        "maxReplicas": hi,
        "rayStartParams": {},
        "template": {"spec": pod_spec},
    }


def _packed_group(group: str, opts: RenderOptions, actors: tuple[int, int], num_gpus: float,
                  cpus_per_actor: float, output_at: str | None) -> dict[str, Any]:
    """Worker group for an actor pool: ``pack`` decides actors and GPUs per pod."""
    per, gpus = pack(num_gpus, actors[1])
    pods = (math.ceil(actors[0] / per), math.ceil(actors[1] / per))
    c = _container("ray-worker", opts, cpu=math.ceil(per * cpus_per_actor - 1e-9) + 1,
                   memory=scale_quantity(opts.worker_memory, per, "--worker-memory"), gpus=gpus,
                   output_at=output_at)
    return _worker_group(group, pods, _pod_spec(opts, c, gpu=gpus > 0))


def cluster_spec(job: JobSpec, opts: RenderOptions, configmap: str) -> dict[str, Any]:
    """rayClusterSpec sized from ``job.resources`` (see the module docstring)."""
    res = job.resources
    actors = (res.actors, res.actors) if isinstance(res.actors, int) else tuple(res.actors)
    out_at = output_mount(job, opts)
    head = _container("ray-head", opts, cpu=2, memory=opts.head_memory, gpus=0, output_at=out_at)
    head["ports"] = [{"containerPort": 6379, "name": "gcs-server"},
                     {"containerPort": 8265, "name": "dashboard"},
                     {"containerPort": 10001, "name": "client"}]
    head["volumeMounts"] = [{"name": "job-spec", "mountPath": SPEC_MOUNT, "readOnly": True},
                            *head.get("volumeMounts", [])]
    spec_volume = {"name": "job-spec", "configMap": {"name": configmap}}
    # The pods' nodes are not this machine: num_cpus "auto" sizes them at 1 CPU per actor.
    groups = [_packed_group("gpu-workers" if res.num_gpus > 0 else "cpu-workers", opts, actors,
                            res.num_gpus, res.cpus_per_actor(None, res.max_actors), out_at)]
    method = method_for(job.compression)
    if method.runs_at == "text_stage" and method.uses_compress_gpus and res.compress_num_gpus > 0:
        # Only a text stage with its own (GPU) actor pool (rag) needs it; Finch and
        # AutoCompressor run inside the generate actor, truncate in the tokenize actor.
        # Text-stage actors ask 0.5 CPU each (pipeline/plan.py).
        n = res.compress_actors
        groups.append(_packed_group("compress-gpu-workers", opts, (n, n), res.compress_num_gpus, 0.5, out_at))
    spec: dict[str, Any] = {
        "rayVersion": opts.ray_version or _ray_version(),
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": "0"},  # the head only runs the driver
            "template": {"spec": _pod_spec(opts, head, gpu=False, volumes=[spec_volume])},
        },
        "workerGroupSpecs": groups,
    }
    if any(g["minReplicas"] != g["maxReplicas"] for g in groups):
        spec["enableInTreeAutoscaling"] = True
    return spec


def _ray_version() -> str:
    from importlib.metadata import version

    return version("ray")


def job_name(job: JobSpec, opts: RenderOptions) -> str:
    """RayJob / RayCronJob name: the job name (cut with a hash suffix) + fixed date."""
    # A fixed date names the RayJob per date, so applying it twice is a no-op, like
    # `longdoc submit` refusing a second submission of one job and date.
    suffix = f"-{opts.run_date}" if opts.run_date else ""
    if opts.kind == "rayjob":
        budget = MAX_RAYJOB_NAME
    else:
        budget = MAX_RAYCRONJOB_NAME_V17 if opts.kuberay_version == "1.7" else MAX_RAYCRONJOB_NAME
    return k8s_name(job.name, budget - len(suffix)) + suffix


def render_manifests(job: JobSpec, opts: RenderOptions) -> list[dict[str, Any]]:
    """[ConfigMap, RayJob | RayCronJob] as plain dicts (see the module docstring)."""
    _check(opts)
    # The Ray Data plan's module: loaded when rendering, not when the CLI starts.
    from pipeline.plan import spec_problems

    if problems := spec_problems(job):
        raise ValueError("`longdoc run` would refuse this spec on the cluster (exit 2) once the cluster is up, "
                         "and KubeRay retries a refusal like any failure (--backoff-limit), each time on a fresh "
                         "cluster; fix it first: " + "; ".join(problems))
    name = job_name(job, opts)
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
        "backoffLimit": opts.backoff_limit,
        "rayClusterSpec": cluster_spec(job, opts, cm_name),
    }
    if opts.kind == "rayjob":
        doc = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": meta, "spec": rayjob}
    else:
        sched = check_cron(opts.schedule, "--schedule")
        cron: dict[str, Any] = {"schedule": sched}
        if opts.kuberay_version == "1.7":
            # v1.7 refuses TZ in the schedule; without timeZone it fires in the operator's
            # own zone, which need not be UTC: the zone is written even when it is UTC.
            cron["timeZone"] = opts.timezone
        elif opts.timezone != "UTC":
            cron["schedule"] = f"CRON_TZ={opts.timezone} {sched}"
        doc = {"apiVersion": "ray.io/v1", "kind": "RayCronJob", "metadata": meta,
               "spec": {**cron, "jobTemplate": rayjob}}
    return [configmap, doc]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the embedded spec) as readable ``|`` blocks."""


def _str(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    style = "|" if "\n" in s else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(docs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=200)


def render_warnings(job: JobSpec, opts: RenderOptions) -> list[str]:
    """What renders but will likely fail on the cluster, one line each (printed to stderr).

    - a local input or model path: the pod reads its own disk, not this one (perhaps on
      purpose: data baked into the image); a local output is refused instead (``output_mount``);
    - an object-store URI and no ``--secret`` (nor ``--service-account``): the pods have no credentials;
    - an image without a registry: the nodes pull it from Docker Hub unless it was preloaded;
    - a RayCronJob: KubeRay's feature gate, the zone prefix v1.7 refuses, and the nights a
      clock change skips or repeats (pipeline/ops/schedule.py ``dst_problems``).
    """
    out = []
    paths = [("input.uri", job.input.uri)]
    model = job.generation.model
    if isinstance(model, str) and model.startswith(("/", "./", "../", "~", "file://")):
        paths.append(("generation.model", model))
    for field_name, uri in paths:
        if "://" not in uri or uri.startswith("file://"):
            out.append(f"{field_name} {uri!r} is a local path: on the cluster it is read from the pod's own disk "
                       "(the image's files), not this machine's; use s3:// or gs://, or bake it into the image")
    remote = [u for _, u in [*paths, ("output.uri", job.output.uri)] if u.startswith(("s3://", "gs://", "gcs://"))]
    if remote and not opts.secrets and not opts.service_account:
        out.append(f"{remote[0]!r} is object storage and no --secret is given: the pods will have no "
                   "credentials; pass --secret NAME (a Secret holding AWS_ACCESS_KEY_ID, "
                   "AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL) or --service-account with workload identity")
    if opts.kind == "raycronjob":
        out.append("KubeRay runs a RayCronJob only with its RayCronJob feature gate on (alpha in v1.6, off by "
                   "default: the operator's --feature-gates=RayCronJob=true, or the Helm chart's featureGates "
                   "list); without it the manifest applies and never fires")
        if opts.timezone != "UTC" and opts.kuberay_version == "1.6":
            out.append(f"the schedule carries the zone as 'CRON_TZ={opts.timezone}', which KubeRay v1.6 reads; "
                       "v1.7 refuses it (its spec.timeZone replaces it): for a v1.7 operator render with "
                       "--kuberay-version 1.7")
        problems = dst_problems(opts.schedule, opts.timezone, date.today())
        clear = clear_schedule(opts.schedule, opts.timezone, date.today()) if problems else None
        out += [f"{p}; pick a time clear of the clock change" + (f", e.g. --schedule '{clear}'" if clear else "")
                for p in problems]
    first = opts.image.split("/", 1)[0]
    if "/" not in opts.image or not ("." in first or ":" in first or first == "localhost"):
        out.append(f"image {opts.image!r} names no registry: the nodes pull it from Docker Hub unless it "
                   "is preloaded; push the image built from infra/Dockerfile to your registry and pass "
                   "--image with the registry's host, e.g. ghcr.io/ORG/longdoc:1.0")
    return out


def render(
    spec: Annotated[str, typer.Argument(help="Job spec YAML.")],
    kind: Annotated[Kind, typer.Option(help="rayjob: one run now; raycronjob: a run per --schedule.")] = Kind.rayjob,
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
    worker_memory: Annotated[str, typer.Option(help="Memory per generate actor (a pod packs several).")] = "8Gi",
    head_memory: Annotated[str, typer.Option(help="Memory of the head pod (runs the driver).")] = "4Gi",
    shm_size: Annotated[str, typer.Option(help="Memory-backed /dev/shm per Ray pod; 0 = none.")] = "2Gi",
    service_account: Annotated[str | None, typer.Option(help="serviceAccountName of the Ray pods.")] = None,
    backoff_limit: Annotated[int, typer.Option(help="Retries of a failed RayJob (a retry resumes).")] = 1,
    toleration: Annotated[
        list[str] | None, typer.Option(help="Toleration for every Ray pod: key[=value][:effect] (repeatable).")
    ] = None,
    gpu_toleration: Annotated[bool, typer.Option(help="GPU pods tolerate the nvidia.com/gpu taint.")] = True,
    output_pvc: Annotated[str | None, typer.Option(
        help="PersistentVolumeClaim (ReadWriteMany) mounted on every Ray pod for a path output.uri.")] = None,
    kuberay_version: Annotated[
        KubeRayVersion, typer.Option(help="KubeRay operator version: 1.7 writes RayCronJob's spec.timeZone.")
    ] = _KUBERAY_DEFAULT,
) -> None:
    """Print KubeRay manifests (ConfigMap + RayJob or RayCronJob) for SPEC."""
    from pipeline.ops.submit import resolve_run_date
    from schemas.loading import SpecError, load_spec

    try:
        job = load_spec(spec, list(overrides or []))
        opts = RenderOptions(
            kind=Kind(kind).value, image=image, namespace=namespace, schedule=schedule, timezone=timezone,
            run_date=resolve_run_date(date) if date else None, date_offset_days=date_offset_days,
            max_failed_fraction=max_failed_fraction, ttl_seconds=ttl_seconds,
            deadline_seconds=deadline_seconds, worker_memory=worker_memory, head_memory=head_memory,
            shm_size=shm_size, service_account=service_account, backoff_limit=backoff_limit,
            tolerations=tuple(toleration or ()), gpu_toleration=gpu_toleration,
            secrets=tuple(secret or ()), kuberay_version=KubeRayVersion(kuberay_version).value,
            output_pvc=output_pvc,
        )
        typer.echo(to_yaml(render_manifests(job, opts)), nl=False)
        for w in render_warnings(job, opts):
            typer.echo(f"warning: {w}", err=True)
    except (SpecError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None

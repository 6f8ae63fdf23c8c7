"""Derive kuberay-v1.6.2.json from the KubeRay CRDs (run by hand when KubeRay moves).

Usage: python infra/kuberay-schema/derive.py RAYJOBS_CRD.yaml RAYCRONJOBS_CRD.yaml [TAG] > kuberay-vX.json
(ray-operator/config/crd/bases/ray.io_rayjobs.yaml and ray.io_raycronjobs.yaml of a KubeRay
release tag; TAG names it in the output's $comment, e.g.
"ray-operator/v1.7.0 (commit 59d663aeec13760646da3db9c1cf8cfe883e30b7)"). RayCronJob's
``timeZone`` (KubeRay >= v1.7) is kept where the CRD has it: `render --kuberay-version 1.7`
writes it. Keeps the RayJob spec fields `longdoc render` writes, rayClusterSpec whole
except pod templates (tests check those against the Kubernetes PodTemplate schema), and
adds additionalProperties: false to objects with properties so a misspelt field fails.
"""

from __future__ import annotations

import copy
import json
import sys

import yaml

USED = {"rayClusterSpec", "entrypoint", "shutdownAfterJobFinishes", "ttlSecondsAfterFinished",
        "activeDeadlineSeconds", "backoffLimit"}
TAG = "ray-operator/v1.6.2 (commit 598eb66aa077c55ae04fa87b192238a3ec184e88)"


def strict(node: dict) -> dict:
    if isinstance(node, dict):
        if (node.get("type") == "object" and "properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        for c in (node.get("properties") or {}).values():
            strict(c)
        for k in ("items", "additionalProperties"):
            if isinstance(node.get(k), dict):
                strict(node[k])
    return node


def prune(node: dict) -> dict:
    if isinstance(node, dict):
        props = node.get("properties") or {}
        for k in list(props):
            if k in ("template", "submitterPodTemplate"):
                props[k] = {"type": "object",
                            "description": "PodTemplateSpec: checked against the Kubernetes schema separately"}
            else:
                prune(props[k])
        if isinstance(node.get("items"), dict):
            prune(node["items"])
    return node


def v1_spec(crd_file: str) -> dict:
    with open(crd_file) as f:
        crd = yaml.safe_load(f)
    v1 = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return v1["schema"]["openAPIV3Schema"]["properties"]["spec"]


def main(rayjobs: str, raycronjobs: str, tag: str = TAG) -> dict:
    job, cron = v1_spec(rayjobs), v1_spec(raycronjobs)
    assert cron["properties"]["jobTemplate"] == job, "RayCronJob jobTemplate differs from the RayJob spec"
    spec = copy.deepcopy(job)
    spec["properties"] = {k: v for k, v in spec["properties"].items() if k in USED}
    spec["properties"]["rayClusterSpec"] = prune(copy.deepcopy(job["properties"]["rayClusterSpec"]))
    spec.pop("x-kubernetes-validations", None)
    meta = {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
        "name": {"type": "string"}, "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}

    def doc(kind: str, spec_schema: dict) -> dict:
        return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
                "additionalProperties": False,
                "properties": {"apiVersion": {"const": "ray.io/v1"}, "kind": {"const": kind},
                               "metadata": meta, "spec": spec_schema}}

    cronspec = {"type": "object", "required": cron.get("required", []), "additionalProperties": False,
                "properties": {"schedule": cron["properties"]["schedule"],
                               "suspend": cron["properties"]["suspend"], "jobTemplate": spec}}
    if "timeZone" in cron["properties"]:  # KubeRay v1.7: the schedule's zone (a CRON_TZ prefix is refused)
        cronspec["properties"]["timeZone"] = cron["properties"]["timeZone"]
    comment = (f"Derived from KubeRay {tag} CRDs ray.io_rayjobs.yaml and ray.io_raycronjobs.yaml, "
               "openAPIV3Schema of version v1 by infra/kuberay-schema/derive.py: the RayJob spec fields "
               "longdoc render writes, with rayClusterSpec kept whole except pod templates (checked "
               "against the Kubernetes PodTemplate schema instead), and additionalProperties: false added "
               "to every object with properties so that a misspelt field fails (the API server would "
               "prune it silently).")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$comment": comment,
            "RayJob": strict(doc("RayJob", spec)), "RayCronJob": strict(doc("RayCronJob", cronspec))}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4]), indent=1, sort_keys=True))

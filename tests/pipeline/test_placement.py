"""pipeline/placement.py: the runner a run takes and the CPUs its generate actors get."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.placement import (
    crowded_note,
    resolve_runner,
    starved_io_note,
    usable_cores,
    with_actor_cpus,
)
from schemas.spec import JobSpec


def _spec(tmp_path: Path, model: str, **resources) -> JobSpec:
    return JobSpec.model_validate({
        "name": "placed", "input": {"uri": str(tmp_path / "docs")}, "generation": {"model": model},
        "resources": resources, "output": {"uri": str(tmp_path / "out")},
    })


def test_auto_runs_in_this_process_only_without_a_cluster_and_with_one_actor(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    one = _spec(tmp_path, "random:tiny")
    assert resolve_runner("auto", one, None) == "local"
    assert resolve_runner("auto", one, "ray://head:10001") == "ray"  # a cluster: Ray's
    assert resolve_runner("auto", _spec(tmp_path, "random:tiny", actors=2), None) == "ray"  # a pool
    assert resolve_runner("auto", _spec(tmp_path, "random:tiny", actors=[1, 3]), None) == "ray"
    assert resolve_runner("ray", one, None) == "ray" and resolve_runner("local", one, "ray://head:10001") == "local"
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    assert resolve_runner("auto", one, None) == "ray"
    with pytest.raises(ValueError, match="'yarn' is not one of auto, ray, local"):
        resolve_runner("yarn", one, None)


def test_num_cpus_auto_is_this_machines_cores_shared_by_its_engines_and_one_on_a_cluster(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "6")  # the caller's thread count is this machine's cores
    assert usable_cores() == 6
    one, pool = _spec(tmp_path, "random:tiny"), _spec(tmp_path, "random:tiny", actors=[1, 3])
    assert one.resources.num_cpus == "auto"
    assert with_actor_cpus(one, "local", None).resources.num_cpus == 6  # the one engine: every core
    assert with_actor_cpus(one, "ray", None).resources.num_cpus == 6  # an embedded Ray, one actor
    assert with_actor_cpus(pool, "ray", None).resources.num_cpus == 2  # shared by the pool's largest size
    assert with_actor_cpus(one, "ray", "ray://head:10001").resources.num_cpus == 1  # a cluster's nodes: unknown
    mine = _spec(tmp_path, "random:tiny", num_cpus=1.5)
    assert with_actor_cpus(mine, "local", None) is mine  # a number is the user's
    monkeypatch.setenv("OMP_NUM_THREADS", "junk")
    assert usable_cores() == len(os.sched_getaffinity(0))


def test_more_actors_than_cores_on_this_machine_is_noted_not_refused(tmp_path, monkeypatch):
    """A trial ran 6 actors on 2 cores: each held a model copy and none went faster."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    note = crowded_note(_spec(tmp_path, "random:tiny", actors=[1, 6]), None)
    assert note is not None and note.startswith("resources.actors 6 on this machine's 2 core(s)")
    assert "fix: resources.actors 2, or a Ray cluster" in note
    assert crowded_note(_spec(tmp_path, "random:tiny", actors=2), None) is None
    assert crowded_note(_spec(tmp_path, "random:tiny", actors=6), "head:6379") is None  # a cluster's nodes
    assert crowded_note(_spec(tmp_path, "random:tiny", actors=6, num_gpus=1), None) is None  # a GPU each


def test_actors_holding_every_cpu_of_a_cluster_are_noted(tmp_path):
    """A trial set resources.num_cpus to its 2-CPU node's cores: the write tasks ran only when
    the generate actor let go (Ray's "Cluster resources are not enough"; 93 s against 30 s)."""
    node = {"Alive": True, "Resources": {"CPU": 2.0, "memory": 8e9}}
    note = starved_io_note(_spec(tmp_path, "random:tiny", num_cpus=2), [node])
    assert note is not None and note.startswith("note: the model stages' actors hold 2.5 of the 2 CPU(s) the cluster")
    assert starved_io_note(_spec(tmp_path, "random:tiny", num_cpus=1), [node]) is None  # room for the tasks
    bigger = [node, {"Alive": True, "Resources": {"CPU": 4.0}}, {"Alive": False, "Resources": {"CPU": 64.0}}]
    assert starved_io_note(_spec(tmp_path, "random:tiny", num_cpus=2), bigger) is None

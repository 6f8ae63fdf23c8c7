"""The object-store retry policy: set once in fsspec's config, never over the user's choice.
(The faults themselves: tests/pipeline/test_storage_faults.py, against a real S3 server.)"""

from __future__ import annotations

import fsspec.config

from stages.storage import S3_RETRIES, configure_object_stores


def test_the_policy_lands_in_fsspecs_s3_defaults(monkeypatch):
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    monkeypatch.setattr(fsspec.config, "conf", {})
    configure_object_stores()
    configure_object_stores()  # idempotent
    assert fsspec.config.conf == {"s3": {"config_kwargs": {"retries": S3_RETRIES}}}
    assert S3_RETRIES["mode"] == "standard" and 2 <= S3_RETRIES["total_max_attempts"] <= 10  # bounded


def test_the_users_own_choice_wins(monkeypatch):
    mine = {"s3": {"config_kwargs": {"retries": {"mode": "adaptive", "max_attempts": 3}, "read_timeout": 5}}}
    monkeypatch.setattr(fsspec.config, "conf", mine)
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    configure_object_stores()
    assert mine["s3"]["config_kwargs"]["retries"] == {"mode": "adaptive", "max_attempts": 3}
    monkeypatch.setattr(fsspec.config, "conf", {})
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "4")  # botocore's own knob: no Config may override it
    configure_object_stores()
    assert fsspec.config.conf == {}

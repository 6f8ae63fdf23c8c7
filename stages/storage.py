"""Object storage that fails now and then: the retry policy every s3:// call runs under.

Why: a nightly job on object storage meets throttling (503 SlowDown), 5xx answers and
connection resets in listings, reads and uploads. botocore owns the retry loop (its
``standard`` mode: exponential backoff with full jitter, capped at 20 s a wait, on
throttling codes, 500/502/503/504 and connection errors, under a retry quota), so no
loop of ours duplicates it; s3fs adds its own few retries of SlowDown and broken
bodies on top. This module only sets the bound.

Contract:
- ``configure_object_stores()`` (idempotent; stages/read.py and stages/write.py call it
  on import, so the driver and every Ray worker that touches storage has it) puts
  ``S3_RETRIES`` into fsspec's configuration for ``s3``, which fsspec applies to every
  S3 filesystem it creates from a URI. A user's own fsspec configuration
  (``~/.config/fsspec/*.json`` or ``FSSPEC_S3_*`` variables) that sets
  ``config_kwargs.retries`` wins; so does ``AWS_MAX_ATTEMPTS`` / ``AWS_RETRY_MODE`` in
  the environment, botocore's own knobs.
- What is still failing after the retries is the caller's: a read becomes a retryable
  error row (stages/read.py), a staged block fails its Ray task (retried by Ray), a
  publish that fails leaves the staged blocks for the next run to publish
  (stages/partition.py ``commit_date``).
"""

from __future__ import annotations

import os

import fsspec.config

#: botocore's retry settings for every S3 client: ``total_max_attempts`` counts the first
#: attempt, so 8 is 7 retries; with standard mode's backoff (random up to 2**n s, at most
#: 20 s) that is at most ~1 minute of waiting on one request before its error is reported.
S3_RETRIES = {"mode": "standard", "total_max_attempts": 8}


def configure_object_stores() -> None:
    """Put ``S3_RETRIES`` into fsspec's defaults for ``s3`` unless the user chose already."""
    if os.environ.get("AWS_MAX_ATTEMPTS") or os.environ.get("AWS_RETRY_MODE"):
        return  # botocore reads these itself; explicit Config would override them
    s3 = fsspec.config.conf.setdefault("s3", {})
    config_kwargs = s3.setdefault("config_kwargs", {})
    config_kwargs.setdefault("retries", dict(S3_RETRIES))

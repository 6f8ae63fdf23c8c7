"""`longdoc bench job`'s options (pipeline/bench/job_settings.py): parsing and the command line
that reproduces them. The refusals of a whole command are in test_job.py."""

from __future__ import annotations

import shlex

import pytest

from pipeline.bench.job_settings import (
    JobBenchSettings,
    Variant,
    command_line,
    parse_sizes,
    parse_variant,
)


def test_batch_sizes_are_distinct_positive_integers():
    assert parse_sizes("1, 4,8") == (1, 4, 8)
    for bad in ("", "0,1", "1,1", "a"):
        with pytest.raises(ValueError, match="--peer-batch-sizes"):
            parse_sizes(bad)


def test_a_variant_splits_its_spec_environment_and_runner_overrides():
    v = parse_variant("one: compression.method=select; env.OMP_NUM_THREADS=1; runner=local; resources.actors=2")
    assert v.name == "one" and v.runner == "local" and v.env == {"OMP_NUM_THREADS": "1"}
    assert v.spec_overrides == ("compression.method=select", "resources.actors=2")
    assert parse_variant("plain:").overrides == () and parse_variant("plain:").runner is None


def test_the_command_line_names_every_option_that_differs_from_its_default():
    s = JobBenchSettings(spec="jobs/sample-qa.yaml", overrides=("generation.max_new_tokens=16",),
                         variants=(Variant("a", ("compression.method=none",)), Variant("b", ("runner=local",))),
                         runs=1, sides=("longdoc",), model="random:llama-1b")
    words = shlex.split(command_line(s))
    assert words[:4] == ["longdoc", "bench", "job", "jobs/sample-qa.yaml"]
    assert words[4:6] == ["--set", "generation.max_new_tokens=16"]
    assert "--variant" in words and "a:compression.method=none" in words and "b:runner=local" in words
    assert words[words.index("--runs") + 1] == "1" and words[words.index("--sides") + 1] == "longdoc"
    assert words[words.index("--model") + 1] == "random:llama-1b" and "--runner" not in words  # auto: the default
    assert "--variant" not in command_line(JobBenchSettings(spec="x.yaml"))  # the one default side

"""pipeline/host_load.py: one rule for a machine too busy for its time figures."""

from __future__ import annotations

from pipeline.host_load import (
    busy_note,
    cpu_identity,
    cpu_label,
    cpu_name,
    load_now,
    shared_threads_note,
)


def test_a_load_above_the_cpus_at_the_start_or_the_end_is_said():
    assert busy_note([3.3, 1.0], 2) == ("the load average (3.30, 1.00 at the start and end) was above this "
                                        "machine's 2 CPUs: other work shared them")
    assert busy_note([1.0, 2.5], 2) is not None
    assert busy_note([1.9, 2.0], 2) is None  # at most one per CPU: quiet enough
    assert busy_note([9.0], None) is None  # unknown CPU count: nothing said
    assert load_now() >= 0.0


_SAPPHIRE = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 8
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
vendor_id\t: OtherVendor
"""


def test_the_cpu_is_named_by_vendor_model_and_isa_features_not_its_brand_string_alone():
    """Under KVM the brand string is "Intel(R) Xeon(R) Processor" whatever the generation: the
    files said that and "2 CPUs", nothing of AVX-512 or AMX."""
    ident = cpu_identity(_SAPPHIRE)
    assert ident == {"vendor": "GenuineIntel", "family": 6, "model": 143, "stepping": 8,
                     "features": ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]}
    assert cpu_label(ident) == "GenuineIntel family 6 model 143 stepping 8; avx2 avx512f avx512_bf16 amx_tile amx_bf16"
    amd = cpu_identity("vendor_id : AuthenticAMD\ncpu family : 23\nmodel : 49\nflags : sse2 avx2\n")
    assert cpu_label(amd) == "AuthenticAMD family 23 model 49; avx2"
    assert cpu_label(cpu_identity("vendor_id : X\nflags : sse2\n")) == "X; none of avx2/avx512f/avx512_bf16/amx_tile/amx_bf16"
    assert cpu_identity("") == {} and cpu_label({}) is None  # no /proc/cpuinfo fields (not Linux): absent
    assert isinstance(cpu_identity(), dict)  # this machine's, whatever it is


def test_the_brand_string_is_the_first_processors_model_name():
    text = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: avx2\n\nprocessor\t: 1\nmodel name\t: other\n"
    assert cpu_name(text) == "Intel(R) Xeon(R) Processor"
    assert cpu_name("processor\t: 0\nflags\t\t: avx2\n") is None


def test_a_cpu_run_with_several_threads_on_a_busy_machine_is_told_to_use_one():
    """A run on a 2-core machine at load ~5 with 2 threads prefilled 10x slower than with 1
    (the soak trial): the run's first lines say so, with the setting to change; a quiet
    machine, one thread, or no CPU count says nothing."""
    note = shared_threads_note(4.94, 2, 2.0)
    assert note is not None and "4.94" in note and "2 CPUs" in note and "--set resources.num_cpus=1" in note
    assert shared_threads_note(1.5, 2, 2.0) is None
    assert shared_threads_note(4.94, 2, 1.0) is None
    assert shared_threads_note(4.94, None, 2.0) is None

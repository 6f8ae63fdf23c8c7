"""Whether this machine was busy while something was timed: one rule for `bench job` and
`eval`, whose time figures are only a measurement on a quiet machine.

Contract: ``busy_note(loads, cpus)``: words for a load average above the CPU count at any
of ``loads`` (e.g. the 1-minute load at the start and at the end), else None. A trial read
an eval's time columns taken beside another job as a method's cost (4.5x instead of 1.3x).
``shared_threads_note(load, cpus, threads)``: words for a CPU run starting with several
threads per generate actor on a machine already busier than its CPUs, else None.
``cpu_identity()``/``cpu_label(ident)``: the host CPU's vendor, family/model/stepping and
ISA features (``CPU_FEATURES``) from /proc/cpuinfo, {} elsewhere, and one line of it; the
bench files record it beside the brand string, which says "Intel(R) Xeon(R) Processor"
under KVM whatever the generation.
"""

from __future__ import annotations

import os


def load_now() -> float:
    """The 1-minute load average (0.0 where the system does not tell it)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def busy_note(loads: list[float], cpus: int | None) -> str | None:
    """See the module contract."""
    if not cpus or not any(x > cpus for x in loads):
        return None
    return (f"the load average ({', '.join(f'{x:.2f}' for x in loads)} at the start and end) was above this "
            f"machine's {cpus} CPUs: other work shared them")


def shared_threads_note(load: float, cpus: int | None, threads: float) -> str | None:
    """Words for a run about to decode on CPU with ``threads`` (> 1) torch threads while the
    1-minute ``load`` is already above the machine's ``cpus``, else None. Why: every
    parallel region of a forward pass waits for its slowest thread, and on a busy machine
    one of them is often off its core (measured: jobs/results/code-choices.md, section
    ``pipeline/host_load.py`` ``shared_threads_note``)."""
    if not cpus or threads <= 1 or load <= cpus:
        return None
    return (f"note: the load average ({load:.2f}) is already above this machine's {cpus} CPUs: with "
            f"{threads:g} threads per generate actor each forward pass waits for the thread other work holds "
            "off its core; on a shared machine --set resources.num_cpus=1")


#: The ISA features that decide which CPU kernels run here (the packed and causal kernels'
#: AVX-512 paths, AMX tiles for bf16), in the order they are printed.
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_identity(cpuinfo: str | None = None) -> dict:
    """The host CPU as the kernels see it: vendor, family, model, stepping and which of
    ``CPU_FEATURES`` its flags have, from /proc/cpuinfo (``cpuinfo``: that file's text). A
    brand string alone says "Intel(R) Xeon(R) Processor" under KVM, whichever generation it
    is. {} where there is no /proc/cpuinfo (not Linux) or it has no such fields."""
    fields = _first_processor(cpuinfo)
    out: dict = {}
    if fields.get("vendor_id"):
        out["vendor"] = fields["vendor_id"]
    for key, name in (("cpu family", "family"), ("model", "model"), ("stepping", "stepping")):
        if fields.get(key, "").isdigit():
            out[name] = int(fields[key])
    if "flags" in fields:
        flags = set(fields["flags"].split())
        out["features"] = [x for x in CPU_FEATURES if x in flags]
    return out


def cpu_name(cpuinfo: str | None = None) -> str | None:
    """The CPU's brand string ("model name" in /proc/cpuinfo; ``cpuinfo``: that file's text),
    None where there is none."""
    return _first_processor(cpuinfo).get("model name") or None


def _first_processor(cpuinfo: str | None) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (``cpuinfo``: its text; read when None),
    {} where there is no such file: the first block describes them all."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return {}
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_label(ident: dict) -> str | None:
    """One line of ``cpu_identity``: "GenuineIntel family 6 model 143 stepping 8; avx2 avx512f
    amx_tile amx_bf16" (None when it is empty)."""
    if not ident:
        return None
    parts = [ident.get("vendor", "?")] + [f"{k} {ident[k]}" for k in ("family", "model", "stepping") if k in ident]
    feats = ident.get("features")
    if feats is None:  # no flags line: nothing known of its ISA
        return " ".join(parts)
    return " ".join(parts) + "; " + (" ".join(feats) if feats else "none of " + "/".join(CPU_FEATURES))

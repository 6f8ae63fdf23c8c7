"""Figures, ratios, targets and files of the bench job (pure functions, no processes)."""

from __future__ import annotations

import json

import pytest

from pipeline.bench.job_report import (
    finish,
    markdown,
    medians,
    merge_previous,
    quantile,
    side_figures,
    summary_lines,
    throughput,
    write_results,
)


def test_throughput_and_cost_per_thousand_documents():
    dph, usd = throughput(10, 36.0, 2.5)
    assert dph == pytest.approx(1000.0)
    assert usd == pytest.approx(2.5)  # 1,000 documents = one device hour
    assert throughput(0, 10.0, 1.0) == (None, None)


def test_quantiles_and_medians():
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([1.0, 2.0], 0.95) == pytest.approx(1.95)
    assert quantile([], 0.5) is None
    runs = [side_figures(4, 0, w, w / 2, [1.0, 2.0], 1.0, {"rss": 2**30}) for w in (10.0, 30.0, 20.0)]
    m = medians(runs)
    assert m["runs"] == 3 and m["wall_s"] == 20.0 and m["steady_s"] == 10.0 and m["peak_rss_gb"] == 1.0
    assert m["peak_gpu_gb"] is None


def _result(device="cpu", sides=None, walls=None):
    sides = sides or {"longdoc": {"kind": "longdoc", "method": "truncate", "speculative": "prompt_lookup",
                                  "peer": "peer", "what": "x"},
                      "peer": {"kind": "peer", "what": "y"}}
    walls = walls or {"longdoc": 50.0, "peer": 100.0}
    runs = {s: [dict(side_figures(10, 0, w, w / 2, [1.0], 1.0, {}), run=1, load_avg=1.0)] for s, w in walls.items()}
    r = {"layout_version": 1, "device": {"type": device, "name": "dev", "file_name": device},
         "settings": {"spec_name": "s", "model": "m", "docs": 10, "max_new_tokens": 4, "synthetic_docs": None,
                      "doc_tokens": None, "dtype": "float32", "docs_label": "10 docs", "runs": 1, "runner": "ray",
                      "usd_per_device_hour": 1.0},
         "sides": {k: v for k, v in sides.items() if k in walls}, "runs_by_side": runs,
         "summary": {s: medians(v) for s, v in runs.items()}, "agreement": {}, "peer_probe": {},
         "command": "longdoc bench job s.yaml", "created_utc": "t", "versions": {"longdoc_commit": "abc"},
         "host": {"cpus": 2, "load_avg_start": [1], "load_avg_end": [1]}, "notes": ["n"]}
    finish(r)
    return r


def test_cpu_target_is_twice_the_peer_whole_process():
    r = _result()
    assert r["ratios"]["longdoc"]["vs_peer"] == {"peer": "peer", "wall": 2.0, "steady": 2.0}
    [t] = r["targets"]
    assert t["pass"] is True and t["value"] == 2.0
    assert any(line.startswith("PASS longdoc: documents/hour >= 1.5x") for line in summary_lines(r))
    slow = _result(walls={"longdoc": 100.0, "peer": 90.0})
    assert slow["targets"][0]["pass"] is False


def test_gpu_targets_finch_over_none_and_peer_and_pld_over_greedy():
    sides = {"none": {"kind": "longdoc", "method": "none", "speculative": "none", "peer": "peer", "what": ""},
             "finch-1k": {"kind": "longdoc", "method": "finch", "speculative": "none", "peer": "peer", "what": ""},
             "pld": {"kind": "longdoc", "method": "none", "speculative": "prompt_lookup", "peer": "peer", "what": ""},
             "peer": {"kind": "peer", "what": ""}}
    r = _result("cuda", sides, {"none": 90.0, "finch-1k": 30.0, "pld": 60.0, "peer": 80.0})
    got = {t["name"].split(":")[0] + " " + t["name"].split(">= ")[1].split(" ")[1]: (t["value"], t["pass"])
           for t in r["targets"]}
    assert got["finch-1k none's"] == (pytest.approx(3.0), True)
    assert got["finch-1k the"] == (pytest.approx(80 / 30), True)
    assert got["pld none's"] == (pytest.approx(1.5), True)
    # A side that did not run makes its target "not measured", never a FAIL.
    r = _result("cuda", sides, {"finch-1k": 30.0})
    assert [t["pass"] for t in r["targets"]] == [None]
    assert any(line.startswith("NOT MEASURED (their sides did not run): finch-1k") for line in summary_lines(r))


def test_runs_far_apart_and_a_busy_machine_are_noted_and_rates_follow_the_median_time():
    """A trial's bench printed 0.74x from runs of 54 s and 218 s of one setting, with nothing
    said; its table gave 135.9 s and 416 docs/h for 10 documents."""
    from pipeline.bench.job_report import noise_notes

    runs = [side_figures(10, 0, wall, None, [], 1.0, {}) for wall in (53.9, 217.9)]
    m = medians(runs)
    assert m["wall_s"] == pytest.approx(135.9) and m["docs_per_hour_wall"] == pytest.approx(3600 * 10 / 135.9)
    result = {"runs_by_side": {"nospec": runs, "spec": [side_figures(10, 0, w, None, [], 1.0, {}) for w in (40, 44)]},
              "host": {"cpus": 2, "load_avg_start": [3.3, 1, 1], "load_avg_end": [1.0, 1, 1]}}
    notes = noise_notes(result)
    assert len(notes) == 2 and notes[0].startswith("side nospec's runs differ by 304% (53.9 s to 217.9 s)")
    assert "load average (3.30, 1.00 at the start and end) was above this machine's 2 CPUs" in notes[1]
    quiet = {"runs_by_side": {"spec": result["runs_by_side"]["spec"]},
             "host": {"cpus": 2, "load_avg_start": [1.0], "load_avg_end": [1.2]}}
    assert noise_notes(quiet) == []


def test_merge_keeps_earlier_sides_of_the_same_settings(tmp_path):
    first = _result(walls={"peer": 100.0})
    js, _, _ = write_results(first, tmp_path)
    second = _result(walls={"longdoc": 50.0})
    merged = merge_previous(second, js)
    assert set(merged["summary"]) == {"longdoc", "peer"}
    assert merged["ratios"]["longdoc"]["vs_peer"]["wall"] == 2.0
    other = _result(walls={"longdoc": 50.0})
    other["settings"] = dict(other["settings"], max_new_tokens=8)
    assert set(merge_previous(other, js)["summary"]) == {"longdoc"}  # other settings: not merged
    eager = _result(walls={"longdoc": 50.0})
    eager["settings"] = dict(eager["settings"], set=["generation.compile=off"])
    assert set(merge_previous(eager, js)["summary"]) == {"longdoc"}  # other --set overrides: not merged
    js2, md2, written = write_results(second, tmp_path, merge=True)
    assert js2 == js and set(json.loads(js.read_text())["summary"]) == {"longdoc", "peer"}
    assert "| longdoc |" in md2.read_text() and "| peer |" in md2.read_text()
    assert "## Every run" in markdown(written)


def test_prefill_bound_is_the_peers_wall_over_longdocs_prompt_reading():
    r = _result(walls={"longdoc": 100.0, "peer": 90.0})
    r["runs_by_side"]["longdoc"][0]["where"] = {"rows_prefill_s": 60.0}
    finish(r)
    vs = r["ratios"]["longdoc"]["vs_peer"]
    # Even with decode, Ray and start-up free, reading the prompts alone caps it at 1.5x.
    assert vs["prefill_bound"] == pytest.approx(1.5) and vs["prefill_s"] == 60.0
    assert "bound longdoc / peer: at most 1.50x if all but its prompts' prefill (60.0 s) were free (its one run)" \
        in summary_lines(r)
    assert "prefill_bound" not in _result()["ratios"]["longdoc"]["vs_peer"]  # no figures, no bound


def test_a_sides_start_before_its_first_row_tightens_the_whole_process_bound():
    sides = {"greedy": {"kind": "longdoc", "method": "none", "speculative": "none", "peer": "peer", "what": ""},
             "pld": {"kind": "longdoc", "method": "none", "speculative": "prompt_lookup", "peer": "peer", "what": ""}}
    r = _result("cuda", sides, {"greedy": 31.0, "pld": 40.0})
    r["runs_by_side"]["pld"][0]["where"] = {"rows_prefill_s": 3.0, "first_row_start_s": 28.0}
    finish(r)
    vs = r["ratios"]["pld"]["vs_first"]
    # Free decoding could not make up for a start longer than greedy's whole run: 31 / (28 + 3).
    assert vs["prefill_bound"] == pytest.approx(31 / 3) and vs["start_s"] == 28.0
    assert vs["start_bound"] == pytest.approx(1.0)
    assert "bound pld / greedy: at most 10.33x if all but its prompts' prefill (3.0 s) were free; 1.00x with its " \
           "start too (28.0 s before its first row) (its one run)" in summary_lines(r)
    assert "start_bound" not in r["ratios"]["greedy"].get("vs_first", {})  # the first side has no vs_first


def test_a_pool_of_engines_shares_its_prefill_in_the_bound():
    r = _result(walls={"longdoc": 100.0, "peer": 90.0})
    r["sides"]["longdoc"]["engines"] = 2  # resources.actors: 2 under Ray, prefilling at once
    r["runs_by_side"]["longdoc"][0]["where"] = {"rows_prefill_s": 120.0}
    finish(r)
    vs = r["ratios"]["longdoc"]["vs_peer"]
    # 120 s of the rows' prefill on two engines is at least 60 s of wall time, not 120 s.
    assert vs["prefill_bound"] == pytest.approx(1.5) and vs["prefill_engines"] == 2
    assert "bound longdoc / peer: at most 1.50x if all but its prompts' prefill (120.0 s over 2 engines) " \
           "were free (its one run)" in summary_lines(r)


def test_a_compressed_side_is_bounded_by_its_prefill_against_the_first_side():
    sides = {"none": {"kind": "longdoc", "method": "none", "speculative": "none", "peer": "peer", "what": ""},
             "finch-1k": {"kind": "longdoc", "method": "finch", "speculative": "none", "peer": "peer", "what": ""},
             "peer": {"kind": "peer", "what": ""}}
    r = _result("cuda", sides, {"none": 72.0, "finch-1k": 78.0, "peer": 144.0})
    r["runs_by_side"]["finch-1k"][0]["where"] = {"rows_prefill_s": 48.0}
    finish(r)
    first = r["ratios"]["finch-1k"]["vs_first"]
    # Finch reads every document through the model: even with free decoding it cannot pass
    # none's 72 s over its own 48 s of prefill, whatever its KV budget.
    assert first["prefill_bound"] == pytest.approx(1.5) and first["prefill_s"] == 48.0
    assert r["ratios"]["finch-1k"]["vs_peer"]["prefill_bound"] == pytest.approx(3.0)
    lines = summary_lines(r)
    assert "bound finch-1k / none: at most 1.50x if all but its prompts' prefill (48.0 s) were free (its one run)" in lines
    assert "bound finch-1k / peer: at most 3.00x if all but its prompts' prefill (48.0 s) were free (its one run)" in lines
    assert "prefill_bound" not in r["ratios"]["none"].get("vs_first", {})  # the first side has no first side


def test_a_machine_that_slows_during_the_command_is_judged_by_its_rounds():
    r = _result()
    # The peer's later runs slowed (within SPREAD_NOTED: more, and no target is judged at all).
    walls = {"longdoc": (88.0, 89.0, 105.0), "peer": (127.0, 146.0, 148.0)}
    r["runs_by_side"] = {s: [dict(side_figures(39, 0, w, w, [1.0], 1.0, {}), run=k + 1, load_avg=1.0)
                             for k, w in enumerate(ws)] for s, ws in walls.items()}
    r["summary"] = {s: medians(v) for s, v in r["runs_by_side"].items()}
    finish(r)
    vs = r["ratios"]["longdoc"]["vs_peer"]
    assert vs["wall"] == pytest.approx(146.0 / 89.0)  # the medians' ratio: 1.64x
    assert vs["rounds"] == pytest.approx([127.0 / 88.0, 146.0 / 89.0, 148.0 / 105.0])
    [t] = r["targets"]
    assert t["value"] == pytest.approx(127.0 / 88.0) and t["pass"] is False  # the median round: 1.44x
    assert any(line.startswith("rounds longdoc / peer: 1.44x, 1.64x, 1.41x") for line in summary_lines(r))
    assert "rounds" not in _result()["ratios"]["longdoc"]["vs_peer"]  # one run: the medians alone


def test_the_markdown_ratios_section_starts_after_the_table_of_a_qa_job():
    """A QA job's table has a "(docs = rows written ...)" line under its head; the section
    took a fixed count of lines off the console block and began with the peer's table row."""
    r = _result()
    r["settings"]["docs_label"] = "10 requests (documents of q.jsonl)"
    assert "(docs = rows written, one per document and question)" in summary_lines(r)
    md = markdown(r)
    section = md.split("## Ratios and targets\n\n")[1].split("\n\n")[0].splitlines()
    assert section[0].startswith("- ratio longdoc / peer: documents/hour 2.00x")
    assert not any(line.startswith(("- peer ", "- longdoc ", "- (docs", "- side ")) for line in section)
    plain = _result()  # no QA line: the same section
    assert markdown(plain).split("## Ratios and targets\n\n")[1].split("\n\n")[0].splitlines() == section


def _where(prefill=13.3, step=34.0, stall=12.2, compress=0.0):
    return {"engine_prefill_s": prefill, "engine_step_s": step, "engine_stall_s": stall, "rows_compress_s": compress,
            "rows_prefill_s": prefill}


def test_the_time_line_says_the_stall_is_part_of_the_prefill_and_where_the_method_read():
    """A trial's line read "decode steps 3.1 s, of which prefill stalled decoding 27.7 s": the
    stall is prefill time while other rows decoded (engine.py _account_prefill), not a part of
    the decode steps; and a text method's compress_s (tokenize stage) was taken off the
    engine's prefill, which never held it."""
    r = _result()
    r["sides"]["longdoc"]["method_runs_at"] = "tokenize"
    r["runs_by_side"]["longdoc"][0]["where"] = _where(prefill=38.6, step=3.1, stall=27.7, compress=2.0)
    [line] = [x for x in summary_lines(r) if x.startswith("time longdoc")]
    assert line == ("time longdoc (run 1 of 1, the last): method reading 2.0 s (tokenize stage, before the engine), "
                    "engine prefill 38.6 s (decoding rows waited through 27.7 s of it), decode steps 3.1 s")
    assert "of which" not in line
    # A method reading inside the engine (Finch): its reading is a part of the engine's prefill.
    r["sides"]["longdoc"].update(method="finch", method_runs_at="prefill")
    [line] = [x for x in summary_lines(r) if x.startswith("time longdoc")]
    assert "engine prefill 38.6 s (the method's reading 2.0 s of it; decoding rows waited through 27.7 s of it), " \
           "decode steps 3.1 s" in line


def test_the_bound_and_time_lines_say_which_runs_they_come_from():
    """The bound took the median prefill, the time line beside it the last run, unsaid."""
    r = _result()
    r["runs_by_side"]["longdoc"] = [dict(r["runs_by_side"]["longdoc"][0], run=k, where=_where(prefill=p))
                                    for k, p in ((1, 10.0), (2, 30.0), (3, 20.0))]
    r["sides"]["longdoc"]["method_runs_at"] = "tokenize"
    finish(r)
    lines = summary_lines(r)
    [bound] = [x for x in lines if x.startswith("bound longdoc")]
    assert "prompts' prefill (20.0 s) were free" in bound and bound.endswith("(medians of its 3 runs)")
    [time] = [x for x in lines if x.startswith("time longdoc")]
    assert time.startswith("time longdoc (run 3 of 3, the last): ") and "engine prefill 20.0 s" in time


def test_a_target_is_not_judged_where_the_noise_note_says_its_figures_are_not_a_measurement(tmp_path):
    """A trial printed "PASS longdoc: ... 2.03x" above "NOTE side peer's runs differ by 93% ...
    its figures and ratios are not a measurement"."""
    r = _result()
    walls = {"longdoc": (36.3, 50.7), "peer": (116.6, 60.3)}
    r["runs_by_side"] = {s: [dict(side_figures(12, 0, w, w, [1.0], 1.0, {}), run=k + 1, load_avg=1.0)
                             for k, w in enumerate(ws)] for s, ws in walls.items()}
    r["summary"] = {s: medians(v) for s, v in r["runs_by_side"].items()}
    finish(r)
    [t] = r["targets"]
    assert t["pass"] is None and t["value"] is not None and t["verdict"] == "NOT JUDGED"
    assert t["not_judged"] == "noise: side longdoc's runs differ by 40%; side peer's runs differ by 93%"
    lines = summary_lines(r)
    assert not any(line.startswith(("PASS", "FAIL")) for line in lines)
    assert any(line.startswith("NOT JUDGED (noise: side longdoc's runs differ by 40%; side peer's runs differ by 93%) "
                               "longdoc: documents/hour >= 1.5x the peer's (whole process, CPU): ") for line in lines)
    js, md, _ = write_results(r, tmp_path)
    assert json.loads(js.read_text())["targets"][0]["verdict"] == "NOT JUDGED"
    assert "- NOT JUDGED (noise: " in md.read_text() and "- PASS" not in md.read_text()
    # Quiet runs: judged as before, with the verdict in the file.
    quiet = _result()
    assert quiet["targets"][0]["verdict"] == "PASS" and quiet["targets"][0]["sides"] == ["longdoc", "peer"]


def test_the_markdown_header_names_the_cpus_vendor_model_and_isa_features():
    r = _result()
    r["host"]["cpu"] = {"vendor": "GenuineIntel", "family": 6, "model": 143, "features": ["avx2", "avx512f", "amx_tile"]}
    assert "(2 CPUs: GenuineIntel family 6 model 143; avx2 avx512f amx_tile).  " in markdown(r)
    assert "(2 CPUs).  " in markdown(_result())  # a result without it (older files, not Linux)

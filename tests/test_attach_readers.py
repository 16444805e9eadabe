"""The merged outputs of timeline attach in the real readers: Perfetto's trace
processor (WASM) joins a host op to a CTA phase inside the kernel it launched;
Holistic Trace Analysis (PyPI HolisticTraceAnalysis) still loads the merged Kineto
JSON and its kernel breakdown equals the framework trace's alone; Chrome DevTools'
trace engine opens it. The framework trace is torch.profiler's own (CPU), with GPU
events in Kineto's schema (tests/kinetokit.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kinetokit as KK
import readers as RD
from timeline import load
from timeline.attach import attach, read_framework
from timeline.attach import write as AW

TRACES = Path(__file__).resolve().parents[1] / "traces"
KERNEL = "mono_ffn_kernel"

JOIN = """
with k as (select id, ts, dur, track_id from slice where category = 'kernel' and name = 'mono_ffn_kernel'),
call as (select f.slice_in as kid, so.id as call_id, so.ts as call_ts, so.track_id as call_track
         from flow f join slice so on so.id = f.slice_out where so.name = 'cuLaunchKernel')
select distinct k.id as kernel, host.name as host_op, grp.name as launch, cta.name as cta, ph.name as phase,
       ph.ts as ts, ph.dur as dur, k.ts as k_ts, k.dur as k_dur
from k join call on call.kid = k.id
join slice host on host.track_id = call.call_track and host.depth = 0 and host.id != call.call_id
                and host.ts <= call.call_ts and host.ts + host.dur >= call.call_ts
join track grp on grp.parent_id = k.track_id
join track cta on cta.parent_id = grp.id
join slice ph on ph.track_id = cta.id and ph.category = 'phase' and ph.ts >= k.ts and ph.ts + ph.dur <= k.ts + k.dur
order by k.ts, ph.ts
"""


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    d = tmp_path_factory.mktemp("attach_readers")
    base = KK.torch_trace(d / "cpu.json", marks=False)
    demo = load(TRACES / "h200_mono_demo.arrow").filter(launches=[0, 1, 2, 3])
    KK.gpu_trace(base, d / "gpu.json", demo)
    att = attach(demo, read_framework(d / "gpu.json"), kernel=KERNEL)
    AW.write_perfetto(att, d / "m.pftrace")
    AW.write_chrome(att, d / "m.json")
    return d, att


def test_trace_processor_joins_a_host_op_to_a_cta_phase_inside_its_kernel(merged):
    d, att = merged
    rows = RD.run("perfetto", d / "m.pftrace", JOIN)
    kernels = {r["kernel"] for r in rows}
    assert len(kernels) == 4  # every instrumented launch: host op -> launch call -> kernel -> CTA phase
    assert {r["host_op"] for r in rows} <= {"decode_0", "decode_1"}
    for r in rows:
        assert int(r["k_ts"]) <= int(r["ts"]) and int(r["ts"]) + int(r["dur"]) <= int(r["k_ts"]) + int(r["k_dur"])
    per_launch = {}
    for r in rows:
        per_launch.setdefault(r["launch"], set()).add(r["kernel"])
    assert all(len(v) == 1 for v in per_launch.values()) and len(per_launch) == 4  # each launch under its own kernel
    want = att.trace.interval_count
    assert len(rows) == want  # every phase interval of the 4 launches, each inside its own kernel


def test_trace_processor_keeps_every_framework_track(merged):
    d, att = merged
    fw = att.frameworks[0]
    got = RD.run("perfetto", d / "m.pftrace", "select category, count(*) as n from slice where category in "
                 "('kernel', 'gpu_memcpy', 'cpu_op', 'cuda_driver', 'cuda_runtime') group by category")
    n = {r["category"]: int(r["n"]) for r in got}
    doc = json.loads(Path(fw.path).read_text())
    want = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in n:
            want[e["cat"]] = want.get(e["cat"], 0) + 1
    assert n == want
    flows = RD.run("perfetto", d / "m.pftrace", "select count(*) as n from flow f join slice a on a.id = f.slice_out "
                   "where a.category in ('cuda_driver', 'cuda_runtime')")
    assert int(flows[0]["n"]) == sum(1 for e in doc["traceEvents"] if e.get("ph") == "s")


def test_hta_loads_the_merged_json_and_its_kernel_breakdown_is_the_frameworks(merged, tmp_path):
    from hta.trace_analysis import TraceAnalysis

    d, att = merged
    out = {}
    for name, src in (("alone", Path(att.frameworks[0].path)), ("merged", d / "m.json")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rank-0.json").write_bytes(src.read_bytes())
        kinds, kernels = TraceAnalysis(trace_dir=str(tmp_path / name)).get_gpu_kernel_breakdown(visualize=False)
        out[name] = (kinds.to_dict("records"), kernels.sort_values("name").to_dict("records"))
    assert out["alone"] == out["merged"]
    assert any(k["name"] == KERNEL for k in out["merged"][1])


def test_devtools_trace_engine_opens_the_merged_json(merged):
    d, att = merged
    threads = RD.run("devtools", d / "m.json")
    pids = {t["pid"] for t in threads}
    assert 0 in pids  # the GPU's streams
    ours = [t for t in threads if isinstance(t["pid"], int) and t["pid"] > AW.PID_OFFSET]
    assert ours and sum(t["entries"] for t in ours) > 0  # the CTA tracks' events are there

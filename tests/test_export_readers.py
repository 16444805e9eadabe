"""Our exports loaded in the real readers (tests/readers.py): Perfetto's trace
processor, Chrome DevTools' trace engine and speedscope. For every bundled real
trace, a synthetic multi-rank one and a hand-built one with every awkward case
(zero-length phases at a task's start, middle and end, a zero-length task,
touching tasks, inherited marks), each reader must show every task at depth 0
and every phase interval inside it at depth 1, at its exact ns, none dropped.

What a reader cannot show it must leave out, never misplace: DevTools' trace
engine keeps no thread instants in its tracks and speedscope draws only spans,
so there the zero-length phases (instants in the export) are absent and every
other event is exact. The trace processor shows them all, instants included.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import readers as RD
from bufkit import empty, put
from timeline import Spec, collect, load, merge
from timeline.ingest import synth
from timeline.export import write_chrome, write_perfetto
from timeline.export import _common as XC

TRACES = Path(__file__).resolve().parents[1] / "traces"
BUNDLED = ["h200_mono_demo.arrow", "h200_mono_warps.parquet", "h200_calibration.arrow"]


def edge_trace():
    """Two ranks of hand-written stamps (memrealtime ticks, 10 ns): on CTA 0, task
    a0 with zero-length start→hint and staged→compute, a1 touching a0 and ending in
    a zero-length compute→end, a2 of zero length, a3 with unwritten marks; rank 1
    the same 7 us later on its own clock."""
    sp = Spec("edge", [("a", 4), ("b", 2)], grid=2)
    t = 1_000_000
    rows = {("a", 0): [t, t, t + 5, t + 5, t + 9], ("a", 1): [t + 9, t + 12, t + 20, t + 31, t + 31],
            ("a", 2): [t + 40] * 5, ("a", 3): [t + 50, 0, t + 57, 0, t + 60],
            ("b", 0): [t + 3, t + 4, t + 8, t + 8, t + 8], ("b", 1): [t + 60, t + 61, t + 62, t + 63, t + 64]}
    traces = []
    for rank in (0, 1):
        s = sp.replace(rank=rank, world=2)
        buf = empty(s)
        for (stage, task), ticks in rows.items():
            cta = 1 if (stage, task) == ("b", 0) else 0
            put(buf, s, stage=stage, task=task, ticks=[x + 700 * rank if x else 0 for x in ticks], cta=cta)
        traces.append(collect(buf, s))
    return merge(traces)


@pytest.fixture(scope="module", params=BUNDLED + ["synthetic", "edge"])
def case(request, tmp_path_factory):
    """``(trace, chrome path, perfetto path)`` of one test trace."""
    name = request.param
    if name == "synthetic":
        trace = synth.synth_trace(synth.glm5_spec(waves=2, world=2, launches=2), grid=8, seed=3)
    elif name == "edge":
        trace = edge_trace()
    else:
        trace = load(TRACES / name)
    d = tmp_path_factory.mktemp(name.replace(".", "_"))
    write_chrome(trace, d / "t.json")
    write_perfetto(trace, d / "t.pftrace")
    return trace, d / "t.json", d / "t.pftrace"


def canonical(events, *, spans_only=False, relative=False):
    """Events in a reader-independent order (time, depth, length, name); ``spans_only``
    drops zero-length ones, ``relative`` measures times from the first event."""
    evs = [e for e in events if e.dur != 0] if spans_only else list(events)
    if relative and evs:
        t0 = min(e.ts for e in evs)
        evs = [e._replace(ts=e.ts - t0, dur=-1) for e in evs]
    return sorted(evs, key=lambda e: (e.ts, e.depth, e.dur, e.name))


def origin_ns(path: Path) -> int:
    us = json.loads(path.read_text())["otherData"]["origin_ts_us"]
    whole, frac = us.split(".")
    return int(whole) * 1000 + int(frac)


def mismatches(want: dict, got: dict, **kw) -> list:
    """The threads whose events differ (with the first difference), plus threads
    the reader invented."""
    bad = []
    for key in sorted(set(want) | set(got)):
        w, g = canonical(want.get(key, []), **kw), canonical(got.get(key, []), **kw)
        if w != g:
            first = next(((a, b) for a, b in zip(w, g) if a != b), (len(w), len(g)))
            bad.append((key, first))
    return bad


def test_the_edge_trace_has_every_awkward_case():
    evs = [e for v in RD.expected(edge_trace()).values() for e in v]
    assert sum(e.dur == 0 and e.depth == 1 for e in evs) >= 4  # zero-length phases in a task
    assert any(e.dur == 0 and e.depth == 0 for e in evs)  # a zero-length task
    tasks = sorted((e.ts, e.ts + e.dur) for e in RD.expected(edge_trace())[(1, 1)] if e.depth == 0)
    assert any(a[1] == b[0] for a, b in zip(tasks, tasks[1:]))  # touching tasks
    assert edge_trace().intervals.column("inherited").to_pylist().count(True) >= 2


def test_chrome_export_is_exact_in_perfetto_trace_processor(case):
    trace, chrome, _ = case
    base = origin_ns(chrome)
    got = {k: [e._replace(ts=e.ts - base) for e in v] for k, v in RD.perfetto_view(chrome).items()}
    assert mismatches(RD.expected(trace), got) == []


def test_chrome_export_is_exact_in_devtools_trace_engine(case):
    trace, chrome, _ = case
    base = origin_ns(chrome)
    got = {k: [e._replace(ts=e.ts - base) for e in v] for k, v in RD.devtools_view(chrome).items()}
    assert mismatches(RD.expected(trace), got, spans_only=True) == []
    assert all(e.dur > 0 for v in got.values() for e in v)  # instants are left out, not misplaced


def test_chrome_export_is_exact_in_speedscope(case):
    trace, chrome, _ = case
    warnings, got = RD.speedscope_view(chrome)
    assert warnings == []  # no stack repairs: every end closed its own begin
    assert mismatches(RD.expected(trace), got, spans_only=True, relative=True) == []


def test_perfetto_protobuf_is_exact_in_the_trace_processor(case):
    """Slice counts, depths and ts/dur to the ns, per track (the protobuf export
    writes zero-length phases as begin/end pairs, in order)."""
    trace, _, pftrace = case
    num = XC.numbering(trace)
    pid, tid, rank, launch, cta, wave, lane = XC.threads(trace, num)
    names = {(int(p), int(t)): (XC.process_name(trace, int(r), int(la)),
                                XC.thread_name(int(c), int(w), int(k)))
             for p, t, r, la, c, w, k in zip(pid, tid, rank, launch, cta, wave, lane)}
    want = {names[key]: evs for key, evs in RD.expected(trace, instants=False).items()}
    shift = -min(0, min((e.ts for v in want.values() for e in v), default=0))
    got = {k: [e._replace(ts=e.ts - shift) for e in v] for k, v in RD.perfetto_track_view(pftrace).items()
           if k[0] != "stage breakdown"}  # the stage tracks: test_export_perfetto.py
    assert mismatches(want, got) == []


FLOW_SQL = {  # per flow: where it leaves and enters (the protobuf's CTA tracks are named tracks under a
    # rank · launch track; the JSON's are threads of processes)
    "chrome": """
select so.ts as out_ts, si.ts as in_ts, po.pid || ':' || to_.tid as out_at, pi.pid || ':' || ti.tid as in_at
from flow f join slice so on so.id = f.slice_out join slice si on si.id = f.slice_in
join thread_track tto on so.track_id = tto.id join thread to_ on tto.utid = to_.utid join process po on to_.upid = po.upid
join thread_track tti on si.track_id = tti.id join thread ti on tti.utid = ti.utid join process pi on ti.upid = pi.upid
order by so.ts""",
    "perfetto": """
select so.ts as out_ts, si.ts as in_ts, ppo.name || ':' || tro.name as out_at, ppi.name || ':' || tri.name as in_at
from flow f join slice so on so.id = f.slice_out join slice si on si.id = f.slice_in
join track tro on so.track_id = tro.id join track ppo on tro.parent_id = ppo.id
join track tri on si.track_id = tri.id join track ppi on tri.parent_id = ppi.id
order by so.ts""",
}


@pytest.mark.parametrize("fmt", ["perfetto", "chrome"])
def test_critical_path_hand_offs_are_flows_in_the_trace_processor(fmt, tmp_path):
    """A trace with a task graph: each hand-off on a launch's exact critical path is
    one flow, from the producer's CTA track to the consumer's, in both exports, as
    the trace processor's ``flow`` table reads them."""
    from timeline.contract import presets

    trace = load(TRACES / "h200_mono_demo.arrow").with_graph(presets.triton_ffn()).filter(launches=[2, 3, 4, 5])
    want = sorted(XC.flows(trace), key=lambda f: f.src_ns)
    assert len(want) >= 4  # at least one data hand-off per launch
    path = tmp_path / ("t.pftrace" if fmt == "perfetto" else "t.json")
    (write_perfetto if fmt == "perfetto" else write_chrome)(trace, path)
    got = RD.run("perfetto", path, FLOW_SQL[fmt])
    num = XC.numbering(trace)

    def at(track):
        rank, launch, cta, wave = track
        if fmt == "chrome":
            return f"{num.pid(rank, launch)}:{num.tid(cta, wave)}"
        return f"{XC.process_name(trace, rank, launch)}:{XC.thread_name(cta, wave)}"

    assert [(r["out_at"], r["in_at"]) for r in got] == [(at(f.src), at(f.dst)) for f in want]
    assert all(int(r["out_ts"]) <= int(r["in_ts"]) for r in got)
    plain = tmp_path / ("p.pftrace" if fmt == "perfetto" else "p.json")
    (write_perfetto if fmt == "perfetto" else write_chrome)(load(TRACES / "h200_mono_demo.arrow"), plain)
    assert RD.run("perfetto", plain, "select count(*) as n from flow") == [{"n": "0"}]  # no graph, no flows

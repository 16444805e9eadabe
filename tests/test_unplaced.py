"""Rows kept without a placement word (``Flag.NO_PLACEMENT``: CTA, wave and the
hardware columns null) through every consumer of the tables: each puts them on its
own labelled "unplaced" track or row (``timeline.core.rows.tracks``), never on a real
CTA's, never crashes, never drops them silently. Traces come from the real
collector (buffers with zero placement words, unwritten phases and marks, no slot
headers), so every nullable column of the tasks table holds nulls."""

from __future__ import annotations

import base64
import io
import json
from collections import defaultdict

import numpy as np
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import readers as RD
from bufkit import empty, put
from test_export_perfetto import Decoded
from timeline import Spec, collect, merge
from timeline.core.trace import Trace
from timeline.analysis import stages as A
from timeline.analysis import edges as E
from timeline.contract import graph as G
from timeline.core import rows as R
from timeline.contract import schema as S
from timeline.analysis import whatif as W
from timeline.export import write_chrome, write_perfetto
from timeline.export import _common as XC

T0 = 5_000_000_000
SPEC = Spec("unplaced", [("a", 4), ("b", 4)], grid=4, launches=2, wait=("start", "hint"), marks=("flag",),
            graph={"b": [G.every("a")]})
P = len(SPEC.phases)
SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def unplaced_traces(draw, worlds=(1, 2)):
    """A trace through the real collector (and merge, for two ranks) whose rows are
    placed or not at random (the first record of each rank unplaced, the second
    placed), tasks of a stage overlapping in time on different CTAs, phases and the
    mark written or not: nulls in every nullable column of the tasks table."""
    world = draw(st.sampled_from(worlds))
    traces = []
    for rank in range(world):
        sp = SPEC.replace(rank=rank, world=world)
        buf = empty(sp)
        first = True
        for launch in range(sp.launches):
            for s, (stage, count) in enumerate(sp.stages):
                t = T0 + launch * 10_000 + s * 1_000
                for task in range(count):
                    kind = "unplaced" if first else draw(st.sampled_from(["placed", "unplaced", "unwritten"]))
                    if launch == 0 and s == 0 and task == 1:
                        kind = "placed"
                    lead, first = first, False
                    if kind == "unwritten":
                        continue
                    start = t + draw(st.integers(0, 60))
                    steps = draw(st.lists(st.integers(0, 40), min_size=P - 1, max_size=P - 1))
                    ticks = list(np.cumsum([start, *steps]))
                    if draw(st.booleans()):
                        ticks[draw(st.integers(1, P - 2))] = 0  # a missing phase: its _ns null
                    mark = 0 if lead else draw(st.sampled_from([0, start + 1]))  # the lead's unwritten: flag_ns has a null
                    put(buf, sp, stage=stage, task=task, launch=launch, ticks=[*ticks, mark], cta=task,
                        placement=0 if kind == "unplaced" else None)
        traces.append(collect(buf, sp))
    trace = merge(traces) if world > 1 else traces[0]
    nulls = {c: trace.tasks.column(c).null_count for c in S.nullable_columns(trace.phases, trace.marks)}
    assert all(nulls[c] for c in ("step", "layer", *S.PLACEMENT_COLUMNS, "flag_ns")), nulls
    return trace


def unplaced_mask(trace) -> np.ndarray:
    """Which task rows have no CTA, read from the table itself (not through the rule)."""
    return trace.tasks.column("cta").is_null().to_numpy(zero_copy_only=False)


def unplaced_count(trace) -> int:
    return int(unplaced_mask(trace).sum())


def drawn_rows(trace) -> np.ndarray:
    """Which task rows an export draws: those with at least one phase interval."""
    return R.phase_intervals(R.phase_matrix(trace.tasks, trace.phases)).valid.any(axis=1)


# -- the rule -------------------------------------------------------------------------------------------
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 100), st.integers(0, 30)), max_size=40))
def test_lanes_never_overlap_and_are_no_more_than_the_peak(rows):
    group = np.array([g for g, _, _ in rows], np.int64)
    first = np.array([f for _, f, _ in rows], np.int64)
    last = first + np.array([d for _, _, d in rows], np.int64)
    lane = R.lanes(group, first, last)
    for g in set(group.tolist()):
        for k in set(lane[group == g].tolist()):
            on = sorted(zip(first[(group == g) & (lane == k)], last[(group == g) & (lane == k)]))
            assert all(a[1] <= b[0] for a, b in zip(on, on[1:])), (g, k, on)
        m = group == g
        inside = lambda x: (first[m] <= x) & ((last[m] > x) | (last[m] == x) & (first[m] == x))  # noqa: E731
        peak = max(inside(x).sum() for x in first[m].tolist())  # a zero-length row occupies its instant
        assert lane[m].max() + 1 <= max(peak, 1)  # no more lanes than rows overlapping at one time


@SETTINGS
@given(unplaced_traces())
def test_tracks_put_unplaced_rows_on_lanes_never_a_cta(trace):
    tr = R.tracks(trace.tasks, trace.phases)
    un = unplaced_mask(trace)
    assert (R.placed(trace.tasks) == ~un).all()
    assert (tr.lane[un] >= 0).all() and (tr.cta[un] == R.NO_CTA).all() and (tr.lane[~un] == R.NO_CTA).all()
    assert (tr.cta[~un] == R.column(trace.tasks, "cta", fill=-1)[~un]).all()
    assert R.track_name(-1, -1, 0) == "unplaced · lane 0" and R.track_name(3, 1) == "CTA 3 · wave 1"


# -- Chrome JSON -------------------------------------------------------------------------------------------
def chrome_doc(trace, **kw) -> dict:
    buf = io.BytesIO()
    write_chrome(trace, buf, **kw)
    return json.loads(buf.getvalue())


def chrome_tasks(doc: dict, stage_names) -> list:
    """(thread name, args) of every task event (a B or X, or an instant of a zero-length task)."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    return [(names[(e["pid"], e["tid"])], e["args"]) for e in doc["traceEvents"]
            if e.get("ph") in ("B", "X", "i") and e.get("cat") in stage_names and "phase_us" in e["args"]]


def assert_balanced(events) -> None:
    """Per thread, every E closes the last open B of that name: spans on one track nest."""
    stacks = defaultdict(list)
    for e in events:
        if e.get("ph") == "B":
            stacks[(e["pid"], e["tid"])].append(e["name"])
        elif e.get("ph") == "E":
            assert stacks[(e["pid"], e["tid"])].pop() == e["name"]


@SETTINGS
@given(unplaced_traces(), st.booleans())
def test_chrome_puts_unplaced_rows_on_unplaced_threads(trace, complete):
    """Was: ``IndexError`` (the null CTA read as NaN, written as digits)."""
    doc = chrome_doc(trace, complete=complete)
    tasks = chrome_tasks(doc, trace.spec.stage_names)
    drawn = drawn_rows(trace)
    un = unplaced_mask(trace)
    assert len(tasks) == int(drawn.sum())  # every drawn row, none dropped
    on_unplaced = [a for name, a in tasks if name.startswith("unplaced · lane ")]
    assert len(on_unplaced) == int((drawn & un).sum())
    assert all(a["cta"] is None and a["wave"] is None for a in on_unplaced)
    assert all(name == f"CTA {a['cta']} · wave {a['wave']}" for name, a in tasks if a["cta"] is not None)
    if not complete:
        assert_balanced(doc["traceEvents"])


# -- Perfetto ---------------------------------------------------------------------------------------------
@SETTINGS
@given(unplaced_traces())
def test_perfetto_puts_unplaced_rows_on_unplaced_tracks(trace):
    """Was: the NaN CTA cast to a garbage track id (a real CTA's track, or one outside
    the kernel's tree)."""
    buf = io.BytesIO()
    write_perfetto(trace, buf)
    d = Decoded(buf.getvalue())
    procs = {t.uuid for t in d.tracks.values() if t.HasField("parent_uuid") and t.parent_uuid == 1}
    names = {u: t.name for u, t in d.tracks.items()}
    parent = {u: t.parent_uuid for u, t in d.tracks.items() if t.HasField("parent_uuid")}
    # task slices: depth 0 on a track whose parent is a (rank, launch) (the stage breakdown's are a level lower)
    tasks = [s for s in d.slices() if s[6] == 0 and parent.get(s[0]) in procs and s[2] in trace.spec.stage_names]
    drawn, un = drawn_rows(trace), unplaced_mask(trace)
    assert len(tasks) == int(drawn.sum())  # every drawn row on a described track of the kernel's tree
    unplaced = [s for s in tasks if names[s[0]].startswith("unplaced · lane ")]
    assert len(unplaced) == int((drawn & un).sum())
    assert all("cta" not in s[5] and "wave" not in s[5] for s in unplaced)
    assert all(names[s[0]] == f"CTA {s[5]['cta']} · wave {s[5]['wave']}" for s in tasks if "cta" in s[5])


# -- analyses, the task graph, merge --------------------------------------------------------------------
@SETTINGS
@given(unplaced_traces())
def test_analyses_count_or_show_unplaced_rows(trace):
    """Was: the per-CTA tables left the rows out without a word, ``critical_path``
    filtered them away (its walk could skip the launch's last task). The heuristic walk
    (``critical_path`` gives this spec's exact path instead, ``exact_path``: checked below)."""
    from timeline.analysis import heuristic_path

    for launch in trace.launches:
        for rank in trace.ranks:
            path = heuristic_path(trace, rank=rank, launch=launch)
            t = R.select(trace.tasks, R.check(trace, [rank], [launch]))
            _, last = R.extent(R.phase_matrix(t, trace.phases))
            assert path.num_rows and R.numpy(path.column("end_ns")).max() == last.max()  # reaches the last end
            cta = path.column("cta")
            assert all(c is None or c >= 0 for c in cta.to_pylist())
    assert A.stage_report(trace).num_rows > 0
    conc = A.concurrency(trace, bins=50)
    assert np.isfinite(R.numpy(conc.column("ctas"))).all()
    n = unplaced_count(trace)
    assert A.idle_per_cta(trace).column("cta").null_count == 0
    assert A.unplaced_rows(A.idle_per_cta(trace)) == n and A.unplaced_rows(A.idle_gaps(trace)) == n
    assert A.unplaced_rows(A.overlapping_tasks(trace)) == n


@SETTINGS
@given(unplaced_traces())
def test_edges_exact_path_and_whatif_with_unplaced_rows(trace):
    g = E.edges(trace)
    m = g.tasks
    placed_keys = {(r, la, s, k) for r, la, s, k, c in zip(*(R.column(trace.tasks, c).tolist() for c in
                   ("rank", "launch", "stage_index", "task")), (~unplaced_mask(trace)).tolist()) if c}
    for i in range(m.n):
        key = (int(m.rank[i]), int(m.launch[i]), int(m.stage[i]), int(m.task[i]))
        assert (m.cta[i] >= 0) == (key in placed_keys)  # any row of the task with a CTA gives it
    cta_order = g.kind == 2
    assert (m.cta[g.consumer[cta_order]] >= 0).all() and (m.cta[g.producer[cta_order]] >= 0).all()
    for launch in trace.launches:
        path = E.exact_path(trace, launch=launch, g=g)
        assert (pc.fill_null(path.column("cta"), 0).to_numpy() >= 0).all()  # null, never -1
    E.edges_table(trace, g)
    rp = W.replay(trace, (), g)  # the replay of no change runs over every task, placed or not
    assert len(rp) if isinstance(rp, tuple) else rp is not None
    assert all(fl.src[2] >= 0 and fl.dst[2] >= 0 for fl in XC.flows(trace))


@SETTINGS
@given(unplaced_traces(worlds=(2,)))
def test_merge_keeps_unplaced_rows_unplaced(trace):
    assert unplaced_count(trace) == int((R.numpy(trace.tasks.column("flags")) & S.Flag.NO_PLACEMENT != 0).sum())
    again = merge([trace.filter(ranks=[0]), trace.filter(ranks=[1])])
    assert unplaced_count(again) == unplaced_count(trace)


# -- the dashboard ----------------------------------------------------------------------------------------
@SETTINGS
@given(unplaced_traces())
def test_gantt_rows_of_unplaced_rows_are_labelled_and_apart(trace):
    from viewer import figures as F
    from viewer import model as M

    d = M.TraceData(trace)
    un = d.cta < 0
    for grouping in M.GROUPINGS:
        view = M.build_view(d, grouping)
        assert view.order.size == d.n  # every interval has a row
        row_of = np.empty(d.n, np.int64)
        row_of[view.order] = view.row
        labels = [M.row_label(d, view, r) for r in range(view.n_rows)]
        unplaced_rows = set(row_of[un].tolist())
        assert all("unplaced · lane" in labels[r] for r in unplaced_rows)
        assert not unplaced_rows & set(row_of[~un].tolist())  # never a CTA's row
        for r in range(view.n_rows):  # the bars of one row never overlap across tasks
            idx = view.order[view.row_start[r]:view.row_start[r + 1]]
            spans = {}
            for i in idx.tolist():
                lo, hi = spans.get(d.tid[i], (d.start[i], d.end[i]))
                spans[d.tid[i]] = (min(lo, d.start[i]), max(hi, d.end[i]))
            s = sorted(spans.values())
            if grouping != "cta":
                assert all(a[1] <= b[0] for a, b in zip(s, s[1:])), (grouping, labels[r], s)
        fig, _ = F.gantt_figure(d, view, r0=0, r1=view.n_rows, t0_ns=d.t_min, t1_ns=d.t_max + 1,
                                stages=list(range(len(d.stage_names))))
        hover = [t for t in fig["data"] if t.get("meta", {}).get("kind") == "hover"]
        said = [t for t in hover if "unplaced: no placement word" in t["hovertemplate"]]
        assert bool(said) == bool(un.any()) and all("CTA %{" in t["hovertemplate"] for t in hover if t not in said)
    # the full CTA range keeps the rows without a CTA
    from viewer.panels import gantt as VG
    assert VG.normalize(d, None, None, None, None, [0, int(d.cta.max())])[4] is None


def dashboard(tmp_path, trace):
    from viewer import app as V

    d = tmp_path / "traces"
    d.mkdir(exist_ok=True)
    trace.save(d / "u.arrow")
    st_, _, _ = V.prepare(["--trace-dir", str(d), str(d / "u.arrow")])
    return st_


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(trace=unplaced_traces())
def test_dashboard_export_and_gantt_callbacks(tmp_path_factory, trace):
    """Was: the export panel said "on export: IndexError"."""
    from viewer.panels import export as VX
    from viewer.panels import gantt as VG
    from viewerkit import bars_of, component_text

    state = dashboard(tmp_path_factory.mktemp("dash"), trace)
    sent = VX.export(state, "u.arrow", None, None, None)
    doc = json.loads(base64.b64decode(sent["content"]))
    tasks = chrome_tasks(doc, trace.spec.stage_names)
    un = unplaced_mask(trace)
    assert sum(name.startswith("unplaced") for name, _ in tasks) == int((drawn_rows(trace) & un).sum())
    g = VG.gantt(state, VG.GanttQuery("u.arrow"))
    ticks = g.figure["layout"]["yaxis"].get("ticktext", [])
    assert any("unplaced · lane 0" in t for t in ticks), ticks
    assert bars_of(g.figure)
    from viewer.panels import tables as VT

    *_, note = VT.idle(state, "u.arrow", None, None)
    assert f"{unplaced_count(trace)} task rows without a placement word" in component_text(note)


# -- real readers -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reader_case(tmp_path_factory):
    """A fixed two-rank trace with overlapping unplaced rows, exported both ways."""
    trace = _fixed_trace()
    d = tmp_path_factory.mktemp("unplaced_readers")
    write_chrome(trace, d / "t.json")
    write_perfetto(trace, d / "t.pftrace")
    return trace, d / "t.json", d / "t.pftrace"


def _fixed_trace():
    traces = []
    for rank in (0, 1):
        sp = SPEC.replace(rank=rank, world=2)
        buf = empty(sp)
        for launch in range(2):
            for s, (stage, count) in enumerate(sp.stages):
                t = T0 + launch * 10_000 + s * 1_000 + rank * 7
                for task in range(count):
                    start = t + 5 * task  # a stage's tasks overlap (different CTAs)
                    ticks = [start, start + 10, start + 20 + task, start + 40, start + 60]
                    put(buf, sp, stage=stage, task=task, launch=launch, ticks=[*ticks, 0], cta=task,
                        placement=0 if task % 2 else None)
        traces.append(collect(buf, sp))
    return merge(traces)


def _tracks_by_name(trace, num):
    pid, tid, rank, launch, cta, wave, lane = XC.threads(trace, num)
    return {(int(p), int(t)): XC.thread_name(int(c), int(w), int(k)) for p, t, c, w, k in zip(pid, tid, cta, wave, lane)}


def test_chrome_with_unplaced_rows_is_exact_in_devtools_and_the_trace_processor(reader_case):
    from test_export_readers import mismatches, origin_ns

    trace, chrome, _ = reader_case
    want = RD.expected(trace)
    names = _tracks_by_name(trace, XC.numbering(trace))
    assert sum(names[k].startswith("unplaced") for k in want) >= 4  # two lanes a (rank, launch) at least
    base = origin_ns(chrome)
    for view, kw in ((RD.perfetto_view, {}), (RD.devtools_view, {"spans_only": True})):
        got = {k: [e._replace(ts=e.ts - base) for e in v] for k, v in view(chrome).items()}
        assert mismatches(want, got, **kw) == []


def test_perfetto_with_unplaced_rows_is_exact_in_the_trace_processor(reader_case):
    from test_export_readers import mismatches

    trace, _, pftrace = reader_case
    num = XC.numbering(trace)
    names = _tracks_by_name(trace, num)
    pnames = {(int(num.pid(r, la))): XC.process_name(trace, r, la) for r in trace.ranks for la in trace.launches}
    want = {(pnames[k[0]], names[k]): v for k, v in RD.expected(trace, instants=False).items()}
    got = {k: v for k, v in RD.perfetto_track_view(pftrace).items() if k[1] != "stage breakdown"
           and k[0] != "stage breakdown"}
    assert any(k[1].startswith("unplaced · lane 1") for k in got)
    assert mismatches(want, got) == []


# -- the CLI ----------------------------------------------------------------------------------------------
def test_cli_export_and_idle_with_unplaced_rows(tmp_path, capsys):
    """Was: ``timeline export --chrome`` died with an ``IndexError`` traceback; the
    idle report left the rows out without a word."""
    from timeline.cli import main

    trace = _fixed_trace()
    path = trace.save(tmp_path / "u.arrow")
    code = main(["export", str(path), "--chrome", str(tmp_path / "u.json"), "--perfetto", str(tmp_path / "u.pf")])
    out, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in out + err
    names = {e["args"]["name"] for e in json.loads((tmp_path / "u.json").read_text())["traceEvents"]
             if e.get("name") == "thread_name"}
    assert {"unplaced · lane 0", "unplaced · lane 1"} <= names
    assert main(["summary", str(path), "--idle"]) == 0
    n = unplaced_count(trace)
    assert f"({n} task rows without a placement word are left out" in capsys.readouterr().out
    assert main(["summary", str(path), "--idle", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unplaced_rows"] == n


@SETTINGS
@given(unplaced_traces())
def test_the_interval_count_is_the_intervals_tables_rows(trace):
    """``Trace.interval_count`` (what `timeline run add` prints, counted without the
    table) is the intervals table's row count, missing phases and all."""
    fresh = Trace(trace.tasks, trace.specs, trace.anomalies)
    assert "intervals" not in fresh.__dict__
    assert fresh.interval_count == fresh.intervals.num_rows == trace.intervals.num_rows

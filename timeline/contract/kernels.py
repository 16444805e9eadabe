"""The known mono kernels' own timeline builds, as data: one ``Profile`` per
generation (ROCm/FlyDSL branch ``glm5-mla-moe-layer-monokernel``; shared
REFERENCE §1, §1b), and the GLM-5 facts every other module imports from here.

A profile says, per generation: the stage order and task counts (functions of the
run's parameters S, heads, topk, ... where the kernel computes them), the
placement rule of every stage (``running`` sum over the base order, a ``fixed``
base, or ``with`` another stage: task ``t`` on that stage's task ``t``'s CTA), the
column count (8: five phases + three debug marks; 5: phases only), the marks and
who stamps them, the cells a stage (or a task range of it) never writes, the
declared wait per stage, and the host report's extra lines. Adding a generation
is adding a ``Profile`` here and a test; the decoder (``timeline.ingest.legacy``) and the
reports (``timeline.analysis.legacy_reports``) only read these fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["Profile", "Stage", "Cells", "Mark", "PROFILES", "profile", "stage_list", "ctas", "cell_mask",
           "unstamped", "stage_waits", "match", "model", "LEGACY_COLS", "LEGACY_PHASES", "LEGACY_MARKS",
           "GLM5_WAIT", "GLM5_UNSTAMPED", "GLM5_STAGES", "GLM5_BASE_ORDER", "GLM5_GRID", "GLM5_ARCH"]

LEGACY_COLS = 8
LEGACY_PHASES = ("start", "hint", "staged", "compute", "end")  # columns 0-4
LEGACY_MARKS = ("mark5", "mark6", "mark7")  # columns 5-7: free debug marks
GLM5_WAIT = ("hint", "staged")  # the barrier comes after hint; producers are polled before staged
GLM5_UNSTAMPED = {"qkv_a": ("hint",), "cache": ("compute",)}  # never written by the kernel (no producer / no math)
GLM5_STAGES = (("qkv_a", 164), ("cache", 1), ("q_b", 128), ("uk", 32), ("split", 32), ("uv", 32),
               ("o", 192), ("router", 32), ("ug", 256), ("down", 192))  # S=1, 8 heads, topk 2048
GLM5_BASE_ORDER = ("qkv_a", "cache", "q_b", "split", "uk", "uv", "o", "router", "ug", "down")
GLM5_GRID = 256
GLM5_ARCH = "gfx950"  # MI355X


def _always(p) -> bool:
    return True


@dataclass(frozen=True)
class Cells:
    """Phases a stage never writes, for its tasks ``lo <= t < hi`` (``hi`` None: all)
    in runs whose parameters satisfy ``when``."""

    phases: tuple
    lo: int = 0
    hi: int | None = None
    when: Callable = _always


@dataclass(frozen=True)
class Stage:
    """One stage: its name, its task count from the run's parameters, its placement
    (``("running",)``, ``("fixed", base)`` or ``("with", stage)``), the cells it never
    writes, and its wait for producers when it is not the profile's (``()``: none)."""

    name: str
    count: Callable
    place: tuple = ("running",)
    cells: tuple = ()
    wait: tuple | None = None


@dataclass(frozen=True)
class Mark:
    """A debug mark: its column, the stage whose rows hold it, and who stamps it."""

    column: int
    stage: str
    by: str


@dataclass(frozen=True)
class Profile:
    """One kernel generation's timeline build (see the module docstring)."""

    name: str
    title: str
    source: str  # file @commit the facts were read from
    saver: str  # which tool saves the tensor, how, where
    stages: tuple  # Stage, in row order
    base_order: tuple  # the running-sum order of the ``running`` stages
    params: tuple  # the parameter sets detection tries, each a dict
    cols: int = LEGACY_COLS
    grid: int = GLM5_GRID
    wait: tuple = GLM5_WAIT
    marks: tuple = ()
    report_extra: tuple = ()  # (stage, line rule of timeline.legacy_reports.EXTRA_LINES)
    median: str = "torch"  # their report's median: "torch" (lower middle) or "statistics" (mean of the two)
    free_counts: bool = False  # counts hang on run dims the file does not carry: names decide, counts as saved
    notes: str = ""
    arch: str = GLM5_ARCH


def _hg(p) -> int:
    return -(-p["heads"] // 8)


def _indexed_stages() -> tuple:
    """``indexed_mla_moe_kernel.py @0959aa87``'s stages (GLM-5 geometry by default)."""
    return (
        Stage("qkv_a", lambda p: p.get("qkv_a", 164), cells=(Cells(("hint",)),)),
        Stage("cache", lambda p: 1, cells=(Cells(("compute",)),)),
        Stage("q_b", lambda p: p["heads"] * p.get("qk_dim", 256) // 16),
        Stage("uk", lambda p: p["heads"] * 4),
        Stage("split", lambda p: p["S"] * (p["topk"] // 64) * (_hg(p) if p["S"] == 1 else 1)),
        Stage("uv", lambda p: p["S"] * p["heads"] * p.get("v_dim", 256) // 64),
        Stage("o", lambda p: p.get("hidden", 6144) // 32),
        Stage("router", lambda p: p["S"] * 32),
        Stage("ug", lambda p: 256 if p["S"] == 1 else p["S"] * 256,
              cells=(Cells(("hint", "staged", "compute"), when=lambda p: p["S"] > 1),)),
        Stage("down", lambda p: p.get("hidden", 6144) // (32 if p["S"] == 1 else 24)),
    )


_GLM5_MARKS = (Mark(5, "split", "split"), Mark(6, "split", "split"), Mark(5, "uv", "uv"),
               Mark(5, "router", "router, thread 448 (wave 7)"), Mark(6, "router", "router"),
               Mark(7, "router", "router"),
               Mark(7, "ug", "route_top8: the ug row whose task index is the CTA id, from the ug stage and "
                              "(S = 1) again from the down stage; at S > 1 once per CTA from ug's dn_route"))
_GLM5_PARAMS = tuple(dict(S=s, heads=8, topk=2048) for s in range(1, 9))


def _mono_stages(indexer: bool) -> tuple:
    """``monokernel/glm/kernel.py @eb043133``'s stages (``glm/layout.py``'s ``stage_tasks``,
    read @50658f7a), with or without the indexer."""
    keys = lambda p: 32 if p["S"] > 4 else 64  # noqa: E731 - split's keys per task
    idx = (Stage("index_q", lambda p: 256, place=("with", "q_b"),
                 cells=(Cells(("hint", "staged"), hi=128),)),) if indexer else ()
    score = (Stage("index_score", lambda p: p["S"] * -(-p.get("index_max_seq", 4096) // 64), place=("fixed", 101),
                   cells=(Cells(("hint", "staged", "compute")),), wait=()),
             Stage("index_select", lambda p: p["S"], place=("fixed", 100),
                   cells=(Cells(("hint", "staged", "compute")),), wait=())) if indexer else ()
    return (
        Stage("qkv_a", lambda p: 164, cells=(Cells(("hint",)),)),
        Stage("q_norm", lambda p: p["S"], cells=(Cells(("compute",)),)),
        Stage("cache", lambda p: 1, cells=(Cells(("compute",)),)),
        Stage("q_b", lambda p: p["heads"] * 16),
        *idx,
        Stage("uk", lambda p: p["heads"] * 4),
        *score,
        Stage("split", lambda p: p["S"] * (p["heads"] // 8) * (p["topk"] // keys(p)),
              wait=("start", "hint") if indexer else None),
        Stage("uv", lambda p: p["S"] * 32),
        Stage("o", lambda p: 192),
        Stage("router", lambda p: p["S"] * 32),
        Stage("ug", lambda p: 256 if p["S"] == 1 else p["S"] * 256),
        Stage("down", lambda p: 6144 // (32 if p["S"] == 1 or (p["S"] > 4 and p.get("expert_mxfp4")) else 24)),
    )


_MONO_BASE = ("qkv_a", "q_norm", "cache", "q_b", "split", "uk", "uv", "o", "router", "ug", "down")


def _dsv4_stages() -> tuple:
    """``monokernel/dsv4/plan.py @ad976866``'s ``stage_tasks`` (DeepSeek-V4 Pro dims by default);
    cells never written as ``dsv4/qkv.py`` / ``attention.py @ad976866`` stamp them: the
    GEMV stages (qkv_a, qkv_c) and cmp no hint (no hint_wait), cache and q_norm no compute."""
    def g(p, k, d):
        return p.get(k, d)

    def hc_tasks(p):
        hc = g(p, "hc_mult", 1)
        return 0 if hc <= 1 else hc * g(p, "hidden", 7168) // (64 * 8 * 2)

    def groups(n):
        return 2 if n > 256 and n % 2 == 0 else 1

    def n_qkv_c(p):
        cr, ihd = g(p, "compress_ratio", 0), g(p, "index_head_dim", 0)
        return 0 if not cr else 2 * g(p, "c_coff", 1) * (g(p, "head_dim", 512) + ihd) // 16

    def uv_tile(p):
        t, n = 64, p["S"] * p["heads"] * g(p, "head_dim", 512)
        while n // t > 256 and t * 2 <= g(p, "head_dim", 512):
            t *= 2
        return t

    def router_spt(p):
        spt, n = 1, g(p, "n_experts", 384) // 8
        while p["S"] * n > 256 * spt and spt < 8:
            spt *= 2
        return spt

    def o_a_spt(p):
        n = p["S"] * g(p, "o_groups", 16) * g(p, "o_lora", 1024) // 32
        return 2 if p["S"] % 2 == 0 and n > 256 else 1

    def dn_tile(p):
        return 32 if p["S"] == 1 else max(16, -(-(g(p, "hidden", 7168) // 256) // 16) * 16)

    def n_comp(p):
        cr = g(p, "compress_ratio", 0)
        return g(p, "max_seq", 0) // cr if cr else 0

    ihd = lambda p: g(p, "index_head_dim", 0)  # noqa: E731
    n_qb = lambda p: p["heads"] * g(p, "head_dim", 512) // 16  # noqa: E731
    iq = lambda p: g(p, "index_heads", 0) * ihd(p) // 16  # noqa: E731
    hidden = lambda p: g(p, "hidden", 7168)  # noqa: E731
    keys = lambda p: g(p, "n_keys", None) or g(p, "window", 128)  # noqa: E731
    ffn_hcc = lambda p: g(p, "hc_mult", 1) > 1 and router_spt(p) > 1  # noqa: E731
    qkv_a = lambda p: (g(p, "q_lora", 1536) + g(p, "head_dim", 512)) // 16  # noqa: E731
    counts = (
        ("hcd_a", lambda p: p["S"] * hc_tasks(p)),
        ("hcc_a", lambda p: hidden(p) // 32 if g(p, "hc_mult", 1) > 1 else 0),
        ("qkv_a", lambda p: qkv_a(p) // groups(qkv_a(p))),
        ("qkv_c", lambda p: n_qkv_c(p) // groups(n_qkv_c(p))),
        ("cache", lambda p: 1),
        ("cmp", lambda p: p["S"] if g(p, "compress_ratio", 0) else 0),
        ("i_cmp", lambda p: p["S"] if ihd(p) else 0),
        ("q_b", lambda p: n_qb(p) // groups(n_qb(p))),
        ("q_norm", lambda p: p["S"] * p["heads"]),
        ("i_q_b", lambda p: iq(p) // groups(iq(p)) if ihd(p) else 0),
        ("i_q", lambda p: p["S"] * g(p, "index_heads", 0) // 8 if ihd(p) else 0),
        ("i_wp", lambda p: p["S"] * g(p, "index_heads", 0) // 8 if ihd(p) else 0),
        ("i_score", lambda p: p["S"] * (-(-n_comp(p) // 512) if ihd(p) else 0)),
        ("i_topk", lambda p: p["S"] * (min(16, max(1, n_comp(p) // 4096)) if ihd(p) else 0)),
        ("split", lambda p: p["S"] * (keys(p) // 64)),
        ("uv", lambda p: p["S"] * (p["heads"] * g(p, "head_dim", 512) // uv_tile(p))),
        ("o_a", lambda p: p["S"] * g(p, "o_groups", 16) * g(p, "o_lora", 1024) // 32 // o_a_spt(p)),
        ("o_b", lambda p: hidden(p) // 32),
        ("hcd_f", lambda p: p["S"] * hc_tasks(p)),
        ("hcc_f", lambda p: hidden(p) // 32 if ffn_hcc(p) else 0),
        ("router", lambda p: p["S"] * (g(p, "n_experts", 384) // 8) // router_spt(p)),
        ("ug", lambda p: p["S"] * g(p, "top_k", 6) * (g(p, "inter", 3072) // 8)),
        ("down", lambda p: hidden(p) // dn_tile(p)),
    )
    never = {"qkv_a": ("hint",), "qkv_c": ("hint",), "cmp": ("hint",), "cache": ("compute",), "q_norm": ("compute",)}
    return tuple(Stage(n, c, cells=(Cells(never[n]),) if n in never else ()) for n, c in counts)


_DSV4_BASE = ("hcd_a", "hcc_a", "qkv_a", "qkv_c", "cache", "cmp", "i_cmp", "split", "q_b", "q_norm", "i_q_b", "i_q",
              "i_wp", "i_score", "i_topk", "uv", "o_a", "o_b", "hcd_f", "hcc_f", "router", "ug", "down")
_SAVER_INDEXED = ("tools/benchmark.py @136bb0aa --trace: torch.save(dict(stages=..., ticks=...)) as "
                  "<trace-dir>/<moe_mode>-s<S>/rank<r>/trace.pt; the vLLM fork's random_weight_check.py "
                  "(MONO_TIMELINE=1): dict(timeline=..., stages=...) as raw_s{S}_{tag}.pt, rank 0")

PROFILES = (
    Profile("glm5-indexed", "GLM-5 layer, indexed MLA + MoE kernel (and the first build, S = 1)",
            "kernels/mla_moe_layer/indexed_mla_moe_kernel.py @0959aa87 (S = 1: shared_reuse_moe_kernel.py "
            "@1e28fd8a, the same rows, cells and marks)", _SAVER_INDEXED, _indexed_stages(), GLM5_BASE_ORDER,
            _GLM5_PARAMS, marks=_GLM5_MARKS,
            notes="at S > 1 ug writes only start and end; split stamps compute once per head group (last wins)"),
    Profile("kimi-k3-attn", "Kimi-K3 attention through the indexed kernel (KimiK3MlaLayer)",
            "kernels/mla_moe_layer/indexed_mla_moe_kernel.py @0959aa87", "no tool saves it (as benchmark.py would)",
            _indexed_stages()[:7], ("qkv_a", "cache", "q_b", "split", "uk", "uv", "o"),
            (dict(S=1, heads=12, topk=2048, qkv_a=228, qk_dim=192, v_dim=128, hidden=7168),),
            marks=(Mark(5, "split", "split"), Mark(6, "split", "split"), Mark(5, "uv", "uv")),
            notes="only S = 1 is known (733 rows); its host CudaStageProfiler uses statistics.median, "
                  "its timeline_report() torch's"),
    Profile("glm5-mono", "GLM-5 MonoKernel (Glm5MonoKernel), no indexer",
            "kernels/monokernel/glm/kernel.py @eb043133", "no FlyDSL tool saves it (the vLLM fork's does)",
            _mono_stages(False), _MONO_BASE, _GLM5_PARAMS, marks=_GLM5_MARKS[:6]),
    Profile("glm5-mono-indexer", "GLM-5 MonoKernel (Glm5MonoKernel) with the indexer",
            "kernels/monokernel/glm/kernel.py @eb043133", "no FlyDSL tool saves it (the vLLM fork's does)",
            _mono_stages(True), _MONO_BASE, tuple(dict(p, index_max_seq=4096) for p in _GLM5_PARAMS),
            marks=_GLM5_MARKS[:6],
            report_extra=(("index_score", "score-ready/sample"), ("index_select", "select-done/sample")),
            notes="index_q runs on q_b's CTAs (t < 128 inline after q_b's task t), index_score / index_select "
                  "on fixed bases 101 / 100; split's wait is start→hint (its indices_ready poll)"),
    Profile("dsv4", "DeepSeek-V4 MonoKernel", "kernels/monokernel/dsv4/plan.py @ad976866 (kernel.py's base[])",
            "no tool saves it (as benchmark.py would)", _dsv4_stages(), _DSV4_BASE,
            tuple(dict(S=s, heads=16, inter=3072 // tp) for s in (1, 2, 3, 4) for tp in (1, 2, 4, 8)),
            cols=5, free_counts=True,
            notes="TL_COLS = 5 (no marks); stages of 0 tasks hold no rows; counts hang on the layer's dims "
                  "(compressor, indexer, hyper-connections), so the 23 names decide and the counts are the file's"),
)


def profile(name: str) -> Profile:
    """The profile called ``name``; ValueError naming the known ones."""
    for p in PROFILES:
        if p.name == name:
            return p
    raise ValueError(f"no kernel profile {name!r}; known: {', '.join(p.name for p in PROFILES)}")


def stage_list(prof: Profile, params: dict) -> tuple:
    """``((name, count), ...)`` of ``prof`` at ``params``, stages of 0 tasks included
    (the kernel's own ``stages`` list)."""
    return tuple((s.name, int(s.count(params))) for s in prof.stages)


def _stage(prof: Profile | None, name: str) -> Stage | None:
    return next((s for s in prof.stages if s.name == name), None) if prof else None


def ctas(prof: Profile | None, stages, grid: int, base_order=None) -> np.ndarray:
    """The CTA of every row: ``running`` stages by the running sum of the counts in
    ``base_order`` (default the profile's; stages the profile does not know append in
    row order), ``fixed`` ones from their base, ``with`` ones on their host stage's
    task-``t`` CTA; task ``t`` on ``(base + t) % grid``."""
    names = [n for n, _ in stages]
    count = dict(stages)
    order = list(base_order if base_order is not None else (prof.base_order if prof else names))
    placed = {n: (_stage(prof, n).place if _stage(prof, n) else ("running",)) for n in names}
    if base_order is None:
        order = [n for n in order if n in count] + [n for n in names if n not in order and placed[n] == ("running",)]
    running = [n for n in names if placed[n] == ("running",)]
    if sorted(order) != sorted(running):
        raise ValueError(f"base order {order} is not an order of the stages {running}: give every stage once "
                         "(the kernel's base[] order)")
    base, acc = {}, 0
    for n in order:
        base[n] = acc
        acc += count[n]
    for n in names:
        kind = placed[n]
        if kind[0] == "fixed":
            base[n] = kind[1]
    for n in names:
        if placed[n][0] == "with":
            base[n] = base[placed[n][1]]
    return np.concatenate([(base[n] + np.arange(count[n], dtype=np.int64)) % grid for n in names]
                          or [np.zeros(0, np.int64)])


def _active(prof: Profile | None, name: str, params: dict):
    st = _stage(prof, name)
    return [c for c in (st.cells if st else ()) if c.when(params)]


def unstamped(prof: Profile | None, stages, params: dict) -> dict:
    """``{stage: phases}`` any task of the stage never writes (a spec's ``unstamped``)."""
    out = {}
    for n, c in stages:
        ph = tuple(dict.fromkeys(p for cell in _active(prof, n, params) for p in cell.phases))
        if ph and c:
            out[n] = ph
    return out


def cell_mask(prof: Profile | None, stages, params: dict, phases=LEGACY_PHASES) -> np.ndarray:
    """``(rows, phases)`` bool: True where the kernel never writes that row's phase."""
    n = sum(c for _, c in stages)
    out = np.zeros((n, len(phases)), bool)
    first = 0
    for name, c in stages:
        for cell in _active(prof, name, params):
            hi = c if cell.hi is None else min(cell.hi, c)
            for p in cell.phases:
                out[first + cell.lo: first + hi, phases.index(p)] = True
        first += c
    return out


def stage_waits(prof: Profile | None, stages) -> dict:
    """``{stage: [phase, phase] or []}`` for stages whose wait is not the profile's."""
    out = {}
    for n, c in stages:
        st = _stage(prof, n)
        if st and st.wait is not None and c:
            out[n] = list(st.wait)
    return out


def match(stages) -> list:
    """``[(profile, params)]`` whose stage list is ``stages`` (names and counts; a
    ``free_counts`` profile by its names, ``params`` None)."""
    stages = tuple((str(n), int(c)) for n, c in stages)
    names = tuple(n for n, _ in stages)
    out = []
    for prof in PROFILES:
        if tuple(s.name for s in prof.stages) != names:
            continue
        hit = next((p for p in prof.params if stage_list(prof, p) == stages), None)
        if hit is not None or prof.free_counts:
            out.append((prof, hit))
    return out


def why_not(prof: Profile, stages) -> str:
    """One phrase: why ``stages`` is not ``prof``'s."""
    names = [n for n, _ in stages]
    mine = [s.name for s in prof.stages]
    if names != mine:
        k = next((i for i, (a, b) in enumerate(zip(names, mine)) if a != b), min(len(names), len(mine)))
        got = names[k] if k < len(names) else "(end)"
        want = mine[k] if k < len(mine) else "(end)"
        return f"{prof.name}: stage {k} is {got!r}, its is {want!r}"
    p = prof.params[0]
    diff = [f"{n} {c} vs {w}" for (n, c), (_, w) in zip(stages, stage_list(prof, p)) if c != w]
    return f"{prof.name}: counts differ at every known parameter set (at {p}: {', '.join(diff[:3])})"


def model(name: str, **params) -> tuple:
    """``(stages, graph)`` of profile ``name`` at ``params`` (defaults: its first
    parameter set) for the synthetic model (``timeline.ingest.synth``): the stage list with
    0-task stages left out, and a task graph: GLM-5's declared one
    (``timeline.contract.presets.glm5``) where the stages are its, else every task waits for
    every task of the stage before (an approximation, said in ``notes``)."""
    from timeline.contract import graph as G
    from timeline.contract import presets

    prof = profile(name)
    p = dict(prof.params[0], **params)
    stages = tuple((n, c) for n, c in stage_list(prof, p) if c)
    names = [n for n, _ in stages]
    if stages == GLM5_STAGES:
        return stages, presets.glm5()
    return stages, {b: [G.every(a)] for a, b in zip(names, names[1:])}

"""Per-launch analyses over many launches of a run, as a map: in this process
(``engine="local"``, the default) or on ``dask.distributed`` (``engine="dask"``: a
LocalCluster this call starts, or the running scheduler at ``scheduler``). Each task
opens the run by path (a shared filesystem on a cluster), reads its one launch
(``Run.launch``) and returns an Arrow table; both engines run the same function, so
their results are identical (tests/test_run_dask.py)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import pyarrow as pa

from timeline.core import rows as R
from timeline.run import launchset
from timeline.run import layout as RL

ENGINES = ("local", "dask")
ANALYSES = ("critical_path", "edges", "whatif", "stages")


class EngineError(RL.RunError):
    """An engine that cannot be started or reached (a bad scheduler address, dask missing)."""


@lru_cache(maxsize=8)
def _opened(path: str, on_damage: str, stamp: int):
    from timeline.run.read import open_run

    return open_run(path, on_damage=on_damage)


def opened(path: str, on_damage: str = "raise"):
    """The run at ``path``, opened once per process while its manifest is unchanged."""
    mdir = Path(path) / RL.MANIFEST_DIR
    stamp = mdir.stat().st_mtime_ns if mdir.is_dir() else 0
    return _opened(str(path), on_damage, stamp)


def key_columns(key) -> dict:
    """A launch key ``(step, layer, capture, slot)`` as the columns every result carries:
    ``launch`` (its printed form, ``timeline.core.launchkey``), then its four fields."""
    from timeline.core import launchkey as KY

    step, layer, capture, slot = key
    def of(v, t):  # R.scalar, not pa.scalar (that imports pandas); a null stays one
        return pa.nulls(1, t)[0] if v is None else R.scalar(v, t)

    return {"launch": of(str(KY.of(step, layer, capture, slot)), pa.string()), "step": of(step, pa.int64()),
            "layer": of(layer, pa.int32()), "capture": of(capture, pa.string()), "slot": of(slot, pa.int32())}


def keyed(table: pa.Table, key) -> pa.Table:
    """``table`` (one launch's analysis) with the ``key_columns`` of ``key`` first;
    a ``launch`` column of the analysis itself (its number in the launch's Trace) gives
    way to the key's."""
    if "launch" in table.column_names:
        table = table.drop_columns(["launch"])
    n = table.num_rows
    cols = {k: pa.repeat(v, n) for k, v in key_columns(key).items()}
    for i, (k, v) in enumerate(cols.items()):
        table = table.add_column(i, k, v)
    return table


def analyze(path: str, key, analysis: str, params: dict | None = None, on_damage: str = "raise") -> pa.Table:
    """One launch of the run at ``path`` (``key``: step, layer, capture, slot):
    ``analyze_trace`` of its Trace, its rows prefixed by the launch key."""
    params = params or {}
    run = opened(path, on_damage)
    return keyed(analyze_trace(launchset.launch_of(run, key, params.get("ranks")), analysis, params), key)


def analyze_trace(trace, analysis: str, params: dict | None = None) -> pa.Table:
    """One launch's analysis (``trace`` holds that launch alone) as an Arrow table.
    ``critical_path``: ``analysis.critical.critical_path``, the exact cross-rank path
    along the task graph where the spec declares one, else each rank's heuristic path;
    ``edges``: per stage what held each wait (``edges.edges_per_stage``); ``whatif``:
    ``whatif.predict`` of ``params["changes"]`` (its per-launch table); ``stages``: the
    stage report."""
    params = params or {}
    launch = trace.launches[0] if trace.launches else 0
    if analysis == "critical_path":
        from timeline.analysis.critical import critical_path

        ranks = [None] if trace.spec.graph else trace.ranks  # exact: across ranks; heuristic: per rank
        return pa.concat_tables([critical_path(trace, rank=r, launch=launch) for r in ranks])
    if analysis == "edges":
        from timeline.analysis import edges as E

        return E.edges_per_stage(trace, E.edges(trace))
    if analysis == "whatif":
        from timeline.analysis import whatif as W

        return W.predict(trace, params["changes"]).launches
    if analysis == "stages":
        from timeline.analysis import stages as A
        from timeline.run.write import STAGE_QUANTILES

        return A.stage_report(trace, by_launch=True, quantiles=STAGE_QUANTILES)
    raise EngineError(f"unknown per-launch analysis {analysis!r}: one of {list(ANALYSES)}")


def launch_keys(launches: pa.Table) -> list:
    """The distinct launches ``(step, layer, capture, slot)`` of a launches table, in its
    order: by (step, layer) where the slot headers name them (capture and slot None),
    else by (capture, slot)."""
    out = []
    for r in launches.select(["step", "layer", "capture", "launch"]).to_pylist():
        named = r["step"] is not None and r["layer"] is not None
        out.append((r["step"], r["layer"], None, None) if named else (None, None, r["capture"], r["launch"]))
    return list(dict.fromkeys(out))


def run_map(path, keys, analysis: str, params=None, *, engine: str = "local", scheduler: str | None = None,
            workers: int | None = None, on_damage: str = "raise", progress=None) -> list:
    """``[analyze(path, key, analysis, params) for key in keys]``, on ``engine``. Dask:
    ``scheduler`` (``tcp://host:port``) uses a running cluster whose workers see ``path``;
    without it a LocalCluster of ``workers`` processes (default 2, one thread each) is
    started for this call and closed after."""
    path = str(Path(path).resolve())
    keys = list(keys)
    if engine not in ENGINES:
        raise EngineError(f"--engine {engine!r}: one of {list(ENGINES)}")
    if engine == "local":
        out = []
        for i, k in enumerate(keys):
            out.append(analyze(path, k, analysis, params, on_damage))
            if progress is not None:
                progress(i + 1, len(keys))
        return out
    with dask_client(scheduler, workers) as client:
        futures = client.map(analyze, [path] * len(keys), keys, [analysis] * len(keys), [params] * len(keys),
                             [on_damage] * len(keys), pure=False)
        return client.gather(futures)


class dask_client:
    """A ``dask.distributed.Client`` for one map: connected to ``scheduler``, or to a
    LocalCluster of ``workers`` single-threaded processes started here; closed on exit."""

    def __init__(self, scheduler: str | None, workers: int | None):
        self.scheduler, self.workers = scheduler, workers
        self.cluster = self.client = None

    def __enter__(self):
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:  # pragma: no cover - a runtime dependency
            raise EngineError("--engine dask needs dask[distributed]: pip install 'dask[distributed]'") from None
        try:
            if self.scheduler:
                self.client = Client(self.scheduler, timeout=float(os.environ.get("TIMELINE_DASK_TIMEOUT", "10")))
            else:
                self.cluster = LocalCluster(n_workers=self.workers or 2, threads_per_worker=1, processes=True,
                                            dashboard_address=None)
                self.client = Client(self.cluster)
        except (OSError, TimeoutError) as e:
            raise EngineError(f"cannot reach the Dask scheduler {self.scheduler or '(local)'}: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}; start one with "
                              "`dask scheduler` and workers with `dask worker ADDRESS`") from None
        return self.client

    def __exit__(self, *exc):
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()
        return False


__all__ = ["ANALYSES", "ENGINES", "EngineError", "analyze", "analyze_trace", "dask_client", "keyed", "launch_keys", "opened",
           "run_map"]

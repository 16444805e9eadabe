"""The export panel: the selection as a Chrome trace JSON download."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from dash import dcc

from viewer.client import RequestError
from viewer.panels.gantt import normalize

EXPORT_LIMIT = 250_000  # intervals a Chrome-trace download may hold (about 55 MB of JSON)


def export(app, name, ranks, launches, stages):
    """The selection (ranks, launches, stages) as a Chrome trace JSON download
    (``timeline.export.chrome.write_chrome``). A download goes through the page as
    base64, so a selection of more than ``EXPORT_LIMIT`` intervals is refused with the
    command that writes it to a file instead."""
    from timeline.export.chrome import write_chrome

    item = app.store.get(name)
    d = item.data
    ranks, launches, stages_t, _, _ = normalize(d, ranks, launches, stages, None, None)
    keep = np.ones(d.n, dtype=bool)
    for arr, vals in ((d.rank, ranks), (d.launch, launches), (d.stage, stages_t)):
        if vals is not None:
            keep &= np.isin(arr, vals)
    n = int(keep.sum())
    names = None if stages_t is None else [d.stage_names[s] for s in stages_t]
    if n > EXPORT_LIMIT:
        opts = "".join(f" --{k} {','.join(map(str, v))}" for k, v in
                       (("rank", ranks), ("launch", launches), ("stage", names)) if v is not None)
        raise RequestError(f"{n:,} intervals is too large a download (limit {EXPORT_LIMIT:,}); narrow the "
                         f"ranks / launches / stages, or run: timeline export {item.path} --chrome OUT.json{opts}")
    if n == 0:
        raise RequestError("nothing to export: the selection has no intervals")
    return dcc.send_bytes(lambda f: write_chrome(item.trace, f, ranks=ranks, launches=launches, stages=names),
                          f"{Path(name).stem}.chrome.json")

"""What the ``timeline`` commands print: a progress bar on stderr and aligned text
tables of Arrow tables (and their JSON rows). Plain functions of what they show;
nothing here reads a file."""

from __future__ import annotations

import math
import sys

# -- progress --------------------------------------------------------------------------
class Progress:
    """A progress bar on stderr (tqdm when installed and stderr is a terminal, else
    silent). Callable as ``progress(done, total)`` (the form the exporters call) and
    usable as ``progress.step(description)`` for a few coarse steps."""

    def __init__(self, desc: str, total=None, enabled: bool = True):
        self._bar = None
        self._stepping = False
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:  # tqdm is optional: no bar, same results
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=desc, unit="", leave=False, file=sys.stderr,
                                 disable=None, dynamic_ncols=True)

    def __call__(self, done, total=None):
        if self._bar is None:
            return
        if total is not None and self._bar.total != total:
            self._bar.total = total
        self._bar.update(done - self._bar.n)

    def update(self, n=1):
        if self._bar is not None:
            self._bar.update(n)

    def step(self, desc: str):
        """Start the next coarse step (the one before it counts as done)."""
        if self._bar is not None:
            if self._stepping:
                self._bar.update(1)
            self._stepping = True
            self._bar.set_description_str(desc)

    def close(self):
        if self._bar is not None:
            self._bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- text tables -------------------------------------------------------------------------
def _cell(v, name: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        if name == "share" or name.endswith("_share"):
            return f"{100 * v:.1f}%"
        return f"{v:.2f}"
    return str(v)


def _head(name: str):
    """(group, header) of a column: ``"start→hint p50_us"`` -> ("start→hint", "p50");
    ``"span_us"`` -> ("", "span")."""
    group, _, last = name.rpartition(" ")
    if group and last.startswith("p") and last.endswith("_us"):
        return group, last[:-3]
    return "", name[:-3] if name.endswith("_us") else name


def format_table(table, *, drop_null_columns: bool = True) -> str:
    """An Arrow table as aligned text: strings left, numbers right, nulls as ``-``,
    µs with 2 decimals (10 ns: the AMD clock's tick), shares in percent. Headers drop
    the ``_us`` unit suffix (the title says µs); percentile columns of one interval
    (``"start→hint p50_us"``, ``"start→hint p90_us"``) share a header line naming
    the interval. All-null columns are left out."""
    names = [n for n in table.column_names
             if not (drop_null_columns and table.column(n).null_count == table.num_rows
                     and table.num_rows)]
    cols = {n: table.column(n).to_pylist() for n in names}
    groups, heads = zip(*(_head(n) for n in names)) if names else ((), ())
    text = [[_cell(v, n) for v in cols[n]] for n in names]
    widths = [max([len(h)] + [len(c) for c in col]) for h, col in zip(heads, text)]
    # widen the last column of a group until the group's label fits above it
    i = 0
    while i < len(names):
        j = i
        while j + 1 < len(names) and groups[j + 1] == groups[i]:
            j += 1
        if groups[i]:
            span = sum(widths[i:j + 1]) + 2 * (j - i)
            widths[j] += max(0, len(groups[i]) - span)
        i = j + 1
    left = [isinstance(next((v for v in cols[n] if v is not None), ""), str) for n in names]

    def line(cells):
        return "  ".join(c.ljust(w) if lf else c.rjust(w) for c, w, lf in zip(cells, widths, left)).rstrip()

    out = []
    if any(groups):
        top, i = [], 0
        while i < len(names):
            j = i
            while j + 1 < len(names) and groups[j + 1] == groups[i]:
                j += 1
            span = sum(widths[i:j + 1]) + 2 * (j - i)
            top.append(groups[i].center(span) if groups[i] else " " * span)
            i = j + 1
        out.append("  ".join(top).rstrip())
    out.append(line(heads))
    out += [line([t[i] for t in text]) for i in range(table.num_rows)]
    return "\n".join(out)


def json_rows(table) -> list:
    """Table rows as dicts, NaN as null (JSON has no NaN)."""
    rows = table.to_pylist()
    for r in rows:
        for k, v in r.items():
            if isinstance(v, float) and math.isnan(v):
                r[k] = None
    return rows

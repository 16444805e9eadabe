"""ISA cost of a timeline stamp in a FlyDSL kernel, side by side with FlyDSL's KTRACE.

Compiles the probe kernels of ``instrument.demo.probes`` (a persistent task loop:
load, multiply-add, store per thread; 1 stage, 5 phases) and the demo mono kernel
for gfx942 and gfx950 without a GPU (``tools.isa``), then prints the final
ISA's instruction count and register use (``.amdhsa_next_free_sgpr/vgpr``) of each
build (stores and branches counted against its normal build), and what one stamp costs:

- a further stamp: ``(all 5 phases - start+end) / 3`` extra instructions;
- the placement: ``start+end - hint+end`` (a first-phase stamp minus a plain one);
- KTRACE per event: one ``ktrace`` range per phase interval, ``(4 ranges - 1
  range) / 6`` extra instructions per push or pop.

The GLM-5-shaped kernel (``instrument.demo.flydsl_glm5``, 56 stamp sites) is compiled
with our stamps and with the kernel's own ``if tid == lead:`` stamp (with and
without its ``stamp_fence``), the same sites.

These are static counts (instructions in the ISA). Goal of issue 3: <= 6
instructions per stamp, >= 8x fewer than KTRACE per event; the verdict line says
which holds. Usage: ``python bench/isa_cost.py [--arch gfx942 gfx950]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import isa as I  # noqa: E402

PROBES = "instrument.demo.probes"
DEMO = "instrument.demo.flydsl_mono"
GLM5 = "instrument.demo.flydsl_glm5"


def jobs():
    """The builds compared: ``name -> Job``."""
    from instrument.demo import probes as P

    def sites(name, mode, mask, pred=False, ktrace=False):
        return I.Job(name, PROBES, "launch_sites", (0, 0, P.TASKS, mode, mask, pred), ktrace)

    demo = (0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 64)
    js = [
        sites("normal", P.NORMAL, P.ALL),
        sites("timeline start+end", P.TIMELINE, P.START_END),
        sites("timeline hint+end", P.TIMELINE, P.HINT_END),
        sites("timeline 5 phases", P.TIMELINE, P.ALL),
        sites("timeline 5 phases, pred", P.TIMELINE, P.ALL, pred=True),
        I.Job("per-wave normal", PROBES, "launch_waves", (0, 0, P.TASKS, P.NORMAL)),
        I.Job("per-wave 5 phases", PROBES, "launch_waves", (0, 0, P.TASKS, P.TIMELINE)),
        sites("ktrace start+end", P.KTRACE, P.START_END, ktrace=True),
        sites("ktrace 5 phases", P.KTRACE, P.ALL, ktrace=True),
        I.Job("demo normal", DEMO, "launch", demo + (False,)),
        I.Job("demo timeline", DEMO, "launch", demo + (True,)),
    ]
    from instrument.demo import flydsl_glm5 as G5

    glm5 = (0, 0, 0, 0, 0, 0, G5.GLM5_GRID)
    js += [I.Job(name, GLM5, "launch", glm5 + (mode,)) for name, mode in (
        ("glm5 normal", G5.NORMAL), ("glm5 timeline", G5.TIMELINE), ("glm5 kernel's stamps", G5.KERNEL),
        ("glm5 kernel's stamps + fence", G5.KERNEL_FENCED))]
    return {j.name: j for j in js}


def derive(isa: dict) -> dict:
    """Per-stamp costs from the parsed builds of one target (see the module doc)."""
    n = {k: len(v.instructions) for k, v in isa.items()}
    further = (n["timeline 5 phases"] - n["timeline start+end"]) / 3
    placement = n["timeline start+end"] - n["timeline hint+end"]
    setup = n["timeline hint+end"] - n["normal"] - 2 * further
    k_event = (n["ktrace 5 phases"] - n["ktrace start+end"]) / 6
    return {
        "further stamp": further,
        "placement (first stamp - plain stamp)": placement,
        "first stamp of a task": further + placement,
        "setup + record offset (once)": setup,
        "mean over 5 stamps incl. setup": (n["timeline 5 phases"] - n["normal"]) / 5,
        "per-wave mean over 5 stamps incl. setup": (n["per-wave 5 phases"] - n["per-wave normal"]) / 5,
        "ktrace per event (push or pop)": k_event,
        "ktrace one range (2 events) incl. setup": n["ktrace start+end"] - n["normal"],
        "timeline start+end incl. setup": n["timeline start+end"] - n["normal"],
        "ktrace 4 ranges (8 events)": n["ktrace 5 phases"] - n["normal"],
        "timeline 5 stamps": n["timeline 5 phases"] - n["normal"],
        "demo stamp sites": isa["demo timeline"].count("s_memrealtime"),
        "demo per stamp site incl. setup": (n["demo timeline"] - n["demo normal"])
        / max(isa["demo timeline"].count("s_memrealtime"), 1),
        "glm5 stamp sites": isa["glm5 timeline"].count("s_memrealtime"),
        "glm5 timeline per site incl. setup": (n["glm5 timeline"] - n["glm5 normal"])
        / max(isa["glm5 timeline"].count("s_memrealtime"), 1),
        "glm5 kernel's stamp per site": (n["glm5 kernel's stamps"] - n["glm5 normal"])
        / max(isa["glm5 kernel's stamps"].count("s_memrealtime"), 1),
    }


def table(arch: str, isa: dict) -> str:
    """The builds of one target, each against its normal build."""
    base = {"per-wave": "per-wave normal", "demo": "demo normal", "glm5": "glm5 normal"}  # else "normal"
    rows = [f"{'build (' + arch + ')':<32} {'instrs':>7} {'+instr':>7} {'SGPRs':>6} {'+SGPR':>6} "
            f"{'VGPRs':>6} {'+VGPR':>6} {'memrt':>6} {'+stores':>7} {'+branch':>7}"]
    for name, x in isa.items():
        ref = isa[next((v for k, v in base.items() if name.startswith(k)), "normal")]
        d = len(x.instructions) - len(ref.instructions)
        stores = sum(x.count(k) - ref.count(k) for k in ("buffer_store*", "s_buffer_store*", "global_store*"))
        branches = x.count("s_cbranch*") - ref.count("s_cbranch*")  # divergent: s_cbranch_execz after a saveexec
        rows.append(f"{name:<32} {len(x.instructions):>7} {d:>+7} {x.sgprs:>6} {x.sgprs - ref.sgprs:>+6} "
                    f"{x.vgprs:>6} {x.vgprs - ref.vgprs:>+6} {x.count('s_memrealtime'):>6} {stores:>+7} "
                    f"{branches:>+7}")
    return "\n".join(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", nargs="+", default=list(I.ARCHES))
    ap.add_argument("--workdir", help="keep the compiled ISA here (default: a temporary directory)")
    args = ap.parse_args(argv)
    try:
        I.check_toolchain()
    except I.ToolchainMissing as e:
        print(f"cannot compile FlyDSL kernels here: {e}", file=sys.stderr)
        return 2
    js = jobs()
    with tempfile.TemporaryDirectory(prefix="isa_cost_") as tmp:
        texts = I.compile_all(list(js.values()), args.arch, Path(args.workdir or tmp))
    verdicts = []
    for arch in args.arch:
        isa = {name: I.parse_isa(texts[(arch, name)]) for name in js}
        d = derive(isa)
        print(table(arch, isa))
        print()
        print(f"per stamp ({arch}), instructions:")
        for k, v in d.items():
            print(f"  {k:<44} {v:>7.1f}")
        ratio = d["ktrace per event (push or pop)"] / d["further stamp"]
        ratio_range = d["ktrace one range (2 events) incl. setup"] / d["timeline start+end incl. setup"]
        ratio_task = d["ktrace 4 ranges (8 events)"] / d["timeline 5 stamps"]
        print(f"  {'KTRACE / timeline, further event':<44} {ratio:>6.1f}x")
        print(f"  {'KTRACE / timeline, one range vs start+end':<44} {ratio_range:>6.1f}x")
        print(f"  {'KTRACE / timeline, a 5-phase task':<44} {ratio_task:>6.1f}x")
        print()
        verdicts.append(
            f"{arch}: further stamp {d['further stamp']:.0f} instructions (goal <= 6: "
            f"{'met' if d['further stamp'] <= 6 else 'NOT met'}), first stamp {d['first stamp of a task']:.0f}; "
            f"KTRACE {ratio:.1f}x per further event, {ratio_range:.1f}x for one range, "
            f"{ratio_task:.1f}x per task (goal >= 8x: {'met' if min(ratio, ratio_task) >= 8 else 'NOT met'})")
    print("\n".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())

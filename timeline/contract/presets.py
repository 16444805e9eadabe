"""Task graphs of the kernels this project knows, to attach to a trace whose spec
declares none (``timeline set-graph TRACE --preset NAME``): the Triton FFN demo
(``instrument.demo.triton_mono``, exact) and the GLM-5 MLA+MoE layer kernel at S=1
(``GLM5_NOTES`` says where its rules approximate the kernel's mailbox polls)."""

from __future__ import annotations

from timeline.contract import graph as G


def triton_ffn(*, up_n: int = 32, norm_per_bm: int = 4, dn_n: int = 8) -> dict:
    """The Triton FFN demo: ``norm`` task t reads the ``up_n`` up tiles of its row
    block ``t // norm_per_bm`` (``up_n = F / BN``, ``norm_per_bm = BM / R``); ``down``
    task t the ``norm_per_bm`` norm tasks of its row block ``t // dn_n`` (``dn_n = D /
    BN``). Defaults: the bundled H200 traces' shape (M 2048, D 1024, F 4096, BM = BN =
    128, R 32)."""
    return {"norm": [G.tiles("up", up_n, div=norm_per_bm, mul=up_n)],
            "down": [G.tiles("norm", norm_per_bm, div=dn_n, mul=norm_per_bm)]}


GLM5_NOTES = ("cache waits for the 36 qkv_a tiles of kv_a; q_b for the 128 of q_a; uk for the 12 q_nope tiles "
              "of its head; split for every uk task and the cache task (approximated: it also reads q_pe from "
              "q_b, reached through uk); uv for every split; o for every uv; the attention and MoE TP8 peer "
              "reduces happen inside o and down, so router and ug wait for o on every rank (all-reduce), ug and "
              "down also for every router task (route_top8), down for every ug task")


def glm5() -> dict:
    """The GLM-5 layer kernel at S=1, 8 heads, topk 2048 (stage names of
    ``timeline.ingest.legacy.GLM5_STAGES``); ``GLM5_NOTES`` names the approximations."""
    return {
        "cache": [G.tiles("qkv_a", 36, mul=0, offset=128)],
        "q_b": [G.tiles("qkv_a", 128, mul=0)],
        "uk": [G.tiles("q_b", 12, div=4, mul=16)],
        "split": [G.every("uk"), G.every("cache")],
        "uv": [G.every("split")],
        "o": [G.every("uv")],
        "router": [G.allreduce("o")],
        "ug": [G.allreduce("o"), G.every("router")],
        "down": [G.every("ug"), G.every("router")],
    }


PRESETS = {"triton-ffn": triton_ffn, "glm5": glm5}

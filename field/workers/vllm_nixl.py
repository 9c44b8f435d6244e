"""vLLM 0.33.0's NixlConnector workers moving KV between two TPs on CPU, end to end.

usage: python field/workers/vllm_nixl.py [--json PATH] [--case NAME ...] [--timeout S]

Each case starts a prefill instance (TP P) and a decode instance (TP D) as one process
per rank (field/workers/vllm_nixl_rank.py: vLLM's own worker, model runner, caches,
NIXL registration, handshake listener, scheduler connector and engine steps), and runs
what serving runs for a few requests: the proxy sends each to prefill with
``do_remote_decode``, prefill's scheduler connector returns its ``kv_transfer_params``
when the request finishes, the proxy hands them to decode, and decode's workers
handshake with prefill's side channel and READ the blocks over NIXL (UCX on loopback,
DRAM). The prefill caches hold the coordinate-hash oracle's values (kvspec/tensors/
oracle.py) in vLLM's own layer views; afterwards every element of each decode rank's
cache is checked: each request's tokens against the oracle, the slots past its last
token, and every block no request holds (still zero). Each READ's descriptor list is
judged against kvspec's DESC-1..3 for the same edge (field/workers/descs.py).

The harness is the proxy and the engines' step loops; it imports no vLLM itself. It
binds nothing: prefill's rank 0 gives vLLM's side channel a port the OS just handed out,
torch's process groups rendezvous through a file, and every socket is on loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from descs import (  # noqa: E402
    Regions,
    judge_edge,
    missing_edges,
    posted_read,
    registered_cache,
    transfer_plan,
)

from kvspec.topology.model import ModelShape  # noqa: E402

RELEASE = "vllm 0.33.0"
KVSPEC_LAYOUT = "vllm_packed_hnd"
"""kvspec's preset for the per-layer cache vLLM 0.33.0 allocates under LBHNC:
``[num_blocks, heads, block_size, 2 * head_size]`` (vllm/v1/kv_cache_interface.py
``create_kv_cache_views``). The harness checks vLLM's views have that shape and
contiguous strides before it relies on it."""


@dataclass(frozen=True)
class Case:
    """One deployment: prefill TP, decode TP and the model's KV heads."""

    name: str
    prefill_tp: int
    decode_tp: int
    kv_heads: int
    attention_heads: int = 8
    layers: int = 2
    head_dim: int = 64
    block_size: int = 32
    seq_lens: tuple[int, ...] = (96, 77)
    expect: str = "moved"
    """``moved`` (every request read and verified) or ``refused`` (vLLM refuses the
    pairing: every request fails, nothing is written)."""
    why: str = ""

    @property
    def model(self) -> ModelShape:
        return ModelShape(self.layers, self.kv_heads, self.head_dim, dtype="bfloat16")


CASES = (
    Case(
        "tp4-to-tp2",
        4,
        2,
        4,
        why="prefill TP above decode TP: each decode rank reads two prefill ranks' blocks "
        "into halves of its own (split local descriptors)",
    ),
    Case(
        "tp2-to-tp4-heads2",
        2,
        4,
        2,
        why="decode TP above the KV heads (2): decode ranks hold replicated heads, and each "
        "reads a whole block of one prefill rank",
    ),
    Case(
        "tp4-to-tp2-heads2",
        4,
        2,
        2,
        expect="refused",
        why="prefill TP above both the decode TP and the KV heads (2): vLLM 0.33.0 refuses "
        "it in the decode worker's handshake (base_worker.py _validate_remote_agent_handshake: "
        "assert not (tp_ratio < 0 and is_kv_replicated)); both instances start",
    ),
)


class RankProcess:
    """One rank's process and its control pipe."""

    def __init__(self, job: dict[str, Any], python: str, log: Path) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        self.name = f"{job['side']}[{job['rank']}]"
        self.log = log
        self.process = subprocess.Popen(
            [
                python,
                str(HERE / "vllm_nixl_rank.py"),
                json.dumps(job),
                str(to_child_r),
                str(from_child_w),
            ],
            pass_fds=(to_child_r, from_child_w),
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            cwd=str(ROOT),
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.writer = os.fdopen(to_child_w, "w", buffering=1)
        self.reader_fd = from_child_r
        self.buffer = b""

    def send(self, cmd: str, **args: Any) -> None:
        self.writer.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.writer.flush()

    def receive(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name} sent nothing in time (log: {self.log})")
            ready, _, _ = select.select([self.reader_fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.reader_fd, 1 << 20)
                if not chunk:
                    raise RuntimeError(
                        f"{self.name} exited ({self.process.poll()}) without a reply "
                        f"(log: {self.log})"
                    )
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        message = dict(json.loads(line))
        if message.get("event") == "error":
            raise RuntimeError(f"{self.name}: {message['error']}\n{message['traceback']}")
        return message["result"]

    def call(self, cmd: str, deadline: float, **args: Any) -> dict[str, Any]:
        self.send(cmd, **args)
        return self.receive(deadline)

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.send("exit")
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.writer.close()
        os.close(self.reader_fd)


@dataclass
class Instance:
    """The ranks of one vLLM instance."""

    side: str
    ranks: list[RankProcess] = field(default_factory=list)
    ready: list[dict[str, Any]] = field(default_factory=list)

    def step_all(self, meta: str, deadline: float) -> list[dict[str, Any]]:
        for rank in self.ranks:
            rank.send("step", meta=meta)
        return [rank.receive(deadline) for rank in self.ranks]


def requests_for(case: Case, num_blocks: int) -> list[dict[str, Any]]:
    """The requests and the block ids each instance's pool hands them, never block 0
    (vLLM's null block): the first request gets the first blocks of a fresh pool
    (``FreeKVCacheBlockQueue`` hands them out in order: consecutive ids), every later one
    distinct ids drawn at random, as a pool fragmented by earlier requests gives them."""
    import random

    rng = random.Random(f"kvspec-field-workers/{case.name}")
    out = []
    for side in ("prefill", "decode"):
        free = list(range(1, num_blocks))
        for i, seq_len in enumerate(case.seq_lens):
            need = -(-seq_len // case.block_size)
            ids = free[:need] if i == 0 else rng.sample(free, need)
            free = [b for b in free if b not in ids]
            if side == "prefill":
                out.append(
                    {
                        "id": f"{case.name}-req{i}",
                        "seq_len": seq_len,
                        "pool": "fresh" if i == 0 else "fragmented",
                    }
                )
            out[i][f"{side}_blocks"] = ids
    return out


def run_case(
    case: Case, python: str, workdir: Path, timeout: float, log_dir: Path | None = None
) -> dict[str, Any]:
    started = time.monotonic()
    deadline = started + timeout
    model_dir = workdir / case.name / "model"
    logs = (log_dir or workdir) / case.name
    logs.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE))
    from vllm_nixl_rank import write_model_dir  # no vLLM import at module level

    model = {
        "layers": case.layers,
        "kv_heads": case.kv_heads,
        "attention_heads": case.attention_heads,
        "head_dim": case.head_dim,
        "dtype": "bfloat16",
    }
    write_model_dir(str(model_dir), model)
    # Enough blocks for the requests and some to spare: the pools are shuffled.
    blocks = 4 * sum(-(-n // case.block_size) for n in case.seq_lens) + 1
    page = 2 * case.block_size * case.head_dim * 2  # K and V, bfloat16, one head
    requests = requests_for(case, blocks)
    instances = {"prefill": Instance("prefill"), "decode": Instance("decode")}
    try:
        for side, tp in (("prefill", case.prefill_tp), ("decode", case.decode_tp)):
            heads_per_rank = max(1, case.kv_heads // tp)
            for rank in range(tp):
                job = {
                    "side": side,
                    "rank": rank,
                    "tp": tp,
                    "model_dir": str(model_dir),
                    "model": model,
                    "block_size": case.block_size,
                    "kv_cache_bytes": blocks * page * heads_per_rank * case.layers,
                    "max_model_len": 256,
                    "engine_id": f"{side}-{case.name}",
                    "dist_init": f"file://{workdir / case.name / (side + '.dist')}",
                    "requests": requests,
                    "seed": 0,
                    "kvspec_layout": KVSPEC_LAYOUT,
                }
                instances[side].ranks.append(RankProcess(job, python, logs / f"{side}-{rank}.log"))
        for instance in instances.values():
            instance.ready = [r.receive(deadline) for r in instance.ranks]
        prefill, decode = instances["prefill"], instances["decode"]
        p0, d0 = prefill.ranks[0], decode.ranks[0]

        layout_problems = check_views(case, prefill.ready + decode.ready)
        # Prefill's engine core publishes every rank's handshake payload.
        served = p0.call(
            "serve",
            deadline,
            payloads={str(i): r["handshake"] for i, r in enumerate(prefill.ready)},
        )
        # The proxy: a request to prefill with do_remote_decode ...
        p0.call(
            "admit",
            deadline,
            params={
                r["id"]: {"do_remote_decode": True, "do_remote_prefill": False} for r in requests
            },
        )
        prefill.step_all(p0.call("build_meta", deadline)["meta"], deadline)
        finished = p0.call("finish", deadline)
        prefill.step_all(p0.call("build_meta", deadline)["meta"], deadline)
        # ... its kv_transfer_params (JSON, as the proxy forwards them) to decode.
        params = {rid: json.loads(json.dumps(f["params"])) for rid, f in finished.items()}
        admitted = d0.call("admit", deadline, params=params)
        recving: dict[str, set[int]] = {r["id"]: set() for r in requests}
        failing: dict[str, set[int]] = {r["id"]: set() for r in requests}
        sending: dict[str, set[int]] = {r["id"]: set() for r in requests}
        steps = 0
        # The engines step until every decode rank has reported every request (received
        # or failed) and, when none failed, every prefill rank has seen its blocks read.
        while time.monotonic() < deadline:
            steps += 1
            for i, out in enumerate(
                decode.step_all(d0.call("build_meta", deadline)["meta"], deadline)
            ):
                for rid in out["finished_recving"]:
                    recving[rid].add(i)
                for rid in out["failed_recving"]:
                    failing[rid].add(i)
            for i, out in enumerate(
                prefill.step_all(p0.call("build_meta", deadline)["meta"], deadline)
            ):
                for rid in out["finished_sending"]:
                    sending[rid].add(i)
            reported = all(len(recving[rid] | failing[rid]) == case.decode_tp for rid in recving)
            failed = any(failing.values())
            sent = all(len(v) == case.prefill_tp for v in sending.values())
            if reported and (failed or sent):
                break
            time.sleep(0.05)
        failed_ids = sorted(rid for rid, ranks in failing.items() if ranks)
        verdicts = [r.call("verify", deadline) for r in decode.ranks]
        result = judge(case, requests, prefill.ready, decode.ready, verdicts)
        result.update(
            {
                "side_channel": {"host": served["host"], "port_from": "the OS"},
                "matched_tokens": {rid: a["matched"] for rid, a in admitted.items()},
                "kv_transfer_params": {
                    rid: {k: v for k, v in p.items() if k in ("tp_size", "remote_num_tokens")}
                    for rid, p in params.items()
                },
                "finished_recving": {rid: sorted(v) for rid, v in recving.items()},
                "finished_sending": {rid: sorted(v) for rid, v in sending.items()},
                "failed_recving": failed_ids,
                "steps": steps,
                "layout_problems": layout_problems,
                "seconds": round(time.monotonic() - started, 1),
                "start_seconds": max(r["start_s"] for r in prefill.ready + decode.ready),
            }
        )
        result["transferred"] = (
            not failed_ids
            and all(len(v) == case.decode_tp for v in recving.values())
            and all(len(v) == case.prefill_tp for v in sending.values())
        )
        result["outcome"] = outcome(result, {r["id"] for r in requests})
        result["expected"] = case.expect
        result["connector_errors"] = sorted({e for v in verdicts for e in v["connector_errors"]})
        return result
    finally:
        for instance in instances.values():
            for process in instance.ranks:
                process.stop()


def outcome(result: dict[str, Any], request_ids: set[str]) -> str:
    """``moved``: every request read by every decode rank, every prefill rank saw its
    blocks read, and every element verified; ``refused``: every request failed and no
    byte of any decode cache was written; ``wrong``: anything else."""
    if result["transferred"] and result["verified"]:
        return "moved"
    untouched = all(r["untouched"] for r in result["requests"])
    if (
        set(result["failed_recving"]) == request_ids
        and untouched
        and not result["stray_nonzero_elements"]
    ):
        return "refused"
    return "wrong"


def check_views(case: Case, ready: list[dict[str, Any]]) -> list[str]:
    """vLLM's layer views are kvspec's vllm_packed_hnd: [blocks, heads, block_size,
    2 * head_size], dense, one region per layer."""
    problems = []
    for info in ready:
        _, heads, slots, width = info["shape"]
        dense = [heads * slots * width, slots * width, width, 1]
        if info["layout"] != "LBHNC" or slots != case.block_size or width != 2 * case.head_dim:
            problems.append(f"layout {info['layout']} shape {info['shape']}")
        if info["strides"] != dense:
            problems.append(f"strides {info['strides']} are not dense {dense}")
        if info["registered_addresses"] != info["layer_addresses"]:
            problems.append("the registered regions are not the attention layers' views")
    return problems


def judge(
    case: Case,
    requests: list[dict[str, Any]],
    prefill: list[dict[str, Any]],
    decode: list[dict[str, Any]],
    verdicts: list[dict[str, Any]],
) -> dict[str, Any]:
    """The decode caches' verdicts and every READ against DESC-1..3."""
    model = case.model
    plan = transfer_plan(case.prefill_tp, case.decode_tp, model)
    by_id = {r["id"]: r for r in requests}
    elements = mismatches = verified_bytes = 0
    request_rows = []
    for rank, verdict in enumerate(verdicts):
        for row in verdict["requests"]:
            elements += row["elements"]
            mismatches += row["mismatches"]
            verified_bytes += row["bytes"]
            request_rows.append({"decode_rank": rank, **row})
    reads = []
    posted_edges: set[tuple[int, int]] = set()
    for dst, verdict in enumerate(verdicts):
        target_regions = Regions(
            tuple(decode[dst]["layer_addresses"]), tuple(decode[dst]["layer_bytes"])
        )
        for read in verdict["reads"]:
            remote_request = read["notif"].rsplit(":", 1)[0]
            request = by_id[remote_request]
            src = next(
                (
                    i
                    for i, info in enumerate(prefill)
                    if _rows_inside(verdict["dlists"][str(read["remote"])]["rows"], info)
                ),
                None,
            )
            if src is None:
                reads.append(
                    {"edge": [None, dst], "problems": ["remote list is no prefill rank's"]}
                )
                continue
            source_regions = Regions(
                tuple(prefill[src]["layer_addresses"]), tuple(prefill[src]["layer_bytes"])
            )
            posted = posted_read(read, verdict["dlists"], source_regions, target_regions)
            posted_edges.add((src, dst))
            source = registered_cache(
                KVSPEC_LAYOUT,
                model,
                num_blocks=prefill[src]["num_blocks"],
                block_size=case.block_size,
                heads=len(prefill[src]["heads"]),
            )
            target = registered_cache(
                KVSPEC_LAYOUT,
                model,
                num_blocks=decode[dst]["num_blocks"],
                block_size=case.block_size,
                heads=len(decode[dst]["heads"]),
            )
            row = judge_edge(
                plan,
                src,
                dst,
                posted.descriptors,
                source,
                request["prefill_blocks"],
                target,
                request["decode_blocks"],
                request["seq_len"],
            )
            row["request"] = request["id"]
            row["seq_len"] = request["seq_len"]
            row["pool"] = request["pool"]
            row["problems"] = list(posted.problems) + row["problems"]
            reads.append(row)
    stray = sum(v["stray_nonzero_elements"] for v in verdicts)
    judged = [r for r in reads if "verdict" in r]
    return {
        "case": case.name,
        "why": case.why,
        "prefill_tp": case.prefill_tp,
        "decode_tp": case.decode_tp,
        "kv_heads": case.kv_heads,
        "layers": case.layers,
        "head_dim": case.head_dim,
        "block_size": case.block_size,
        "dtype": "bfloat16",
        "backend": decode[0]["backend"],
        "layout": decode[0]["layout"],
        "heads": {
            "prefill": [info["heads"] for info in prefill],
            "decode": [info["heads"] for info in decode],
        },
        "requests": request_rows,
        "elements_verified": elements,
        "elements_wrong": mismatches,
        "bytes_verified": verified_bytes,
        "stray_nonzero_elements": stray,
        "reads": reads,
        "plan_edges_not_read": missing_edges(plan, posted_edges),
        "reads_by_verdict": {
            v: sum(r.get("verdict") == v for r in reads) for v in ("exact", "whole blocks", "wrong")
        },
        "descriptors_posted": sum(r["count"] for r in judged),
        "descriptors_minimum": sum(r.get("minimum", 0) for r in judged),
        # Every element of the decode caches accounted for: the requests' tokens equal the
        # oracle, the slots past a last token hold zeros or the prefill's same slots, and
        # no other block was written.
        "verified": mismatches == 0
        and stray == 0
        and bool(request_rows)
        and all(r["tail"] != "other bytes" for r in request_rows),
    }


def _rows_inside(rows: list[list[int]], info: dict[str, Any]) -> bool:
    regions = Regions(tuple(info["layer_addresses"]), tuple(info["layer_bytes"]))
    return bool(rows) and regions.locate(int(rows[0][0]), int(rows[0][1])) is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--case", action="append", choices=[c.name for c in CASES])
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per case")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--logs", help="keep each rank's log here (default: discarded)")
    args = parser.parse_args(argv)
    chosen = [c for c in CASES if not args.case or c.name in args.case]
    results = []
    with tempfile.TemporaryDirectory(prefix="kvspec-workers-") as tmp:
        for case in chosen:
            try:
                logs = Path(args.logs) if args.logs else None
                results.append(run_case(case, args.python, Path(tmp), args.timeout, logs))
            except Exception as error:  # a case that cannot run is a result too
                results.append(
                    {
                        "case": case.name,
                        "error": f"{type(error).__name__}: {error}",
                        "where": traceback.format_exc(limit=-3),
                    }
                )
            print(json.dumps(results[-1], indent=1)[:4000], file=sys.stderr)
    report = {"engine": "vllm-nixl", "release": RELEASE, "cases": results}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    ok = all(r.get("outcome") == r.get("expected") for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

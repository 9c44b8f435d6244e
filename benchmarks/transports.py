"""The sim's two data paths on the same bytes: tensor frames over torch.distributed
(``--transport gloo``) against the same runs over ZMQ (``--transport tcp``).

Each pair of runs moves the same requests with the same plan; only the path of the
tensor frames differs (headers stay on ZMQ either way, :mod:`sim.net.p2p`). The runs
alternate, who goes first alternating too, ``REPEAT`` of each (three at most: a full
run moves 256 MiB, a quick one 16 MiB); the figure is the gloo runs' useful throughput
(first shard sent to last received, verification after transfer, no checksums), the
baseline the ZMQ runs' in the same session, the ratio ZMQ median time / gloo median time.
"""

from __future__ import annotations

from dataclasses import replace

from benchmarks import figure
from benchmarks.figure import Figure
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.harness.cluster import run_simulation
from sim.run.config import SimConfig

PAIRS: tuple[tuple[int, int], ...] = ((1, 1), (4, 2))


def _config(source: int, target: int, quick: bool) -> SimConfig:
    seq_len = 64 if quick else 1024
    return SimConfig(
        stages=(StageLayout(source), StageLayout(target)),
        model=ModelShape(num_layers=8, num_kv_heads=8, head_dim=128),
        requests=8,
        seq_len=(seq_len, seq_len),
        verify_after=True,
        checksum=False,
        ports="os",
        timeout=600,
    )


def run(quick: bool) -> list[Figure]:
    figures = []
    for source, target in PAIRS:
        config = _config(source, target, quick)
        seconds: dict[str, list[float]] = {"tcp": [], "gloo": []}
        moved = 0
        for i in range(min(figure.REPEAT, 3)):
            for transport in ("tcp", "gloo") if i % 2 == 0 else ("gloo", "tcp"):
                report = run_simulation(replace(config, transport=transport))
                assert report.ok, report.render()
                assert not moved or report.bytes_moved == moved, "the two paths moved other bytes"
                moved = report.bytes_moved
                seconds[transport].append(report.transfer_s)
        gloo, zmq = figure.Spread.of(seconds["gloo"]), figure.Spread.of(seconds["tcp"])
        figures.append(
            Figure(
                name=f"sim TP{source}->TP{target} over gloo ({moved >> 20} MiB)",
                unit="GB/s",
                value=moved / gloo.median / 1e9,
                baseline=moved / zmq.median / 1e9,
                baseline_name="the same runs over ZMQ",
                ratio=zmq.median / gloo.median,
                note="tensor frames by torch.distributed send/recv, headers on ZMQ; "
                "no checksums, verification after transfer",
                value_range=(moved / gloo.high / 1e9, moved / gloo.low / 1e9),
                repeats=len(seconds["gloo"]),
            )
        )
    return figures

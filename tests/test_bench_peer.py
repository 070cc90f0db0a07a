"""The measuring helpers of tests/bench/bench_peer.py (issue #17): the figures it prints are only
as honest as these."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench import bench_peer
from tests.bench.bench_peer import ALICE, Row, crossing, flatness, summary_table


def test_crossing_interpolates_between_the_samples_around_it() -> None:
    samples = [(1.0, 100, 0.5), (2.0, 300, 1.5), (4.0, 400, 2.0)]
    assert crossing(samples, 50) == pytest.approx((0.5, 0.25))  # from (0 s, 0 messages, 0 s)
    assert crossing(samples, 200) == pytest.approx((1.5, 1.0))
    assert crossing(samples, 400) == pytest.approx((4.0, 2.0))
    assert crossing(samples, 401) is None


def test_flatness_compares_windows_of_the_same_size() -> None:
    # 1,000 messages/s for the first 5,000, then 500/s; the CPU per message doubles too.
    samples = [(t / 10, 100 * t, t / 20) for t in range(1, 51)]
    samples += [(5 + t / 10, 5000 + 50 * t, 2.5 + t / 20) for t in range(1, 101)]
    flat = flatness(samples, 10_000)
    assert flat is not None
    assert flat.window == 1_000
    assert flat.early == (500, 1_500) and flat.late == (9_000, 10_000)
    assert flat.early_rate == pytest.approx(1_000)
    assert flat.late_rate == pytest.approx(500)
    assert flat.ratio == pytest.approx(0.5)
    assert flat.early_cpu_rate == pytest.approx(2_000) and flat.cpu_ratio == pytest.approx(0.5)
    assert flat.tenths == pytest.approx([1_000] * 5 + [500] * 5)
    assert flatness(samples[:10], 10_000) is None  # the pull never got there


def test_summary_marks_figures_taken_below_the_issues_size() -> None:
    table = summary_table([Row("pull", "0.6 V", ">= 0.5 V", True), Row("flat", "0.8", ">= 0.9", False, False),
                           Row("reference", "0.01 V", "—", None)])
    lines = table.splitlines()
    assert lines[2].endswith("met") and lines[3].endswith("NOT met *") and lines[4].endswith("—")


def test_first_messages_go_through_the_engines_pipe(tmp_path: Path) -> None:
    store = tmp_path / "small.db"
    bench_peer.build(store, 5, 64)
    messages = bench_peer.first_messages(store, ALICE.did, 3)
    assert len(messages) == 3
    assert all(data is not None and len(data) == 64 for _, data in messages)
    run = bench_peer.run_pipe(bench_peer.engine_command(), bench_peer.ROOT, ALICE.did, messages)
    assert run.codes == [202, 202, 202]
    assert len(run.reply_times) == 3 and run.rate() > 0

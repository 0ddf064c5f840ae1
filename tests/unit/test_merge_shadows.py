"""Workers' shadow records merged as one server's (workbench.observability.whole_server.merge_shadows): each worker
mirrors the requests it answered, so the server's record is theirs together."""

from __future__ import annotations

import pytest

from workbench.observability.whole_server import merge_shadows, merge_stats


def record(compared: int, agreement: float, p99: float, max_abs: float, slow_ms: float) -> dict:
    return {
        "version": 2, "primary_version": 1, "fraction": 1.0,
        "mirrored": compared + 1, "compared": compared, "failed": 1, "dropped": 0,
        "agreement": agreement, "p50_ms": p99 / 2, "p99_ms": p99, "primary_p50_ms": 1.0, "primary_p99_ms": 2.0,
        "outputs": {"predictions": {"agreement": agreement, "mean_abs_diff": None, "max_abs_diff": None,
                                    "mean_rel_diff": None},
                    "scores": {"agreement": agreement, "mean_abs_diff": max_abs / 2, "max_abs_diff": max_abs,
                               "mean_rel_diff": 0.1}},
        "slowest": [{"ms": slow_ms, "inputs": f"x={slow_ms}"}],
        "recent_abs_diffs": [max_abs],
    }  # fmt: skip


def test_counts_add_rates_are_weighted_by_what_each_compared_and_the_worst_is_the_worst() -> None:
    merged = merge_shadows([{"m": record(300, 0.9, 10.0, 0.5, 7.0)}, {"m": record(100, 0.5, 30.0, 2.0, 9.0)}])["m"]
    assert (merged["mirrored"], merged["compared"], merged["failed"]) == (402, 400, 2)
    assert merged["agreement"] == pytest.approx((300 * 0.9 + 100 * 0.5) / 400, abs=1e-3)
    assert merged["p99_ms"] == pytest.approx((300 * 10 + 100 * 30) / 400, abs=1e-3)
    assert merged["outputs"]["scores"]["max_abs_diff"] == 2.0
    assert merged["outputs"]["scores"]["mean_abs_diff"] == pytest.approx((300 * 0.25 + 100 * 1.0) / 400)
    assert merged["outputs"]["predictions"]["mean_abs_diff"] is None
    assert [slow["ms"] for slow in merged["slowest"]] == [9.0, 7.0]
    assert sorted(merged["recent_abs_diffs"]) == [0.5, 2.0]


def test_the_stats_snapshot_of_a_server_of_workers_carries_the_merged_record() -> None:
    base = {"time": 1.0, "window_seconds": 60, "models": {}}
    snapshots = [{**base, "shadow": {"m": record(10, 1.0, 1.0, 0.0, 1.0)}}, {**base}]
    merged = merge_stats(snapshots)
    assert merged["shadow"]["m"]["compared"] == 10
    assert "shadow" not in merge_stats([base, base])

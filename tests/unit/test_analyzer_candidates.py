"""The analyzer's candidates (workbench.analyzer.candidates): the grid, names, files and flags."""

from __future__ import annotations

import pytest

from workbench.analyzer.candidates import Candidate, grid
from workbench.config.batching_parameters import parse_batching_parameters


def test_the_grid_is_every_combination_once_and_no_batching_takes_no_batching_setting() -> None:
    found = grid(max_batch_size=[1, 8], batch_timeout_micros=[0, 500], num_workers=[1, 2], model_runners=["auto", "1"])
    # size 1: the timeouts collapse (2 workers x 2 runner settings); size 8: 2 timeouts x 2 x 2
    assert len(found) == 4 + 8 and len(set(found)) == len(found)
    assert Candidate(num_workers=2, model_runners="1") in found
    assert all(c.batch_timeout_micros == 0 for c in found if not c.batching)


def test_a_candidate_is_the_files_and_flags_a_server_reads() -> None:
    candidate = Candidate(16, 1000, 2, 50, num_workers=4, model_runners="in_process")
    params = parse_batching_parameters(candidate.batching_parameters_text())
    assert (params.max_batch_size, params.batch_timeout_micros, params.num_batch_threads) == (16, 1000, 2)
    assert params.max_enqueued_batches == 50
    assert candidate.serve_flags() == ["--enable_batching", "--num_workers=4", "--model_runners=in_process"]
    assert candidate.name == "batch 16, 1000 µs, 2 threads, 4 workers, runners in_process"
    assert Candidate().serve_flags() == [] and Candidate().name == "no batching"


@pytest.mark.parametrize("bad", [{"max_batch_size": [0]}, {"batch_timeout_micros": [-1]}, {"model_runners": ["x"]}])
def test_impossible_values_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        grid(**bad)

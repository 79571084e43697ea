"""The graphed talker's choosers: the code predictor's top-k-only choice
picks what the whole vocabulary's warpers pick for the same noise, and
greedy rows take the argmax whatever their noise."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omnix.engines.talker_choose import (  # noqa: E402
    RowSampling,
    _pick,
    choose_residual,
)


def _rows(temperature: list[float]) -> RowSampling:
    n = len(temperature)
    return RowSampling(
        temperature=torch.tensor(temperature),
        top_k=torch.zeros(n, dtype=torch.long),
        top_p=torch.ones(n),
        penalty=torch.ones(n),
    )


@pytest.mark.parametrize(("top_k", "top_p"), [(50, 0.8), (50, 1.0), (7, 0.3), (1, 0.8)])
def test_the_top_k_choice_equals_the_whole_vocabulary_s(top_k: int, top_p: float) -> None:
    gen = torch.Generator().manual_seed(top_k)
    rows = _rows([0.9] * 31 + [0.0])
    for _ in range(20):
        logits = torch.randn(32, 2048, generator=gen) * 3  # float32: no ties
        noise = torch.empty(32, 2048).exponential_(generator=gen)
        want = _pick(
            logits,
            rows.temperature,
            torch.full((32,), top_k),
            torch.full((32,), top_p),
            noise,
        )
        assert torch.equal(choose_residual(logits, rows, top_k, top_p, noise), want)


def test_greedy_rows_take_the_argmax_and_sampled_rows_follow_their_noise() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 512, generator=gen)
    rows = _rows([0.0, 0.0, 1.0, 1.0])
    picks = set()
    for _ in range(50):
        noise = torch.empty(4, 512).exponential_(generator=gen)
        got = choose_residual(logits, rows, 50, 0.8, noise)
        assert got[:2].tolist() == logits[:2].argmax(-1).tolist()
        picks.add(int(got[2]))
    assert len(picks) > 1  # sampled, not greedy
    # a top-k of the whole vocabulary (or none) takes the general path
    noise = torch.ones(4, 512)
    assert (
        choose_residual(logits, rows, 0, 1.0, noise)[:2].tolist() == logits[:2].argmax(-1).tolist()
    )

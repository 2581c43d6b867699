"""The kernels' sampler (sk_sample.h through streamkit.engine.native.sampling): its draws follow
streamkit.engine.sampling.target_probs (repetition penalty, temperature, top-k, top-p) on every
instruction-set path, temperature 0 is the argmax after the penalty, and a draw depends on the
sequence's seed and the token's position only."""
import numpy as np
import pytest
import torch

from streamkit.engine import SamplingParams, native
from streamkit.engine.native.sampling import sample_rows
from streamkit.engine.sampling import sample_one, target_probs


@pytest.fixture(params=native.ISAS)
def lib(request):
    if not native.available(request.param):
        pytest.skip(f"native {request.param} path unavailable here: {native.error(request.param)}")
    return native.load(request.param)


def _draws(lib, logits: torch.Tensor, params: SamplingParams, prev: list[int], n: int, pos: int = 5) -> np.ndarray:
    """n draws from one row of logits, seeds 0..n-1, in calls of up to 256 rows"""
    out = []
    for a in range(0, n, 256):
        k = min(256, n - a)
        out += sample_rows(lib, logits.repeat(k, 1), [params] * k, list(range(a, a + k)), [pos] * k, [prev] * k)
    return np.asarray(out)


GRID = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=20),
    SamplingParams(temperature=1.3, top_p=0.9),
    SamplingParams(temperature=0.8, top_k=50, top_p=0.5),
    SamplingParams(temperature=1.0, repetition_penalty=1.5),
    SamplingParams(temperature=0.9, top_k=40, top_p=0.9, repetition_penalty=1.1),
]


@pytest.mark.parametrize("params", GRID, ids=lambda p: f"t{p.temperature}-k{p.top_k}-p{p.top_p}-r{p.repetition_penalty}")
def test_draws_follow_the_target_distribution(lib, params):
    """50,000 draws over 200 tokens: no token outside the distribution's support, every token of
    probability 0.1 % or more drawn, total variation to it below 0.02 (a temperature off by 0.1
    moves the distribution by 0.036-0.076 here)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(200, generator=g) * 3
    prev = [3, 7, 11, int(logits.argmax())]
    want = target_probs(logits.clone(), params, prev).double().numpy()
    got = np.bincount(_draws(lib, logits, params, prev, 50_000), minlength=200) / 50_000
    assert not ((got > 0) & (want == 0)).any()
    assert (got[want >= 1e-3] > 0).all()
    assert 0.5 * np.abs(got - want).sum() < 0.02


def test_top_k_and_top_p_keep_the_tokens_torch_keeps_over_a_real_vocabulary(lib):
    """49,152 logits (SmolLM2's vocabulary), peaked as a model's are: the draws stay inside the
    support target_probs gives and reach its likely tokens; logits tied at the k-th are all kept.
    (Where top-p's boundary falls inside a tie, which of the tied tokens torch keeps is its sort's
    choice; the kernels keep the lowest ids.)"""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(49152, generator=g) * 4
    for params in (SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=0.7, top_k=12),
                   SamplingParams(temperature=1.0, top_p=0.5), SamplingParams(temperature=1.5, top_p=0.95),
                   SamplingParams(temperature=1.0, top_k=40, top_p=0.8)):
        want = target_probs(logits.clone(), params, []).numpy()
        got = _draws(lib, logits, params, [], 1500)
        assert (want[got] > 0).all(), params
        assert set(np.flatnonzero(want >= 1e-2)) <= set(got.tolist()), params
    logits[100:110] = logits.max() + 1.0  # ten tied logits at the top
    assert set(_draws(lib, logits, SamplingParams(temperature=0.7, top_k=5), [], 500).tolist()) == set(range(100, 110))


def test_temperature_zero_is_the_argmax_after_the_penalty(lib):
    logits = torch.tensor([0.5, 3.0, 2.5, -1.0, 2.9])
    for pen, prev in ((1.0, []), (1.5, [1]), (1.5, [1, 4]), (3.0, [1, 2, 4])):
        params = SamplingParams(temperature=0.0, repetition_penalty=pen)
        want = sample_one(logits.clone(), params, prev, None)
        assert sample_rows(lib, logits[None].clone(), [params], [0], [0], [prev]) == [want]


def test_a_draw_depends_on_seed_and_position_alone(lib):
    """The same (seed, position) draws the same token in any row of any call; other seeds or
    positions draw others."""
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=1.0)
    seeds, pos = [3, 2**63 + 5, 42, 7], [10, 10, 11, 500]
    one = [sample_rows(lib, logits[None].clone(), [params], [s], [p], [[]])[0] for s, p in zip(seeds, pos)]
    together = sample_rows(lib, logits.repeat(4, 1), [params] * 4, seeds[::-1], pos[::-1], [[]] * 4)
    assert together == one[::-1]
    assert len(set(_draws(lib, logits, params, [], 64).tolist())) > 20
    by_pos = [sample_rows(lib, logits[None].clone(), [params], [3], [p], [[]])[0] for p in range(64)]
    assert len(set(by_pos)) > 20


def test_logits_of_another_type_are_refused_by_name(lib):
    with pytest.raises(ValueError, match="contiguous float32"):
        sample_rows(lib, torch.zeros(1, 10, dtype=torch.float16), [SamplingParams(temperature=1.0)], [0], [0], [[]])

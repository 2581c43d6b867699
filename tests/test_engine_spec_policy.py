"""The adaptive speculation policy (engine/spec_policy.py): measured bursts of both ways, then the
cheaper one per batch bucket, re-measuring the other way every `explore_every` steps;
uneven steps count by their summed seconds and tokens; the option and its environment variable."""
import pytest
import torch

from streamkit.engine.options import resolve_options
from streamkit.engine.spec_policy import DRAFT, PLAIN, SpeculationPolicy


def _run(policy: SpeculationPolicy, batch: int, steps: int, cost: dict[bool, tuple[float, int]]) -> list[bool]:
    """Drive the policy for `steps` steps where a step each way takes cost[way] = (seconds, tokens)."""
    ways = []
    for _ in range(steps):
        way = policy.choose(batch)
        policy.observe(batch, way, *cost[way])
        ways.append(way)
    return ways


def test_measures_both_ways_then_takes_the_cheaper_and_re_explores_ever_less_often():
    p = SpeculationPolicy(burst=3, explore_every=10)
    cheap_draft = {DRAFT: (0.045, 2), PLAIN: (0.028, 1)}  # 22.5 vs 28 ms a token
    ways = _run(p, 1, 6 + 10 + 3 + 20 + 3 + 40 + 3, cheap_draft)
    assert ways[:6] == [DRAFT] * 3 + [PLAIN] * 3  # a burst each way first
    assert ways[6:16] == [DRAFT] * 10  # then the cheaper way
    assert ways[16:19] == [PLAIN] * 3  # a burst the other way after explore_every steps
    assert ways[19:39] == [DRAFT] * 20  # it did not change the choice: twice as long until the next
    assert ways[39:42] == [PLAIN] * 3
    assert ways[42:82] == [DRAFT] * 40 and ways[82:] == [PLAIN] * 3
    assert p.stats()["spec_policy"]["1"] == {"draft_ms_per_token": 22.5, "plain_ms_per_token": 28.0, "drafting": True}


def test_follows_a_change_in_what_is_cheaper():
    p = SpeculationPolicy(burst=4, explore_every=8)
    _run(p, 1, 20, {DRAFT: (0.040, 2), PLAIN: (0.030, 1)})
    assert p.choose(1) is DRAFT
    # the text changes: drafts are rejected, a round now yields one token for more than a plain step
    ways = _run(p, 1, 60, {DRAFT: (0.045, 1), PLAIN: (0.030, 1)})
    assert ways[-40:].count(PLAIN) >= 36  # bursts of 4 drafting steps, ever rarer
    assert p.stats()["spec_policy"]["1"]["drafting"] is False


def test_uneven_steps_count_by_summed_seconds_and_tokens():
    """A costly drafting step now and then (a round whose drafts were rejected: long, one token)
    among cheaper ones: per step the rounds look cheaper than plain steps; summed, drafting is not,
    so the policy decodes plainly (ratio of summed seconds and tokens, not a mean of ratios)."""
    p = SpeculationPolicy(burst=12, explore_every=1000, decay=0.05)
    sentence = [(0.080, 2)] + [(0.046, 2)] * 4  # 264 ms for 10 tokens: 26.4 ms a token
    for _ in range(3):
        for cost in sentence:
            way = p.choose(1)
            p.observe(1, way, *(cost if way is DRAFT else (0.025, 1)))
    assert p.choose(1) is PLAIN
    ms = p.stats()["spec_policy"]["1"]
    assert ms["plain_ms_per_token"] == pytest.approx(25.0) and ms["draft_ms_per_token"] > 25.0


def test_batch_buckets_are_measured_apart():
    p = SpeculationPolicy(burst=2, explore_every=50)
    _run(p, 1, 10, {DRAFT: (0.02, 2), PLAIN: (0.03, 1)})  # one stream: drafting pays
    _run(p, 16, 10, {DRAFT: (0.30, 20), PLAIN: (0.10, 16)})  # 16 streams: it does not
    assert p.choose(1) is DRAFT and p.choose(13) is PLAIN
    assert [SpeculationPolicy.bucket_of(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [0, 1, 2, 2, 3, 3, 4, 4, 5]
    assert set(p.stats()["spec_policy"]) == {"1", "16"}
    assert p.stats()["spec_drafted_steps"] + p.stats()["spec_plain_steps"] == 20


@pytest.mark.parametrize("kw", [{"burst": 0}, {"explore_every": 0}, {"max_backoff": 0}, {"decay": 0.0},
                                {"decay": 1.5}])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError, match="burst"):
        SpeculationPolicy(**kw)


def test_adaptive_is_the_default_and_the_environment_turns_it_off(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve_options(cpu, speculative="ngram").spec_adaptive is True
    monkeypatch.setenv("STREAMKIT_SPEC_ADAPTIVE", "0")
    assert resolve_options(cpu, speculative="ngram").spec_adaptive is False
    assert resolve_options(cpu, speculative="ngram", spec_adaptive=True).spec_adaptive is True


def test_plain_runs_ahead_are_what_choose_would_have_answered():
    """plain_ahead: how many steps choose() would answer plain in a row (the rest of a plain burst,
    or the steps before the next exploring burst while plain is the cheaper), 0 where it would draft
    or start a burst; skip_plain moves the policy on as that many choose() calls would have."""
    p = SpeculationPolicy(burst=4, explore_every=10)
    cheap_plain = {DRAFT: (0.050, 1), PLAIN: (0.030, 1)}
    assert p.plain_ahead(1) == 0  # nothing measured: a drafting burst comes first
    _run(p, 1, 5, cheap_plain)  # 4 drafting steps, then the first of 4 plain ones
    assert p.plain_ahead(1) == 3
    p.skip_plain(1, 3)
    assert p.plain_ahead(1) == 10  # plain is the cheaper: until the next exploring burst
    p.skip_plain(1, 6)
    assert p.plain_ahead(1) == 4
    twin = SpeculationPolicy(burst=4, explore_every=10)  # the same steps, every one chosen
    _run(twin, 1, 5 + 3 + 6, cheap_plain)
    assert _run(p, 1, 10, cheap_plain) == _run(twin, 1, 10, cheap_plain)
    cheap_draft = SpeculationPolicy(burst=2, explore_every=10)
    _run(cheap_draft, 1, 6, {DRAFT: (0.040, 2), PLAIN: (0.030, 1)})
    assert cheap_draft.plain_ahead(1) == 0

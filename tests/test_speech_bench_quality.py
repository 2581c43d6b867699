"""The speech benchmarks' scoring: chrF, dubbed-speech intelligibility, bench asr on recorded prompts."""

import json
from pathlib import Path

import pytest

from streamkit.bench.dub_quality import chrf, intelligibility


def test_chrf_bounds_and_order():
    ref = ["La reunión empieza a las nueve."]
    assert chrf(ref, ref) == pytest.approx(100.0)
    assert chrf(["xyz qqq"], ref) < 5
    close = chrf(["La reunión empieza a las diez."], ref)
    assert 50 < close < 100


def test_intelligibility_of_spanish_speech():
    from streamkit.speech.kokoro import get_kokoro

    text = "Buenos días a todos, gracias por unirse a la llamada."
    audio = get_kokoro("jm_kumo", "es")(text)
    result = intelligibility([audio], [text], 24000, "es")
    assert result["dubbed_cer"] <= 0.10, result


def test_intelligibility_of_audio_that_came_late():
    """Synthesis behind: the first utterance's second half arrives after the second's text."""
    import numpy as np

    from streamkit.speech.kokoro import get_kokoro

    voice = get_kokoro("jm_kumo", "es")
    texts = ["Buenos días a todos.", "Gracias por unirse a la llamada."]
    first, second = voice(texts[0]), voice(texts[1])
    half = len(first) // 2
    late = [first[:half], np.concatenate([first[half:], np.zeros(4800, np.float32), second])]
    result = intelligibility(late, texts, 24000, "es")
    assert result["dubbed_cer"] <= 0.10, result
    assert len(result["dubbed_heard"]) == 2


@pytest.mark.skipif(not Path("/usr/share/doc/asterisk-core-sounds-en").exists(),
                    reason="asterisk-core-sounds-en is not installed")
def test_bench_asr_real_json(capsys):
    from streamkit.bench.asr import main

    assert main(["--real", "2", "--real-only", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["real_files"] == 2
    assert 0 <= result["real_wer"] <= 0.5 and 0 <= result["real_peer_wer"] <= 0.5
    assert result["real_final_latency_ms_p50"] > 0


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/share/doc/asterisk-core-sounds-es").exists(),
                    reason="asterisk-core-sounds-es is not installed")
def test_bench_dubbing_spanish_json(capsys):
    """es -> en on real Spanish speech: the dubbed English is scored by Whisper base."""
    from streamkit.bench.dubbing import main

    assert main(["--spanish", "--sentences", "2", "--gap", "2.0", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["utterances"] == 2 and result["dubbed_utterances"] >= 1
    assert result["asr_cer"] <= 0.3 and result["dubbed_cer"] is not None
    assert result["translation_chrf"] is None

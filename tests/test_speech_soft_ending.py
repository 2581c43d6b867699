"""A speaker who trails off: the last words, quieter, must be in the final transcript.

The audio is hibari's "Good morning everyone, thank you for joining the call." with everything
after 2.4 s (from "joining") 25 dB quieter. Silero scores those words between neg_threshold and
threshold. Before the fix the VAD counted such windows as silence: speech_pause fell in
"joining", speech_end followed without a speech_resume, and the ASR's speculative final (decoded
at the pause) was the whole transcript: "Good morning, everyone. Thank you for joining." over the
websocket at real-time pace, while an offline decode of the same audio has every word.
"""

import shutil
from pathlib import Path

import numpy as np
import pytest
from speech import synthesize

from streamkit.speech.vad import Segmenter
from streamkit.speech.wer import normalize

TEXT = "Good morning everyone, thank you for joining the call."
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def soft_ending() -> np.ndarray:
    audio = synthesize(TEXT).copy()
    audio[int(2.4 * 16000):] *= 10 ** (-25 / 20)
    return np.concatenate([audio, np.zeros(16000, np.float32)])


def test_vad_keeps_soft_speech_in_the_segment(soft_ending):
    seg = Segmenter()
    events = []
    for i in range(0, len(soft_ending), 320):
        events += [e for e in seg.process(soft_ending[i:i + 320]) if e[0] != "audio"]
    events += [e for e in seg.flush() if e[0] != "audio"]
    kinds = [k for k, _ in events]
    assert kinds.count("start") == kinds.count("end") == 1, events
    # the soft words score >= neg_threshold: every pause during them is followed by a resume, and
    # the pause that leads to the end comes after the voiced end of "call"
    last_pause = max(p["at"] for k, p in events if k == "pause")
    assert kinds.index("end") == kinds.index("pause", kinds.index("end") - 1) + 1
    assert last_pause >= 2.75, events


def test_vad_end_gives_next_segment_its_leading_pad():
    """A word that starts 50 ms after the VAD ended the previous segment keeps its leading pad
    (the quiet end of the previous segment), as a word after a long silence does."""
    from streamkit.speech.corpus import voiced_span

    a, b = synthesize("Thank you very much."), synthesize("The river flows slowly.")
    a = a[: int((voiced_span(a)[1] + 0.05) * 16000)]
    b = b[int(voiced_span(b)[0] * 16000):]
    seg = Segmenter(min_silence_ms=300, speech_pad_ms=160)
    fired = None
    silence = np.concatenate([a, np.zeros(16000, np.float32)])
    for i in range(0, len(silence), 512):
        if any(k == "end" for k, _ in seg.process(silence[i:i + 512])):
            fired = i + 512
            break
    assert fired is not None
    gap = int((fired / 16000 + 0.05 - len(a) / 16000) * 16000)
    assert gap > 0
    audio = np.concatenate([a, np.zeros(gap, np.float32), b, np.zeros(16000, np.float32)])
    seg = Segmenter(min_silence_ms=300, speech_pad_ms=160)
    events = seg.process(audio) + seg.flush()
    starts = [p["start"] for k, p in events if k == "start"]
    assert len(starts) == 2
    onset = (len(a) + gap) / 16000
    assert starts[1] <= onset - 0.1, (starts, onset)


async def test_websocket_final_keeps_the_soft_last_words(tmp_path, soft_ending):
    from streamkit.client import StreamClient
    from streamkit.server.testing import running_server

    shutil.copy(ROOT / "pipelines" / "transcribe.yaml", tmp_path / "transcribe.yaml")
    async with running_server(tmp_path) as server, StreamClient(server.url) as c:
        await c.start("transcribe")
        result = await c.stream_audio(soft_ending, speed=1.0, chunk_s=0.02)
    finals = [e for e in result.events if e.get("type") == "transcript" and e.get("final")]
    assert len(finals) == 1, finals
    assert normalize(finals[0]["text"]) == normalize(TEXT), finals[0]["text"]

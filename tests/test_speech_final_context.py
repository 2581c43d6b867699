"""The final's decode in Whisper's full 30 s context (asr `final_full_context: true`) on real
telephone speech: Asterisk's "Followed by the pound key." (8 kHz), which tiny.en hears as "All but
a pound key." in the shortened context of the file's own length."""

import numpy as np
import recordings

from streamkit.speech.wer import normalize

PIPELINE = """name: careful
input: {audio: {sample_rate: 16000}}
stages:
  - {name: vad, type: vad, min_silence_ms: 300, speech_pad_ms: 160}
  - {name: asr, type: asr, model: tiny.en, language: en, final_full_context: true}
output: [asr]
"""


def test_window_decoder_full_context_hears_the_short_prompt():
    from streamkit.audio import resample_array
    from streamkit.speech import whisper
    from streamkit.speech.whisper import WindowDecoder

    recordings.require()
    audio = resample_array(recordings.load("astcc-followed-by-the-pound-key"), recordings.RATE, 16000)
    decoder = WindowDecoder(whisper.get_whisper(None, 2, "int8"), "en", beam_size=5)
    assert normalize(decoder.decode(audio).text) != normalize(decoder.decode(audio, full_context=True).text)
    assert normalize(decoder.decode(audio, full_context=True).text) == ["followed", "by", "the", "pound", "key"]


async def test_a_pipeline_with_full_context_finals_streams_the_prompt(tmp_path):
    from streamkit.client import StreamClient
    from streamkit.server.testing import running_server

    recordings.require()
    audio, texts = recordings.prompt_stream(["astcc-followed-by-the-pound-key"])
    (tmp_path / "careful.yaml").write_text(PIPELINE)
    async with running_server(tmp_path) as server, StreamClient(server.url) as c:
        await c.start("careful", sample_rate=recordings.RATE)
        result = await c.stream_audio(np.asarray(audio, np.float32), speed=0)
    finals = [e for e in result.events if e.get("type") == "transcript" and e.get("final")]
    assert len(finals) == 1 and not result.errors, (finals, result.errors)
    assert normalize(finals[0]["text"]) == normalize(texts[0]), finals[0]["text"]

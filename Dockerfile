# The one container image every fullres pipeline step runs in (and Dataflow workers, via --sdk_container_image).
#
#   fullres image build                       # the CPU image, tag fullres:cpu (see `fullres image build --help`)
#   fullres image build --accelerator gpu --tag REGION-docker.pkg.dev/PROJECT/REPO/fullres:gpu
#
# or by hand (BuildKit; the CA bundle only where the registries need it, as a secret, never in a layer):
#
#   DOCKER_BUILDKIT=1 docker build --build-arg ACCELERATOR=cpu --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt -t fullres:cpu .
#
# then `fullres pipeline compile --image <that tag>` (or `fullres pipeline submit --image ...`).
# The environment is the committed uv.lock (JAX for CPU); the gpu and tpu variants add the matching
# JAX plug-in (CUDA 12 wheels, or libtpu) of exactly the locked JAX version, constrained by the lock.
# BASE is any image with Python 3.11 and venv (`fullres image base` makes a Debian one without Docker Hub).
ARG BASE=python:3.11-slim
FROM ${BASE}

ARG ACCELERATOR=cpu
# The package index (the one this machine's pip/uv use; `fullres image build` passes it).
ARG INDEX_URL=https://pypi.org/simple
# No persistent JAX compilation cache in the image: each pipeline step is a new container, so a cache in its
# home would never be read again (point JAX_COMPILATION_CACHE_DIR at a bucket or volume to share one).
ENV PYTHONUNBUFFERED=1 \
    KERAS_BACKEND=jax \
    JAX_COMPILATION_CACHE_DIR= \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/fullres/.venv \
    PATH=/opt/fullres/.venv/bin:/opt/uv/bin:$PATH

# Every step that reaches the index mounts the CA bundle secret (if given) and points pip/uv at it:
# the file lives only for that step, in /run/secrets, never in a layer.
RUN --mount=type=secret,id=ca,target=/run/secrets/ca \
    case "$ACCELERATOR" in cpu|gpu|tpu) ;; \
      *) echo "ACCELERATOR must be cpu, gpu or tpu, got '$ACCELERATOR'" >&2; exit 1 ;; esac \
    && if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && python3 -m venv /opt/uv \
    && /opt/uv/bin/pip install --no-cache-dir --disable-pip-version-check --index-url "$INDEX_URL" uv

WORKDIR /opt/fullres
# Dependencies first (this layer is reused while only fullres's code changes), then fullres itself.
# uv's download cache is a cache mount: it speeds up rebuilds and stays out of the image.
# TensorFlow's C++ headers (0.3 GB, for compiling custom ops; fullres only reads and writes
# TFRecords and SavedModels with it) are left out, in the same layer, so they take no space; so are
# libclang's Python bindings (TensorFlow's build tooling), the packages' own test suites (0.14 GB), and
# TensorFlow Text (0.19 GB: keras-hub's text tokenizers, each import of it guarded by keras-hub, none used by
# fullres), which pays for PyAV's FFmpeg (0.10 GB, `preprocess video` and video predict).
COPY pyproject.toml uv.lock ./
RUN --mount=type=cache,target=/root/.cache/uv --mount=type=secret,id=ca,target=/run/secrets/ca \
    if [ -s /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca; fi \
    && export UV_DEFAULT_INDEX="$INDEX_URL" \
    && uv sync --locked --no-dev --no-install-project \
    && rm -r /opt/fullres/.venv/lib/python3.11/site-packages/tensorflow/include \
             /opt/fullres/.venv/lib/python3.11/site-packages/clang \
             /opt/fullres/.venv/lib/python3.11/site-packages/tensorflow_text \
    && find /opt/fullres/.venv/lib/python3.11/site-packages -depth -mindepth 2 -type d -name tests \
            -exec rm -r {} + \
    && case "$ACCELERATOR" in gpu) extra=cuda12 ;; tpu) extra=tpu ;; *) extra= ;; esac \
    && if [ -n "$extra" ]; then \
         uv export --locked --no-dev --no-hashes --no-emit-project --quiet -o /tmp/locked.txt \
         && JAX_VERSION="$(python -c 'import importlib.metadata as m; print(m.version("jax"))')" \
         && uv pip install --python /opt/fullres/.venv --constraint /tmp/locked.txt "jax[$extra]==${JAX_VERSION}" \
         && rm /tmp/locked.txt; \
       fi

COPY README.md ./
COPY common common
COPY preprocessing preprocessing
COPY trainer trainer
COPY components components
COPY pipelines pipelines
COPY fullres fullres
# --inexact keeps the gpu/tpu plug-in installed above. The smoke check imports Keras before the
# trainer, as any user code may: KERAS_BACKEND=jax (above) makes that order safe.
RUN --mount=type=cache,target=/root/.cache/uv --mount=type=secret,id=ca,target=/run/secrets/ca \
    if [ -s /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca; fi \
    && export UV_DEFAULT_INDEX="$INDEX_URL" \
    && uv sync --locked --no-dev --no-editable --inexact \
    && python -c "import keras, trainer, kfp, jax, apache_beam, components, pipelines, fullres; print('fullres image, JAX', jax.__version__, 'Keras backend', keras.backend.backend())"

# KFP runs each component's own command (python3 -m kfp.dsl.executor_main ...) with this PATH;
# as a plain container it is the fullres CLI.
ENTRYPOINT []
CMD ["fullres", "--help"]

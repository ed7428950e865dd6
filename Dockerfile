# The one container image every fullres pipeline step runs in (and Dataflow workers, via --sdk_container_image).
#
#   docker build -t fullres:cpu .
#   docker build --build-arg ACCELERATOR=gpu -t REGION-docker.pkg.dev/PROJECT/REPO/fullres:gpu .
#   docker build --build-arg ACCELERATOR=tpu -t REGION-docker.pkg.dev/PROJECT/REPO/fullres:tpu .
#
# then `fullres pipeline compile --image <that tag>` (or `fullres pipeline submit --image ...`).
# The environment is the committed uv.lock (JAX for CPU); the gpu and tpu variants add the matching
# JAX plug-in (CUDA 12 wheels, or libtpu) of exactly the locked JAX version.
FROM python:3.11-slim

ARG ACCELERATOR=cpu
ENV PYTHONUNBUFFERED=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/opt/fullres/.venv \
    PATH=/opt/fullres/.venv/bin:$PATH

RUN case "$ACCELERATOR" in cpu|gpu|tpu) ;; \
      *) echo "ACCELERATOR must be cpu, gpu or tpu, got '$ACCELERATOR'" >&2; exit 1 ;; esac \
    && pip install --no-cache-dir uv

WORKDIR /opt/fullres
# Dependencies first (cached while only the code changes), then fullres itself.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --locked --no-dev --no-install-project
COPY preprocessing preprocessing
COPY trainer trainer
COPY components components
COPY pipelines pipelines
RUN uv sync --locked --no-dev --no-editable \
    && JAX_VERSION="$(python -c 'import importlib.metadata as m; print(m.version("jax"))')" \
    && case "$ACCELERATOR" in \
         gpu) uv pip install --python /opt/fullres/.venv "jax[cuda12]==${JAX_VERSION}" ;; \
         tpu) uv pip install --python /opt/fullres/.venv "jax[tpu]==${JAX_VERSION}" ;; \
       esac \
    && python -c "import kfp, jax, keras, apache_beam, trainer, components, pipelines; print('fullres image, JAX', jax.__version__)"

# KFP runs each component's own command (python3 -m kfp.dsl.executor_main ...) with this PATH;
# as a plain container it is the fullres CLI.
ENTRYPOINT []
CMD ["fullres", "--help"]

# syntax=docker/dockerfile:1
# The operator image: `episode-operator run` as a non-root user, the package installed from its
# wheel. The release workflow (.github/workflows/release.yml) builds it for linux/amd64 and
# linux/arm64 and pushes it signed, with an SBOM; to build your own:
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/episode-operator:0.1.0 --push .
#
# PYTHON_IMAGE is the base of both stages: a Debian bookworm with `python` 3.11, pip and venv.
# `hack/images build episode-operator --local-base` builds this file with buildah from a base made of
# Debian packages (no registry needed); `hack/cluster images` builds the same image without a builder
# (episode-operator.local/operator:dev: the same venv path, user and entrypoint).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
# The project's wheel and its dependencies' for the target platform; pip's cache outlives the build,
# so a changed source re-downloads nothing.
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m pip wheel --disable-pip-version-check --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
# Debian's static busybox at /bin/busybox: agent and verifier pods borrow it to fill the compose volumes
# only sidecars mount from a sidecar's image, which may have no shell (kube/objects/pods.py).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends busybox-static \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/opt/episode-operator/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=wheels /wheels /tmp/wheels
RUN python -m venv /opt/episode-operator \
 && /opt/episode-operator/bin/pip install --no-cache-dir --disable-pip-version-check --no-index \
      --find-links /tmp/wheels episode-operator \
 && rm -rf /tmp/wheels \
 && groupadd --gid 65532 episode-operator \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin episode-operator \
 && mkdir -p /var/lib/episode-operator/data \
 && chown -R 65532:65532 /var/lib/episode-operator
USER 65532:65532
# /metrics (open); kopf's liveness endpoint (--liveness); the data API (TLS, --data-api-port).
EXPOSE 8080 8081 8443
ENTRYPOINT ["episode-operator"]
CMD ["run"]

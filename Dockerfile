# The operator image: `episode-operator run` as a non-root user, the package installed from its
# wheel. `hack/cluster images` builds the same image without Docker for the test cluster
# (episode-operator.local/operator:dev: Debian bookworm, the same venv path, user and entrypoint).
#
#   docker build -t REGISTRY/episode-operator:0.1.0 .
#   helm install episode-operator helm/episode-operator -n episode-operator-system --create-namespace \
#     --set image.repository=REGISTRY/episode-operator --set image.tag=0.1.0

FROM python:3.11-slim-bookworm AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
ENV PATH=/opt/episode-operator/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=wheel /wheels /tmp/wheels
RUN python -m venv /opt/episode-operator \
 && /opt/episode-operator/bin/pip install --no-cache-dir /tmp/wheels/episode_operator-*.whl \
 && rm -rf /tmp/wheels \
 && groupadd --gid 65532 episode-operator \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin episode-operator \
 && mkdir -p /var/lib/episode-operator/data \
 && chown -R 65532:65532 /var/lib/episode-operator
USER 65532:65532
# /metrics and the kept logs and artifacts; kopf's liveness endpoint (--liveness).
EXPOSE 8080 8081
ENTRYPOINT ["episode-operator"]
CMD ["run"]

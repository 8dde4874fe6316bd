# An image running `rmqkit consume` (docs/deploy.md), the one `rmqkit deploy k8s` expects:
#   docker build -t rmqkit .                          (optional: --build-arg EXTRAS=postgres)
#   docker run --rm -e RMQKIT_URL=amqp://… rmqkit consume examples.handlers:handle --queue …
# Your handlers go into an image built FROM this one (COPY them to /app, or pip install them).
# Credentials are never baked in: they come from the environment (a Secret, an env file).
FROM python:3.11-slim

# No .pyc files beside the code (Kubernetes runs the image with a read-only root file system),
# and no pip cache in the image.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The user the consumer runs as; numeric in USER below, so that Kubernetes' runAsNonRoot can
# check it (`rmqkit deploy k8s` sets runAsUser 10001).
RUN groupadd --system --gid 10001 rmqkit \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin rmqkit

# The project only (not the checkout's virtualenv, tests or git history); EXTRAS names
# optional dependencies, e.g. postgres for PostgreSQL dedupe and outbox stores.
ARG EXTRAS=""
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rmqkit ./rmqkit
RUN pip install ".${EXTRAS:+[$EXTRAS]}" \
 && rm -rf /src

# `rmqkit consume HANDLER` imports HANDLER from the working directory, as uvicorn does. The
# examples are the handlers of scripts/demo (examples.handlers:handle).
WORKDIR /app
COPY examples ./examples

USER 10001:10001

# SIGTERM is the consumer's graceful stop: in-flight handlers finish within --grace (30s by
# default) and are acked. `docker stop` waits 10s before SIGKILL: give it -t above the grace.
# No HEALTHCHECK: the health server's port is consume's --metrics-port (Kubernetes ignores
# HEALTHCHECK and probes /healthz and /readyz itself).
STOPSIGNAL SIGTERM
ENTRYPOINT ["rmqkit"]
CMD ["--help"]

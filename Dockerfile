# patchgym's own image: the CLI (and, once it exists, `patchgym serve`) with its bundled tasks.
#
# No image registry is assumed: the default base is patchgym's own Debian image, built from Debian
# packages with `patchgym images bootstrap` (debootstrap + docker import). Any Debian-based image
# with python3 and python3-venv works too: docker build --build-arg BASE=debian:bookworm-slim .
#
#   patchgym images bootstrap                  # once, on the host (makes patchgym/base:bookworm)
#   docker build -t patchgym .
#
# Sandboxes from inside this container:
# * local backend (default): bubblewrap needs to create namespaces and mount a new /proc, so run
#   the container with
#   docker run --rm --security-opt seccomp=unconfined --security-opt systempaths=unconfined \
#     --cap-add SYS_ADMIN patchgym eval --predictions gold
#   Without those, commands run unisolated (a warning says so): fine for trusted predictions only.
# * docker backend: mount the host's engine and use sibling containers,
#   docker run --rm -v /var/run/docker.sock:/var/run/docker.sock patchgym eval --backend docker ...
#   (the base image must exist on that engine: `patchgym images bootstrap` there).
ARG BASE=patchgym/base:bookworm
FROM ${BASE}
# Not one of the images patchgym manages (the base's labels would say so, and prune would take it).
LABEL org.patchgym.managed="0" org.patchgym.kind="server"

# Build-time network only: the host's CA bundle is already in patchgym's base image.
# gcc and libc6-dev (already in patchgym's base): the local sandboxes' init is compiled on first use
# (about 0.1 MiB idle each; without a compiler, the Python init: about 8.5 MiB).
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends bubblewrap git patch ca-certificates python3-venv gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

COPY . /src
RUN python3 -m venv /opt/patchgym \
 && /opt/patchgym/bin/pip install --no-cache-dir /src \
 && rm -rf /src

ENV PATH=/opt/patchgym/bin:$PATH \
    PATCHGYM_HOME=/var/cache/patchgym
WORKDIR /work
ENTRYPOINT ["patchgym"]
CMD ["--help"]

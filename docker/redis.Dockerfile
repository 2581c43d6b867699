# A Redis image from Debian's packages, for machines without Docker Hub (compose's default is the
# official redis:7-alpine):  docker build -f docker/redis.Dockerfile --build-arg BASE_IMAGE=... -t TAG docker
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
# like the official image: reachable from other containers although no password is set
ENTRYPOINT ["/bin/sh", "-c", "if [ \"$1\" = redis-server ]; then shift; exec redis-server --protected-mode no \"$@\"; fi; exec \"$@\"", "--"]
CMD ["redis-server"]

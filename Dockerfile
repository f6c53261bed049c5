# The gateway's image: build with the Go toolchain, run from a minimal base
# as a non-root user. Base images are build arguments because no registry
# is reachable where sandgate is tested: pass locally made ones, e.g.
#   docker build --build-arg BUILDER=my/go:1.26 --build-arg RUNTIME=scratch .
# `make image` builds it from a context made aside (scripts/image-context.sh:
# the checkout, the terminal page's xterm files, the module vendor tree), so
# no network is needed and the checkout never gets a vendor/ directory.
ARG BUILDER=golang:1.26-bookworm
ARG RUNTIME=gcr.io/distroless/static-debian12:nonroot

FROM ${BUILDER} AS build
WORKDIR /src
COPY . .
# A context with vendor/ builds offline; otherwise modules are downloaded.
RUN if [ -d vendor ]; then flags=-mod=vendor; fi; \
    CGO_ENABLED=0 go build $flags -trimpath -ldflags='-s -w' -o /out/gateway ./cmd/gateway && \
    CGO_ENABLED=0 go build $flags -trimpath -ldflags='-s -w' -o /out/sandgate-agent ./cmd/sandgate-agent && \
    mkdir -p /out/data

FROM ${RUNTIME}
COPY --from=build /out/gateway /out/sandgate-agent /usr/local/bin/
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
ENV SANDGATE_STATE_DIR=/data SANDGATE_LISTEN=0.0.0.0:8080 SANDGATE_PROVIDER=docker
VOLUME /data
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD ["/usr/local/bin/gateway", "healthcheck"]
# The Docker socket must be mounted and readable by uid 65532, e.g.
#   docker run -v /var/run/docker.sock:/var/run/docker.sock \
#     --group-add $(stat -c %g /var/run/docker.sock) -e SANDGATE_API_KEYS=... -p 8080:8080 IMAGE
ENTRYPOINT ["/usr/local/bin/gateway"]
CMD ["serve"]

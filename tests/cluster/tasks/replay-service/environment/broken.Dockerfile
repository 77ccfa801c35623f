FROM ubuntu:24.04
RUN echo about to fail
RUN echo "no such thing" >&2; exit 7
RUN echo never

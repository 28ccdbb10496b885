"""OpenTelemetry traces: off unless the standard ``OTEL_*`` variables turn them on
(:func:`wanted`; docs/deploy.md, tracing).

A small facade every layer calls. While tracing is off (no :func:`start`) each call is one
test of a module global: :func:`span` hands back one shared no-op context manager,
:func:`current_traceparent` and :func:`current_trace_id` give None, :func:`inject` and
:func:`annotate` do nothing, and the SDK is never imported.

The trace context that crosses processes is a W3C ``traceparent`` string: written with a timer
and an order event (their ``trace_parent`` column) by :func:`current_traceparent`, and turned
back into a span link by the worker and the webhook deliverer (:func:`span`'s ``links``).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from dueflow.exceptions import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

#: The tracer of this process; None while tracing is off.
_tracer: trace.Tracer | None = None
#: The provider :func:`start` made (or was given); None while off.
_provider: TracerProvider | None = None
#: What :func:`span` hands back while tracing is off (one object, used again by every call).
_OFF: AbstractContextManager[None] = contextlib.nullcontext()
#: version 00: trace id, parent (span) id, flags; all lower-case hex.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
#: The exporters ``OTEL_TRACES_EXPORTER`` may name.
EXPORTERS = ("otlp", "console")

CLIENT = SpanKind.CLIENT
PRODUCER = SpanKind.PRODUCER
CONSUMER = SpanKind.CONSUMER
INTERNAL = SpanKind.INTERNAL


def wanted(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The exporters ``environ`` asks for; empty: tracing stays off.

    ``OTEL_SDK_DISABLED=true`` turns it off whatever else is set. Otherwise
    ``OTEL_TRACES_EXPORTER`` names the exporters (comma-separated: ``otlp``, ``console``;
    ``none`` is off); unset, tracing is on (OTLP) only where an OTLP endpoint is given
    (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``).

    Raises:
        ConfigError: an exporter this process cannot make.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    names = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not names:
        endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        return ("otlp",) if any(environ.get(name, "").strip() for name in endpoints) else ()
    chosen = tuple(dict.fromkeys(n.strip() for n in names.split(",") if n.strip()))
    if chosen == ("none",):
        return ()
    unknown = [n for n in chosen if n not in EXPORTERS]
    if unknown:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER: {', '.join(unknown)} is not one of {', '.join(EXPORTERS)}"
            " or none"
        )
    return chosen


def setup(environ: Mapping[str, str] | None = None) -> bool:
    """Start tracing in this process when ``environ`` (default: ``os.environ``) asks for it
    and it is not on already; True when tracing is on after the call.

    Raises:
        ConfigError: an exporter that cannot be made (unknown, OTLP over gRPC, or the OTLP
            exporter not installed: ``pip install 'dueflow[otlp]'``).
    """
    if _tracer is not None:
        return True
    environ = os.environ if environ is None else environ
    names = wanted(environ)
    if not names:
        return False
    start([_exporter(name, environ) for name in names], batch=True)
    return True


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    ).strip()
    if protocol not in ("", "http/protobuf"):
        raise ConfigError(f"OTLP over {protocol} is not supported here: use http/protobuf")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise ConfigError(
            "OTLP traces need the OTLP exporter: pip install 'dueflow[otlp]'"
        ) from None
    return OTLPSpanExporter()  # its endpoint, headers and timeout from the OTEL_* variables


def start(exporters: Iterable[SpanExporter], *, batch: bool = False) -> TracerProvider:
    """Turn tracing on in this process, spans going to ``exporters`` (each behind a batch
    processor when ``batch``, else sent as each span ends: tests). The resource is the SDK's
    from ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``, ``service.name`` dueflow
    when neither names one; the sampler is the SDK's from ``OTEL_TRACES_SAMPLER``."""
    global _tracer, _provider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    provider = TracerProvider(
        resource=Resource.create({} if named else {"service.name": "dueflow"})
    )
    for exporter in exporters:
        processor = BatchSpanProcessor if batch else SimpleSpanProcessor
        provider.add_span_processor(processor(exporter))
    _provider = provider
    _tracer = provider.get_tracer("dueflow")
    return provider


def stop() -> None:
    """Turn tracing off (spans in flight are sent first)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def on() -> bool:
    """Tracing is on in this process."""
    return _tracer is not None


def provider() -> TracerProvider | None:
    """The provider spans go to (the HTTP app's request spans too); None while off."""
    return _provider


def span(
    name: str,
    *,
    kind: SpanKind = INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    links: Iterable[str | None] = (),
    root: bool = False,
) -> AbstractContextManager[trace.Span | None]:
    """A span around the ``with`` block, current within it; None (and nothing done) while
    tracing is off. ``links``: traceparents (None skipped) the span links to; ``root``: a trace
    of its own, whatever span is current (a timer's handler, a webhook delivery)."""
    if _tracer is None:
        return _OFF
    return _span(_tracer, name, kind, attributes, links, root)


@contextmanager
def _span(
    tracer: trace.Tracer,
    name: str,
    kind: SpanKind,
    attributes: Mapping[str, Any] | None,
    links: Iterable[str | None],
    root: bool,
) -> Iterator[trace.Span]:
    parent = otel_context.Context() if root else None
    found = [Link(c) for c in map(_context_of, dict.fromkeys(links)) if c is not None]
    with tracer.start_as_current_span(
        name, context=parent, kind=kind, attributes=attributes, links=found
    ) as current:
        yield current


def transaction(kind: str, dialect: str) -> AbstractContextManager[None]:
    """A span around a database transaction (``kind``: write, read or report) that is not
    made current: what runs inside stays a child of the enclosing span, so the timers and
    events the transaction writes keep the request's (or the handler's) traceparent. Only
    under a current span: the worker's polls and the event loops' own reads and writes would
    each be a trace of one span."""
    if _tracer is None or not trace.get_current_span().get_span_context().is_valid:
        return _OFF
    return _detached(_tracer, f"db.{kind}", {"db.system.name": dialect})


@contextmanager
def _detached(tracer: trace.Tracer, name: str, attributes: Mapping[str, Any]) -> Iterator[None]:
    started = tracer.start_span(name, kind=CLIENT, attributes=attributes)
    try:
        yield
    except BaseException as exc:
        started.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        started.end()


def _context_of(traceparent: str | None) -> SpanContext | None:
    """The remote span context a traceparent names; None for None or a malformed one."""
    if traceparent is None:
        return None
    match = _TRACEPARENT.fullmatch(traceparent)
    if match is None:
        return None
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(match[3], 16)))


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, kept with what it writes (a timer, an order
    event); None while off or outside any span."""
    if _tracer is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def current_trace_id() -> str | None:
    """The current trace's id (32 hex digits), for log lines; None while off or outside any
    span."""
    if _tracer is None:
        return None
    context = trace.get_current_span().get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else None


def inject(headers: MutableMapping[str, str]) -> None:
    """Put the current span's context on an outgoing request's ``headers`` (``traceparent``,
    by the propagators ``OTEL_PROPAGATORS`` names); nothing while off."""
    if _tracer is not None:
        propagate.inject(headers)


def annotate(attributes: Mapping[str, Any]) -> None:
    """Set ``attributes`` (None values skipped) on the current span; nothing while off."""
    if _tracer is None:
        return
    current = trace.get_current_span()
    for key, value in attributes.items():
        if value is not None:
            current.set_attribute(key, value)

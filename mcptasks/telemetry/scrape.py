"""An optional Prometheus scrape view, for staff or a bearer token only.

It serves ``prometheus_client``'s default registry in the text exposition
format: what the site's ``PrometheusMetricReader``
(``opentelemetry-exporter-prometheus``, the site's choice of SDK reader)
collects there. Mount it where the site likes::

    path("metrics", mcptasks.telemetry.scrape.metrics_view)

A signed-in staff user may read it, and so may a request with
``Authorization: Bearer <MCPTASKS["METRICS_TOKEN"]>``; anyone else gets 404,
which does not tell a scanner that there is something to guess at. Without
``prometheus_client`` installed the view answers 404 to everyone.
"""

from __future__ import annotations

import hmac

from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from ..conf import settings


def allowed(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return True
    token = settings.METRICS_TOKEN
    scheme, _, offered = request.headers.get("Authorization", "").partition(" ")
    if not token or scheme.lower() != "bearer":
        return False
    # As bytes: compare_digest refuses a str that is not ASCII, and a header may hold any.
    return hmac.compare_digest(offered.strip(" \t").encode("utf-8", "surrogatepass"), str(token).encode("utf-8"))


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        raise Http404("No metrics here")
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
    except ImportError:
        raise Http404("prometheus_client is not installed") from None
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)

"""The floor: the cheapest Django views on the same server stack."""

from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt

BODY = b'{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete"}}'


@csrf_exempt
def bare(request):
    """A plain (sync) view returning constant JSON, like the MCP endpoint is."""
    return HttpResponse(BODY, content_type="application/json")


@csrf_exempt
async def bare_async(request):
    """The same as an async view: no thread hop under ASGI."""
    return HttpResponse(BODY, content_type="application/json")

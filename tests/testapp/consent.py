"""The consent page of the test site's authorization server: the toolkit's
view, with each requested scope beside its description for the template."""

from typing import Any

from oauth2_provider.views import AuthorizationView


class ConsentView(AuthorizationView):
    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context: dict[str, Any] = super().get_context_data(**kwargs)
        scopes = context.get("scopes") or []
        descriptions = context.get("scopes_descriptions") or []
        context["scope_list"] = list(zip(scopes, descriptions, strict=False))
        return context

"""The consent page: django-oauth-toolkit's authorization view, with each
requested scope next to its description for the template
(templates/oauth2_provider/authorize.html)."""

from typing import Any

from oauth2_provider.views import AuthorizationView


class ConsentView(AuthorizationView):
    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["scope_list"] = list(
            zip(context.get("scopes") or [], context.get("scopes_descriptions") or [], strict=False)
        )
        return context

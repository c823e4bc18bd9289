"""The tool-author API: the ``@tool`` registry, the context a tool gets, and
result helpers. Re-exported at the top (``from mcptasks import tool``)."""

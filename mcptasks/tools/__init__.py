"""The tool-author API: the decorators and their registry, the context a tool
or prompt gets, and result helpers. Re-exported at the top
(``from mcptasks import tool``)."""

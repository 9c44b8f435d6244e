"""The project's field tools: real engines through kvspec (``make field``), the report
builder (``field.report``), the historical corpus, the worker harness and the repros.

Not part of the kvspec wheel (``pyproject.toml`` packages only ``kvspec`` and ``sim``):
field/ may import kvspec; kvspec never imports field/.
"""

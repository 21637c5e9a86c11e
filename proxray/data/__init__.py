"""Routing data: the canonical routing table (``table``), importers of public formats, the query sets an
evaluation job reads (``querysets``), and the embedded synthetic world (``synthetic``)."""

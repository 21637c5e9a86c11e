"""End-to-end demos (``proxray demo ...``)."""

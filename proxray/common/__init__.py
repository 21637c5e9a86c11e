"""What every stage shares: one atomic write to any filesystem URI (``storage``), logging and progress, YAML
configs validated by pydantic, and the one way to turn a model id into a name (``naming``)."""

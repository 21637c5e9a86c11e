"""Reading a YAML config into a pydantic model at the boundary: one error that names the file and, for
every problem at once, the field, the rule and the value given."""
from __future__ import annotations

from pathlib import Path


def load_yaml_model(path, model_cls, what: str, error_cls=ValueError):
    import yaml
    from pydantic import ValidationError

    from proxray.common.storage import is_uri, read_file

    if not is_uri(path):
        path = Path(path)
        if not path.is_file():
            raise error_cls(f"{path}: no such {what}")
    try:
        text = read_file(path).decode()
    except FileNotFoundError:
        raise error_cls(f"{path}: no such {what}") from None
    except (OSError, ValueError) as e:
        raise error_cls(f"{path}: cannot read the {what} ({e})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise error_cls(f"{path}: not valid YAML: {e}") from None
    try:
        return model_cls.model_validate(raw)
    except ValidationError as e:
        lines = [f"  {'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg']} (got {_short(err.get('input'))})"
                 for err in e.errors()]
        raise error_cls(f"{path}: invalid {what}:\n" + "\n".join(lines)) from None


def _short(value, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"

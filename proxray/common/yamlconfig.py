"""Every config's base (``StrictModel``: unknown keys refused) and reading one from YAML at the boundary: one error
that names the file and, for every problem at once, the field, the rule and the value given (``error_lines``, the
one formatter of validation errors)."""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """The base of every config and spec: a key it does not know is an error, never ignored."""
    model_config = ConfigDict(extra="forbid")

    @classmethod
    def from_file(cls, path, what: str, error_cls=ValueError):
        """Read and validate one from a YAML file (a path or a URI); ``what`` names it in errors."""
        return load_yaml_model(path, cls, what, error_cls)


def error_lines(e) -> list[str]:
    """One line per error of a pydantic ``ValidationError``: the field, the rule and the value given."""
    return [f"{'.'.join(map(str, x['loc'])) or '(top level)'}: {x['msg']} (got {_short(x.get('input'))})"
            for x in e.errors()]


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
        raise error_cls(f"{path}: invalid {what}:\n" + "\n".join("  " + line for line in error_lines(e))) from None


def _short(value, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"

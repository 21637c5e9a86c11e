"""The evaluation job's configuration, validated at the boundary: the pool (the one pool-model spec), the query
sets, the one sampling spec and judge grading. ``load_config`` names the file, the field, the value and the rule."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from proxray.common.naming import slug
from proxray.common.yamlconfig import StrictModel
from proxray.pool.spec import PoolModel, Sampling


class SyntheticSet(StrictModel):
    """The embedded synthetic tasks (real text, simulated answers) as a query set."""
    n_per_task: int = Field(20, ge=1, description="queries per task")
    seed: int = Field(0, description="which queries are drawn")
    tasks: list[str] | None = Field(None, min_length=1, description="the tasks to draw from (default: all ten)")

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, v):
        from proxray.data.synthetic import TASKS

        unknown = [t for t in v or () if t not in TASKS]
        if unknown:
            raise ValueError(f"{unknown} are not synthetic tasks; allowed: {', '.join(TASKS)}")
        return v


class QuerySetSpec(StrictModel):
    """One set of queries: exactly one of ``path``, ``hf`` or ``synthetic``."""
    name: str | None = Field(None, description="written to the table's split column")
    path: str | None = Field(None, description=(
        "JSONL or parquet of {query_id, task, prompt, answer, answer_type}, a local path or a URI "
        "(answer and answer_type may be empty where a grader judges)"))
    hf: str | None = Field(None, description="one of the paper's ten tasks, from the Hugging Face Hub")
    split: str | None = Field(None, description="hf: the data set's split; default its test split")
    n: int | None = Field(None, ge=1, description="a seeded sample of at most this many queries of the set")
    synthetic: SyntheticSet | None = Field(None, description="the embedded synthetic tasks")

    @model_validator(mode="after")
    def _one_source(self):
        given = [k for k in ("path", "hf", "synthetic") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a query set needs exactly one of path, hf, synthetic (got: {', '.join(given) or 'none'})")
        return self


DEFAULT_RUBRIC = (
    "You are grading an AI assistant's answer to a user's request.\n\nRequest:\n{question}\n\n"
    "Answer:\n{response}\n\nIs the answer correct and does it do what the request asks? Reply with one line, "
    "'Score: X', where X is a number from 0 (wrong or useless) to 1 (fully correct).")


class GraderSpec(StrictModel):
    """Judge grading: a model of the pool scores each (query, response) pair in [0, 1] from a rubric prompt."""
    model: str = Field(min_length=1, description="the judge: a model id of this config's pool (any engine)")
    rubric: str = Field(DEFAULT_RUBRIC, description="judge prompt with {question} and {response}; the judge "
                        "answers 'Score: X', X in [0, 1] (or 'X/10')")
    apply_to: Literal["unanswered", "all"] = Field(
        "unanswered", description="unanswered: the judge grades the rows without a reference answer, the rest "
        "are graded against their answer; all: the judge grades every row")
    max_tokens: int = Field(16, ge=1, description="the judge's output budget")

    @model_validator(mode="after")
    def _placeholders(self):
        missing = [p for p in ("{question}", "{response}") if p not in self.rubric]
        if missing:
            raise ValueError(f"grader.rubric must contain {' and '.join(missing)}")
        try:
            self.rubric.format(question="q", response="r")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"grader.rubric: only {{question}} and {{response}} may be placeholders "
                             f"(write other braces as {{{{ }}}}): {e}") from None
        return self


class JobTemplate(StrictModel):
    """An evaluation job without its queries and output: the pool, how it generates and how it is graded (what the
    drift monitor runs on the queries it picks, ``MonitorConfig.job``)."""
    models: list[PoolModel] = Field(min_length=1, description="the pool: every model runs every query (a price "
                                    "is required: the job prices every answer)")
    sampling: Sampling = Field(default_factory=Sampling, description="how every model generates")
    grader: GraderSpec | None = Field(None, description="judge grading (for queries without reference answers)")

    @model_validator(mode="after")
    def _priced(self):
        unpriced = [m.id for m in self.models if m.price is None]
        if unpriced:
            raise ValueError(f"models {unpriced}: the evaluation job prices every answer; give each model "
                             "price: {input_per_mtok: ..., output_per_mtok: ...}")
        return self

    @model_validator(mode="after")
    def _judge_in_pool(self):
        if self.grader is not None and self.grader.model not in {m.id for m in self.models}:
            raise ValueError(f"grader.model {self.grader.model!r} is not a model of the pool "
                             f"({', '.join(m.id for m in self.models)})")
        return self

    @model_validator(mode="after")
    def _unique_models(self):
        ids = [m.id for m in self.models]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"model ids must be unique; repeated: {', '.join(dup)}")
        slugs = {}
        for i in ids:  # injective by construction (a hash of the id); refused all the same if it ever is not
            if slug(i) in slugs:
                raise ValueError(f"model ids {slugs[slug(i)]!r} and {i!r} map to the same output folder {slug(i)!r}")
            slugs[slug(i)] = i
        return self


class JobConfig(JobTemplate):
    """The evaluation job (``proxray build-table --config``; ``jobs/build_table.py`` on a cluster)."""
    output: str = Field("out/table", description="folder or URI the table is written to (--out overrides it)")
    query_sets: list[QuerySetSpec] = Field(min_length=1, description="the queries")


class ConfigError(ValueError):
    pass


def load_config(path) -> JobConfig:
    """Read and validate a job YAML; errors name the file, the field, the value and the rule."""
    return JobConfig.from_file(path, "job config", ConfigError)


def sampled(config: JobConfig, n: int) -> JobConfig:
    """The config with every query set cut to a seeded sample of at most ``n`` queries (``--sample``: try a job on a
    few queries first; the rows it writes are the full job's, so a later full run resumes from them)."""
    if n < 1:
        raise ConfigError(f"--sample {n}: must be at least 1")
    sets = [qs.model_copy(update={"n": min(n, qs.n or n), **({"synthetic": qs.synthetic.model_copy(update={
        "n_per_task": min(n, qs.synthetic.n_per_task)})} if qs.synthetic is not None else {})}) for qs in config.query_sets]
    return config.model_copy(update={"query_sets": sets})


def rehearsal(config: JobConfig) -> JobConfig:
    """The config as a rehearsal on a CPU (``--simulate``): every model the simulated one under its own id, with its
    price, replicas and resources (``proxray.pool.simulated.rehearsal``), and every Hugging Face query set the
    synthetic stand-in of the same task (nothing is downloaded). Local query files stay as they are."""
    from proxray.pool.simulated import rehearsal as simulated

    sets = []
    for qs in config.query_sets:
        if qs.hf is not None:
            qs = QuerySetSpec(name=qs.name or qs.hf, n=qs.n,
                              synthetic=SyntheticSet(n_per_task=qs.n or 20, seed=config.sampling.seed, tasks=[qs.hf]))
        sets.append(qs)
    return config.model_copy(update={"models": [simulated(m) for m in config.models], "query_sets": sets})


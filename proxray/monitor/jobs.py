"""How the monitor runs an evaluation job: through the Ray Jobs API with a submission id chosen (and
recorded) before submitting, so a restarted monitor that submits the same evaluation again gets
"already exists" instead of a second job; or inline, in-process (tests without a Jobs API).
"""
from __future__ import annotations

import shlex
import sys


def entrypoint(config_path, out, models=None) -> str:
    cmd = (f"{shlex.quote(sys.executable)} -m proxray.cli build-table --config {shlex.quote(str(config_path))} "
           f"--out {shlex.quote(str(out))}")
    return cmd + (f" --models {shlex.quote(','.join(models))}" if models else "")


class JobsApiRunner:
    """Ray Jobs API client; Ray's token auth as the cluster has it (the client sends the token)."""

    TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED", "MISSING")

    def __init__(self, address: str | None = None):
        self.address = address
        self._client = None

    def where(self) -> str | None:
        """The Jobs API's address: the configured one, else the one Ray records for the head's dashboard (the
        monitor runs on the head, where that address answers)."""
        if self.address is None:
            from ray._private.services import get_webui_url_from_internal_kv

            url = get_webui_url_from_internal_kv()
            return f"http://{url}" if url else None
        return self.address

    def _c(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            self._client = JobSubmissionClient(self.where())
        return self._client

    def submit(self, submission_id: str, config_path, out, models=None) -> None:
        try:
            self._c().submit_job(entrypoint=entrypoint(config_path, out, models), submission_id=submission_id)
        except RuntimeError as e:
            if "already exists" not in str(e):  # submitted before a restart: that one job goes on
                raise

    def status(self, submission_id: str) -> str:
        """PENDING / RUNNING / SUCCEEDED / FAILED / STOPPED, or MISSING when the Jobs API does not know it."""
        try:
            return str(self._c().get_job_status(submission_id)).split(".")[-1]
        except RuntimeError as e:
            if "does not exist" in str(e) or "404" in str(e):
                return "MISSING"
            raise

    def stop(self, submission_id: str) -> None:
        try:
            self._c().stop_job(submission_id)
        except RuntimeError:
            pass


class InlineRunner:
    """The same job in this process, at submit time (tests without a Jobs API server)."""

    def __init__(self):
        self.done = {}

    def where(self) -> str:
        return "inline"

    def submit(self, submission_id: str, config_path, out, models=None) -> None:
        from proxray.evaljob import load_config, run_job

        try:
            run_job(load_config(config_path), out, models=models)
            self.done[submission_id] = "SUCCEEDED"
        except Exception:  # noqa: BLE001 - reported as a failed job, like the Jobs API would
            import logging

            logging.getLogger("proxray.monitor").exception("evaluation %s failed", submission_id)
            self.done[submission_id] = "FAILED"

    def status(self, submission_id: str) -> str:
        return self.done.get(submission_id, "MISSING")

    def stop(self, submission_id: str) -> None:
        pass
